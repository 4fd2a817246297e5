#!/usr/bin/env bash
# test_nonfinite: numbers that are not numbers, on the real pipeline (tiny target, CPU):
#   - K steps in a row with a NaN loss / gradient (DF_FAULT_NONFINITE in the drafter's
#     topology env, drafter.max_nonfinite_steps 3): drafter exit 100 after the third naming
#     the step and the likely causes, not restarted, orchestrator exit 1; the metrics count
#     them; the skipped steps did not touch the weights (the checkpoint after two skipped
#     steps has the same model and optimizer bytes as the one before them);
#   - one non-finite step near the end: the run completes, train_summary.json is valid JSON
#     with "loss_end": null, "loss_end_nonfinite": true, "nonfinite_steps": 1; its TensorBoard
#     events hold the NaN loss where the metrics line has null (tests/check_tfevents.py);
#   - a target whose weights hold a NaN (a layer) or an Inf (the embedding): target exit 100
#     naming the file, the tensor and the element, not restarted, orchestrator exit 1.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 24 --max-len 300 >/dev/null || fail "prepare_data"

# topo NAME MODEL_DIR DRAFTER_ENV_JSON: writes $T/NAME.json, sets RUN and TOPO
topo() {
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 5, "deterministic": true,
  "target": { "model_dir": "$2", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "checkpoint_every": 2, "keep_checkpoints": 0,
               "mask_token_id": 261, "max_nonfinite_steps": 3 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 400, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 1048576 }, { "name": "pd", "slots": 4, "slot_bytes": 1048576 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd", "env": $3 } ],
  "supervision": { "max_restarts": 3, "backoff_initial_ms": 20, "metrics_interval_ms": 5000, "shutdown_timeout_ms": 5000 } }
JSON
}
# steplines FIELD...: the drafter's step metrics, one line per step with those fields
steplines() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    e=json.loads(l)
    if e.get('ev')=='step': print(' '.join(str(e.get(k)) for k in sys.argv[2:]))" "$RUN/metrics/drafter0.jsonl" "$@"; }

# ---- three non-finite steps in a row from step 3: stop at step 5 with exit 100
topo nf3 "$PWD/models/tiny-target" '{"DF_FAULT_NONFINITE": "3"}'
start_orch; wait_orch 240
[ "$ORCH_RC" = 1 ] || fail "orchestrator exit $ORCH_RC, expected 1 (drafter failed permanently)"
grep -q "drafter0 failed permanently (exit 100)" "$T/orch.out" || fail "no permanent drafter failure reported"
msg="step 5: 3 steps in a row with a non-finite loss or gradient norm (drafter.max_nonfinite_steps 3"
grep -qF "$msg" "$RUN/logs/drafter0.log" || fail "the drafter's message lacks '$msg'"
grep -q "Likely causes: a learning rate too high (drafter.lr" "$RUN/logs/drafter0.log" || fail "no likely cause named"
[ "$(events spawn | grep -c '"drafter0"')" = 1 ] || fail "drafter0 was restarted after exit 100"
[ "$(steplines step nonfinite nonfinite_steps loss | tr '\n' ,)" = \
  "$(printf '1 0 0 %s,2 0 0 %s,3 1 1 None,4 1 2 None,5 1 3 None,' "$(steplines step loss | sed -n 1p | cut -d' ' -f2)" "$(steplines step loss | sed -n 2p | cut -d' ' -f2)")" ] \
  || fail "metrics: $(steplines step nonfinite nonfinite_steps loss | tr '\n' ,)"
for f in model.safetensors optimizer.safetensors; do
  cmp "$RUN/checkpoints/step-00000002/$f" "$RUN/checkpoints/step-00000004/$f" \
    || fail "$f changed across the skipped steps 3 and 4"
done
ok "3 non-finite steps in a row -> drafter exit 100 at step 5 naming the cause, not restarted; metrics count 1,2,3; steps 3-4 left weights and AdamW state bit-identical"

# ---- one non-finite step near the end: completes, the summary says so in valid JSON
topo clean "$PWD/models/tiny-target" '{}'
start_orch; wait_orch 240   # a clean run first, to learn the step count
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC"
n=$(steplines step | wc -l); [ "$n" -ge 4 ] || fail "only $n steps"
topo nf1 "$PWD/models/tiny-target" "{\"DF_FAULT_NONFINITE\": \"$n:1\"}"
start_orch; wait_orch 240
[ "$ORCH_RC" = 0 ] || fail "run with one non-finite step (the last, $n) exited $ORCH_RC"
audit_exactly_once
python3 - "$RUN/train_summary.json" "$n" <<'PY' || fail "summary: $(cat "$RUN/train_summary.json")"
import json, sys
s = json.load(open(sys.argv[1]), parse_constant=lambda c: sys.exit("non-JSON constant " + c))
assert s["steps"] == int(sys.argv[2]), s
assert s["loss_end"] is None and s["loss_end_nonfinite"] is True and s["nonfinite_steps"] == 1, s
assert isinstance(s["loss_start"], float) and "loss_start_nonfinite" not in s, s
PY
grep -q "out of memory" "$RUN/logs/drafter0.log" && fail "the drafter reports out of memory"
[ "$(steplines nonfinite_steps | tail -1)" = 1 ] || fail "metrics: nonfinite_steps $(steplines nonfinite_steps | tail -1)"
# the TensorBoard events carry the NaN loss where the JSONL line has null
tb_check "$RUN" --workers drafter0
ok "one non-finite step (step $n of $n) -> run completes, train_summary.json valid: loss_end null + loss_end_nonfinite, nonfinite_steps 1"

# ---- target weights with NaN / Inf: refused at load
# poison TENSOR VALUE_HEX: a copy of the tiny target with element 5 of TENSOR (bf16) set
poison() {
  rm -rf "$T/bad"; mkdir -p "$T/bad"; cp models/tiny-target/* "$T/bad/"
  python3 - "$T/bad/model.safetensors" "$1" "$2" <<'PY' || fail "poisoning $1"
import json, struct, sys
p, name, val = sys.argv[1], sys.argv[2], int(sys.argv[3], 16)
b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
assert h[name]['dtype'] == 'BF16'
off = 8 + n + h[name]['data_offsets'][0] + 5 * 2
b[off:off + 2] = struct.pack('<H', val)
open(p, 'wb').write(b)
PY
}
for c in "model.layers.1.mlp.down_proj.weight 7fc0 NaN" "model.embed_tokens.weight ff80 -Inf"; do
  set -- $c
  poison "$1" "$2"
  topo "nan$2" "$T/bad" '{}'
  start_orch; wait_orch 240
  [ "$ORCH_RC" = 1 ] || fail "target with a $3 in $1: orchestrator exit $ORCH_RC, expected 1"
  # (the drafter reads the embedding too: whichever of the two is reaped first stops the run,
  # the other's refusal is still reported as a permanent failure)
  grep -q "target0 failed permanently (exit 100)" "$T/orch.out" || fail "$1: no permanent target failure"
  want="$T/bad/model.safetensors: tensor \"$1\": element 5 is $3"
  grep -qF "$want" "$RUN/logs/target0.log" || fail "target0's message lacks '$want': $(tail -3 "$RUN/logs/target0.log")"
  [ "$(events spawn | grep -c '"target0"')" = 1 ] || fail "target0 was restarted after exit 100"
done
ok "target weights with a NaN (layer 1 down_proj) or -Inf (embedding) -> target exit 100 naming file, tensor and element"
echo "test_nonfinite: ok"
