#!/usr/bin/env bash
# bench/pipeline/run.sh: the whole pipeline on one GPU at a real target shape, beside the
# stage-alone ceilings and the single-process PyTorch peer, measured in the same call on the
# same data. GPU machine only.
#   bench/pipeline/run.sh 1.7b|8b|30b-a3b [s768|full]        (BUILD=build-cuda; make CUDA=1 first)
# Workloads:
#   s768 (default): configs/qwen3-<shape>-s768.json: documents of exactly 768 random
#        tokens (TRAIN of them; default 3000 at 1.7b, 1200 at 8b), 256 anchors each, 10 per
#        batch; stage-alone: bench_target 10 documents of 768 packed in 7680 tokens (as the
#        pipeline's batch), bench_drafter S = 768 / 256 anchors, 10 documents per step
#   full: configs/qwen3-<shape>.json: 1.7b self-generated text, 8b random tokens of 512-2048
#        (the earlier benchmark); stage-alone: bench_target T = 8192, bench_drafter S = 2048 /
#        512 anchors
# 30b-a3b: the Qwen3-30B-A3B mixture-of-experts shape with LAYERS decoder layers (default 8;
#   each one the real shape: 128 experts of width 768, top 8, about 1.26 GB in bf16; the 48
#   layers' 61 GB do not fit the GPU machine's disk): model gpu/models/qwen3-30b-a3b-l$LAYERS,
#   random tokens (s768: TRAIN default 2000; full: 320 of 512-2048), run name
#   qwen3-30b-a3b-l$LAYERS[-s768]. Its topology is written at run time to
#   gpu/runs/<name>.topology.json from configs/qwen3-30b-a3b.json (the 48-layer layout: rings,
#   workers, drafter) with this model, data, run dir and workload, and the capture layers of
#   the DFlash rule for LAYERS layers (scripts/make_topology.py default_layer_ids; 5 distinct
#   ones need LAYERS >= 8; 8 -> 1..5, so the target runs 6 of its 8 layers): written, not
#   committed, because the capture layers and the model directory follow LAYERS. The writer
#   checks that a batch fits the ring slots (161 MiB each; a batch needs 150 MiB at s768, 161
#   at full) and prints make_topology.py's one-GPU memory estimate (LAYERS 8, 6 run: target
#   weights 7.5 GiB, its workspace 0.9, drafter + AdamW + embedding / head 6.3, the 8 slots
#   1.3: about 16 GiB of the 80; refused above 80). Stage-alone: bench_moe --layers <the
#   layers the pipeline's target runs> with the batch's tokens and documents (s768: 10 x 768,
#   --doc-len; full: 4 x 2048 and 2 x 4096), bench_drafter --shape 30b-a3b; the peer runs
#   transformers' Qwen3MoeForCausalLM with its experts on PEER_EXPERTS (default grouped_mm;
#   empty: transformers' default; the backend that ran is in its JSON)
# 1. makes the random-weight target (scripts/make_gpu_target.py) and the workload's data if
#    missing
# 2. runs the orchestrator on the workload's topology (run dir gpu/runs/<name>)
# 3. bench_target and bench_drafter (target alone, drafter alone; SKIP_ALONE=1 skips them)
# 4. the peer on the same topology and shards (bench/pipeline/peer_pipeline.py: transformers
#    target forward, then the PyTorch DFlash step + AdamW, batch after batch; PEER_ARGS adds
#    options, e.g. "--compile --batches 12"; PEER_ATTN lists the step's attention, one peer
#    run each, default "auto sdpa": flex_attention + torch.compile where it runs, then the
#    eager SDPA step; SKIP_PEER=1 skips the peers)
# 5. prints the table (ours vs the peer: samples/s, tokens/s, ratio) and writes
#    bench/results/pipeline/pipeline_<name>.json (bench/pipeline/report.py)
# CKPT_EVERY=N (and CKPT_ASYNC=0|1): our run checkpoints every N steps (the configs say
#    100000: none before the end), written beside training or, with CKPT_ASYNC=0, in the
#    loop; the config is copied to gpu/runs/<name>.topology.json with those two fields set
#    (what checkpoints cost the pipeline; docs/drafter.md)
# MPS=1: our run goes under the CUDA Multi-Process Service, so the target's and the
#    drafter's kernels may share the GPU at the same time instead of taking time slices: the
#    script starts a control daemon of its own (pipe and log directories under gpu/mps) before
#    the orchestrator and stops it right after; the stage-alone benches and the peers (one
#    process each) run without it. Our files get the suffix _mps (pipeline_<name>_mps.*), so
#    a call can run the workload both ways (docs/pipeline.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
shape=${1:?usage: bench/pipeline/run.sh 1.7b|8b|30b-a3b [s768|full]}
work=${2:-s768}
BUILD=${BUILD:-build-cuda}
PY=${PYTHON:-python3}
res=bench/results/pipeline; mkdir -p "$res" gpu/models gpu/data
case "$shape" in 1.7b|8b|30b-a3b) ;; *) echo "bench/pipeline/run.sh: shape must be 1.7b, 8b or 30b-a3b, got '$shape'" >&2; exit 2 ;; esac
model=gpu/models/qwen3-$shape
moe=0
if [ "$shape" = 30b-a3b ]; then
  moe=1; LAYERS=${LAYERS:-8}
  case "$LAYERS" in ''|*[!0-9]*) n=0 ;; *) n=$((10#$LAYERS)) ;; esac
  if [ "$n" -lt 8 ] || [ "$n" -gt 48 ]; then
    echo "bench/pipeline/run.sh: LAYERS must be 8..48 (5 distinct capture layers need 8), got '$LAYERS'" >&2; exit 2
  fi
  LAYERS=$n; model=gpu/models/qwen3-30b-a3b-l$LAYERS
fi
case "$work" in
  s768) name=qwen3-$shape-s768; data=gpu/data/qwen3-$shape-s768
        case "$shape" in 1.7b) train=${TRAIN:-3000} ;; 8b) train=${TRAIN:-1200} ;; *) train=${TRAIN:-2000} ;; esac
        gen="--generate 0 --min-len 768 --max-len 768 --train $train --heldout 8"
        tgt_tokens=7680; tgt_doc="--doc-len 768"; dr_seq=768; dr_anchors=256 ;;
  full) name=qwen3-$shape; data=gpu/data/qwen3-$shape
        if [ "$shape" = 1.7b ]; then gen="--generate 224 --train ${TRAIN:-2048} --heldout 32 --batch 512"
        else gen="--generate 0 --train ${TRAIN:-320} --heldout 8"; fi
        tgt_tokens=8192; tgt_doc=""; dr_seq=2048; dr_anchors=512 ;;
  *) echo "bench/pipeline/run.sh: workload must be s768 or full, got '$work'" >&2; exit 2 ;;
esac
cfg=configs/$name.json
[ $moe = 1 ] && { name=${name/qwen3-30b-a3b/qwen3-30b-a3b-l$LAYERS}; gen="$gen --layers $LAYERS"; }
if [ ! -f "$model/config.json" ] || [ ! -f "$data-train-000.dfs" ]; then
  # shellcheck disable=SC2086
  $PY scripts/make_gpu_target.py --shape "$shape" --out "$model" --data "$data" $gen
fi
if [ $moe = 1 ]; then # the topology of this model and workload (the header's 30b-a3b paragraph)
  mkdir -p gpu/runs; cfg=gpu/runs/$name.topology.json
  python3 - configs/qwen3-30b-a3b.json "$cfg" "$model" "$data" "$name" "$work" <<'PY' || exit 1
import json, sys
sys.path.insert(0, "scripts")
import make_topology as mt
src, out, model, data, name, work = sys.argv[1:]
t = json.load(open(src))
shape = mt.read_config(model)[3]
cap = mt.default_layer_ids(t["drafter"]["num_layers"], shape["num_hidden_layers"])
t.update(name=name, run_dir=f"gpu/runs/{name}",
         description=f"benchmark: bench/pipeline/run.sh 30b-a3b {work}, written from {src}: {model} "
                     f"({shape['num_hidden_layers']} layers, capture {cap}); throughput on one GPU only")
t["target"].update(model_dir=model, capture_layers=cap)
t["data"]["shards"] = [f"{data}-train-000.dfs"]
if work == "s768":
    t["data"].update(token_budget=7680, max_seq_len=768)
    t["drafter"]["num_anchors"] = 256
budget, anchors = t["data"]["token_budget"], t["drafter"]["num_anchors"]
for r in t["rings"]:
    need = mt.batch_bytes(budget, len(cap), shape["hidden_size"], 2, mt.BATCH_MAX_DOCS, anchors, pd=r["name"] != "tp")
    if r["slot_bytes"] < need:
        sys.exit(f"{src}: ring {r['name']}: slot_bytes {r['slot_bytes']} < the {need} a batch needs")
for g, (tot, items) in mt.memory_per_gpu(shape, cap, t["drafter"]["num_layers"], budget, t["workers"], t["rings"],
                                         False).items():
    print(f"== memory estimate, GPU {g}: {tot / 2**30:.1f} GiB: " + ", ".join(f"{w} {b / 2**30:.2f}" for w, b in items))
    if tot > 80 * 2**30:
        sys.exit(f"{name}: the estimate passes an 80 GiB GPU (fewer LAYERS)")
json.dump(t, open(out, "w"), indent=1)
print(f"== topology {out}: capture layers {cap} of {shape['num_hidden_layers']}")
PY
fi
rm -rf "gpu/runs/$name"
run_cfg=$cfg
if [ -n "${CKPT_EVERY:-}" ]; then
  mkdir -p gpu/runs; run_cfg=gpu/runs/$name.topology.json
  python3 - "$cfg" "$run_cfg" "$CKPT_EVERY" "${CKPT_ASYNC:-1}" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["drafter"]["checkpoint_every"] = int(sys.argv[3])
t["drafter"]["checkpoint_async"] = sys.argv[4] != "0"
json.dump(t, open(sys.argv[2], "w"), indent=1)
PY
fi
ours=$name
mps_stop() { :; }
if [ "${MPS:-0}" = 1 ]; then
  ours=${name}_mps
  command -v nvidia-cuda-mps-control >/dev/null ||
    { echo "bench/pipeline/run.sh: MPS=1, but nvidia-cuda-mps-control is not on the PATH" >&2; exit 1; }
  export CUDA_MPS_PIPE_DIRECTORY=$PWD/gpu/mps/pipe CUDA_MPS_LOG_DIRECTORY=$PWD/gpu/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d ||
    { echo "bench/pipeline/run.sh: nvidia-cuda-mps-control -d failed (logs: $CUDA_MPS_LOG_DIRECTORY)" >&2; exit 1; }
  mps_stop() {
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    mps_stop() { :; }
  }
  trap 'mps_stop' EXIT
  echo "== MPS control daemon started (gpu/mps); our run is its client"
fi
echo "== pipeline: $BUILD/bin/orchestrator $run_cfg"
t0=$(date +%s)
timeout --kill-after=10 "${PIPELINE_TIMEOUT:-400}" "$BUILD/bin/orchestrator" "$run_cfg" >"$res/pipeline_$ours.log" 2>&1 || {
  echo "orchestrator failed: tail of $res/pipeline_$ours.log"; tail -40 "$res/pipeline_$ours.log"
  [ "${MPS:-0}" = 1 ] && tail -20 "$CUDA_MPS_LOG_DIRECTORY"/*.log 2>/dev/null
  exit 1; }
echo "pipeline run: $(( $(date +%s) - t0 ))s"
mps_stop
extra=()
if [ "${SKIP_ALONE:-0}" != 1 ]; then
  echo "== target alone"
  if [ $moe = 1 ]; then # the layers the pipeline's target runs: 0 .. the last capture layer
    run_layers=$(python3 -c 'import json,sys; print(max(json.load(open(sys.argv[1]))["target"]["capture_layers"]) + 1)' "$cfg")
    # shellcheck disable=SC2086
    timeout 200 "$BUILD/bench/bench_moe" --layers "$run_layers" --tokens "$tgt_tokens" $tgt_doc --iters 5 --no-breakdown \
      --json "$res/pipeline_${name}_target.json" >"$res/pipeline_${name}_target.log" 2>&1 || tail -5 "$res/pipeline_${name}_target.log"
  else
    # shellcheck disable=SC2086
    timeout 200 "$BUILD/bench/bench_target" --models "$shape" --tokens "$tgt_tokens" $tgt_doc --iters 5 \
      --json "$res/pipeline_${name}_target.json" >"$res/pipeline_${name}_target.log" 2>&1 || tail -5 "$res/pipeline_${name}_target.log"
  fi
  echo "== drafter alone"
  # as many documents packed per step as the pipeline's batches hold (token_budget / S)
  dpb=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["data"]; print(max(1, d["token_budget"] // d["max_seq_len"]))' "$cfg")
  timeout 200 "$BUILD/bench/bench_drafter" --shape "$shape" --seq "$dr_seq" --anchors "$dr_anchors" --docs "$dpb" --iters 5 --warmup 2 \
    --json "$res/pipeline_${name}_drafter.json" >"$res/pipeline_${name}_drafter.log" 2>&1 || tail -5 "$res/pipeline_${name}_drafter.log"
  grep "optimizer:" "$res/pipeline_${name}_drafter.log" || true
  [ -f "$res/pipeline_${name}_target.json" ] && extra+=(--target-json "$res/pipeline_${name}_target.json")
  [ -f "$res/pipeline_${name}_drafter.json" ] && extra+=(--drafter-json "$res/pipeline_${name}_drafter.json")
fi
if [ "${SKIP_PEER:-0}" != 1 ]; then
  seq=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data"]["max_seq_len"])' "$cfg")
  anchors=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["drafter"]["num_anchors"])' "$cfg")
  experts=""; [ $moe = 1 ] && [ -n "${PEER_EXPERTS-grouped_mm}" ] && experts="--experts ${PEER_EXPERTS-grouped_mm}"
  for attn in ${PEER_ATTN:-auto sdpa}; do
    sfx=""; [ "$attn" = auto ] || sfx="_$attn"
    echo "== peer: bench/pipeline/peer_pipeline.py --topology $cfg --attn $attn (same shards)"
    rm -f "$res/pipeline_${name}_peer$sfx.json"
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 timeout --kill-after=10 "${PEER_TIMEOUT:-600}" $PY bench/pipeline/peer_pipeline.py --topology "$cfg" \
      --seq "$seq" --anchors "$anchors" --attn "$attn" --json "$res/pipeline_${name}_peer$sfx.json" $experts ${PEER_ARGS:-} 2>&1 |
      tee "$res/pipeline_${name}_peer$sfx.log" | grep -v "^\s*$" | tail -25 || true
    [ -f "$res/pipeline_${name}_peer$sfx.json" ] && extra+=(--peer-json "$res/pipeline_${name}_peer$sfx.json") ||
      echo "peer --attn $attn: no result (see $res/pipeline_${name}_peer$sfx.log)"
  done
fi
$PY bench/pipeline/report.py "gpu/runs/$name" --label "$ours" --json "$res/pipeline_$ours.json" ${extra[@]+"${extra[@]}"}
