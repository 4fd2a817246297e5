#!/usr/bin/env bash
# bench/pipeline/validator.sh: what the GPU validator costs training. GPU machine only.
#   bench/pipeline/validator.sh [1.7b|8b]        (BUILD=build-cuda; make CUDA=1 first)
# The same pipeline (configs/qwen3-<shape>-s768.json: documents of 768 random tokens, 256
# anchors, 10 per batch, one GPU) runs twice on the same data with the same checkpoint
# cadence (every CKPT_EVERY steps, written beside training):
#   off: no validator;
#   on:  a validator worker on GPU 0 with validation.every_steps = CKPT_EVERY, scoring
#        MAX_SAMPLES held-out documents of 768 tokens per checkpoint.
# Prints samples/s of each (steady state: the steps after the first 10%, and end to end, by
# bench/pipeline/report.py), the slowdown, and the validator's figures: seconds per
# evaluation (eval_s, of which load_s loading and verifying the checkpoint on the CPU),
# the start-up features (target forward on the GPU), its device memory; and the evaluation
# interval at which the measured cost would be 3%. Writes
# bench/results/pipeline/validator_<shape>.json (and, when OUT is set, copies it and every
# log to $OUT/validator_<shape>/).
# Env: TRAIN (training documents; default 1000 at 1.7b, 600 at 8b), CKPT_EVERY (steps;
# default 20 at 1.7b, 15 at 8b), MAX_SAMPLES (default 64), KEEP (keep_checkpoints, default 3
# at 1.7b, 2 at 8b: an 8b checkpoint with its optimizer state is about 12.6 GB),
# PIPELINE_TIMEOUT (seconds per run, default 400), ORDER ("off on" or "on off").
# Memory: the 8b drafter context alone is about 79 GiB: 8b needs an H200 (the 1.7b run fits
# an H100).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
shape=${1:-1.7b}
case "$shape" in
  1.7b) train=${TRAIN:-1000}; every=${CKPT_EVERY:-20}; keep=${KEEP:-3} ;;
  8b) train=${TRAIN:-600}; every=${CKPT_EVERY:-15}; keep=${KEEP:-2} ;;
  *) echo "bench/pipeline/validator.sh: shape must be 1.7b or 8b, got '$shape'" >&2; exit 2 ;;
esac
BUILD=${BUILD:-build-cuda}
PY=${PYTHON:-python3}
samples=${MAX_SAMPLES:-64}
res=bench/results/pipeline
out_dir=""
[ -n "${OUT:-}" ] && out_dir=$OUT/validator_$shape
mkdir -p "$res" gpu/models gpu/data gpu/runs ${out_dir:+"$out_dir"}
log=${out_dir:-$res}/validator_${shape}.log
say() { echo "$*" | tee -a "$log"; }
: >"$log"
for b in orchestrator target_worker postproc_worker drafter_worker validator cuda_helper; do
  [ -x "$BUILD/bin/$b" ] || { say "bench/pipeline/validator.sh: $BUILD/bin/$b missing (make CUDA=1)"; exit 1; }
done
model=gpu/models/qwen3-$shape
data=gpu/data/qwen3-$shape-s768v
cfg=configs/qwen3-$shape-s768.json
if [ ! -f "$model/config.json" ] || [ ! -f "$data-train-000.dfs" ] || [ ! -f "$data-heldout-000.dfs" ]; then
  say "== making the random-weight target and data ($train training, $samples held-out documents of 768 tokens)"
  $PY scripts/make_gpu_target.py --shape "$shape" --out "$model" --data "$data" --generate 0 --min-len 768 \
    --max-len 768 --train "$train" --heldout "$samples" 2>&1 | grep -v 'Writing model shards' | tee -a "$log"
  [ -f "$data-heldout-000.dfs" ] || { say "make_gpu_target.py failed"; exit 1; }
fi

run() { # run off|on: one pipeline run, its report JSON in gpu/runs/val-<shape>-<mode>.report.json
  local mode=$1 name=val-$shape-$1
  rm -rf "gpu/runs/$name"
  $PY - "$cfg" "gpu/runs/$name.topology.json" "gpu/runs/$name" "$data" "$every" "$keep" "$samples" "$mode" <<'PY'
import json, sys
cfg, out, run_dir, data, every, keep, samples, mode = sys.argv[1:]
t = json.load(open(cfg))
t["name"] = run_dir.rsplit("/", 1)[1]
t["run_dir"] = run_dir
t["data"]["shards"] = [f"{data}-train-000.dfs"]
t["drafter"]["checkpoint_every"] = int(every)
t["drafter"]["keep_checkpoints"] = int(keep)
t["drafter"]["checkpoint_async"] = True
if mode == "on":
    t["validation"] = {"shards": [f"{data}-heldout-000.dfs"], "max_samples": int(samples), "every_steps": int(every)}
    t["workers"].append({"name": "validator", "role": "validator", "gpu": 0})
json.dump(t, open(out, "w"), indent=1)
PY
  say "== $mode: $BUILD/bin/orchestrator gpu/runs/$name.topology.json"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "${PIPELINE_TIMEOUT:-400}" "$BUILD/bin/orchestrator" "gpu/runs/$name.topology.json" \
    >"gpu/runs/$name.log" 2>&1
  rc=$?
  say "$mode: orchestrator exit $rc after $(( $(date +%s) - t0 ))s"
  [ -n "$out_dir" ] && { cp "gpu/runs/$name.log" "$out_dir/"; mkdir -p "$out_dir/$name";
                         cp -r "gpu/runs/$name/logs" "gpu/runs/$name/metrics" "$out_dir/$name/" 2>/dev/null; }
  if [ $rc != 0 ]; then
    tail -30 "gpu/runs/$name.log" | tee -a "$log"
    [ -f "gpu/runs/$name/logs/validator.log" ] && tail -20 "gpu/runs/$name/logs/validator.log" | tee -a "$log"
    return 1
  fi
  $PY bench/pipeline/report.py "gpu/runs/$name" --label "$name" --json "gpu/runs/$name.report.json" 2>&1 |
    sed -n '1,4p' | tee -a "$log"
  rm -rf "gpu/runs/$name/checkpoints" # tens of GB at 8b; the metrics and logs stay
}

ok=1
for mode in ${ORDER:-off on}; do run "$mode" || ok=0; done

$PY - "$shape" "$res/validator_$shape.json" "gpu/runs/val-$shape" "$every" "$samples" <<'PY' | tee -a "$log"
import json, os, re, sys
shape, out, base, every, samples = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
res = {"shape": shape, "ckpt_every": every, "max_samples": samples}
for mode in ("off", "on"):
    p = f"{base}-{mode}.report.json"
    if os.path.exists(p):
        r = json.load(open(p))
        res[mode] = {k: r.get(k) for k in ("steps", "samples", "wall_s", "samples_s", "steady_samples_s", "tok_s",
                                            "steady_tok_s", "exactly_once")}
vpath = f"{base}-on/metrics/validator.jsonl"
if os.path.exists(vpath):
    L = [json.loads(l) for l in open(vpath) if l.strip()]
    ev = [x["eval_s"] for x in L]
    ld = [x.get("load_s", 0.0) for x in L]
    v = {"evaluations": len(L), "steps": [x["step"] for x in L]}
    if L:
        v.update(eval_s_mean=sum(ev) / len(ev), eval_s_max=max(ev), load_s_mean=sum(ld) / len(ld),
                 score_s_mean=sum(e - l for e, l in zip(ev, ld)) / len(ev), val_loss_last=L[-1]["val_loss"])
    logp = f"{base}-on/logs/validator.log"
    if os.path.exists(logp):
        text = open(logp, errors="replace").read()
        m = re.findall(r"held-out set: (\d+) samples, (\d+) tokens .*; features ([\d.]+) MiB in (.*) "
                       r"\(target forward on ([^,]+), ([\d.]+) s\)$", text, re.M)
        if m:
            n, tok, mib, where, dev, s = m[-1]
            v.update(features_samples=int(n), features_tokens=int(tok), features_mib=float(mib),
                     features_where=where.strip(), features_device=dev, features_s=float(s))
        m = re.findall(r"drafter forward context: ([\d.]+) GiB", text)
        if m:
            v["device_gib"] = float(m[-1])
        v["pruned_before_scored"] = text.count("pruned before it was scored")
    res["validator"] = v
print(f"validator bench, Qwen3-{shape} shape, checkpoints every {every} steps, {samples} held-out documents:")
for mode in ("off", "on"):
    r = res.get(mode)
    if r:
        print(f"  {mode:>3}: {r['samples_s']:.2f} samples/s end to end, {r['steady_samples_s']:.2f} steady "
              f"({r['steps']} steps, {r['wall_s']:.1f}s, exactly once {r['exactly_once']})")
    else:
        print(f"  {mode:>3}: no result")
v = res.get("validator", {})
if v.get("evaluations"):
    print(f"  validator: {v['evaluations']} evaluations (steps {v['steps']}); {v['eval_s_mean']:.2f}s each on average "
          f"(max {v['eval_s_max']:.2f}s), of which {v['load_s_mean']:.2f}s loading the checkpoint and "
          f"{v['score_s_mean']:.2f}s scoring; {v.get('pruned_before_scored', 0)} checkpoints pruned before scored")
if "features_s" in v:
    print(f"  validator start-up: {v['features_samples']} samples, {v['features_tokens']} tokens through the target on "
          f"{v['features_device']} in {v['features_s']:.2f}s; features {v['features_mib']:.0f} MiB in {v['features_where']}; "
          f"drafter forward context {v.get('device_gib', float('nan')):.2f} GiB on the device")
if res.get("off") and res.get("on"):
    for k in ("steady_samples_s", "samples_s"):
        res[f"slowdown_{k}_pct"] = 100.0 * (1.0 - res["on"][k] / res["off"][k])
    # seconds of training between two evaluations at this cadence (10 documents per step)
    docs_per_step = res["off"]["samples"] / max(1, res["off"]["steps"])
    interval = every * docs_per_step / res["off"]["steady_samples_s"]
    res["eval_interval_s"] = interval
    sd = res["slowdown_steady_samples_s_pct"]
    res["interval_for_3pct_s"] = interval * sd / 3.0 if sd > 0 else 0.0
    print(f"  slowdown: {sd:.2f}% steady state, {res['slowdown_samples_s_pct']:.2f}% end to end, with an evaluation "
          f"every {interval:.1f}s of training; at this cost per evaluation the slowdown stays under 3% while "
          f"evaluations are at least {res['interval_for_3pct_s']:.1f}s of training apart (one run each: differences "
          f"of 1-2% can be run-to-run noise)")
json.dump(res, open(out, "w"), indent=1)
print(f"  -> {out}")
PY
[ -n "$out_dir" ] && cp "$res/validator_$shape.json" "$out_dir/" 2>/dev/null
[ $ok = 1 ] || { echo "bench/pipeline/validator.sh: a run failed (logs above)"; exit 1; }
