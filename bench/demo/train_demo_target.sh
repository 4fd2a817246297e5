#!/usr/bin/env bash
# bench/demo/train_demo_target.sh: a new embedded-default target whose greedy text a drafter
# can learn, measured the way `make run` measures it; one call on the GPU machine.
#
#   1. build the CPU programs (make -j, DEPS_PREFIX=.deps/root when .deps/ came along);
#   2. meanwhile, on the GPU: scripts/train_target.py --shape tiny for each target variant
#      (corpus = the stdlib plus structured text from scripts/demo_corpus.py, TB seconds
#      each, all variants at once), which then answers 4000 training and 64 held-out
#      prompts greedily (chat-train.jsonl / chat-heldout.jsonl);
#   3. for each variant, as soon as its target is ready: shards (prepare_data.py, as
#      scripts/run_default.sh makes them), then the make-run pipeline (configs/tiny.json
#      pointed at the variant: CPU backend, deterministic, validator) once per sample count
#      in SAMPLES, all runs at once on the CPU cores (each run keeps about two busy), each
#      followed by dflash_eval on 32 held-out prompts, trained vs untrained (its initial
#      weights), as run_default.sh does;
#   4. a table (stdout, OUT/demo_results.txt) and OUT/demo_results.json: per run the target's
#      corpus, training steps and held-out bits/byte, the drafter's steps and seconds, tau
#      pooled / mean / median untrained vs trained, acc k = 1..15, lossless count, and tau
#      per kind of held-out prompt (stdlib or a structured kind);
#   5. OUT/demo_best.tgz: the best run's target (model/), its data (chat JSONL + shards),
#      topology, train summary and evals; OUT/demo_all.tgz: every variant's target, chat
#      files and logs, every run's summary and evals.
# Best: the run with the fewest drafter samples among those reaching tau pooled >= 2.5
# (ties: higher tau), else the highest tau.
#
# Env: OUT (the device sets it; default bench/results/demo/train_demo), TB (85: seconds of
# target training each), VARIANTS (lines "name corpus batch"), SAMPLES ("1600 2400"),
# DEADLINE (530: seconds after which nothing new starts and every stage still running is
# stopped, so the table and the archives are written by about DEADLINE + 20 s), PY (python3
# with torch), QUICK=1 (a dry run on a CPU machine: tiny sizes everywhere, minutes).
#
# On the GPU machine: carry .deps (scripts/fetch_deps.sh) and run
#   bench/demo/train_demo_target.sh
# About 6-7 minutes: build ~1 min beside the targets' ~2.5 min (training + answers),
# then the pipelines and evaluations ~2.5-3 min.
set -euo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
QUICK=${QUICK:-0}
OUT=${OUT:-bench/results/demo/train_demo}
PY=${PY:-python3}
BUILD=${BUILD:-build}
W=${WORK:-gpu/demo_target}
DEADLINE=${DEADLINE:-500}
TB=${TB:-85}
VARIANTS=${VARIANTS:-"T0 shipped 0
A demo:0.75 128
B demo:0.9 128
C demo:1 128"}
SAMPLES=${SAMPLES:-"1600 2400 3200"}
# 3200 answers: the most SAMPLES takes; one generation batch per prompt length (3 lengths)
N_TRAIN=${N_TRAIN:-3200} N_HELD=64 GEN_BATCH=2048 PROMPTS=32 MAX_NEW=128 TEXTRA=() SHIPPED_SAMPLES=1600
if [ "$QUICK" = 1 ]; then  # everything tiny: checks the logic, not the figures
  TB=0 N_TRAIN=48 N_HELD=8 GEN_BATCH=64 PROMPTS=4 MAX_NEW=24 SAMPLES=${SAMPLES_QUICK:-"12 24"} SHIPPED_SAMPLES=12
  TEXTRA=(--steps 6 --batch 4 --seq 64 --resp-len 48 --device cpu)
fi
if [ ! -f .deps/root/usr/include/uv.h ] && [ ! -f /usr/include/uv.h ]; then
  echo "train_demo_target: no libuv headers: run scripts/fetch_deps.sh here and carry .deps along"
  exit 2
fi
rm -rf "${W:?}"
mkdir -p "$OUT" "$W/runs" "$W/logs"
exec > >(tee -a "$OUT/train_demo_target.log") 2>&1
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); } # seconds until the deadline
# tmo SECONDS CMD...: CMD under a limit no later than the deadline (at least 1 s)
tmo() {
  local cap=$1 l
  shift
  l=$(left)
  [ "$l" -lt "$cap" ] && cap=$l
  [ "$cap" -lt 1 ] && { echo "deadline passed: not running $*"; return 124; }
  timeout -k 5 "$cap" "$@"
}
stamp "train_demo_target: OUT=$OUT work=$W QUICK=$QUICK TB=${TB}s deadline ${DEADLINE}s"
echo "$VARIANTS" | sed 's/^/  variant: /'
echo "  drafter samples: $SAMPLES; eval: $PROMPTS held-out prompts x $MAX_NEW tokens"
(command -v nvidia-smi >/dev/null && nvidia-smi -L) || true
nproc

SEED=$(python3 -c 'import json; print(json.load(open("configs/tiny.json"))["seed"])')

# 1. the CPU programs, in the background (the targets train meanwhile)
BINS="orchestrator target_worker postproc_worker drafter_worker validator dflash_eval"
mk=(make -j"$(nproc)" BUILD_ROOT="$BUILD")
[ -f .deps/root/usr/include/uv.h ] && mk+=(DEPS_PREFIX=.deps/root)
rm -f "$W/build.ok" "$W/build.done"
(
  if tmo 300 "${mk[@]}" $(printf "$BUILD/bin/%s " $BINS) >"$W/logs/build.log" 2>&1; then
    touch "$W/build.ok"
  fi
  touch "$W/build.done"
) &
build_pid=$!

# 2-3. one chain per variant: target -> shards -> pipelines -> evaluations
run_one() { # run_one VARIANT SAMPLES: the make-run pipeline on this variant's data, then the evals
  local v=$1 n=$2 r="$W/runs/$1-$2"
  python3 - "$v" "$n" "$W" "$r" <<'PY'
import json, sys
v, n, w, r = sys.argv[1:5]
c = json.load(open("configs/tiny.json"))
c["name"] = f"demo-{v}-{n}"
c["run_dir"] = r
c["target"]["model_dir"] = f"{w}/{v}/model"
c["data"]["shards"] = [f"{w}/{v}/data/train{n}-000.dfs"]
c["validation"]["shards"] = [f"{w}/{v}/data/heldout-000.dfs"]
json.dump(c, open(f"{w}/topo-{v}-{n}.json", "w"), indent=1)
PY
  local s rc=0
  s=$(date +%s)
  tmo 400 "$BUILD/bin/orchestrator" "$W/topo-$v-$n.json" >"$W/logs/pipeline-$v-$n.log" 2>&1 || rc=$?
  echo $(($(date +%s) - s)) >"$W/logs/wall-$v-$n"
  if [ $rc != 0 ]; then
    stamp "run $v-$n: orchestrator exit $rc (tail of $W/logs/pipeline-$v-$n.log):"
    tail -5 "$W/logs/pipeline-$v-$n.log"
    return 1
  fi
  stamp "run $v-$n: trained in $(cat "$W/logs/wall-$v-$n")s; evaluating"
  local ev=("$BUILD/bin/dflash_eval" --target "$W/$v/model" --drafter "$r/drafter"
    --prompts "$W/$v/data/chat-heldout.jsonl" --max-prompts "$PROMPTS" --max-new "$MAX_NEW" --quiet)
  # the trained drafter first: the figure that matters, should the deadline come
  s=$(date +%s)
  tmo 200 "${ev[@]}" --label "trained $v-$n" --json "$r/eval_trained.json" \
    >"$r/eval_trained.txt" 2>&1 || { stamp "run $v-$n: trained eval failed"; tail -3 "$r/eval_trained.txt"; }
  echo $(($(date +%s) - s)) >"$W/logs/eval_trained_s-$v-$n"
  s=$(date +%s) # untrained: the run's initial weights (the run seed), as run_default.sh does
  tmo 200 "${ev[@]}" --random-drafter "$SEED" --label "untrained $v-$n" --json "$r/eval_untrained.json" \
    >"$r/eval_untrained.txt" 2>&1 || { stamp "run $v-$n: untrained eval failed"; tail -3 "$r/eval_untrained.txt"; }
  echo $(($(date +%s) - s)) >"$W/logs/eval_untrained_s-$v-$n"
  stamp "run $v-$n: done"
}

chain() { # chain NAME CORPUS BATCH; CORPUS "shipped": models/tiny-target and data/tiny (make run today)
  local v=$1 corpus=$2 batch=$3 samples=$SAMPLES
  local tb=()
  [ "$TB" != 0 ] && tb=(--time-budget "$TB")
  if [ "$corpus" = shipped ]; then
    mkdir -p "$W/$v/model" "$W/$v/data"
    cp models/tiny-target/* "$W/$v/model/"
    cp data/tiny/chat-train.jsonl data/tiny/chat-heldout.jsonl "$W/$v/data/"
    samples=$SHIPPED_SAMPLES
    stamp "target $v: the shipped one (models/tiny-target, data/tiny), $samples samples"
  else
    stamp "target $v: $corpus, batch $batch, ${TB}s"
    if ! tmo 330 "$PY" scripts/train_target.py --shape tiny --corpus "$corpus" --batch "$batch" "${tb[@]}" \
      --seed 0 --out "$W/$v/model" --data "$W/$v/data" --n-train "$N_TRAIN" --n-heldout "$N_HELD" \
      --gen-batch "$GEN_BATCH" "${TEXTRA[@]}" >"$W/logs/target-$v.log" 2>&1; then
      stamp "target $v failed (tail of $W/logs/target-$v.log):"
      tail -8 "$W/logs/target-$v.log"
      return 1
    fi
    stamp "target $v ready: $(grep -h 'held-out loss' "$W/logs/target-$v.log")"
    grep -h -E "ms/step|structured training|greedy bytes|done in" "$W/logs/target-$v.log" | sed "s/^/  $v: /" || true
  fi
  while [ ! -e "$W/build.done" ]; do
    [ "$(left)" -gt 0 ] || { stamp "target $v: deadline while waiting for the build"; return 1; }
    sleep 2
  done
  [ -e "$W/build.ok" ] || { stamp "target $v: no build (see $W/logs/build.log)"; return 1; }
  local n pids=() fail=0
  for n in $samples; do # as run_default.sh prepares data/tiny/train-000.dfs
    python3 scripts/prepare_data.py --tokenizer "$W/$v/model" --out "$W/$v/data/train$n" \
      "$W/$v/data/chat-train.jsonl" --max-samples "$n" --max-len 512 >"$W/logs/prepare-$v-$n.log" 2>&1 ||
      { stamp "target $v: prepare_data failed ($W/logs/prepare-$v-$n.log)"; return 1; }
  done
  python3 scripts/prepare_data.py --tokenizer "$W/$v/model" --out "$W/$v/data/heldout" \
    "$W/$v/data/chat-heldout.jsonl" >"$W/logs/prepare-$v-heldout.log" 2>&1 ||
    { stamp "target $v: prepare_data failed ($W/logs/prepare-$v-heldout.log)"; return 1; }
  for n in $samples; do
    run_one "$v" "$n" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  return $fail
}

SHIPPED_NAMES=$(echo "$VARIANTS" | awk '$2 == "shipped" {printf "%s%s", s, $1; s="|"}')
SHIPPED_NAMES=${SHIPPED_NAMES:-none}
chains=()
while read -r v corpus batch; do
  [ -n "$v" ] || continue
  chain "$v" "$corpus" "$batch" &
  chains+=($!)
done <<<"$VARIANTS"
cfail=0
for p in "${chains[@]}"; do wait "$p" || cfail=1; done
wait "$build_pid" || true
[ -e "$W/build.ok" ] || { echo "build failed: tail of $W/logs/build.log"; tail -20 "$W/logs/build.log"; }
stamp "all chains done (some failed: $cfail)"

# 4. the table and the JSON (also when some runs failed: what exists is reported)
"$PY" bench/demo/demo_report.py --work "$W" --variants "$VARIANTS" --samples "$SAMPLES" \
  --shipped-samples "$SHIPPED_SAMPLES" --out "$OUT" || echo "report failed"

# 5. archives: the best run's target and data, and everything small
best=$(cat "$OUT/demo_best.txt" 2>/dev/null || true)
if [ -n "$best" ]; then
  bv=${best%-*}
  bn=${best##*-}
  stamp "best run: $best (target $bv, $bn samples)"
  tar czf "$OUT/demo_best.tgz" -C "$W" "$bv/model" "$bv/data/chat-train.jsonl" "$bv/data/chat-heldout.jsonl" \
    "$bv/data/train$bn-000.dfs" "$bv/data/heldout-000.dfs" "topo-$best.json" \
    "runs/$best/train_summary.json" "runs/$best/ledger_audit.json" "runs/$best/eval_trained.json" \
    "runs/$best/eval_untrained.json" "runs/$best/eval_trained.txt" "logs/target-$bv.log" || echo "tar of the best run failed"
fi
# every trained variant's target and answers (not the shipped copy), every run's figures
(cd "$W" && ls -d ./*/model ./*/data/chat-*.jsonl logs topo-*.json runs/*/train_summary.json runs/*/ledger_audit.json \
  runs/*/eval_*.json runs/*/eval_*.txt runs/*/metrics 2>/dev/null | grep -v -E "^\./($SHIPPED_NAMES)/") >"$W/all.list" || true
tar czf "$OUT/demo_all.tgz" -C "$W" -T "$W/all.list" || echo "tar of all runs failed"
if [ "$(stat -c %s "$OUT/demo_all.tgz" 2>/dev/null || echo 0)" -gt 15000000 ]; then # the 16 MiB a file may bring back
  echo "demo_all.tgz over 15 MB: again without the training answers"
  grep -v chat-train "$W/all.list" >"$W/all2.list"
  tar czf "$OUT/demo_all.tgz" -C "$W" -T "$W/all2.list" || echo "tar of all runs failed"
fi
ls -la "$OUT"
stamp "train_demo_target: done"
