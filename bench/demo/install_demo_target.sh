#!/usr/bin/env bash
# bench/demo/install_demo_target.sh: put a target measured by bench/demo/train_demo_target.sh
# where configs/demo.json expects it.
#   bench/demo/install_demo_target.sh FILES_DIR [VARIANT SAMPLES]
# FILES_DIR: the files that call brought back (demo_all.tgz, demo_best.tgz, demo_best.txt,
# demo_results.json/.txt, train_demo_target.log). Without VARIANT SAMPLES, the best run
# (demo_best.txt, e.g. "B-2400"). Then:
#   1. MODEL_DIR (models/demo-target) <- the variant's model/ (config.json, model.safetensors,
#      generation_config.json, byte_tokenizer.json);
#   2. DATA_DIR (data/demo) <- its chat-train.jsonl and chat-heldout.jsonl, and the shards
#      made from them as scripts/run_default.sh makes them: train<SAMPLES>-000.dfs (the first
#      SAMPLES answers) and heldout-000.dfs; when the call brought that run's shards back
#      (demo_best.tgz), ours must be the same bytes;
#   3. CONFIG (configs/demo.json): its training shard becomes DATA_DIR/train<SAMPLES>-000.dfs;
#   4. RESULTS (bench/results/demo/train_demo) <- the call's table, JSON and log, the targets'
#      training logs, and every run's train summary, ledger audit and evaluations.
# Refuses to replace an existing MODEL_DIR or DATA_DIR unless FORCE=1.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# = 1 ] || [ $# = 3 ] || { echo "usage: $0 FILES_DIR [VARIANT SAMPLES]" >&2; exit 2; }
src=$1
MODEL_DIR=${MODEL_DIR:-models/demo-target}
DATA_DIR=${DATA_DIR:-data/demo}
CONFIG=${CONFIG:-configs/demo.json}
RESULTS=${RESULTS:-bench/results/demo/train_demo}
for f in demo_all.tgz demo_results.json; do
  [ -f "$src/$f" ] || { echo "install_demo_target: $src/$f missing" >&2; exit 100; }
done
if [ $# = 3 ]; then
  v=$2 n=$3
else
  best=$(cat "$src/demo_best.txt" 2>/dev/null || true)
  [ -n "$best" ] || { echo "install_demo_target: no best run in $src/demo_best.txt: name VARIANT SAMPLES" >&2; exit 100; }
  v=${best%-*} n=${best##*-}
fi
case $n in '' | *[!0-9]*) echo "install_demo_target: SAMPLES '$n' is not a number" >&2; exit 2 ;; esac
if [ "${FORCE:-0}" != 1 ]; then
  for d in "$MODEL_DIR" "$DATA_DIR"; do
    [ ! -e "$d" ] || { echo "install_demo_target: $d exists (FORCE=1 replaces it)" >&2; exit 100; }
  done
fi
tmp=$(mktemp -d /tmp/df_install_demo_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$src/demo_all.tgz" -C "$tmp"
[ -f "$src/demo_best.tgz" ] && mkdir -p "$tmp/best" && tar xzf "$src/demo_best.tgz" -C "$tmp/best"
[ -f "$tmp/$v/model/model.safetensors" ] || { echo "install_demo_target: no variant $v in $src/demo_all.tgz" >&2; exit 100; }
echo "install_demo_target: variant $v, $n samples -> $MODEL_DIR, $DATA_DIR, $CONFIG"
rm -rf "$MODEL_DIR" "$DATA_DIR"
mkdir -p "$MODEL_DIR" "$DATA_DIR"
cp "$tmp/$v"/model/{config.json,generation_config.json,model.safetensors,byte_tokenizer.json} "$MODEL_DIR/"
cp "$tmp/$v"/data/chat-{train,heldout}.jsonl "$DATA_DIR/"
python3 scripts/prepare_data.py --tokenizer "$MODEL_DIR" --out "$DATA_DIR/train$n" "$DATA_DIR/chat-train.jsonl" \
  --max-samples "$n" --max-len 512
python3 scripts/prepare_data.py --tokenizer "$MODEL_DIR" --out "$DATA_DIR/heldout" "$DATA_DIR/chat-heldout.jsonl"
for s in "train$n-000.dfs" heldout-000.dfs; do
  if [ -f "$tmp/best/$v/data/$s" ]; then
    cmp "$tmp/best/$v/data/$s" "$DATA_DIR/$s" || { echo "install_demo_target: $DATA_DIR/$s differs from the measured run's" >&2; exit 1; }
    echo "  $DATA_DIR/$s: the same bytes as the measured run's"
  fi
done
python3 - "$CONFIG" "$DATA_DIR/train$n-000.dfs" "$MODEL_DIR" "$DATA_DIR/heldout-000.dfs" <<'PY'
import json, re, sys
path, shard, model, held = sys.argv[1:5]
s = open(path).read()
c = json.loads(s)
# rewrite the three paths in place (the file keeps its layout)
s = s.replace(json.dumps(c["data"]["shards"][0]), json.dumps(shard), 1)
s = s.replace(json.dumps(c["target"]["model_dir"]), json.dumps(model), 1)
s = s.replace(json.dumps(c["validation"]["shards"][0]), json.dumps(held), 1)
c2 = json.loads(s)
assert (c2["data"]["shards"][0], c2["target"]["model_dir"], c2["validation"]["shards"][0]) == (shard, model, held)
open(path, "w").write(s)
print(f"  {path}: target {model}, shard {shard}, validation {held}")
PY
mkdir -p "$RESULTS"
cp "$src"/demo_results.json "$src"/demo_results.txt "$RESULTS/"
[ -f "$src/train_demo_target.log" ] && cp "$src/train_demo_target.log" "$RESULTS/"
for r in "$tmp"/runs/*/; do
  r=$(basename "$r")
  mkdir -p "$RESULTS/runs/$r"
  for f in train_summary.json ledger_audit.json eval_untrained.json eval_trained.json; do
    [ -f "$tmp/runs/$r/$f" ] && cp "$tmp/runs/$r/$f" "$RESULTS/runs/$r/"
  done
done
cp "$tmp"/logs/target-*.log "$RESULTS/" 2>/dev/null || true
echo "  $RESULTS: demo_results.json/.txt, train_demo_target.log, target-*.log, runs/*/ (summaries, evals)"
echo "next: CONFIG=$CONFIG scripts/run_default.sh   (what make run would print with this target)"
