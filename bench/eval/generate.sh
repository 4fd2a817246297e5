#!/usr/bin/env bash
# bench/eval/generate.sh: response regeneration speed on the GPU (target_generate --backend
# cuda) at the Qwen3-1.7B shape, beside transformers' generate on the same prompts in the
# same call (the peer). GPU machine only; make CUDA=1 first (BUILD=build-cuda).
#   bench/eval/generate.sh          env: PROMPTS (16), MAX_NEW (256), RES (bench/results/eval)
# Prints one table and writes $RES/generate_1.7b.json. Both sides decode one prompt at a
# time (batch 1; ours also at --batch 16, with the check that it writes the same shards) for
# exactly MAX_NEW tokens (no eos: the random-weight target has no
# meaningful one), greedy and sampled (temperature 0.7, top-p 0.9, top-k 20).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda} PROMPTS=${PROMPTS:-16} MAX_NEW=${MAX_NEW:-256}
res=${RES:-bench/results/eval}
mkdir -p "$res" gpu/models gpu/data
model=gpu/models/qwen3-1.7b data=gpu/data/gen-1.7b
[ -x "$BUILD/bin/target_generate" ] || { echo "bench/eval/generate: make CUDA=1 first"; exit 2; }
if [ ! -f "$model/config.json" ]; then
  python3 scripts/make_gpu_target.py --shape 1.7b --out "$model" --data "$data" --train 1 --heldout "$PROMPTS" \
    --generate 0 --min-len 64 --max-len 64
elif [ ! -f "$data-heldout-000.dfs" ]; then
  python3 scripts/make_gpu_target.py --shape 1.7b --out "$model.data-only" --data "$data" --train 1 \
    --heldout "$PROMPTS" --generate 0 --min-len 64 --max-len 64
fi
rm -f "$model/generation_config.json" # the bench sets every option itself
out=$(mktemp -d /tmp/df_gen_bench_XXXXXX); trap 'rm -rf "$out"' EXIT
ours() { # ours LABEL OPTIONS...
  local label=$1; shift
  "$BUILD/bin/target_generate" --backend cuda --target "$model" --prompts "$data-heldout-000.dfs" \
    --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --eos 0 --out "$out/$label" --quiet "$@" >"$out/$label.log" 2>&1 \
    || { cat "$out/$label.log"; exit 1; }
  cp "$out/$label.json" "$res/generate_1.7b_ours_$label.json"
}
ours greedy --greedy --batch 1
ours sampled --temperature 0.7 --top-p 0.9 --top-k 20 --batch 1
# ours batched (the peer stays at batch 1): the same responses, one pass over the weights per step
ours greedy_b16 --greedy --batch 16
ours sampled_b16 --temperature 0.7 --top-p 0.9 --top-k 20 --batch 16
tail -n 1 "$out/greedy.log" "$out/sampled.log" "$out/greedy_b16.log" "$out/sampled_b16.log"
for k in greedy sampled; do
  cmp -s "$out/$k-000.dfs" "$out/${k}_b16-000.dfs" && echo "$k: --batch 16 wrote the same shard as --batch 1" ||
    echo "$k: --batch 16 DIFFERS from --batch 1"
done
python3 bench/eval/peer_regenerate.py --model "$model" --prompts "$data-heldout-000.dfs" --n "$PROMPTS" \
  --max-new "$MAX_NEW" --ours-greedy "$out/greedy" --ours-json "$res/generate_1.7b_ours_greedy.json" \
  --ours-sampled-json "$res/generate_1.7b_ours_sampled.json" --json "$res/generate_1.7b.json"
