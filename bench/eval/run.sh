#!/usr/bin/env bash
# bench/eval/run.sh: speculative decoding on the GPU with a drafter the pipeline just
# trained, at the Qwen3-1.7B shape, beside plain greedy decoding in the same process (the
# peer: speedup = plain time per output token / speculative). GPU machine only.
#   bench/eval/run.sh            (BUILD=build-cuda; make CUDA=1 first)
# 1. makes the random-weight target and its self-generated data if missing
#    (scripts/make_gpu_target.py; TRAIN samples of 32 random prompt tokens + GEN greedy
#    tokens, HELDOUT held-out samples whose prompts dflash_eval decodes)
# 2. trains a drafter with the whole pipeline on configs/qwen3-1.7b.json (one GPU)
# 3. dflash_eval --backend cuda: the trained drafter, then the same drafter at its initial
#    weights (--random-drafter <run seed>); PROMPTS prompts, MAX_NEW new tokens each
# 4. prints both tables and writes bench/results/eval/eval_1.7b_{trained,untrained}.json
# Env: TRAIN (1024), GEN (224), HELDOUT (8), PROMPTS (8), MAX_NEW (128), RES (bench/results/eval).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda}
TRAIN=${TRAIN:-1024} GEN=${GEN:-224} HELDOUT=${HELDOUT:-8} PROMPTS=${PROMPTS:-8} MAX_NEW=${MAX_NEW:-128}
res=${RES:-bench/results/eval}
mkdir -p "$res" gpu/models gpu/data
for b in orchestrator target_worker postproc_worker drafter_worker cuda_helper dflash_eval; do
  [ -x "$BUILD/bin/$b" ] || { echo "bench/eval: missing $BUILD/bin/$b: make CUDA=1 first"; exit 2; }
done
model=gpu/models/qwen3-1.7b data=gpu/data/qwen3-1.7b run=gpu/runs/qwen3-1.7b
t0=$(date +%s)
if [ ! -f "$model/config.json" ] || [ ! -f "$data-train-000.dfs" ]; then
  echo "== making the target and its data ($TRAIN + $HELDOUT samples, $GEN generated tokens each)"
  python3 scripts/make_gpu_target.py --shape 1.7b --out "$model" --data "$data" \
    --generate "$GEN" --train "$TRAIN" --heldout "$HELDOUT" --batch 512
fi
echo "== training: $BUILD/bin/orchestrator configs/qwen3-1.7b.json  [$(( $(date +%s) - t0 ))s]"
rm -rf "$run"
timeout --kill-after=10 300 "$BUILD/bin/orchestrator" configs/qwen3-1.7b.json >"$res/train_1.7b.log" 2>&1 || {
  echo "orchestrator failed: tail of $res/train_1.7b.log"; tail -30 "$res/train_1.7b.log"; exit 1; }
cp "$run/train_summary.json" "$res/train_1.7b_summary.json"
python3 - "$run" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/train_summary.json"))
a = json.load(open(f"{sys.argv[1]}/ledger_audit.json"))
print(f"drafter: {s['steps']} steps in {s['seconds']:.0f}s, loss {s['loss_start']:.3f} -> {s['loss_end']:.3f}, "
      f"expected tau {s['expected_tau']:.2f}, exactly once {a.get('exactly_once')}")
print("  per-position accuracy: " + " ".join(f"{x:.2f}" for x in s["acc"]))
PY
[ -f "$run/drafter/config.json" ] || { echo "no release drafter in $run/drafter"; exit 1; }
seed=$(python3 -c "import json; print(json.load(open('configs/qwen3-1.7b.json'))['seed'])")
ev() { # ev LABEL EXTRA...: one dflash_eval over the held-out prompts
  local label=$1; shift
  echo "== dflash_eval --backend cuda: $label  [$(( $(date +%s) - t0 ))s]"
  timeout 240 "$BUILD/bin/dflash_eval" --backend cuda --target "$model" --drafter "$run/drafter" \
    --prompts "$data-heldout-000.dfs" --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --eos -1 \
    --label "qwen3-1.7b shape, $label" --json "$res/eval_1.7b_$label.json" "$@" 2>&1 | tee "$res/eval_1.7b_$label.log"
}
ev trained
ev untrained --random-drafter "$seed"
echo "bench/eval: done in $(( $(date +%s) - t0 ))s; JSON in $res/"
