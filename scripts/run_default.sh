#!/usr/bin/env bash
# make run: the embedded default. Trains a DFlash drafter for the tiny byte-level target
# (models/tiny-target) on its own chat answers (data/tiny), entirely on the CPU backend,
# through the real pipeline: orchestrator + target_worker + postproc_worker + drafter_worker
# over shared-memory rings. Ends with the loss at start and end, per-position accuracy,
# the expected acceptance length, and a release-format drafter directory.
#   scripts/run_default.sh            (BUILD=build by default; RUN_DIR=run/tiny)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RUN_DIR=run/tiny
if [ ! -f data/tiny/train-000.dfs ]; then
  echo "run: preparing data/tiny/train-000.dfs from data/tiny/chat-train.jsonl"
  python3 scripts/prepare_data.py --tokenizer models/tiny-target --out data/tiny/train \
    data/tiny/chat-train.jsonl --max-samples 800 --max-len 512
fi
if [ -e "$RUN_DIR" ]; then
  old="$RUN_DIR.$(date +%Y%m%d-%H%M%S)"
  echo "run: moving the previous run to $old"
  mv "$RUN_DIR" "$old"
fi
echo "run: $BUILD/bin/orchestrator configs/tiny.json   (watch it: $BUILD/bin/dfctl --run-dir $RUN_DIR top)"
t0=$(date +%s)
"$BUILD/bin/orchestrator" configs/tiny.json
echo "run: finished in $(( $(date +%s) - t0 ))s; run dir $RUN_DIR"
python3 - "$RUN_DIR" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(f"{run}/train_summary.json"))
a = json.load(open(f"{run}/ledger_audit.json"))
print()
print(f"drafter trained for {s['steps']} steps in {s['seconds']:.0f}s (block size {s['block_size']})")
print(f"  loss at start {s['loss_start']:.3f} -> at end {s['loss_end']:.3f}")
print("  per-position accuracy (last steps): " + " ".join(f"{x:.2f}" for x in s["acc"]))
print(f"  expected acceptance length tau ~ {s['expected_tau']:.2f}")
print(f"  ledger audit: exactly once = {a.get('exactly_once')}")
print(f"  release-format drafter: {run}/drafter/ (config.json + model.safetensors)")
PY
