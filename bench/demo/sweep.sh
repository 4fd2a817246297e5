#!/usr/bin/env bash
# bench/demo/sweep.sh: which embedded default makes a drafter that visibly learns?
# Measures, on one machine and in one call, what each choice buys in held-out tau:
# the target (the shipped one, or a new byte-level Qwen3 trained by scripts/train_target.py
# at two depths), how many prepared samples the drafter trains on, its depth and anchors.
# Every run is the real CPU pipeline (orchestrator + 3 workers, deterministic mode) on a
# topology derived from configs/tiny.json, followed by dflash_eval (CPU, greedy, held-out
# prompts the target answered itself). Needs torch + a GPU for the target training (the
# GPU machine); the pipelines run on its CPU cores, several at once.
#   bench/demo/sweep.sh [OUTDIR]      (default bench/results/demo)
# Writes OUTDIR/sweep.json, sweep.txt and demo_targets.tgz (the new targets and their data).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench/results/demo}; mkdir -p "$out"
BUILD=${BUILD:-build}
W=gpu/demo; mkdir -p "$W"; rm -rf "$W/runs" "$W/base"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
[ -x "$BUILD/bin/orchestrator" ] || { echo "sweep: build first (make)"; exit 2; }

# 1. targets (GPU): the same script at two depths, a fixed time budget each
TB=${TB:-110}
if [ "${REUSE_TARGETS:-0}" = 1 ] && [ -f $W/tA/model/config.json ] && [ -f $W/tB/model/config.json ]; then
  stamp "reusing the targets in $W/tA, $W/tB"
else
stamp "training targets (tiny, tiny-deep; ${TB}s each)"
python3 scripts/train_target.py --shape tiny --time-budget "$TB" --out $W/tA/model --data $W/tA/data \
  --n-train 4000 --n-heldout 64 >"$out/target_tA.log" 2>&1 &
pa=$!
python3 scripts/train_target.py --shape tiny-deep --time-budget "$TB" --out $W/tB/model --data $W/tB/data \
  --n-train 4000 --n-heldout 64 >"$out/target_tB.log" 2>&1 &
pb=$!
wait $pa || { tail -20 "$out/target_tA.log"; exit 1; }
wait $pb || { tail -20 "$out/target_tB.log"; exit 1; }
fi
mkdir -p $W/t0/model $W/t0/data
cp models/tiny-target/* $W/t0/model/; cp data/tiny/chat-*.jsonl $W/t0/data/

# 2. shards: the first N prepared samples
for t in t0 tA tB; do
  for n in 800 2400; do
    python3 scripts/prepare_data.py --tokenizer $W/$t/model --out $W/$t/data/train$n \
      $W/$t/data/chat-train.jsonl --max-samples $n --max-len 512 >/dev/null
  done
done
stamp "targets and shards ready"

# 3. runs: name target samples layers anchors capture
RUNS=${RUNS:-"o1 t0 800 1 32 1,3
o2 t0 2400 1 32 1,3
a1 tA 800 1 32 1,3
a2 tA 2400 1 32 1,3
a3 tA 2400 2 32 1,3
a4 tA 2400 1 64 1,3
b2 tB 2400 1 32 1,3,5
b3 tB 2400 2 32 1,3,5"}
mkrun() { # mkrun name target samples layers anchors capture
  python3 - "$@" <<'PY'
import json, sys
name, t, n, layers, anchors, cap = sys.argv[1:7]
c = json.load(open("configs/tiny.json"))
c["name"] = f"sweep-{name}"
c["run_dir"] = f"gpu/demo/runs/{name}"
c["target"]["model_dir"] = f"gpu/demo/{t}/model"
c["target"]["capture_layers"] = [int(x) for x in cap.split(",")]
c["drafter"]["num_layers"] = int(layers)
c["drafter"]["num_anchors"] = int(anchors)
c["data"]["shards"] = [f"gpu/demo/{t}/data/train{n}-000.dfs"]
json.dump(c, open(f"gpu/demo/topo-{name}.json", "w"), indent=1)
PY
}
one() { # one name target samples layers anchors capture: train, then evaluate
  local name=$1 t=$2
  mkrun "$@"
  local s=$(date +%s)
  "$BUILD/bin/orchestrator" "$W/topo-$name.json" >"$W/$name.log" 2>&1 || { echo "run $name failed"; tail -5 "$W/$name.log"; return 1; }
  echo $(( $(date +%s) - s )) >"$W/runs/$name/wall_s"
  "$BUILD/bin/dflash_eval" --target $W/$t/model --drafter $W/runs/$name/drafter --prompts $W/$t/data/chat-heldout.jsonl \
    --max-prompts 32 --max-new 128 --quiet --json $W/runs/$name/eval.json >$W/runs/$name/eval.txt 2>&1
}
stamp "pipelines: $(echo "$RUNS" | wc -l) runs in parallel"
pids=()
while read -r line; do [ -n "$line" ] && { one $line & pids+=($!); }; done <<<"$RUNS"
fail=0
for p in "${pids[@]}"; do wait $p || fail=1; done
stamp "pipelines done (fail=$fail)"
for t in t0 tA tB; do  # untrained: same shape as run a2/b2/o2, initial weights of the run seed
  mkdir -p $W/base/$t
  r=$( [ $t = t0 ] && echo o2 || { [ $t = tA ] && echo a2 || echo b2; } )
  [ -d $W/runs/$r/drafter ] && "$BUILD/bin/dflash_eval" --target $W/$t/model --drafter $W/runs/$r/drafter \
    --prompts $W/$t/data/chat-heldout.jsonl --max-prompts 32 --max-new 128 --quiet \
    --random-drafter 1234 --json $W/base/$t/eval.json >$W/base/$t/eval.txt 2>&1 || true
done
python3 - "$out" "$RUNS" <<'PY'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2]
rows = []
def ev(path):
    try: return json.load(open(path))["overall"]
    except Exception: return None
for line in runs.strip().splitlines():
    name, t, n, layers, anchors, cap = line.split()
    d = f"gpu/demo/runs/{name}"
    try: s = json.load(open(f"{d}/train_summary.json"))
    except Exception: s = {}
    e = ev(f"{d}/eval.json")
    wall = open(f"{d}/wall_s").read().strip() if os.path.exists(f"{d}/wall_s") else None
    rows.append(dict(run=name, target=t, samples=int(n), layers=int(layers), anchors=int(anchors), capture=cap,
                     steps=s.get("steps"), train_s=s.get("seconds"), wall_s=wall, loss_start=s.get("loss_start"),
                     loss_end=s.get("loss_end"), train_acc=s.get("acc"), expected_tau=s.get("expected_tau"),
                     eval=e))
base = {t: ev(f"gpu/demo/base/{t}/eval.json") for t in ("t0", "tA", "tB")}
json.dump({"runs": rows, "untrained": base}, open(f"{out}/sweep.json", "w"), indent=1)
lines = [f"{'run':4} {'tgt':3} {'samp':>5} {'L':>2} {'anc':>4} {'steps':>5} {'train_s':>7} {'loss':>12} "
         f"{'exp_tau':>7} {'tau_pool':>8} {'tau_mean':>8} {'tau_med':>7} {'acc1':>5} {'acc2':>5} {'acc4':>5} {'acc8':>5}"]
for r in rows:
    e = r["eval"] or {}
    pa = e.get("pos_acc") or [None] * 16
    f = lambda x: "-" if x is None else f"{x:.2f}"
    lines.append(f"{r['run']:4} {r['target']:3} {r['samples']:5} {r['layers']:2} {r['anchors']:4} {str(r['steps']):>5} "
                 f"{str(r['train_s'] and round(r['train_s'])):>7} {f(r['loss_start']):>5}->{f(r['loss_end']):>5} "
                 f"{f(r['expected_tau']):>7} {f(e.get('tau_token_weighted')):>8} {f(e.get('tau')):>8} "
                 f"{f(e.get('tau_median')):>7} {f(pa[1]):>5} {f(pa[2]):>5} {f(pa[4]):>5} {f(pa[8]):>5}")
for t, e in base.items():
    if e:
        lines.append(f"untrained {t}: tau pooled {e['tau_token_weighted']:.2f}, mean {e['tau']:.2f}, acc1 {e['pos_acc'][1]:.2f}")
open(f"{out}/sweep.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
tar czf "$out/demo_targets.tgz" -C $W tA/model tA/data/chat-train.jsonl tA/data/chat-heldout.jsonl \
  tB/model tB/data/chat-train.jsonl tB/data/chat-heldout.jsonl
cp "$out"/target_t*.log "$out/" 2>/dev/null || true
stamp "sweep done"
