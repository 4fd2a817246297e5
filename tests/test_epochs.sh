#!/usr/bin/env bash
# test_epochs: drafter.epochs 2 on the real pipeline (tiny target, 24 samples, CPU backend).
#   1. clean run: exit 0; ledger_audit-epoch0.json and -epoch1.json each exactly once (and
#      ledger_audit.json = the last); the two epochs' plans differ (another shuffle); the
#      drafter's steps = the sum of both epochs' batches, one LR schedule over both (the
#      "steps planned" of every incarnation is that sum); export + summary at the very end.
#   2. the same run with the drafter killed in epoch 1 after a checkpoint there: it resumes
#      from that checkpoint in epoch 1 and the run ends with the same audits and step count;
#      then the orchestrator is killed in epoch 1 of a third run and --resume continues in
#      epoch 1 (ledger.bin carries the epoch).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 24 --max-len 300 >/dev/null || fail "prepare_data"
mk_topo() { # NAME [DETERMINISTIC] [DRAFTER_ENV_JSON]
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 5, "deterministic": ${2:-false},
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "checkpoint_every": 3, "epochs": 2,
               "keep_checkpoints": 0, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 700, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 2097152 }, { "name": "pd", "slots": 4, "slot_bytes": 2097152 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd"${3:+, \"env\": $3} } ],
  "supervision": { "max_restarts": 5, "backoff_initial_ms": 20, "metrics_interval_ms": 300, "shutdown_timeout_ms": 5000 } }
JSON
}
# check_run: both audits exactly once, steps = sum of batches, schedule = that sum
check_run() {
  python3 - "$RUN" <<'PY' || fail "epoch audits / steps"
import json, os, re, sys
run = sys.argv[1]
a = [json.load(open(f"{run}/ledger_audit-epoch{e}.json")) for e in (0, 1)]
last = json.load(open(f"{run}/ledger_audit.json"))
for e, x in enumerate(a):
    assert x["exactly_once"] is True and x["epoch"] == e, (e, x["exactly_once"], x["epoch"])
    assert x["counts"]["committed"] == x["n_batches"], (e, x["counts"])
assert last["epoch"] == 1 and last["exactly_once"] is True
total = a[0]["n_batches"] + a[1]["n_batches"]
steps = [json.loads(l)["step"] for l in open(f"{run}/metrics/drafter0.jsonl") if '"ev":"step"' in l]
final = max(steps)
assert final == total, f"final step {final}, batches {a[0]['n_batches']} + {a[1]['n_batches']}"
planned = set(re.findall(r"(\d+) steps planned", open(f"{run}/logs/drafter0.log").read()))
assert planned == {str(total)}, planned
s = json.load(open(f"{run}/train_summary.json"))
assert s["steps"] == total, s
assert sorted(os.listdir(f"{run}/drafter")) == ["config.json", "dflash.py", "model.safetensors"], os.listdir(f"{run}/drafter")
eps = [json.loads(l) for l in open(f"{run}/metrics/orchestrator.jsonl") if '"ev":"epoch"' in l]
assert len(eps) == 1 and eps[0]["done"] == 0 and eps[0]["epoch"] == 1, eps
print(f"epochs 2: {a[0]['n_batches']} + {a[1]['n_batches']} batches, final step {final}")
PY
}

# 1. clean
mk_topo clean
start_orch; wait_orch 240
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC"
check_run
cmp -s "$RUN/ledger_audit-epoch0.json" "$RUN/ledger_audit-epoch1.json" && fail "the two epochs' audits are identical"
ok "clean 2-epoch run: both audits exactly once, steps = sum of both epochs' batches, export at the end"
e0=$(pyjson "$RUN/ledger_audit-epoch0.json" "d['n_batches']")

# 2. drafter killed in epoch 1 after a checkpoint there
mk_topo kill false '{"DF_FAULT_STEP_DELAY_MS": "400"}'
start_orch
wait_for 240 sh -c "grep -q '\"ev\":\"epoch\"' '$RUN/metrics/orchestrator.jsonl' 2>/dev/null" || fail "epoch 1 never started"
ck=$(( (e0 / 3 + 1) * 3 )) # the first checkpoint inside epoch 1
wait_for 240 committed_ge $ck || fail "no checkpoint at step $ck in epoch 1"
"$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "run with a drafter kill in epoch 1 exited $ORCH_RC"
check_run
# the kill lands at or after checkpoint $ck (under load the drafter may write the next one
# first): its last resume (after the kill) is from an epoch-1 checkpoint, $ck or later
rs=$(sed -n 's/.*resumed from .*step-[0-9]* (step \([0-9]*\)).*/\1/p' "$RUN/logs/drafter0.log" | tail -1)
[ -n "$rs" ] && [ "$rs" -ge "$ck" ] && [ $((rs % 3)) -eq 0 ] ||
  fail "the drafter did not resume from an epoch-1 checkpoint (>= step $ck): '${rs:-none}'"
[ "$(events restart | grep -c drafter0)" -ge 1 ] || fail "no drafter restart recorded"
ok "drafter SIGKILL in epoch 1: resumed from its epoch-1 checkpoint, both audits exactly once, same step count"

# 3. the orchestrator killed in epoch 1, then --resume
mk_topo orch false '{"DF_FAULT_STEP_DELAY_MS": "400"}'
start_orch
wait_for 240 sh -c "grep -q '\"ev\":\"epoch\"' '$RUN/metrics/orchestrator.jsonl' 2>/dev/null" || fail "epoch 1 never started"
wait_for 240 committed_ge $ck || fail "no checkpoint at step $ck in epoch 1"
kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
sleep 0.5
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 || fail "--resume in epoch 1 exited $?: $(tail -5 "$T/orch.out")"
grep -q "plan: epoch 2 of 2" "$T/orch.out" || fail "--resume did not continue in the second epoch (epoch 2 of 2 in the log, counted from 1): $(head -5 "$T/orch.out")"
check_run
ok "orchestrator SIGKILL in epoch 1, --resume continues in epoch 1 and completes"

# 4. deterministic mode: a clean 2-epoch run and one with the drafter killed in epoch 1 end
# with byte-identical final checkpoints and exports
mk_topo detclean true
start_orch; wait_orch 240
[ "$ORCH_RC" = 0 ] || fail "deterministic clean run exited $ORCH_RC"
check_run; CLEAN=$RUN
mk_topo detkill true '{"DF_FAULT_STEP_DELAY_MS": "400"}'
start_orch
wait_for 240 committed_ge $ck || fail "no checkpoint at step $ck in epoch 1"
"$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "deterministic run with a kill exited $ORCH_RC"
check_run
fin=$(cat "$RUN/checkpoints/latest")
for f in model.safetensors optimizer.safetensors; do
  cmp "$CLEAN/checkpoints/$fin/$f" "$RUN/checkpoints/$fin/$f" || fail "deterministic: $fin/$f differs from the clean run"
done
cmp "$CLEAN/drafter/model.safetensors" "$RUN/drafter/model.safetensors" || fail "deterministic: the export differs"
ok "deterministic 2-epoch run with a drafter kill in epoch 1: final checkpoint and export identical to the clean run"
echo "test_epochs: ok"
