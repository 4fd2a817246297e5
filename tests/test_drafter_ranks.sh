#!/usr/bin/env bash
# test_drafter_ranks: two data-parallel drafter ranks (CPU backend, shm all-reduce) in the
# real pipeline on the tiny model (docs/allreduce.md, "How the drafter_worker uses it").
#   1. deterministic, clean: exit 0, every batch exactly once, both ranks end with the same
#      weights and AdamW state (each writes a hash of them into its metrics), and with an odd
#      number of batches the last step has a batch on rank 0 only (rank 1 contributes zero
#      gradients: an "empty_step" line);
#   2. deterministic, rank 1 SIGKILLed after a checkpoint: the orchestrator aborts the
#      all-reduce, restarts the group (the whole pipeline in this mode) from the checkpoint,
#      the audit is still exactly once and the final checkpoint and export are byte-identical
#      to run 1's, although this run all-reduces in per-layer buckets handed over during the
#      backward (drafter.allreduce_bucket_kb 0) and run 1 in one bucket; both ranks'
#      TensorBoard event files match their metrics lines (tests/check_tfevents.py);
#   3. fast mode (any ready slot per rank), rank 0 SIGKILLed after a checkpoint: exactly once,
#      the ranks' hashes agree.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 110 --max-len 300 >/dev/null || fail "prepare_data"
mk_topo() { # NAME DETERMINISTIC [ALLREDUCE_BUCKET_KB]
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 9, "deterministic": $2,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 3, "mask_token_id": 261, "allreduce_bucket_kb": ${3:-16384} },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 600, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 1048576, "max_attempts": 8 },
             { "name": "pd", "slots": 4, "slot_bytes": 1048576, "max_attempts": 8 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd", "rank": 0 },
               { "name": "drafter1", "role": "drafter", "in": "pd", "rank": 1 } ],
  "supervision": { "backoff_initial_ms": 20, "backoff_max_ms": 200, "max_restarts": 20, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
steps() { grep -c '"ev":"step"' "$RUN/metrics/$1.jsonl" 2>/dev/null || echo 0; }
steps_ge() { [ "$(steps "$1")" -ge "$2" ]; }
inc_ge() { [ "$(wstat "$1" incarnation 2>/dev/null || echo 0)" -ge "$2" ]; }
# last_final WORKER FIELD: the last "final" metrics line's field
last_final() { python3 -c "
import json,sys
L=[json.loads(l) for l in open(sys.argv[1]) if '\"ev\":\"final\"' in l]
print(L[-1][sys.argv[2]] if L else 'none')" "$RUN/metrics/$1.jsonl" "$2"; }
check_run() { # WHAT: exit 0, exactly once, both ranks at the same final state
  [ "$ORCH_RC" = 0 ] || fail "$1: exited $ORCH_RC"
  audit_exactly_once
  [ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "$1: poisoned batches"
  h0=$(last_final drafter0 state_hash); h1=$(last_final drafter1 state_hash)
  [ "$h0" != none ] && [ "$h0" = "$h1" ] || fail "$1: ranks disagree: rank 0 state $h0, rank 1 $h1"
  [ "$(last_final drafter0 step)" = "$(last_final drafter1 step)" ] || fail "$1: ranks ended at different steps"
  [ -f "$RUN/drafter/model.safetensors" ] || fail "$1: no release export"
  [ ! -f "$RUN/logs/drafter1.log" ] || ! grep -q 'checkpoint at step' "$RUN/logs/drafter1.log" || fail "$1: rank 1 wrote a checkpoint"
}

# 1. deterministic, clean
mk_topo clean true
start_orch; wait_orch 200
check_run "clean run"
CLEAN=$RUN
n=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ $((n % 2)) = 1 ] || fail "test setup: expected an odd number of batches, the plan has $n"
fs=$(last_final drafter0 step)
[ "$fs" = $(( (n + 1) / 2 )) ] || fail "clean run: $n batches on 2 ranks should take $(( (n + 1) / 2 )) steps, took $fs"
grep -q '"ev":"empty_step"' "$RUN/metrics/drafter1.jsonl" || fail "clean run: rank 1 never stepped without a batch"
s0=$(steps drafter0); s1=$(steps drafter1)
[ $((s0 + s1)) = "$n" ] || fail "clean run: ranks trained $s0 + $s1 batches, the plan has $n"
ok "clean run, 2 ranks: $n batches exactly once in $fs steps ($s0 on rank 0, $s1 on rank 1), identical state $(last_final drafter0 state_hash)"

# 2. deterministic, rank 1 killed after a checkpoint; gradients all-reduced in per-layer
#    buckets overlapped with the backward (the clean run: one bucket): the bits must not change
mk_topo killed true 0
start_orch
wait_for 60 committed_ge 1 || fail "no checkpoint before the kill"
wait_for 60 steps_ge drafter1 4 || fail "rank 1 stalled"
"$DFCTL" --run-dir "$RUN" kill drafter1 >/dev/null || fail "dfctl kill drafter1"
wait_orch 200
check_run "killed run"
events group_restart | grep -q '"pipeline": true' || fail "killed run: no group restart"
for d in drafter0 drafter1; do grep -q 'resumed from' "$RUN/logs/$d.log" || fail "killed run: $d did not resume"; done
same_result "$CLEAN" "$RUN" "killed run"
ov=$(python3 -c "
import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if '\"ev\":\"step\"' in l]
print(min(x['allreduce_buckets_overlapped'] for x in s), max(x['allreduce_buckets_overlapped'] for x in s))" "$RUN/metrics/drafter0.jsonl")
# (a batch without loss positions has no backward: 0 overlapped, all handed over at the end)
[ "${ov#* }" = 3 ] || fail "killed run: steps handed over $ov (min max) buckets from inside the backward, expected 3 (1 layer + final norm + context)"
# both ranks' TensorBoard files (empty steps, the bucket figures, a second file per rank
# after the group restart) against their metrics lines
tb_check "$RUN" --workers drafter0,drafter1
ok "rank 1 killed: group restarted from its checkpoint, exactly once; per-layer buckets (3 a step, overlapped with the backward); final checkpoint and export byte-identical to the clean (one-bucket) run's"

# 3. fast mode, rank 0 killed after a checkpoint
mk_topo fast false
start_orch
wait_for 60 committed_ge 1 || fail "fast: no checkpoint before the kill"
wait_for 60 steps_ge drafter0 4 || fail "fast: rank 0 stalled"
"$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
wait_orch 200
check_run "fast run"
events group_restart | grep -q '"pipeline": false' || fail "fast run: no drafter group restart"
[ "$(events spawn | grep -c '"worker": "target0"')" = 1 ] || fail "fast run: the target must not restart with the drafter group"
ok "fast mode, rank 0 killed: drafter group restarted, exactly once, ranks identical"
echo "test_drafter_ranks: ok"
