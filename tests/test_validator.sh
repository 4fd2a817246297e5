#!/usr/bin/env bash
# test_validator: the validation worker (eval/validator_main.c, role "validator") on the real
# CPU pipeline with the tiny target, its held-out shard as the validation set.
#   1. a clean run over two epochs: exit 0; metrics/validator.jsonl has one line per committed checkpoint
#      whose step is a multiple of validation.every_steps, plus each epoch's last, each once, in
#      order; acc has B-1 entries in [0, 1], val_exp_tau = 1 + sum_k prod_{j<=k} acc_j, the
#      loss is finite and falls; the orchestrator's summary carries the validator's last
#      line (metrics aggregation) and dfctl status lists it while the run is up; the
#      training figures (loss, lr, tokens/s, ETA, validation) reach dfctl top, the progress
#      line, summary.jsonl and pipeline.prom; every log line starts with a timestamp;
#   2. the validator SIGKILLed in the middle of an evaluation (DF_FAULT_VALIDATOR_SAMPLE_MS
#      slows it down): it is restarted alone (no group restart of the deterministic
#      pipeline), the run ends 0, and the jsonl has the same step list with every step
#      exactly once;
#   3. a validator that always crashes (DF_FAULT_VALIDATOR=crash): the supervisor gives up
#      on it after its restart budget, says so, and training completes with exit 0,
#      exactly once.
# Parts 1 and 2 also read every record of the drafter's and the validator's TensorBoard event
# files and compare them with their metrics lines (tests/check_tfevents.py).
# Part 1 also scores the first and last checkpoint by hand (validator --topology T --device cpu
# CKPT...: the worker's figures exactly) and asks for --device 0 without a GPU (exit 100).
# How each part can fail: without the supervisor's validator case in give_up (part 3) the
# run ends 1; without read_done (part 2) the restarted validator scores steps again
# (duplicates); a wrong tau formula or step filter fails part 1.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker validator; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 90 --max-len 400 >/dev/null || fail "prepare_data"
mk_topo() { # NAME VALIDATOR_ENV_JSON MAX_RESTARTS [EPOCHS]
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 5, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 16, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 4, "keep_checkpoints": 0, "mask_token_id": 261, "epochs": ${4:-1} },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 800, "max_seq_len": 400 },
  "validation": { "shards": ["$PWD/data/tiny/heldout-000.dfs"], "max_samples": 6, "every_steps": 8 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 2097152, "max_attempts": 4 },
             { "name": "pd", "slots": 4, "slot_bytes": 2097152, "max_attempts": 4 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" },
               { "name": "validator", "role": "validator", "env": $2 } ],
  "supervision": { "backoff_initial_ms": 50, "backoff_max_ms": 200, "max_restarts": $3, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
# check_steps: validator.jsonl's steps == committed checkpoints at multiples of 8 + the last
# of each epoch,
# each once, ascending; the numbers are consistent
check_steps() {
  python3 - "$RUN" <<'PY' || fail "validator.jsonl check"
import json, math, os, sys
run = sys.argv[1]
L = [json.loads(l) for l in open(f"{run}/metrics/validator.jsonl")]
steps = [x["step"] for x in L]
ck = sorted(int(d[5:]) for d in os.listdir(f"{run}/checkpoints") if d.startswith("step-"))
committed = max(ck)
ends = [json.loads(l)["step"] for l in open(f"{run}/metrics/orchestrator.jsonl") if '"ev":"epoch"' in l]
want = sorted(set([s for s in ck if s % 8 == 0] + ends + [committed]))  # + each epoch's last
print(f"validator steps {steps}; checkpoints {ck}")
assert sorted(steps) == want, f"scored {sorted(steps)}, expected {want}"
assert len(steps) == len(set(steps)), f"a step scored twice: {steps}"
for x in L:
    acc = x["val_acc"]
    assert len(acc) == 7 and all(0.0 <= a <= 1.0 for a in acc), x
    tau, prod = 1.0, 1.0
    for a in acc:
        prod *= a; tau += prod
    assert abs(tau - x["val_exp_tau"]) < 1e-9, (tau, x)
    assert math.isfinite(x["val_loss"]) and x["val_loss"] > 0 and x["samples"] == 6 and x["eval_s"] >= 0, x
byStep = {x["step"]: x for x in L}
first, last = byStep[min(byStep)], byStep[committed]
print(f"val_loss {first['val_loss']:.3f} (step {min(byStep)}) -> {last['val_loss']:.3f} (step {committed})")
assert last["val_loss"] < first["val_loss"], "validation loss did not fall"
PY
}

# 1. clean run, two epochs (the validator ends with each and is started again with the next)
mk_topo clean '{}' 5 2
start_orch
wait_for 120 test -S "$RUN/ctl.sock" || fail "no control socket"
wait_for 120 sh -c "'$DFCTL' --run-dir '$RUN' status | grep -q '^validator  *validator '" || fail "dfctl status does not list the validator"
"$DFCTL" --run-dir "$RUN" top --count 2 >"$T/top.txt" 2>&1
grep -q 'BUSY *WAIT' "$T/top.txt" && grep -q '^train: step ' "$T/top.txt" || fail "dfctl top lacks BUSY/WAIT or the train line: $(cat "$T/top.txt")"
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC"
audit_exactly_once
check_steps
tb_check "$RUN" --workers drafter0,validator # two files each: one per epoch
[ "$(ls "$RUN/tensorboard/validator" | wc -l)" = 2 ] || fail "expected one validator event file per epoch"
python3 - "$RUN" <<'PY' || fail "summary.jsonl does not carry the validator's metrics"
import json, sys
run = sys.argv[1]
last = [json.loads(l) for l in open(f"{run}/metrics/summary.jsonl")][-1]
v = [w for w in last["workers"] if w["name"] == "validator"][0]
assert v["role"] == "validator" and v["state"] == "done", v
assert "val_loss" in v["metrics"] and v["metrics"]["ev"] == "validation", v
PY
for m in df_train_loss df_train_lr df_train_step df_train_total_steps df_train_tokens_per_second df_train_eta_seconds \
         df_validation_loss df_validation_expected_tau; do
  grep -q "^$m [0-9]" "$RUN/metrics/pipeline.prom" || fail "pipeline.prom has no $m: $(cat "$RUN/metrics/pipeline.prom")"
done
# the progress line and the summary carried loss, lr, tokens/s and an ETA while the run went on
grep -Eq '\| step [0-9]+/[0-9]+ loss [0-9.]+ lr [0-9.e+-]+ [0-9]+ tok/s ETA [0-9]' "$T/orch.out" ||
  fail "no progress line with loss, lr, tokens/s and ETA: $(grep ledger "$T/orch.out" | tail -n 3)"
grep -q ' | val loss [0-9.]* tau [0-9.]* @[0-9]' "$T/orch.out" || fail "no progress line with the validation figures"
python3 - "$RUN" <<'PY' || fail "summary.jsonl: no train figures"
import json, sys
L = [json.loads(l)["train"] for l in open(f"{sys.argv[1]}/metrics/summary.jsonl")]
mid = [t for t in L if isinstance(t.get("eta_s"), float) and t["eta_s"] > 0 and t.get("loss") is not None]
assert mid, "no summary line with a positive ETA and a loss"
t = mid[0]
assert t["total_steps"] > 0 and t["samples_total"] > t["samples_done"] > 0 and t["lr"] > 0, t
PY
# every log line starts with an ISO-8601 UTC time with milliseconds
for f in "$RUN"/logs/*.log "$T/orch.out"; do
  bad=$(grep -Evn '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z ' "$f" | head -n 3)
  [ -z "$bad" ] || fail "$f: lines without a timestamp: $bad"
done
[ "$(events spawn | grep -c '"worker": "validator"')" = 2 ] || fail "the validator was not started once per epoch"
ok "clean run (2 epochs): validator scored every committed checkpoint at a multiple of 8 and the last, once each"

# by hand (validator --topology): the worker's figures for the same checkpoints, exactly; a GPU
# device in a build without CUDA (or on a machine without that GPU) is a permanent error
first=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["step"])' "$RUN/metrics/validator.jsonl")
last=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["step"])' "$RUN/metrics/validator.jsonl")
"$BIN/validator" --topology "$TOPO" --device cpu "$RUN/checkpoints/step-$(printf %08d "$first")" \
  "$RUN/checkpoints/step-$(printf %08d "$last")" >"$T/hand.jsonl" 2>"$T/hand.err" || fail "validator by hand: $(cat "$T/hand.err")"
python3 - "$RUN" "$T/hand.jsonl" <<'PY' || fail "the validator by hand differs from the worker"
import json, sys
worker = {x["step"]: x for x in map(json.loads, open(f"{sys.argv[1]}/metrics/validator.jsonl"))}
hand = [json.loads(l) for l in open(sys.argv[2])]
assert len(hand) == 2, hand
for h in hand:
    w = worker[int(h["checkpoint"].rsplit("-", 1)[1])]
    for f in ("val_loss", "val_acc", "val_exp_tau", "samples"):
        assert h[f] == w[f], (f, h[f], w[f])
    assert h["backend"] == "cpu" and sum(h["count"]) > 0 and h["feature_bytes"] > 0, h
print(f"by hand: {[h['checkpoint'].rsplit('/', 1)[1] for h in hand]} give the worker's figures")
PY
"$BIN/validator" --topology "$TOPO" --device 0 "$RUN/checkpoints/step-$(printf %08d "$last")" >/dev/null 2>"$T/dev0.err"
rc=$?
[ $rc = 100 ] && grep -Eq 'device 0: (this build has no CUDA|this machine has)' "$T/dev0.err" ||
  fail "validator --device 0 without a GPU: exit $rc: $(cat "$T/dev0.err")"
"$BIN/validator" --topology "$TOPO" >/dev/null 2>&1; [ $? = 2 ] || fail "validator --topology without a checkpoint: not exit 2"
ok "validator by hand: the worker's figures; --device 0 without a GPU: exit 100 ($(tail -1 "$T/dev0.err" | sed 's/.*validator: //'))"

# 2. killed in the middle of an evaluation
mk_topo killed '{"DF_FAULT_VALIDATOR_SAMPLE_MS": "250"}' 5
start_orch
# after its first line, inside its second evaluation: a restart that forgot what it scored
# would score the first step again
wait_for 180 sh -c "[ \$(grep -c 'evaluating step' '$RUN/logs/validator.log' 2>/dev/null || echo 0) -ge 2 ]" ||
  fail "the validator never started a second evaluation"
lines=$(cat "$RUN/metrics/validator.jsonl" 2>/dev/null | wc -l)
[ "$lines" -ge 1 ] || fail "no line after the first evaluation"
"$DFCTL" --run-dir "$RUN" kill validator >/dev/null || fail "dfctl kill validator"
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "run with the validator killed exited $ORCH_RC"
audit_exactly_once
[ -n "$(events restart | grep '"worker": "validator"')" ] || fail "the validator was not restarted"
[ -z "$(events group_restart)" ] || fail "killing the validator restarted the pipeline: $(events group_restart)"
grep -q 'cutting a torn' "$RUN/logs/validator.log" && fail "a torn line was found (one write per line)"
check_steps
tb_check "$RUN" --workers drafter0,validator --parser wire # the restarted validator: a file of its own
ok "validator killed mid-evaluation (after $lines lines): restarted alone, each step exactly once"

# 3. a validator that always crashes
mk_topo crash '{"DF_FAULT_VALIDATOR": "crash"}' 2
start_orch
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "run with a crashing validator exited $ORCH_RC"
audit_exactly_once
grep -q 'giving up on the validator' "$T/orch.out" || fail "the give-up is not logged"
[ -n "$(events gave_up | grep '"worker": "validator"')" ] || fail "no gave_up event"
[ -f "$RUN/train_summary.json" ] || fail "training did not finish"
[ ! -s "$RUN/metrics/validator.jsonl" ] || fail "the crashing validator wrote lines"
ok "always-crashing validator: given up on, training completed with exit 0"
