#!/usr/bin/env bash
# bench/eval/objectives.sh: drafter variants on one trained target (bench/eval/trained_target.sh),
# at equal steps and data. By default which training objective gives the better drafter on
# the trained 0.6B-shape byte target: the decay loss at gamma 7 and 4, D-PACE at alpha 0.5 and
# 0.3 (docs/dflash_spec.md, "D-PACE"); the same mechanism compares the drafter's attention
# kinds (full, sliding:W; bench/eval/sliding_window.sh sets the long-context defaults for
# them). The target and its answers are made once (the first variant) and reused by the
# others, so every variant trains on the same shards for the same steps; each is judged by
# held-out tau with dflash_eval (pooled, mean, median, per-position accuracy).
# Usage (GPU machine, after make CUDA=1): bench/eval/objectives.sh [VARIANT...]
#   VARIANT: decay:G or dpace:A (default: decay:7 decay:4 dpace:0.5 dpace:0.3): LOSS and
#   GAMMA or DPACE_ALPHA; full: LAYER_TYPES=full; sliding:W: LAYER_TYPES=SLIDING_LAYERS
#   (default sliding-but-last) and SLIDING_WINDOW=W. Variants may not share a tag.
# Env: as trained_target.sh (TB, NTRAIN, EPOCHS, VAL_EVERY, WORK, SHAPE, RES, SEQ,
# PROMPT_LENS, MAX_SEQ_LEN, ...; every variant gets them); BATCH=1 is set (the batched
# evaluation adds nothing to these comparisons). NAME (objectives): the variants' logs are
# RES/NAME_<variant>.log, the table's JSON RES/NAME.json. BUDGET (540): seconds for the
# whole comparison: the first variant trains the target and answers the prompts, then every
# other variant starts beside it on the same GPU with what is left (SEQUENTIAL=1: one after
# the other, each BUDGET seconds). Side by side, the variants' drafters share the GPU: their
# ms/step compare with each other, not with a run alone.
# Prints one table (drafter steps, seconds, ms/step, held-out tau, per-position accuracy,
# lossless prompts); writes RES/NAME.json. The objectives' comparison ran on an H100 on
# 2026-12-07 (docs/drafter_quality.md, "Which objective").
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
RES=${RES:-bench/results/eval} NAME=${NAME:-objectives}
mkdir -p "$RES"
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(decay:7 decay:4 dpace:0.5 dpace:0.3)
# venv V: the env settings of variant V (for env(1))
venv() {
  case $1 in
    decay:*) echo "LOSS=decay GAMMA=${1#decay:} DPACE_ALPHA=" ;;
    dpace:*) echo "LOSS=dpace DPACE_ALPHA=${1#dpace:} GAMMA=" ;;
    full) echo "LAYER_TYPES=full SLIDING_WINDOW=" ;;
    sliding:*) echo "LAYER_TYPES=${SLIDING_LAYERS:-sliding-but-last} SLIDING_WINDOW=${1#sliding:}" ;;
  esac
}
# the variants' tags and data dirs (trained_target.sh PATHS_ONLY=1 checks their settings)
tags=() data=
for v in "${variants[@]}"; do
  case $v in
    decay:?* | dpace:?* | full | sliding:?*) ;;
    *) echo "$NAME: $v: expected decay:GAMMA, dpace:ALPHA, full or sliding:WINDOW" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2046 # venv's words are NAME=VALUE settings
  p=$(env $(venv "$v") PATHS_ONLY=1 bench/eval/trained_target.sh) || exit 2
  read -r tag _ d _ <<<"$p"
  for t in "${tags[@]}"; do [ "$t" != "$tag" ] || { echo "$NAME: $v: a second variant of tag $tag" >&2; exit 2; }; done
  [ -z "$data" ] || [ "$d" = "$data" ] || { echo "$NAME: $v answers into $d, not $data" >&2; exit 2; }
  tags+=("$tag") data=$d
done
# launch V BUDGET: one variant through trained_target.sh in the background, its log RES/NAME_<v>.log
launch() {
  local v=$1 b=$2
  echo "== $NAME: $v (BUDGET ${b}s, $(($(date +%s) - T0))s in)"
  # shellcheck disable=SC2046 # venv's words are NAME=VALUE settings
  env $(venv "$v") BATCH=1 BUDGET="$b" RES="$RES" bench/eval/trained_target.sh >"$RES/${NAME}_${v/:/_}.log" 2>&1 &
  pids+=($!)
}
T0=$(date +%s) BUDGET=${BUDGET:-540} pids=()
# The first variant trains the target and answers the prompts; the others need those answers,
# then train at once beside each other (SEQUENTIAL=1: one after the other, each its BUDGET).
if [ "${SEQUENTIAL:-0}" = 1 ]; then
  for v in "${variants[@]}"; do launch "$v" "$BUDGET"; wait "${pids[-1]}" || echo "$NAME: $v failed (exit $?)"; done
else
  launch "${variants[0]}" "$BUDGET"
  ready=$data/heldout.json
  [ "${VAL_EVERY:-250}" -gt 0 ] || ready=$data/train.json
  while [ ! -f "$ready" ] && kill -0 "${pids[0]}" 2>/dev/null; do sleep 2; done
  if [ -f "$ready" ]; then
    for v in "${variants[@]:1}"; do launch "$v" $((BUDGET - ($(date +%s) - T0))); done
  else
    echo "$NAME: the first variant ended before its answers were ready; the others do not run"
  fi
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || echo "$NAME: ${variants[$i]} failed (exit $?)"; done
fi
for v in "${variants[@]}"; do echo "---- ${v}: tail of its log"; tail -25 "$RES/${NAME}_${v/:/_}.log"; done
pairs=()
for i in "${!variants[@]}"; do pairs+=("${variants[$i]}=${tags[$i]}"); done
python3 - "$RES" "$NAME" "${SEQUENTIAL:-0}" "${pairs[@]}" <<'PY'
import json, os, sys
res, name, sequential, pairs = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
def load(tag, kind):
    p = os.path.join(res, f"{tag}_{kind}.json")
    return json.load(open(p)) if os.path.exists(p) else None
rows = []
for pair in pairs:
    v, tag = pair.split("=", 1)
    s, et, eu = load(tag, "summary"), load(tag, "eval_trained"), load(tag, "eval_untrained")
    drafter = None
    if s:
        drafter = {k: s.get(k) for k in ("steps", "seconds", "loss_start", "loss_end", "expected_tau", "backend")}
        drafter["ms_per_step"] = 1e3 * s["seconds"] / s["steps"] if s.get("steps") else None
    lossless = None
    if et and "mismatches" in et["overall"]:
        lossless = sum(1 for p in et["prompts"] if p.get("lossless"))
    rows.append({"variant": v, "tag": tag, "drafter": drafter, "trained": et and et["overall"],
                 "untrained": eu and eu["overall"], "lossless": lossless,
                 "prompt_tokens": et and [p["prompt_tokens"] for p in et["prompts"]]})
print(f"{name}: drafters trained " + ("one after the other" if sequential or len(rows) == 1 else
      "side by side, sharing the device (ms/step compare with each other, not with a run alone)") +
      "; tau and accuracy on the held-out prompts (dflash_eval)")
print(f"{'variant':14} {'steps':>6} {'drafter s':>9} {'ms/step':>8} {'tau pooled':>10} {'mean':>6} {'median':>7} "
      f"{'acc1':>5} {'acc4':>5} {'acc8':>5} {'acc15':>5} {'untrained':>9} {'lossless':>9}")
for r in rows:
    d, t, u = r["drafter"], r["trained"], r["untrained"]
    if d:
        ms = f"{d['ms_per_step']:8.1f}" if d["ms_per_step"] is not None else f"{'-':>8}"
        head = f"{r['variant']:14} {d['steps']:6d} {d['seconds']:9.1f} {ms}"
    else:
        head = f"{r['variant']:14} {'-':>6} {'-':>9} {'-':>8}"
    if not t:
        print(f"{head} (no held-out result)")
        continue
    a = t["pos_acc"]
    f = lambda k: f"{a[k]:.2f}" if k < len(a) and a[k] is not None else "  -"
    ll = f"{r['lossless']}/{t['n_prompts']}" if r["lossless"] is not None else "-"
    print(f"{head} {t['tau_token_weighted']:10.2f} {t['tau']:6.2f} {t['tau_median']:7.2f} "
          f"{f(1):>5} {f(4):>5} {f(8):>5} {f(15):>5} {(u['tau_token_weighted'] if u else float('nan')):9.2f} {ll:>9}")
print("per-position accuracy, held-out (position 1 ..):")
for r in rows:
    if r["trained"]:
        print(f"  {r['variant']:14} " + " ".join("  - " if x is None else f"{x:.2f}" for x in r["trained"]["pos_acc"][1:]))
pt = [n for r in rows for n in (r["prompt_tokens"] or [])]
if pt:
    print(f"held-out prompts: {min(pt)}..{max(pt)} tokens")
json.dump(rows, open(os.path.join(res, f"{name}.json"), "w"), indent=1)
PY
