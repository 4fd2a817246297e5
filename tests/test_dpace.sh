#!/usr/bin/env bash
# test_dpace: the D-PACE objective (drafter.loss "dpace", docs/dflash_spec.md "Loss weights")
# through the real CPU pipeline on the tiny target, deterministic mode:
#   1. a clean run: every step line carries w_pos (B-1 shares of the loss weight, >= 0,
#      summing to 1; under D-PACE they move from step to step), the loss falls and acc1 rises;
#      the drafter logs the objective; train_summary.json names it and has w_pos; the
#      checkpoint's trainer_state.json and the release config.json record dflash_loss and
#      dflash_dpace_alpha;
#   2. the same topology with the drafter SIGKILLed after a checkpoint: it resumes under the
#      topology's objective and ends with a final checkpoint and release byte-identical to
#      the clean run's;
#   3. a decay run of the same data learns too; its config records no dflash_loss (decay
#      files are as they were) and its summary says "decay".
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
inc_ge() { [ "$(wstat "$1" incarnation 2>/dev/null || echo 0)" -ge "$2" ]; }
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 160 --max-len 300 >/dev/null || fail "prepare_data"
mk_topo() { # NAME LOSS_JSON
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 7, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 3, "mask_token_id": 261 $2 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 600, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 3, "slot_bytes": 1048576, "max_attempts": 8 },
             { "name": "pd", "slots": 4, "slot_bytes": 1048576, "max_attempts": 8 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd"${3:+, \"env\": $3} } ],
  "supervision": { "backoff_initial_ms": 20, "backoff_max_ms": 200, "max_restarts": 20, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
# check_run KIND ALPHA: the metrics, summary and config of $RUN
check_run() {
  python3 - "$RUN" "$1" "$2" <<'PY' || fail "$1 run: metrics, summary or config"
import glob, json, math, sys
run, kind, alpha = sys.argv[1], sys.argv[2], float(sys.argv[3])
B = 8
steps = [json.loads(l) for l in open(f"{run}/metrics/drafter0.jsonl") if '"ev":"step"' in l]
assert len(steps) >= 20, f"only {len(steps)} steps"
for s in steps:
    w = s["w_pos"]
    assert len(w) == B - 1 and all(x >= 0 for x in w) and abs(sum(w) - 1) < 1e-9, (s["step"], w)
first = sum(s["loss"] for s in steps[:5]) / 5
last = sum(s["loss"] for s in steps[-10:]) / 10
acc0 = sum(s["acc1"] for s in steps[:5]) / 5
acc1 = sum(s["acc1"] for s in steps[-10:]) / 10
distinct = len({tuple(round(x, 9) for x in s["w_pos"]) for s in steps})
print(f"{kind}: {len(steps)} steps, loss {first:.3f} -> {last:.3f}, acc1 {acc0:.3f} -> {acc1:.3f}, "
      f"{distinct} distinct w_pos, last {[round(x, 3) for x in steps[-1]['w_pos']]}")
assert last < 0.8 * first and acc1 > acc0 + 0.1, "it did not learn"
summ = json.load(open(f"{run}/train_summary.json"))
assert summ["loss"] == kind and len(summ["w_pos"]) == B - 1 and abs(sum(summ["w_pos"]) - 1) < 1e-9, summ
ckpt = open(f"{run}/checkpoints/latest").read().strip()
state = json.load(open(f"{run}/checkpoints/{ckpt}/trainer_state.json"))["config"]
rel = json.load(open(f"{run}/drafter/config.json"))
for what, c in (("trainer_state.json", state), ("release config.json", rel)):
    if kind == "dpace":
        assert c.get("dflash_loss") == "dpace" and c.get("dflash_dpace_alpha") == alpha, (what, c)
    else:
        assert "dflash_loss" not in c and "dflash_dpace_alpha" not in c, (what, c)
if kind == "dpace":  # the weights follow the drafter's confidence
    assert distinct > len(steps) // 2, f"w_pos barely moves: {distinct} distinct"
    # more confident by the end: later positions get a larger share than at the start
    assert steps[-1]["w_pos"][-1] > steps[0]["w_pos"][-1], (steps[0]["w_pos"], steps[-1]["w_pos"])
PY
}

# 1. clean D-PACE run
mk_topo clean ', "loss": "dpace", "dpace_alpha": 0.3'
start_orch; wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "clean dpace run exited $ORCH_RC"
audit_exactly_once
grep -q 'objective: dpace (alpha 0.3)' "$RUN/logs/drafter0.log" || fail "the drafter did not log its objective"
check_run dpace 0.3
CLEAN=$RUN

# 2. the drafter killed after a checkpoint: resumed under D-PACE, same bytes
mk_topo kill ', "loss": "dpace", "dpace_alpha": 0.3' '{"DF_FAULT_CKPT_DELAY_MS": "200"}'
start_orch
wait_for 60 committed_ge 3 || fail "no checkpoint before the drafter kill"
"$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
wait_for 60 inc_ge drafter0 2 || fail "drafter0 not restarted"
wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "killed dpace run exited $ORCH_RC"
audit_exactly_once
[ "$(grep -c 'resumed from' "$RUN/logs/drafter0.log")" -ge 1 ] || fail "the drafter did not resume"
[ "$(grep -c 'objective: dpace (alpha 0.3)' "$RUN/logs/drafter0.log")" -ge 2 ] || fail "the resumed drafter's objective"
same_result "$CLEAN" "$RUN" "dpace run with a drafter kill"
ok "dpace: a drafter killed after a checkpoint resumes under D-PACE; final checkpoint and release byte-identical"

# 3. decay on the same data
mk_topo decay ''
start_orch; wait_orch 200
[ "$ORCH_RC" = 0 ] || fail "decay run exited $ORCH_RC"
check_run decay 0
echo "test_dpace: ok"
