#!/usr/bin/env bash
# bench/target/run.sh: our CUDA target forward (bench_target) and the transformers peer
# (peer_transformers.py) on the same GPU in one call; prints ONE side-by-side table and
# writes bench/results/target.json (plus target_ours.json, target_peer.json and logs).
# Usage: bench/target/run.sh [--build]    (BUILD=build-cuda by default; --build runs
#   make CUDA=1 for the bench first, with DEPS_PREFIX=.deps/root when that exists)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-cuda}
res=bench/results; mkdir -p "$res"
if [ "${1:-}" = "--build" ]; then
  deps=""; [ -f .deps/root/usr/include/uv.h ] && deps="DEPS_PREFIX=.deps/root"
  root=${BUILD%-cuda}
  make -j"$(nproc)" CUDA=1 $deps BUILD_ROOT="$root" "$BUILD/bench/bench_target"
fi
bin=$BUILD/bench/bench_target
[ -x "$bin" ] || { echo "run.sh: $bin missing: build with make CUDA=1 (or pass --build)" >&2; exit 2; }
echo "== ours: $bin"
timeout --kill-after=10 580 "$bin" --json "$res/target_ours.json" 2>&1 | tee "$res/target_ours.log"
echo "== peer: transformers"
timeout --kill-after=10 580 python3 bench/target/peer_transformers.py --json "$res/target_peer.json" \
  >"$res/target_peer.log" 2>&1 || { echo "peer failed: tail of $res/target_peer.log:"; tail -20 "$res/target_peer.log"; exit 1; }
python3 - "$res" <<'PY'
import json, subprocess, sys, time
res = sys.argv[1]
ours = json.load(open(f"{res}/target_ours.json"))
peer = json.load(open(f"{res}/target_peer.json"))
pk = {(r["model"], r["T"]): r for r in peer["results"]}
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
rows = []
print(f"\ntarget forward, {ours['device']}: GEMM ceiling {ours['gemm_ceiling_tflops']:.0f} TFLOP/s (cuBLASLt, ours), "
      f"{peer['torch_matmul_ceiling_tflops']:.0f} (torch, peer)")
hdr = f"{'model':11} {'layout':30} {'ours tok/s':>11} {'MFU':>6} {'peer B x T':>10} {'peer tok/s':>11} {'MFU':>6} {'speedup':>8}"
print(hdr); print("-" * len(hdr))
for r in ours["results"]:
    p = pk.get((r["model"], r["T"])) if r["T"] else None
    sp = r["tok_s"] / p["tok_s"] if p else None
    rows.append(dict(ours=r, peer=p, speedup=sp))
    print(f"{r['model']:11} {r['layout'][:30]:30} {r['tok_s']:11.0f} {100*r['mfu']:5.1f}% "
          f"{(str(p['B'])+' x '+str(p['T'])) if p else '-':>10} {p['tok_s'] if p else 0:11.0f} "
          f"{100*p['mfu'] if p else 0:5.1f}% {('%.2fx' % sp) if sp else '-':>8}")
print("ours: layers 0..last captured (5 DFlash default layers), one packed row, CUDA graph; "
      "peer: all layers, model.model(output_hidden_states=True), sdpa")
out = dict(bench="target_forward", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=commit, device=ours["device"],
           gemm_ceiling_tflops=ours["gemm_ceiling_tflops"], peer=peer.get("peer"), rows=rows)
with open(f"{res}/target.json", "w") as f:
    json.dump(out, f, indent=2)
print(f"wrote {res}/target.json")
PY
