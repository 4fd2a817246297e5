#!/usr/bin/env bash
# test_ring_model.sh: model-checks the ring + hand-off protocol (tests/ring_model.pml) with
# spin: producer -> ring A -> middle -> ring B -> consumer, an orchestrator that reaps,
# recovers and restarts, process death as a transition anywhere.
#   1. safety   (MAXD=2 deaths): assertions, the slot-owner monitor, no invalid end state
#   2. liveness (MAXD=1 death, -a -f): ltl "progress" = <> every batch committed or poisoned,
#      under weak fairness. RING_MODEL_FULL=1 also runs it with MAXD=2 (~1 min, ~1 GB).
#   3. two mutants must FAIL, so the checks can fail: recovery ignores "output published"
#      (safety: double commit), reclaim forgets to requeue (liveness: a stuck batch).
# Full state space, no bitstate; -DCOLLAPSE only for the liveness run (memory).
# Exit 77 with a SKIPPED line when spin or gcc is missing.
set -u
cd "$(dirname "$0")/.."
model=$PWD/tests/ring_model.pml
command -v spin >/dev/null || { echo "SKIPPED: spin is not installed (apt-get install spin)"; exit 77; }
command -v gcc >/dev/null || { echo "SKIPPED: gcc is not installed"; exit 77; }
work=$(mktemp -d /tmp/ring_model.XXXXXX) || exit 1
trap 'rm -rf "$work"' EXIT
cd "$work"

# run NAME SPIN_DEFS CC_DEFS PAN_ARGS MODEL: prints the verdict and states; 0 if no error
run() {
  local name=$1 sdefs=$2 cdefs=$3 args=$4 m=$5
  spin $sdefs -a "$m" >spin.out 2>&1 || { echo "FAIL $name: spin -a failed:"; cat spin.out; return 1; }
  gcc -w -O2 $cdefs -o pan pan.c >cc.out 2>&1 || { echo "FAIL $name: gcc pan.c failed:"; cat cc.out; return 1; }
  ./pan $args >pan.out 2>&1
  local rc=$?
  local states errs
  states=$(grep -m1 'states, stored' pan.out | sed 's/^ *//')
  errs=$(grep -m1 -o 'errors: [0-9]*' pan.out)
  echo "$name: $errs; $states; $(grep -m1 'elapsed time' pan.out | sed 's/pan: //')"
  if [ $rc -ne 0 ] || [ "$errs" != "errors: 0" ] || grep -q 'max search depth too small' pan.out; then
    grep -E 'violated|invalid end|acceptance cycle|max search depth|error' pan.out | head -5
    return 1
  fi
  return 0
}

fail=0
run "safety   (MAXD=2)" "-DMAXD=2" "-DNOCLAIM -DSAFETY" "-m200000" "$model" || fail=1
run "liveness (MAXD=1)" "-DMAXD=1" "-DCOLLAPSE -DNFAIR=3" "-a -f -m200000" "$model" || fail=1
if [ "${RING_MODEL_FULL:-0}" = 1 ]; then
  run "liveness (MAXD=2)" "-DMAXD=2" "-DCOLLAPSE -DNFAIR=3" "-a -f -m200000" "$model" || fail=1
fi
# the mutant: recovery treats a published output as unpublished -> the batch is doubled
sed 's/:: intent\[w\].phase == I_PUB -> pub = 1/:: intent[w].phase == I_PUB -> pub = 0/' "$model" >mutant.pml
if cmp -s "$model" mutant.pml; then echo "FAIL mutant: the sed found nothing to change"; fail=1
elif run "mutant   (must fail)" "-DMAXD=2" "-DNOCLAIM -DSAFETY" "-m200000" mutant.pml >mut.out; then
  cat mut.out; echo "FAIL mutant: the model check did not catch a recovery that doubles batches"; fail=1
else
  echo "mutant (recovery ignores 'published'): caught: $(grep -m1 -o 'assertion violated.*' pan.out)"
fi
# liveness mutant: reclaim leaves a dead consumer's slot READING -> the batch is stuck
sed 's/:: else -> st\[j\] = READY fi/:: else -> st[j] = READING fi/' "$model" >mutant2.pml
if cmp -s "$model" mutant2.pml; then echo "FAIL mutant2: the sed found nothing to change"; fail=1
elif run "mutant2  (must fail)" "-DMAXD=1" "-DCOLLAPSE -DNFAIR=3" "-a -f -m200000" mutant2.pml >mut.out; then
  cat mut.out; echo "FAIL mutant2: the liveness check did not catch a batch stuck in READING"; fail=1
else
  echo "mutant2 (reclaim forgets to requeue): caught: $(grep -m1 -o 'acceptance cycle.*' pan.out)"
fi
[ $fail -eq 0 ] && echo "ring model: safety and liveness checks passed" || echo "ring model: FAILED"
exit $fail
