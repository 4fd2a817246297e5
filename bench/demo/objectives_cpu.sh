#!/usr/bin/env bash
# bench/demo/objectives_cpu.sh: which training objective gives the better drafter for the
# embedded default target, on the CPU: the make-run recipe (CONFIG, default configs/demo.json)
# trained once per objective and seed at equal steps and data (the same shard, the same
# deterministic plan), each drafter judged by held-out tau with dflash_eval on 32 held-out
# prompts x 128 tokens (pooled over verify steps, mean and median per response, per-position
# acceptance). The GPU comparison at the 0.6B shape is bench/eval/objectives.sh.
# Usage: bench/demo/objectives_cpu.sh [VARIANT...]
#   VARIANT: decay:GAMMA or dpace:ALPHA (default: decay:7 decay:4 dpace:0.5 dpace:0.3)
# Env: CONFIG (configs/demo.json), SEEDS ("1234 99": the drafter's init and data order),
#      BUILD (build), RES (bench/results/demo/objectives), PROMPTS (32), MAX_NEW (128).
# Prints one table (a row per variant and seed, then the mean over seeds); writes
# RES/objectives_cpu.json and each run's eval JSON. Exit 2 on usage errors, 1 if a run failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
CONFIG=${CONFIG:-configs/demo.json} SEEDS=${SEEDS:-1234 99} BUILD=${BUILD:-build}
RES=${RES:-bench/results/demo/objectives} PROMPTS=${PROMPTS:-32} MAX_NEW=${MAX_NEW:-128}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(decay:7 decay:4 dpace:0.5 dpace:0.3)
for v in "${variants[@]}"; do
  case $v in decay:* | dpace:*) ;; *) echo "objectives_cpu: $v: expected decay:GAMMA or dpace:ALPHA" >&2; exit 2 ;; esac
done
for b in orchestrator dflash_eval; do
  [ -x "$BUILD/bin/$b" ] || { echo "objectives_cpu: $BUILD/bin/$b missing: run make first" >&2; exit 2; }
done
[ -f "$CONFIG" ] || { echo "objectives_cpu: $CONFIG: no such file" >&2; exit 2; }
model=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["target"]["model_dir"])' "$CONFIG")
shard=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["data"]["shards"][0])' "$CONFIG")
prompts=$(dirname "$shard")/chat-heldout.jsonl
for f in "$model/config.json" "$shard" "$prompts"; do
  [ -f "$f" ] || { echo "objectives_cpu: $f missing (make run prepares the data of $CONFIG)" >&2; exit 2; }
done
mkdir -p "$RES" || exit 2
work=$(mktemp -d /tmp/objectives_cpu.XXXXXX) || exit 2
trap 'rm -rf "$work"' EXIT
failed=0
for seed in $SEEDS; do
  for v in "${variants[@]}"; do
    tag=${v/:/_}_s$seed
    python3 - "$CONFIG" "$work/$tag.json" "$work/run-$tag" "$v" "$seed" <<'PY' || exit 2
import json, sys
src, out, run, v, seed = sys.argv[1:]
c = json.load(open(src))
loss, x = v.split(":")
c["run_dir"], c["seed"], c["name"] = run, int(seed), f"objectives-{loss}-{x}-s{seed}"
c["drafter"]["loss"] = loss
if loss == "decay":
    c["drafter"]["gamma"] = float(x)
else:
    c["drafter"]["dpace_alpha"] = float(x)
c.pop("validation", None)  # dflash_eval below is the judge; the validator would only cost time
c["workers"] = [w for w in c["workers"] if w["role"] != "validator"]
json.dump(c, open(out, "w"), indent=1)
PY
    t0=$(date +%s)
    echo "== objectives_cpu: $v, seed $seed: training ($CONFIG)"
    if ! "$BUILD/bin/orchestrator" "$work/$tag.json" >"$work/$tag.log" 2>&1; then
      echo "objectives_cpu: $v seed $seed: the run failed; tail of its log:"; tail -5 "$work/$tag.log"
      failed=1; continue
    fi
    cp "$work/run-$tag/train_summary.json" "$RES/${tag}_summary.json"
    if ! "$BUILD/bin/dflash_eval" --target "$model" --drafter "$work/run-$tag/drafter" --prompts "$prompts" \
      --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --quiet --label "$v seed $seed" \
      --json "$RES/${tag}_eval.json" >"$work/$tag.eval" 2>&1; then
      echo "objectives_cpu: $v seed $seed: dflash_eval failed"; tail -5 "$work/$tag.eval"; failed=1; continue
    fi
    echo "   done in $(($(date +%s) - t0))s: $(grep '^overall' "$work/$tag.eval")"
  done
done
python3 - "$RES" "$CONFIG" "$SEEDS" "${variants[@]}" <<'PY'
import json, os, statistics, sys
res, config, seeds, variants = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
rows = []
for v in variants:
    for s in seeds:
        tag = f"{v.replace(':', '_')}_s{s}"
        try:
            e = json.load(open(os.path.join(res, f"{tag}_eval.json")))["overall"]
            t = json.load(open(os.path.join(res, f"{tag}_summary.json")))
        except (OSError, KeyError, ValueError):
            rows.append({"variant": v, "seed": int(s), "result": None})
            continue
        rows.append({"variant": v, "seed": int(s), "steps": t["steps"], "seconds": t["seconds"],
                     "tau_pooled": e["tau_token_weighted"], "tau_mean": e["tau"], "tau_median": e["tau_median"],
                     "pos_acc": e["pos_acc"], "lossless": e["mismatches"] == 0})
print(f"objectives on {config}, held-out tau with dflash_eval (seeds {' '.join(seeds)})")
print(f"{'variant':11} {'seed':>5} {'steps':>5} {'tau pooled':>10} {'mean':>6} {'median':>6} {'acc1':>5} {'acc2':>5} {'acc4':>5} {'acc8':>5}")
fa = lambda a, k: f"{a[k]:.2f}" if k < len(a) and a[k] is not None else "-"
for r in rows:
    if "steps" not in r:
        print(f"{r['variant']:11} {r['seed']:5d} (no result)")
        continue
    a = r["pos_acc"]
    print(f"{r['variant']:11} {r['seed']:5d} {r['steps']:5d} {r['tau_pooled']:10.3f} {r['tau_mean']:6.2f} "
          f"{r['tau_median']:6.2f} {fa(a, 1):>5} {fa(a, 2):>5} {fa(a, 4):>5} {fa(a, 8):>5}")
print("mean over seeds:")
for v in variants:
    ok = [r for r in rows if r["variant"] == v and "steps" in r]
    if ok:
        print(f"{v:11} tau pooled {statistics.mean(r['tau_pooled'] for r in ok):.3f}, "
              f"mean {statistics.mean(r['tau_mean'] for r in ok):.2f} ({len(ok)} seed(s))")
json.dump({"config": config, "seeds": seeds, "rows": rows}, open(os.path.join(res, "objectives_cpu.json"), "w"), indent=1)
PY
exit $failed
