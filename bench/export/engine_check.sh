#!/usr/bin/env bash
# bench/export/engine_check.sh (GPU machine with torch + transformers): does our release
# export load and draft in transformers as in our C inference? Builds dflash_tool +
# dflash_logits (CUDA=1), exports random drafters for the tiny target (the make-run shape;
# a 2-layer one with a sliding layer) and for a random-weight Qwen3-1.7B-shape target
# (scripts/make_gpu_target.py; a 5-layer, block-16 drafter as the public b16 drafters), and
# runs tests/reference/engine_load_check.py on each: our dflash.py through AutoModel +
# trust_remote_code, the reference implementation's DFlashDraftModel (a checkout of the
# z-lab dflash repository at $ZLAB; that part is skipped without one), the float64
# reference, all against dflash_logits (docs/export.md).
#   ZLAB=path/to/dflash DEPS_PREFIX=... bash bench/export/engine_check.sh
# Results: the tables on stdout, JSON under $OUT (default bench/results/export).
set -uo pipefail
cd "$(dirname "$0")/../.."
O=${OUT:-bench/results/export}; mkdir -p "$O"
T=$(mktemp -d /tmp/engine_check.XXXXXX)
trap 'rm -rf "$T"' EXIT
ZLAB=${ZLAB:-}
DEPS=${DEPS_PREFIX:+DEPS_PREFIX=$DEPS_PREFIX}
t0=$(date +%s)
[ -x build-cuda/bin/dflash_logits ] || make CUDA=1 -j16 $DEPS build-cuda/bin/dflash_tool \
  build-cuda/bin/dflash_logits >"$T/build.log" 2>&1 || { tail -30 "$T/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 ))s"
# the big target first, in the background (random init + save, about a minute)
python3 scripts/make_gpu_target.py --shape 1.7b --out "$T/qwen3-1.7b" --data "$T/q17data" --train 8 \
  --heldout 2 --generate 0 --min-len 64 --max-len 128 >"$T/make_target.log" 2>&1 &
mk=$!
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
tiny = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "num_target_layers": 4,
        "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 261}, "hidden_size": 128,
        "intermediate_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "vocab_size": 264, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "layer_types": ["full_attention"]}
json.dump(tiny, open(f"{t}/tiny_a.json", "w"))
tiny.update(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=6,
            use_sliding_window=True)
json.dump(tiny, open(f"{t}/tiny_b.json", "w"))
q = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16, "num_target_layers": 28,
     "dflash_config": {"target_layer_ids": [1, 7, 13, 19, 25], "mask_token_id": 151669}, "hidden_size": 2048,
     "intermediate_size": 6144, "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
     "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
     "max_position_embeddings": 40960, "tie_word_embeddings": True, "layer_types": ["full_attention"] * 5}
json.dump(q, open(f"{t}/q17.json", "w"))
PY
for v in tiny_a tiny_b q17; do
  build-cuda/bin/dflash_tool init --out "$T/ck_$v" --config "$T/$v.json" --seed 5 >/dev/null || exit 1
  build-cuda/bin/dflash_tool export "$T/ck_$v" "$T/$v" >/dev/null || exit 1
done
ls -l "$T/tiny_a"
rc=0
for v in tiny_a tiny_b; do
  echo "== $v (models/tiny-target) $(( $(date +%s) - t0 ))s"
  python3 tests/reference/engine_load_check.py --export "$T/$v" --target models/tiny-target ${ZLAB:+--zlab "$ZLAB"} \
    --logits-bin build-cuda/bin/dflash_logits --device cuda --context 48 --require-transformers \
    --json "$O/$v.json" || rc=1
done
wait $mk || { echo "make_gpu_target failed"; tail -20 "$T/make_target.log"; exit 1; }
echo "== q17 (random-weight Qwen3-1.7B shape, 5-layer drafter) $(( $(date +%s) - t0 ))s"
python3 tests/reference/engine_load_check.py --export "$T/q17" --target "$T/qwen3-1.7b" ${ZLAB:+--zlab "$ZLAB"} \
  --logits-bin build-cuda/bin/dflash_logits --device cuda --context 128 --require-transformers \
  --json "$O/q17.json" || rc=1
cp "$T/tiny_a/config.json" "$O/export_config.json"
echo "engine_check: rc=$rc in $(( $(date +%s) - t0 ))s"
exit $rc
