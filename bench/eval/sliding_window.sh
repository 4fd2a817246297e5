#!/usr/bin/env bash
# bench/eval/sliding_window.sh: sliding-window drafter layers at a real shape on long
# documents, beside full attention, in one device call (an 80 GB H100, 10 min): the
# drafter's step time and its held-out tau. Prepared, not yet run on a GPU
# (docs/drafter_quality.md, "Sliding-window drafter layers at a real shape").
# One target for both (bench/eval/trained_target.sh through bench/eval/objectives.sh, the
# variants' mechanism): the 0.6B-shape byte target trained on windows of SEQ (4096) bytes
# (8 x 4096 a step in passes of 2: ~22 GiB of activations, as the 8 x 1024 passes of the
# short recipe), then target_generate answers prompts of PROMPT_LENS (3000,3300,3600) bytes
# with RESP_LEN (224) bytes: samples of ~3.2-3.8 K tokens, so the drafter's context runs
# past a window of 2048. Variants (arguments; default: full sliding:$WINDOW, WINDOW 2048):
#   full        every drafter layer full attention (LAYER_TYPES=full);
#   sliding:W   every drafter layer but the last sliding, window W tokens, the last full
#               (SLIDING_LAYERS, default sliding-but-last). Our choice: the first public
#               DFlash releases were all full attention, recent ones mix sliding and full
#               layers (docs/dflash_spec.md); which layers slide in them is not copied here,
#               one full layer at the top keeps the whole context in reach.
# The first variant trains the target and answers; the second starts beside it once the
# answers exist, so both drafters train on the same shards for the same steps, side by side
# on the GPU (their ms/step compare with each other; SEQUENTIAL=1 runs them one after the
# other, each with the whole BUDGET: for clean step times, on a warm machine where the
# target and its answers are reused). The pipeline keeps whole samples (MAX_SEQ_LEN 4096 =
# data.max_seq_len; the 0.6b config's token_budget is 4096 already), target_generate and
# dflash_eval keep whole prompts (--max-prompt-len: the longest prompt + 3 template tokens).
# Prints one table: per variant the drafter's steps, seconds and ms/step
# (train_summary.json), held-out tau pooled / mean / median, per-position accuracy and the
# lossless prompts (dflash_eval --json), the untrained drafter's tau; writes
# RES/sliding_window.json, each variant's log RES/sliding_window_<variant>.log and
# trained_target.sh's RES/trained_0.6b_s4096-..._*.json.
# Usage (GPU machine, after make CUDA=1): bench/eval/sliding_window.sh [VARIANT...]
# Env (defaults for this bench; everything else as trained_target.sh / objectives.sh):
#   SEQ 4096, PROMPT_LENS 3000,3300,3600, MAX_SEQ_LEN 4096, RESP_LEN 224, NTRAIN 1000
#   (answering 1000 prompts of ~3.3 K bytes; one sample a drafter step), EPOCHS 1,
#   VAL_EVERY 0 (no validator: dflash_eval judges), TB 150, BUDGET 540, WINDOW 2048.
# Dry run on a CPU (no torch needed; tests/test_sliding_window_bench.sh does it): place a
# byte target and the prompts where PATHS_ONLY=1 bench/eval/trained_target.sh says (models/
# tiny-target, prompts drawn with scripts/stdlib_corpus.py's draw_prompts), then
#   BACKEND=cpu SHAPE=tiny WORK=... SEQ=256 PROMPT_LENS=1100,1200 MAX_SEQ_LEN=2048 RESP_LEN=24 \
#   NTRAIN=24 SLIDING_LAYERS=sliding ... bench/eval/sliding_window.sh full sliding:64
# (configs/tiny.json's drafter has one layer: sliding-but-last would leave none sliding).
# With a torch, PY=that python trains the tiny target too (phase 1; e.g. TB=0
# TRAIN_ARGS="--steps 6 --batch 4").
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export SEQ=${SEQ:-4096} PROMPT_LENS=${PROMPT_LENS:-3000,3300,3600} MAX_SEQ_LEN=${MAX_SEQ_LEN:-4096}
export RESP_LEN=${RESP_LEN:-224} NTRAIN=${NTRAIN:-1000} EPOCHS=${EPOCHS:-1} VAL_EVERY=${VAL_EVERY:-0}
export TB=${TB:-150} BUDGET=${BUDGET:-540}
WINDOW=${WINDOW:-2048}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(full "sliding:$WINDOW")
shortest=$(tr ',' '\n' <<<"$PROMPT_LENS" | sort -n | head -1)
for v in "${variants[@]}"; do
  case $v in
    full | sliding:?*) ;;
    *) echo "sliding_window: $v: expected full or sliding:WINDOW" >&2; exit 2 ;;
  esac
  if [[ $v == sliding:* ]] && [ "${v#sliding:}" -ge $((shortest + 3)) ] 2>/dev/null; then
    echo "sliding_window: note: $v: the shortest prompts ($shortest bytes) fit its window: their context never slides"
  fi
done
echo "sliding_window: SEQ $SEQ, PROMPT_LENS $PROMPT_LENS, RESP_LEN $RESP_LEN, MAX_SEQ_LEN $MAX_SEQ_LEN," \
  "NTRAIN $NTRAIN, EPOCHS $EPOCHS; variants ${variants[*]}"
NAME=sliding_window exec bench/eval/objectives.sh "${variants[@]}"
