#!/usr/bin/env bash
# bench/eval/objectives.sh: which training objective gives the better drafter, on the trained
# 0.6B-shape byte target (bench/eval/trained_target.sh), at equal steps and data: the decay
# loss at gamma 7 and 4, D-PACE at alpha 0.5 and 0.3 (docs/dflash_spec.md, "D-PACE"). The
# target and its answers are made once (the first variant) and reused by the others, so every
# variant trains on the same shards for the same steps; each is judged by held-out tau with
# dflash_eval (pooled, mean, median, per-position accuracy).
# Usage (GPU machine, after make CUDA=1): bench/eval/objectives.sh [VARIANT...]
#   VARIANT: decay:G or dpace:A (default: decay:7 decay:4 dpace:0.5 dpace:0.3)
# Env: as trained_target.sh (TB, NTRAIN, EPOCHS, VAL_EVERY, WORK, SHAPE, RES); BATCH=1 is set
# (the batched evaluation adds nothing to this comparison). BUDGET (540): seconds for the
# whole comparison: the first variant trains the target and answers the prompts, then every
# other variant starts beside it on the same GPU with what is left (SEQUENTIAL=1: one after
# the other, each BUDGET seconds). Each variant's output: RES/objectives_<variant>.log.
# Prints one table; writes RES/objectives.json. Not yet run on a GPU (docs/drafter_quality.md).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
RES=${RES:-bench/results/eval}
mkdir -p "$RES"
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(decay:7 decay:4 dpace:0.5 dpace:0.3)
# launch V BUDGET: one variant through trained_target.sh in the background, its log RES/objectives_<v>.log
launch() {
  local v=$1 b=$2 LOSS GAMMA DPACE_ALPHA
  case $v in
    decay:*) LOSS=decay GAMMA=${v#decay:} DPACE_ALPHA= ;;
    dpace:*) LOSS=dpace DPACE_ALPHA=${v#dpace:} GAMMA= ;;
  esac
  echo "== objectives: $v (BUDGET ${b}s, $(($(date +%s) - T0))s in)"
  LOSS=$LOSS GAMMA=$GAMMA DPACE_ALPHA=$DPACE_ALPHA BATCH=1 BUDGET=$b RES=$RES \
    bench/eval/trained_target.sh >"$RES/objectives_${v/:/_}.log" 2>&1 &
  pids+=($!)
}
for v in "${variants[@]}"; do
  case $v in decay:* | dpace:*) ;; *) echo "objectives: $v: expected decay:GAMMA or dpace:ALPHA" >&2; exit 2 ;; esac
done
T0=$(date +%s) BUDGET=${BUDGET:-540} pids=()
# The first variant trains the target and answers the prompts; the others need those answers,
# then train at once beside each other (SEQUENTIAL=1: one after the other, each its BUDGET).
if [ "${SEQUENTIAL:-0}" = 1 ]; then
  for v in "${variants[@]}"; do launch "$v" "$BUDGET"; wait "${pids[-1]}" || echo "objectives: $v failed (exit $?)"; done
else
  launch "${variants[0]}" "$BUDGET"
  data=${WORK:-gpu}/data/$([ "${SHAPE:-0.6b}" = tiny ] && echo tiny-bytes || echo qwen3-0.6b-bytes)
  ready=$data/heldout.json
  [ "${VAL_EVERY:-250}" -gt 0 ] || ready=$data/train.json
  while [ ! -f "$ready" ] && kill -0 "${pids[0]}" 2>/dev/null; do sleep 2; done
  if [ -f "$ready" ]; then
    for v in "${variants[@]:1}"; do launch "$v" $((BUDGET - ($(date +%s) - T0))); done
  else
    echo "objectives: the first variant ended before its answers were ready; the others do not run"
  fi
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || echo "objectives: ${variants[$i]} failed (exit $?)"; done
fi
for v in "${variants[@]}"; do echo "---- ${v}: tail of its log"; tail -25 "$RES/objectives_${v/:/_}.log"; done
python3 - "$RES" "${variants[@]}" <<'PY'
import glob, json, os, sys
res, variants = sys.argv[1], sys.argv[2:]
rows = []
for v in variants:
    loss, x = v.split(":")
    tag = f"trained_{os.environ.get('SHAPE', '0.6b')}_{loss}_a{x if loss == 'dpace' else 'cfg'}_g{x if loss == 'decay' else 'cfg'}"
    def load(kind):
        p = os.path.join(res, f"{tag}_eval_{kind}.json")
        return json.load(open(p))["overall"] if os.path.exists(p) else None
    t, u = load("trained"), load("untrained")
    rows.append({"variant": v, "tag": tag, "trained": t, "untrained": u})
print(f"{'variant':12} {'tau pooled':>10} {'mean':>6} {'median':>7} {'acc1':>5} {'acc4':>5} {'acc8':>5} {'acc15':>5}")
for r in rows:
    t = r["trained"]
    if not t:
        print(f"{r['variant']:12} (no result)")
        continue
    a = t["pos_acc"]
    f = lambda k: f"{a[k]:.2f}" if k < len(a) and a[k] is not None else "  -"
    print(f"{r['variant']:12} {t['tau_token_weighted']:10.2f} {t['tau']:6.2f} {t['tau_median']:7.2f} "
          f"{f(1):>5} {f(4):>5} {f(8):>5} {f(15):>5}")
json.dump(rows, open(os.path.join(res, "objectives.json"), "w"), indent=1)
PY
