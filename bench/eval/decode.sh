#!/usr/bin/env bash
# bench/eval/decode.sh: decoding speed on the GPU in one call (GPU machine, after
# make CUDA=1): bench_decode (ours: plain decoding against its memory ceiling, the parts of
# a speculative step, the speculative loop at three acceptance rates with the lossless
# check, the same loops for a batch of BATCH prompts decoded together) and
# peer_generate.py (transformers generate) at the Qwen3-1.7B and Qwen3-8B shapes, random
# weights made on the GPU. Prints both, then one table of ours beside the peer
# (bench/eval/decode_table.py); writes bench/results/eval/decode.json, decode_peer.json and
# decode_vs_peer.json.
# Env: BUILD (build-cuda), MODELS (1.7b,8b), PROMPT (128), NEW (128), BATCH (4; 1: no
# batch), COMPILE (0; 1 adds the peer's static cache + our torch.compile variant, minutes of
# compilation; transformers already compiles a static-cache generate by itself), RES,
# PEER_FALLBACK (more peer JSON files, for shapes the new peer run did not reach).
# The speedup bar with a drafter that works: bench/eval/trained_target.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda} MODELS=${MODELS:-1.7b,8b} PROMPT=${PROMPT:-128} NEW=${NEW:-128} BATCH=${BATCH:-4}
res=${RES:-bench/results/eval}; mkdir -p "$res"
[ -x "$BUILD/bench/bench_decode" ] || { echo "decode.sh: missing $BUILD/bench/bench_decode: make CUDA=1 first"; exit 2; }
"$BUILD/bench/bench_decode" --models "$MODELS" --prompt "$PROMPT" --new "$NEW" --batch "$BATCH" --json "$res/decode.json" 2>&1 |
  tee "$res/decode.log"
extra=(); [ "${COMPILE:-0}" = 1 ] && extra=(--compile)
PYTHONUNBUFFERED=1 timeout 400 python3 bench/eval/peer_generate.py --models "$MODELS" --prompt "$PROMPT" --new "$NEW" \
  --json "$res/decode_peer.json" "${extra[@]}" 2>&1 | grep -v Warning | tee "$res/decode_peer.log" || echo "peer failed"
# shellcheck disable=SC2086 # PEER_FALLBACK is a list of files
python3 bench/eval/decode_table.py "$res/decode.json" "$res/decode_peer.json" ${PEER_FALLBACK:-} --json "$res/decode_vs_peer.json" |
  tee "$res/decode_vs_peer.log"
