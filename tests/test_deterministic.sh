#!/usr/bin/env bash
# test_deterministic: "deterministic": true reproduces bit for bit (docs/ledger.md,
# "Deterministic mode"). The real pipeline on the tiny model with 2 target workers, 2
# postproc workers and 1 drafter, so batches reach the drafter's ring out of plan order:
#   1. a clean run;
#   2. the same topology while a target, a postproc worker, the drafter (after a checkpoint:
#      every stage restarts from it) and the orchestrator (then `orchestrator --resume`) are
#      SIGKILLed.
# Both audits must say exactly once, and every file of the final checkpoint
# (model.safetensors, optimizer.safetensors, trainer_state.json) and of the release export
# must be byte-identical (cmp). Fast mode with kills is covered by tests/test_pipeline.sh's
# second run and tests/test_chaos.sh.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 160 --max-len 300 >/dev/null || fail "prepare_data"
mk_topo() { # NAME [DRAFTER_ENV_JSON]
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 7, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "lr": 3e-3, "warmup_frac": 0.1,
               "noise_std": 0.05, "checkpoint_every": 3, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 600, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 3, "slot_bytes": 1048576, "max_attempts": 8 },
             { "name": "pd", "slots": 4, "slot_bytes": 1048576, "max_attempts": 8 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "target1", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "postproc1", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd"${2:+, \"env\": $2} } ],
  "supervision": { "backoff_initial_ms": 20, "backoff_max_ms": 200, "max_restarts": 20, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
steps() { grep -c '"ev":"step"' "$RUN/metrics/drafter0.jsonl" 2>/dev/null || echo 0; }
steps_ge() { [ "$(steps)" -ge "$1" ]; }
inc_ge() { [ "$(wstat "$1" incarnation 2>/dev/null || echo 0)" -ge "$2" ]; }

# 1. clean run
mk_topo clean
start_orch; wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC"
audit_exactly_once
CLEAN=$RUN
n_batches=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n_batches" ] || fail "clean: not every batch committed"
ok "clean run: $n_batches batches exactly once, final checkpoint $(cat "$RUN/checkpoints/latest")"

# 2. every role killed once, then the orchestrator; resume. Each checkpoint is held back
# 400 ms (DF_FAULT_CKPT_DELAY_MS: the same values, written later; training waits for the
# previous write at each one), so trained batches wait longer for their commit and the run
# lasts long enough for the kills on a loaded machine (it took 6.5 s without: a drafter
# kill that landed just after a commit sent nothing back, and its retry found the run over)
mk_topo kills '{"DF_FAULT_CKPT_DELAY_MS": "400"}'
start_orch
wait_for 60 steps_ge 1 || fail "no step"
"$DFCTL" --run-dir "$RUN" kill target1 >/dev/null || fail "dfctl kill target1"
wait_for 60 inc_ge target1 2 || fail "target1 not restarted"
"$DFCTL" --run-dir "$RUN" kill postproc0 >/dev/null || fail "dfctl kill postproc0"
wait_for 60 inc_ge postproc0 2 || fail "postproc0 not restarted"
wait_for 60 committed_ge 1 || fail "no checkpoint before the drafter kill"
wait_for 60 steps_ge 4 || fail "drafter stalled"
# kill the drafter while batches are in flight (claimed, in a ring or trained after the last
# checkpoint), so the restart has something to send back; on a loaded machine the targets
# may lag and leave nothing in flight for a moment
in_flight_ge() { [ "$("$DFCTL" --run-dir "$RUN" --json status | python3 -c "
import json,sys; l=json.load(sys.stdin)['ledger']; print(l['claimed'] + l['in_ring'] + l['trained'])")" -ge "$1" ]; }
redone() { events group_restart | python3 -c "
import json,sys; print(sum(json.loads(l)['returned'] + json.loads(l)['in_flight_returned'] for l in sys.stdin))"; }
# the status read and the kill are not atomic: if the drafter commits what was in flight in
# between (a checkpoint lands), the restart has nothing to send back; then kill it again
for attempt in 1 2 3; do
  wait_for 60 in_flight_ge 2 || fail "nothing in flight before drafter kill $attempt"
  inc=$(wstat drafter0 incarnation)
  "$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
  wait_for 60 inc_ge drafter0 $((inc + 1)) || fail "drafter0 not restarted after kill $attempt"
  [ "$(redone)" -ge 1 ] && break
  echo "note: drafter kill $attempt sent no batch back (what was in flight got committed first); again"
done
before=$(steps)
wait_for 60 steps_ge $((before + 3)) || fail "drafter stalled after its restart"
pids=$("$DFCTL" --run-dir "$RUN" --json status | python3 -c "import json,sys; print(' '.join(str(w['pid']) for w in json.load(sys.stdin)['workers'] if w['pid']))")
kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
grep -q '"ev": *"finish"' "$RUN/metrics/orchestrator.jsonl" && fail "the run ended before the orchestrator kill"
# the workers die with it (PR_SET_PDEATHSIG); resume in the same run dir once they are gone
alive() { for p in $pids; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
wait_for 20 sh -c "! { $(declare -f alive); pids='$pids'; alive; }" || fail "workers outlived the orchestrator: $pids"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 & ORCH_PID=$!
wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "resumed run exited $ORCH_RC"
audit_exactly_once
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n_batches" ] || fail "kills: not every batch committed"
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "kills: poisoned batches"
grep -q 'resume: ledger.bin: step' "$T/orch.out" || fail "--resume did not replay ledger.bin"
events group_restart | grep -q '"pipeline": true' || fail "no deterministic pipeline restart after the drafter kill"
[ "$(grep -c 'resumed from' "$RUN/logs/drafter0.log")" -ge 2 ] || fail "the drafter did not resume twice"

# 3. byte for byte
same_result "$CLEAN" "$RUN" "killed run"
B=$(final_ckpt "$RUN")
n_redone=$(redone)
[ "$n_redone" -ge 1 ] || fail "3 drafter kills sent no batch back: the restart was not exercised"
ok "killed run (target1, postproc0, drafter0, orchestrator + --resume; the pipeline restart redid $n_redone batches): final checkpoint $(basename "$B") and release export byte-identical to the clean run's"
echo "test_deterministic: ok"
