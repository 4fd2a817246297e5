/* ring_model.pml: Promela model of the ring + hand-off protocol (common/ipc/ring.c,
 * handoff.c) with process death as a transition. Checked by tests/test_ring_model.sh.
 *
 *   Producer --ring A--> Middle --ring B--> Consumer (commits)      Orchestrator
 *
 * Every worker step that is one CAS or one store in the C code is one atomic step here;
 * between any two steps the worker may die (DIE), at most MAXD times in a run. A dead
 * worker does nothing until the orchestrator has "reaped" it (dead[w] == 1), recovered
 * its leases and intent (handoff_recover_ex + the claim sweep), and restarted it
 * (dead[w] = 0: it starts from the top with fresh local state).
 *
 * Abstractions (and why they are sound):
 * - Generations are not modelled: recovery compares "state and owner" where the C code
 *   compares "state, owner and generation". The two agree here because a dead worker's
 *   leases cannot change until recovery and a live worker holds at most one lease per
 *   ring; the generation in C guards the same check against a stale process.
 * - Recovery is one atomic step. In C it is several CASes, but every word it reads or
 *   writes belongs to the dead worker (its leases, its intent, its claims) or is stable
 *   while that worker is dead (the commit of the batch it held), so no live worker can
 *   interleave with it in a way that changes the outcome.
 * - Consumers and the middle take ANY ready slot (C takes the oldest): a superset.
 * - Sleep/wake is Promela blocking (a guard waits until it holds): the futex protocol
 *   below it (no lost wake-up) is argued in ring.c's ordering contract, not checked here.
 *
 * Checks:
 * - assert: a live worker's lease is never taken from it (state and owner are what it
 *   left); a batch is never committed twice; at the end every batch was committed or
 *   poisoned, never both.
 * - monitor: at most one holder per slot, and a holder is the slot's recorded owner.
 * - safety run: no invalid end state (a lost batch leaves everyone blocked: deadlock).
 * - ltl progress: <> all batches done, under weak fairness, with MAXD deaths anywhere.
 */

#ifndef NB
#define NB 2          /* batches */
#endif
#define NS 2          /* slots per ring (fixed: the monitor and the pickers name slots 0 and 1) */
#ifndef MAXD
#define MAXD 2        /* deaths in one run (any workers, any points) */
#endif
#define K 2           /* max_attempts: a batch whose consumer died K times is poisoned */

#define FREE 0
#define WRITING 1
#define READY 2
#define READING 3
#define POISONED 4

#define P 0           /* producer */
#define M 1           /* middle */
#define C 2           /* consumer */
#define NOBODY 3
#define NONE 255      /* no slot / no batch */

#define PENDING 0     /* batch claim states (the ledger's role) */
#define CLAIMED 1
#define INRING 2

#define I_NONE 0      /* intent phases */
#define I_INTENT 1
#define I_PUB 2

byte stA[NS], ownA[NS], batA[NS], attA[NS];
byte stB[NS], ownB[NS], batB[NS], attB[NS];
byte holdA[3] = NONE, holdB[3] = NONE;   /* the slot each worker believes it holds */
byte bstate[NB];                          /* PENDING / CLAIMED (by the producer) / INRING */
byte committed[NB], poisoned[NB];
bit dead[3];
byte deaths;

/* one intent per worker: input (ring A/B slot, or external token) -> output */
typedef intent_t { byte phase; byte in_ring; byte in_slot; byte in_tok; byte out_ring; byte out_slot; byte out_tok };
#define R_A 1
#define R_B 2
#define R_EXT 3
intent_t intent[3];

#define BATCH_DONE(b) (committed[b] > 0 || poisoned[b] > 0)
#if NB == 2
#define ALL_DONE (BATCH_DONE(0) && BATCH_DONE(1))
#define ANY_PENDING (bstate[0] == PENDING || bstate[1] == PENDING)
#elif NB == 3
#define ALL_DONE (BATCH_DONE(0) && BATCH_DONE(1) && BATCH_DONE(2))
#define ANY_PENDING (bstate[0] == PENDING || bstate[1] == PENDING || bstate[2] == PENDING)
#endif

#define DIE if :: deaths < MAXD -> deaths++; goto died :: skip fi

/* -------------------------------------------------------------------------------- */
proctype Producer()
{
    byte b, s, i;
start:
    b = NONE; s = NONE;
    do
    :: atomic { ANY_PENDING -> /* claim: one CAS on the batch's state */
         i = 0;
         do :: i < NB && bstate[i] != PENDING -> i++ :: else -> break od;
         b = i; bstate[b] = CLAIMED }
       DIE;
       atomic { /* ring_acquire_free(A) */
         i = 0;
         do :: i < NS && stA[i] != FREE -> i++ :: else -> break od;
         i < NS -> s = i; stA[s] = WRITING; ownA[s] = P; attA[s] = 0; holdA[P] = s }
       DIE;
       atomic { intent[P].phase = I_INTENT; intent[P].in_ring = R_EXT; intent[P].in_tok = b;
                intent[P].out_ring = R_A; intent[P].out_slot = s }
       DIE;
       batA[s] = b;                                  /* fill descriptor + payload */
       DIE;
       atomic { assert(stA[s] == WRITING && ownA[s] == P); /* ring_publish */
                stA[s] = READY; ownA[s] = NOBODY; holdA[P] = NONE }
       DIE;
       intent[P].phase = I_PUB;                      /* handoff_mark_published */
       DIE;
       atomic { assert(bstate[b] == CLAIMED); bstate[b] = INRING }  /* ledger_set_in_ring */
       DIE;
       intent[P].phase = I_NONE;                     /* handoff_clear */
       b = NONE; s = NONE
    :: ALL_DONE -> break
    od;
    goto fin;
died:
    dead[P] = 1;
    dead[P] == 0;
    goto start;
fin:
    skip
}

proctype Middle()
{
    byte si, so, i;
start:
    si = NONE; so = NONE;
    do
    :: atomic { /* ring_acquire_ready(A): any READY slot */
         if :: stA[0] == READY -> si = 0
            :: NS > 1 && stA[1] == READY -> si = 1
         fi;
         stA[si] = READING; ownA[si] = M; holdA[M] = si }
       DIE;
       atomic { /* ring_acquire_free(B) */
         i = 0;
         do :: i < NS && stB[i] != FREE -> i++ :: else -> break od;
         i < NS -> so = i; stB[so] = WRITING; ownB[so] = M; attB[so] = 0; holdB[M] = so }
       DIE;
       atomic { intent[M].phase = I_INTENT; intent[M].in_ring = R_A; intent[M].in_slot = si;
                intent[M].out_ring = R_B; intent[M].out_slot = so }
       DIE;
       atomic { assert(stA[si] == READING && ownA[si] == M); batB[so] = batA[si] }
       DIE;
       atomic { assert(stB[so] == WRITING && ownB[so] == M);
                stB[so] = READY; ownB[so] = NOBODY; holdB[M] = NONE }
       DIE;
       intent[M].phase = I_PUB;
       DIE;
       atomic { assert(stA[si] == READING && ownA[si] == M);   /* ring_release(A) */
                stA[si] = FREE; ownA[si] = NOBODY; holdA[M] = NONE }
       DIE;
       intent[M].phase = I_NONE;
       si = NONE; so = NONE
    :: ALL_DONE -> break
    od;
    goto fin;
died:
    dead[M] = 1;
    dead[M] == 0;
    goto start;
fin:
    skip
}

proctype Consumer()
{
    byte s, b;
start:
    s = NONE; b = NONE;
    do
    :: atomic {
         if :: stB[0] == READY -> s = 0
            :: NS > 1 && stB[1] == READY -> s = 1
         fi;
         stB[s] = READING; ownB[s] = C; holdB[C] = s; b = batB[s] }
       DIE;
       atomic { intent[C].phase = I_INTENT; intent[C].in_ring = R_B; intent[C].in_slot = s;
                intent[C].out_ring = R_EXT; intent[C].out_tok = b }
       DIE;
       atomic { assert(committed[b] == 0);           /* the commit: never twice */
                committed[b]++ }
       DIE;
       intent[C].phase = I_PUB;
       DIE;
       atomic { assert(stB[s] == READING && ownB[s] == C);
                stB[s] = FREE; ownB[s] = NOBODY; holdB[C] = NONE }
       DIE;
       intent[C].phase = I_NONE;
       s = NONE; b = NONE
    :: ALL_DONE -> break
    od;
    goto fin;
died:
    dead[C] = 1;
    dead[C] == 0;
    goto start;
fin:
    skip
}

/* -------------------------------------------------------------------------------- */
/* ring_reclaim_owner(ring, w): WRITING(w) -> FREE; READING(w) -> READY attempts+1 or
 * POISONED at K. (A cpp macro: Promela inlines take no array parameters.) */
#define RECLAIM_RING(st, own, att, w) \
    j = 0; \
    do \
    :: j < NS -> \
       if \
       :: st[j] == WRITING && own[j] == w -> st[j] = FREE; own[j] = NOBODY \
       :: st[j] == READING && own[j] == w -> \
          att[j]++; \
          own[j] = NOBODY; \
          if :: att[j] >= K -> st[j] = POISONED :: else -> st[j] = READY fi \
       :: else -> skip \
       fi; \
       j++ \
    :: else -> break \
    od

inline recover(w)
{
    d_step {
        pub = 0;
        if
        :: intent[w].phase != I_NONE ->
           /* was the output published? phase says so, or the out slot is no longer
            * WRITING by w (the publish CAS happened), or the external commit happened */
           if
           :: intent[w].phase == I_PUB -> pub = 1
           :: else ->
              if
              :: intent[w].out_ring == R_A -> pub = !(stA[intent[w].out_slot] == WRITING && ownA[intent[w].out_slot] == w)
              :: intent[w].out_ring == R_B -> pub = !(stB[intent[w].out_slot] == WRITING && ownB[intent[w].out_slot] == w)
              :: intent[w].out_ring == R_EXT -> pub = (committed[intent[w].out_tok] > 0)
              fi
           fi;
           if
           :: pub && intent[w].in_ring == R_A && stA[intent[w].in_slot] == READING && ownA[intent[w].in_slot] == w ->
              stA[intent[w].in_slot] = FREE; ownA[intent[w].in_slot] = NOBODY
           :: pub && intent[w].in_ring == R_B && stB[intent[w].in_slot] == READING && ownB[intent[w].in_slot] == w ->
              stB[intent[w].in_slot] = FREE; ownB[intent[w].in_slot] = NOBODY
           :: intent[w].in_ring == R_EXT && bstate[intent[w].in_tok] == CLAIMED ->
              if :: pub -> bstate[intent[w].in_tok] = INRING
                 :: else -> bstate[intent[w].in_tok] = PENDING
              fi
           :: else -> skip
           fi;
           intent[w].phase = I_NONE
        :: else -> skip
        fi;
        RECLAIM_RING(stA, ownA, attA, w);
        RECLAIM_RING(stB, ownB, attB, w);
        /* the producer's claims it never recorded in an intent (ledger_reclaim_owner) */
        if
        :: w == P ->
           j = 0;
           do :: j < NB -> if :: bstate[j] == CLAIMED -> bstate[j] = PENDING :: else -> skip fi; j++
              :: else -> break
           od
        :: else -> skip
        fi;
        holdA[w] = NONE; holdB[w] = NONE;
        pub = 0; j = 0
    }
}

/* the orchestrator records a poisoned batch, then frees its slot (ring_free_poisoned) */
#define FREE_POISONED(st, bat) \
    d_step { \
        j = 0; \
        do \
        :: j < NS -> \
           if :: st[j] == POISONED -> assert(committed[bat[j]] == 0); poisoned[bat[j]] = 1; st[j] = FREE \
              :: else -> skip \
           fi; \
           j++ \
        :: else -> break \
        od; \
        j = 0 \
    }

active proctype Orchestrator()
{
    byte j;
    bit pub;
    d_step { j = 0; do :: j < NS -> ownA[j] = NOBODY; ownB[j] = NOBODY; j++ :: else -> break od; j = 0 }
    atomic { run Producer(); run Middle(); run Consumer() }
end_watch:
    do
    :: dead[P] == 1 -> recover(P); dead[P] = 0
    :: dead[M] == 1 -> recover(M); dead[M] = 0
    :: dead[C] == 1 -> recover(C); dead[C] = 0
    :: (stA[0] == POISONED || (NS > 1 && stA[1] == POISONED)) -> FREE_POISONED(stA, batA)
    :: (stB[0] == POISONED || (NS > 1 && stB[1] == POISONED)) -> FREE_POISONED(stB, batB)
    :: ALL_DONE && _nr_pr == 2 -> break  /* all workers finished (2: us and the monitor) */
    od;
    /* end of run: every batch done exactly once, nothing leased */
    j = 0;
    do
    :: j < NB -> assert(committed[j] + poisoned[j] == 1); j++
    :: else -> break
    od;
    j = 0;
    do
    :: j < NS -> assert(stA[j] == FREE && stB[j] == FREE); j++
    :: else -> break
    od
}

/* at most one holder per slot, and a holder is the slot's recorded owner */
#define HOLD_OK(hold, st, own, w) (hold[w] == NONE || (own[hold[w]] == w && (st[hold[w]] == WRITING || st[hold[w]] == READING)) || dead[w])
#define SLOT_ONE(hold, s) (!(hold[P] == s && hold[M] == s) && !(hold[M] == s && hold[C] == s) && !(hold[P] == s && hold[C] == s))
active proctype Monitor()
{
end_mon:
    atomic {
        !(HOLD_OK(holdA, stA, ownA, P) && HOLD_OK(holdA, stA, ownA, M) &&
          HOLD_OK(holdB, stB, ownB, M) && HOLD_OK(holdB, stB, ownB, C) &&
          SLOT_ONE(holdA, 0) && SLOT_ONE(holdA, 1) && SLOT_ONE(holdB, 0) && SLOT_ONE(holdB, 1)) ->
        assert(false)
    }
}

ltl progress { <> (ALL_DONE) }
