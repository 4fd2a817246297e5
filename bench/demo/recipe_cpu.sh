#!/usr/bin/env bash
# bench/demo/recipe_cpu.sh: which drafter recipe works best for the embedded default target,
# on the CPU: the make-run recipe (CONFIG, default configs/tiny.json) trained once per variant
# and seed at equal data (the same shard, the same deterministic plan), each drafter judged by
# held-out tau with dflash_eval on 32 held-out prompts x 128 tokens (pooled over verify steps,
# mean and median per response, per-position acceptance). The GPU comparison of objectives
# at the 0.6B shape is bench/eval/objectives.sh.
# Usage: bench/demo/recipe_cpu.sh [VARIANT...]
#   VARIANT: one or more comma-separated parts, each changing one thing of CONFIG:
#     decay:GAMMA | dpace:ALPHA   the objective (drafter.loss, gamma / dpace_alpha)
#     full | sliding:W            every drafter layer full attention, or every one sliding
#                                 with window W (drafter.layer_types, sliding_window)
#     layers:N                    drafter.num_layers
#     samples:N                   train on the first N answers of the config's data dir
#                                 (made here from its chat-train.jsonl, as make run does)
#   e.g. dpace:0.5,sliding:4,layers:2,samples:2400; default: decay:7 decay:4 dpace:0.5 dpace:0.3
# Env: CONFIG (configs/tiny.json), SEEDS ("1234 99": the drafter's init and data order),
#      BUILD (build), RES (bench/results/demo/recipe), PROMPTS (32), MAX_NEW (128).
# Prints one table (a row per variant and seed, then the mean over seeds); writes
# RES/recipe_cpu.json and each run's summary, eval JSON and drafter config.json. Exit 2 on usage errors, 1 if a
# run failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
CONFIG=${CONFIG:-configs/tiny.json} SEEDS=${SEEDS:-1234 99} BUILD=${BUILD:-build}
RES=${RES:-bench/results/demo/recipe} PROMPTS=${PROMPTS:-32} MAX_NEW=${MAX_NEW:-128}
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(decay:7 decay:4 dpace:0.5 dpace:0.3)
for v in "${variants[@]}"; do
  IFS=, read -ra parts <<<"$v"
  [ ${#parts[@]} -gt 0 ] || { echo "recipe_cpu: an empty variant" >&2; exit 2; }
  for p in "${parts[@]}"; do
    case $p in
      decay:?* | dpace:?* | full | sliding:?* | layers:?* | samples:?*) ;;
      *) echo "recipe_cpu: $v: $p: expected decay:GAMMA, dpace:ALPHA, full, sliding:W, layers:N or samples:N" >&2
         exit 2 ;;
    esac
  done
done
for b in orchestrator dflash_eval; do
  [ -x "$BUILD/bin/$b" ] || { echo "recipe_cpu: $BUILD/bin/$b missing: run make first" >&2; exit 2; }
done
[ -f "$CONFIG" ] || { echo "recipe_cpu: $CONFIG: no such file" >&2; exit 2; }
model=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["target"]["model_dir"])' "$CONFIG")
shard=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["data"]["shards"][0])' "$CONFIG")
prompts=$(dirname "$shard")/chat-heldout.jsonl
for f in "$model/config.json" "$shard" "$prompts"; do
  [ -f "$f" ] || { echo "recipe_cpu: $f missing (make run prepares the data of $CONFIG)" >&2; exit 2; }
done
mkdir -p "$RES" || exit 2
work=$(mktemp -d /tmp/recipe_cpu.XXXXXX) || exit 2
trap 'rm -rf "$work"' EXIT
tag_of() { local t=${1//:/_}; echo "${t//,/+}"; }
failed=0
for seed in $SEEDS; do
  for v in "${variants[@]}"; do
    tag=$(tag_of "$v")_s$seed
    python3 - "$CONFIG" "$work/$tag.json" "$work/run-$tag" "$v" "$seed" "$work" <<'PY' || exit 2
import json, os, subprocess, sys
src, out, run, v, seed, work = sys.argv[1:]
c = json.load(open(src))
name = "".join(ch if ch.isalnum() or ch in "_.-" else "_" for ch in f"recipe-s{seed}-{v}")
c["run_dir"], c["seed"], c["name"] = run, int(seed), name[:63]  # the topology's name: 1..63 of [A-Za-z0-9_.-]
d = c["drafter"]
def bad(msg):
    print(f"recipe_cpu: {v}: {msg}", file=sys.stderr)
    sys.exit(2)
def number(x, kind, lo):
    try:
        n = kind(x)
    except ValueError:
        bad(f"{x}: expected a number")
    if not n >= lo:
        bad(f"{x}: expected at least {lo}")
    return n
samples = None
for part in v.split(","):
    key, _, x = part.partition(":")
    if key in ("decay", "dpace"):
        d["loss"] = key
        d["gamma" if key == "decay" else "dpace_alpha"] = number(x, float, 1e-9)
    elif key == "layers":
        d["num_layers"] = number(x, int, 1)
    elif key == "full":
        d["layer_types"], d["sliding_window"] = None, None
    elif key == "sliding":
        d["sliding_window"] = number(x, int, 1)
    elif key == "samples":
        samples = number(x, int, 1)
if any(p.startswith("sliding:") for p in v.split(",")):
    d["layer_types"] = ["sliding_attention"] * d["num_layers"]
elif d.get("layer_types") and len(d["layer_types"]) != d["num_layers"]:
    bad(f"CONFIG's drafter.layer_types has {len(d['layer_types'])} entries, the variant {d['num_layers']} "
        "layers: add full or sliding:W")
if samples is not None:
    data = os.path.dirname(c["data"]["shards"][0])
    shard = os.path.join(work, f"train{samples}")
    if not os.path.exists(shard + "-000.dfs"):
        r = subprocess.run([sys.executable, "scripts/prepare_data.py", "--tokenizer", c["target"]["model_dir"],
                            "--out", shard, os.path.join(data, "chat-train.jsonl"), "--max-samples", str(samples),
                            "--max-len", "512"], stdout=subprocess.DEVNULL)
        if r.returncode:
            bad(f"prepare_data.py for {samples} samples failed")
    c["data"]["shards"] = [shard + "-000.dfs"]
c.pop("validation", None)  # dflash_eval below is the judge; the validator would only cost time
c["workers"] = [w for w in c["workers"] if w["role"] != "validator"]
json.dump(c, open(out, "w"), indent=1)
PY
    t0=$(date +%s)
    echo "== recipe_cpu: $v, seed $seed: training ($CONFIG)"
    if ! "$BUILD/bin/orchestrator" "$work/$tag.json" >"$work/$tag.log" 2>&1; then
      echo "recipe_cpu: $v seed $seed: the run failed; tail of its log:"; tail -5 "$work/$tag.log"
      failed=1; continue
    fi
    cp "$work/run-$tag/train_summary.json" "$RES/${tag}_summary.json"
    cp "$work/run-$tag/drafter/config.json" "$RES/${tag}_drafter_config.json" # what was trained
    if ! "$BUILD/bin/dflash_eval" --target "$model" --drafter "$work/run-$tag/drafter" --prompts "$prompts" \
      --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --quiet --label "$v seed $seed" \
      --json "$RES/${tag}_eval.json" >"$work/$tag.eval" 2>&1; then
      echo "recipe_cpu: $v seed $seed: dflash_eval failed"; tail -5 "$work/$tag.eval"; failed=1; continue
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
        tag = f"{v.replace(':', '_').replace(',', '+')}_s{s}"
        try:
            e = json.load(open(os.path.join(res, f"{tag}_eval.json")))["overall"]
            t = json.load(open(os.path.join(res, f"{tag}_summary.json")))
        except (OSError, KeyError, ValueError):
            rows.append({"variant": v, "seed": int(s), "result": None})
            continue
        rows.append({"variant": v, "seed": int(s), "steps": t["steps"], "seconds": t["seconds"],
                     "tau_pooled": e["tau_token_weighted"], "tau_mean": e["tau"], "tau_median": e["tau_median"],
                     "pos_acc": e["pos_acc"], "lossless": e["mismatches"] == 0})
w = max([11] + [len(v) for v in variants])
print(f"drafter recipes on {config}, held-out tau with dflash_eval (seeds {' '.join(seeds)})")
print(f"{'variant':{w}} {'seed':>5} {'steps':>5} {'train s':>7} {'tau pooled':>10} {'mean':>6} {'median':>6} {'acc1':>5} {'acc2':>5} {'acc4':>5} {'acc8':>5}")
fa = lambda a, k: f"{a[k]:.2f}" if k < len(a) and a[k] is not None else "-"
for r in rows:
    if "steps" not in r:
        print(f"{r['variant']:{w}} {r['seed']:5d} (no result)")
        continue
    a = r["pos_acc"]
    print(f"{r['variant']:{w}} {r['seed']:5d} {r['steps']:5d} {r['seconds']:7.0f} {r['tau_pooled']:10.3f} {r['tau_mean']:6.2f} "
          f"{r['tau_median']:6.2f} {fa(a, 1):>5} {fa(a, 2):>5} {fa(a, 4):>5} {fa(a, 8):>5}")
print("mean over seeds:")
for v in variants:
    ok = [r for r in rows if r["variant"] == v and "steps" in r]
    if ok:
        print(f"{v:{w}} tau pooled {statistics.mean(r['tau_pooled'] for r in ok):.3f}, "
              f"mean {statistics.mean(r['tau_mean'] for r in ok):.2f} ({len(ok)} seed(s))")
json.dump({"config": config, "seeds": seeds, "rows": rows}, open(os.path.join(res, "recipe_cpu.json"), "w"), indent=1)
PY
exit $failed
