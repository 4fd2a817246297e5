#!/usr/bin/env bash
# bench/pipeline/run.sh: the whole pipeline on one GPU at a real target shape, beside the
# stage-alone ceilings measured in the same call. GPU machine only.
#   bench/pipeline/run.sh 1.7b|8b        (BUILD=build-cuda; make CUDA=1 first)
# 1. makes the random-weight target and its data if missing (scripts/make_gpu_target.py;
#    1.7b: self-generated text, 8b: random tokens, throughput only)
# 2. runs the orchestrator on configs/qwen3-<shape>.json (run dir gpu/runs/qwen3-<shape>)
# 3. bench_target (target alone, T = 8192) and bench_drafter (drafter alone, S = 2048,
#    512 anchors) at the same shape
# 4. prints the table and writes bench/results/pipeline/pipeline_<shape>.json (bench/pipeline/report.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:?usage: bench/pipeline/run.sh 1.7b|8b}
BUILD=${BUILD:-build-cuda}
res=bench/results/pipeline; mkdir -p "$res" gpu/models gpu/data
model=gpu/models/qwen3-$shape
if [ ! -f "$model/config.json" ] || [ ! -f "gpu/data/qwen3-$shape-train-000.dfs" ]; then
  if [ "$shape" = 1.7b ]; then gen="--generate 224 --train 2048 --heldout 32 --batch 512"
  else gen="--generate 0 --train 320 --heldout 8"; fi
  python3 scripts/make_gpu_target.py --shape "$shape" --out "$model" --data "gpu/data/qwen3-$shape" $gen
fi
rm -rf "gpu/runs/qwen3-$shape"
echo "== pipeline: $BUILD/bin/orchestrator configs/qwen3-$shape.json"
t0=$(date +%s)
timeout --kill-after=10 400 "$BUILD/bin/orchestrator" "configs/qwen3-$shape.json" >"$res/pipeline_$shape.log" 2>&1 || {
  echo "orchestrator failed: tail of $res/pipeline_$shape.log"; tail -40 "$res/pipeline_$shape.log"; exit 1; }
echo "pipeline run: $(( $(date +%s) - t0 ))s"
echo "== target alone"
timeout 200 "$BUILD/bench/bench_target" --models "$shape" --tokens 8192 --iters 5 \
  --json "$res/pipeline_${shape}_target.json" >"$res/pipeline_${shape}_target.log" 2>&1 || tail -5 "$res/pipeline_${shape}_target.log"
echo "== drafter alone"
timeout 200 "$BUILD/bench/bench_drafter" --shape "$shape" --seq 2048 --anchors 512 --iters 5 --warmup 2 \
  --json "$res/pipeline_${shape}_drafter.json" >"$res/pipeline_${shape}_drafter.log" 2>&1 || tail -5 "$res/pipeline_${shape}_drafter.log"
python3 bench/pipeline/report.py "gpu/runs/qwen3-$shape" --label "qwen3-$shape" --json "$res/pipeline_$shape.json" \
  --target-json "$res/pipeline_${shape}_target.json" --drafter-json "$res/pipeline_${shape}_drafter.json"
