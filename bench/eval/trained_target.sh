#!/usr/bin/env bash
# bench/eval/trained_target.sh: a drafter that works, at a real shape, on the GPU machine.
# No weights can be downloaded there, so the target is trained in the same call:
#   1. scripts/train_target.py --shape 0.6b: a byte-level Qwen3 with Qwen3-0.6B's body
#      (28 layers, d 1024, 16/8 heads, MLP 3072, tied embeddings) trained from scratch on
#      the Python standard library shipped on the machine (TB seconds, default 200), then
#      it answers NTRAIN training prompts and 64 held-out prompts greedily (224 bytes each);
#   2. scripts/prepare_data.py: the answers to token shards;
#   3. the whole pipeline, CUDA backend (configs/qwen3-0.6b-bytes.json): a 5-layer drafter,
#      EPOCHS passes over the data;
#   4. dflash_eval --backend cuda on PROMPTS held-out prompts: the trained drafter, then the
#      same drafter at its initial weights (--random-drafter <run seed>): tau pooled per
#      verify step, per response and median, the per-position accuracy curve, the lossless
#      check, plain vs speculative time per token.
# Prints a table; writes bench/results/eval/trained_0.6b_*.json (RES to change).
# Env: TB (200), NTRAIN (8000), EPOCHS (2), PROMPTS (32), MAX_NEW (128), BUILD (build-cuda),
#      BATCH (4: the trained drafter again with BATCH prompts decoded together; 1 skips it).
# Time on the H200: about 8 min for step 1 (the answers take longer than the training), 2.5
# min for the rest. Step 1 is skipped when gpu/models/qwen3-0.6b-bytes and its data exist, so
# under a per-command limit of 10 min run it twice on the same machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda}
TB=${TB:-200} NTRAIN=${NTRAIN:-8000} EPOCHS=${EPOCHS:-2} PROMPTS=${PROMPTS:-32} MAX_NEW=${MAX_NEW:-128}
BATCH=${BATCH:-4}
res=${RES:-bench/results/eval}; mkdir -p "$res" gpu/models gpu/data gpu/runs
for b in orchestrator target_worker postproc_worker drafter_worker cuda_helper dflash_eval; do
  [ -x "$BUILD/bin/$b" ] || { echo "trained_target: missing $BUILD/bin/$b: make CUDA=1 first"; exit 2; }
done
model=gpu/models/qwen3-0.6b-bytes data=gpu/data/qwen3-0.6b-bytes run=gpu/runs/qwen3-0.6b-bytes
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }
if [ ! -f "$model/model.safetensors" ] || [ ! -f "$data/chat-heldout.jsonl" ]; then
  stamp "training the target (${TB}s) and answering $NTRAIN + 64 prompts"
  python3 scripts/train_target.py --shape 0.6b --time-budget "$TB" --with-tests --n-train "$NTRAIN" \
    --n-heldout 64 --out "$model" --data "$data" 2>&1 | tee "$res/trained_0.6b_target.log"
else
  stamp "reusing $model and $data"
fi
python3 scripts/prepare_data.py --tokenizer "$model" --out "$data/train" "$data/chat-train.jsonl" --max-len 1024
cfg=gpu/qwen3-0.6b-bytes.json
python3 - "$EPOCHS" "$cfg" <<'PY'
import json, sys
c = json.load(open("configs/qwen3-0.6b-bytes.json"))
c["drafter"]["epochs"] = int(sys.argv[1])
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
stamp "pipeline: $BUILD/bin/orchestrator configs/qwen3-0.6b-bytes.json (epochs $EPOCHS)"
rm -rf "$run"
timeout --kill-after=10 330 "$BUILD/bin/orchestrator" "$cfg" >"$res/trained_0.6b_train.log" 2>&1 || {
  echo "orchestrator failed: tail of $res/trained_0.6b_train.log"; tail -30 "$res/trained_0.6b_train.log"
  tail -20 "$run"/logs/drafter0.log 2>/dev/null; exit 1; }
cp "$run/train_summary.json" "$res/trained_0.6b_summary.json"
cp "$run/ledger_audit.json" "$res/trained_0.6b_audit.json"
python3 - "$run" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/train_summary.json"))
a = json.load(open(f"{sys.argv[1]}/ledger_audit.json"))
print(f"drafter: {s['steps']} steps in {s['seconds']:.0f}s, loss {s['loss_start']:.3f} -> {s['loss_end']:.3f}, "
      f"expected tau {s['expected_tau']:.2f}, exactly once {a.get('exactly_once')}")
print("  per-position accuracy (training mask, last steps): " + " ".join(f"{x:.2f}" for x in s["acc"]))
PY
seed=$(python3 -c "import json; print(json.load(open('configs/qwen3-0.6b-bytes.json'))['seed'])")
ev() { # ev LABEL EXTRA...: one dflash_eval over the held-out prompts
  local label=$1; shift
  stamp "dflash_eval --backend cuda: $label"
  timeout 200 "$BUILD/bin/dflash_eval" --backend cuda --target "$model" --drafter "$run/drafter" \
    --prompts "$data/chat-heldout.jsonl" --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --eos -1 --quiet \
    --label "qwen3-0.6b-bytes, $label" --json "$res/trained_0.6b_eval_$label.json" "$@" 2>&1 | tee "$res/trained_0.6b_eval_$label.log"
}
ev trained
[ "$BATCH" -gt 1 ] && ev "trained_batch$BATCH" --batch "$BATCH"
ev untrained --random-drafter "$seed"
stamp "done; JSON in $res/"
