#!/usr/bin/env bash
# make run: the embedded default. Trains a DFlash drafter for the tiny byte-level target
# (models/tiny-target) on its own chat answers (data/tiny), entirely on the CPU backend,
# through the real pipeline: orchestrator + target_worker + postproc_worker + drafter_worker
# over shared-memory rings. Ends with the loss at start and end, per-position accuracy,
# the expected acceptance length, and a release-format drafter directory; then measures
# the real acceptance length: greedy speculative decoding (build/bin/dflash_eval) on
# held-out prompts with the trained drafter and with the untrained one (its initial
# weights: the same random init, same seed), printing both taus.
#   scripts/run_default.sh            (BUILD=build by default; CONFIG=configs/tiny.json,
#                                      whose run_dir is run/tiny)
# The data come from the config: its first training shard (DATA_DIR/train[N]-000.dfs, made
# here from DATA_DIR/chat-train.jsonl when missing: the first N answers, 1600 when the
# name has no N), its validation shard (from DATA_DIR/chat-heldout.jsonl) and the held-out
# prompts DATA_DIR/chat-heldout.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONFIG=${CONFIG:-configs/tiny.json}
cfg() { # cfg KEY [KEY...]: a field of the run config (a number indexes a list)
  python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$CONFIG" "$@"; }
RUN_DIR=$(cfg run_dir)
MODEL=$(cfg target model_dir)
SHARD=$(cfg data shards 0)
VSHARD=$(cfg validation shards 0)
DATA_DIR=$(dirname "$SHARD")
if [ ! -f "$SHARD" ]; then
  n=$(basename "$SHARD" | sed -n 's/^train\([0-9][0-9]*\)-000\.dfs$/\1/p')
  n=${n:-1600}
  echo "run: preparing $SHARD from $DATA_DIR/chat-train.jsonl (the first $n answers)"
  python3 scripts/prepare_data.py --tokenizer "$MODEL" --out "${SHARD%-000.dfs}" \
    "$DATA_DIR/chat-train.jsonl" --max-samples "$n" --max-len 512
fi
if [ ! -f "$VSHARD" ]; then
  echo "run: preparing $VSHARD from $(dirname "$VSHARD")/chat-heldout.jsonl"
  python3 scripts/prepare_data.py --tokenizer "$MODEL" --out "${VSHARD%-000.dfs}" \
    "$(dirname "$VSHARD")/chat-heldout.jsonl"
fi
if [ -e "$RUN_DIR" ]; then
  old="$RUN_DIR.$(date +%Y%m%d-%H%M%S)"
  echo "run: moving the previous run to $old"
  mv "$RUN_DIR" "$old"
fi
echo "run: $BUILD/bin/orchestrator $CONFIG   (watch it: $BUILD/bin/dfctl --run-dir $RUN_DIR top)"
t0=$(date +%s)
"$BUILD/bin/orchestrator" "$CONFIG"
echo "run: finished in $(( $(date +%s) - t0 ))s; run dir $RUN_DIR"
python3 - "$RUN_DIR" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(f"{run}/train_summary.json"))
a = json.load(open(f"{run}/ledger_audit.json"))
f = lambda x: "n/a (non-finite)" if x is None else f"{x:.3f}"
print()
print(f"drafter trained for {s['steps']} steps in {s['seconds']:.0f}s (block size {s['block_size']})")
print(f"  loss at start {f(s['loss_start'])} -> at end {f(s['loss_end'])}"
      + ("  (D-PACE: a sum over each block's positions, not a per-token mean)" if s.get("loss") == "dpace" else ""))
print("  per-position accuracy on training batches (last steps): " + " ".join(f"{x:.2f}" for x in s["acc"]))
print(f"  expected acceptance length from those: tau ~ {f(s['expected_tau'])}")
print(f"  ledger audit: exactly once = {a.get('exactly_once')}")
print(f"  release-format drafter: {run}/drafter/ (config.json + dflash.py + model.safetensors)")
PY

# The figure that matters: tau of real speculative decoding (docs/eval.md). The untrained
# baseline is this run's own starting point: the drafter worker initialises with the run
# seed (std 0.02), and --random-drafter SEED rebuilds exactly those weights.
echo
echo "run: evaluating on held-out prompts ($DATA_DIR/chat-heldout.jsonl): untrained vs trained drafter"
EVAL=("$BUILD/bin/dflash_eval" --target "$MODEL" --drafter "$RUN_DIR/drafter"
      --prompts "$DATA_DIR/chat-heldout.jsonl" --max-prompts 32 --max-new 128 --quiet)
"${EVAL[@]}" --random-drafter "$(cfg seed)" --label "untrained (initial weights)" \
  --json "$RUN_DIR/eval_untrained.json" >"$RUN_DIR/eval_untrained.txt"
"${EVAL[@]}" --label "trained" --json "$RUN_DIR/eval_trained.json" | tee "$RUN_DIR/eval_trained.txt"
python3 - "$RUN_DIR" <<'PY'
import json, sys
run = sys.argv[1]
u = json.load(open(f"{run}/eval_untrained.json"))["overall"]
t = json.load(open(f"{run}/eval_trained.json"))["overall"]
acc = lambda o: " ".join("  - " if x is None else f"{x:.2f}" for x in o["pos_acc"][1:])
print()
print(f"held-out prompts ({t['n_prompts']}, greedy, block size {len(t['hist']) - 1}): acceptance length tau")
print(f"  {'':10} {'pooled per verify step':>22} {'mean per response':>18} {'median response':>16}")
for name, o in (("untrained", u), ("trained", t)):
    print(f"  {name:10} {o['tau_token_weighted']:22.2f} {o['tau']:18.2f} {o['tau_median']:16.2f}")
print(f"  per-position accuracy of the drafts vs the target's greedy text, k = 1..{len(t['pos_acc']) - 1}:")
print(f"    untrained {acc(u)}")
print(f"    trained   {acc(t)}")
print(f"  speculative output == plain greedy output for {t['n_prompts'] - t['mismatches']} of {t['n_prompts']} "
      f"prompts; speedup on this CPU {t['speedup']:.2f}x (time per output token, plain / speculative; "
      f"a CPU verify of {len(t['hist']) - 1} rows costs {t['verify_ms_per_step'] / t['plain_step_ms']:.1f} plain "
      f"steps here, on a GPU about one, docs/eval.md)")
print(f"  details: {run}/eval_trained.txt, {run}/eval_trained.json, {run}/eval_untrained.json")
PY

# Curves: plot_run.py runs itself under a Python that has matplotlib, or prints the one
# command that gets them; the same figures are always in the TensorBoard event files.
python3 scripts/plot_run.py "$RUN_DIR" || true # without matplotlib it printed the command that draws them
echo "run: TensorBoard: tensorboard --logdir $RUN_DIR/tensorboard   (training and validation scalars per step)"
