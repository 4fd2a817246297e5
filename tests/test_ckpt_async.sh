#!/usr/bin/env bash
# test_ckpt_async: the drafter writes its checkpoints on a thread while it trains
# (drafter_worker/ckpt_writer.h, docs/drafter.md "Checkpoints written beside training").
# The real pipeline on the tiny model, "deterministic": true, so results compare byte for byte:
#   1. drafter.checkpoint_async false: every checkpoint written before training goes on;
#   2. async, the writer held back 700 ms per checkpoint (DF_FAULT_CKPT_DELAY_MS): training
#      went on during a write (a checkpoint collected at a later step than its own), and the
#      final checkpoint and release export are byte-identical to run 1's;
#   3. the same, and the drafter SIGKILLed while a write is in flight (the checkpoint it
#      had started never reported by that incarnation), with a leftover temp dir planted as
#      a death in the middle of a save leaves it: the next incarnation deletes it, resumes
#      from the committed checkpoint, and the run ends exactly once and byte-identical.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 120 --max-len 300 >/dev/null || fail "prepare_data"
mk_topo() { # NAME ASYNC DRAFTER_ENV
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 11, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 5, "checkpoint_async": $2, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 600, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 3, "slot_bytes": 1048576, "max_attempts": 8 },
             { "name": "pd", "slots": 3, "slot_bytes": 1048576, "max_attempts": 8 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd", "env": {$3} } ],
  "supervision": { "backoff_initial_ms": 20, "backoff_max_ms": 200, "max_restarts": 20, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
ckpt_lines() { grep '"ev":"checkpoint"' "$RUN/metrics/drafter0.jsonl" 2>/dev/null; }

# 1. synchronous
mk_topo sync false ""
start_orch; wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "sync run exited $ORCH_RC"
audit_exactly_once
SYNC=$RUN
n_sync=$(ckpt_lines | python3 -c "
import json,sys
L=[json.loads(l) for l in sys.stdin]
assert L and all(l['ok'] == 1 and l['async'] == 0 and l['at_step'] == l['step'] for l in L), L
print(len(L))") || fail "sync run: checkpoint lines not all ok, synchronous, collected at their own step"
grep -q 'start-up: weights and optimizer state (random) [0-9.]* s, cpu backend open [0-9.]* s' "$RUN/logs/drafter0.log" \
  || fail "sync run: no start-up line in the drafter's log"
ok "sync: $n_sync checkpoints, each written before training went on; final $(cat "$RUN/checkpoints/latest")"

# 2. async, the writer held back
mk_topo async true '"DF_FAULT_CKPT_DELAY_MS": "700"'
start_orch; wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "async run exited $ORCH_RC"
audit_exactly_once
later=$(ckpt_lines | python3 -c "
import json,sys
L=[json.loads(l) for l in sys.stdin]
assert L and all(l['ok'] == 1 and l['async'] == 1 for l in L), L
print(sum(l['at_step'] > l['step'] for l in L))") || fail "async run: checkpoint lines not all ok and async"
[ "$later" -ge 1 ] || fail "async run: no checkpoint was collected after training had gone on (at_step > step)"
grep -q 'writing beside training' "$RUN/logs/drafter0.log" || fail "async run: no 'writing beside training' log line"
same_result "$SYNC" "$RUN" "async run"
ok "async: $later checkpoints collected after later steps had trained; final checkpoint and export byte-identical to sync"

# 3. async, killed with a write in flight
mk_topo kill true '"DF_FAULT_CKPT_DELAY_MS": "700"'
start_orch
started_step() { grep 'writing beside training' "$RUN/logs/drafter0.log" 2>/dev/null | tail -1 | sed 's/.*checkpoint step \([0-9]*\):.*/\1/'; }
reported() { ckpt_lines | python3 -c "
import json,sys
print(any(json.loads(l)['inc'] == $1 and json.loads(l)['step'] == $2 for l in sys.stdin) and 1 or 0)"; }
have_committed() { [ -n "$(events checkpoint)" ]; }
hit=0
for attempt in 1 2 3; do
  # a checkpoint committed (so the restart resumes from one), then a later one in flight
  wait_for 60 have_committed || fail "no checkpoint committed"
  inc=$(wstat drafter0 incarnation)
  [ -n "$inc" ] || fail "no incarnation for drafter0 in dfctl status"
  in_flight() { s=$(started_step); [ -n "$s" ] && [ "$(reported "$inc" "$s")" = 0 ]; }
  wait_for 60 in_flight || fail "no checkpoint in flight"
  s=$(started_step)
  mkdir -p "$RUN/checkpoints/.tmp-step-00000999.4242" && echo partial >"$RUN/checkpoints/.tmp-step-00000999.4242/model.safetensors"
  "$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
  restarted() { [ "$(wstat drafter0 incarnation)" -gt "$inc" ]; }
  wait_for 60 restarted || fail "drafter0 not restarted"
  if [ "$(reported "$inc" "$s")" = 0 ]; then hit=1; break; fi
  echo "note: the checkpoint of step $s finished before the kill landed; again"
done
[ "$hit" = 1 ] || fail "3 kills, none with a checkpoint in flight"
wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "killed run exited $ORCH_RC"
audit_exactly_once
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "killed run: poisoned batches"
grep -q 'tidied' "$RUN/logs/drafter0.log" || fail "the restarted drafter did not tidy the leftover temp dir"
ls -a "$RUN/checkpoints" | grep -q '^\.tmp-' && fail "temp dirs left in $RUN/checkpoints: $(ls -a "$RUN/checkpoints")"
grep -q 'resumed from' "$RUN/logs/drafter0.log" || fail "the drafter did not resume"
grep -q 'start-up: weights and optimizer state (checkpoint)' "$RUN/logs/drafter0.log" \
  || fail "the resumed drafter's start-up line does not say it loaded a checkpoint"
same_result "$SYNC" "$RUN" "killed run"
ok "killed with the checkpoint of step $s in flight (never reported by that incarnation): temp dir tidied, resumed, exactly once, byte-identical to sync"
echo "test_ckpt_async: ok"
