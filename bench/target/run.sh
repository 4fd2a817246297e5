#!/usr/bin/env bash
# bench/target/run.sh: our CUDA target forward (bench_target) and the transformers peers
# (peer_transformers.py: eager, and torch.compile) on the same GPU in one call; prints ONE
# side-by-side table (ours, eager peer, compiled peer, both ratios) and writes
# bench/results/target.json (plus target_ours.json, target_peer.json and logs).
# Usage: bench/target/run.sh [--build]    (BUILD=build-cuda by default; --build runs
#   make CUDA=1 for the bench first, with DEPS_PREFIX=.deps/root when that exists)
# Environment: MODELS (default 1.7b,8b), COMPILE (peer modes, default "none,default";
#   add max-autotune-no-cudagraphs when there is time for its autotuning), COMPILE_SCOPE
#   (layers|model, default layers), OURS_ARGS (more bench_target arguments, e.g.
#   "--breakdown --variants default,base"; the table takes each layout's first variant).
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
MODELS=${MODELS:-1.7b,8b}
COMPILE=${COMPILE:-none,default}
# shellcheck disable=SC2086 # OURS_ARGS is a list of arguments
timeout --kill-after=10 580 "$bin" --models "$MODELS" ${OURS_ARGS:-} --json "$res/target_ours.json" 2>&1 |
  tee "$res/target_ours.log"
echo "== peer: transformers, modes $COMPILE"
timeout --kill-after=10 "${PEER_TIMEOUT:-1200}" python3 bench/target/peer_transformers.py --models "$MODELS" \
  --compile "$COMPILE" --compile-scope "${COMPILE_SCOPE:-layers}" --json "$res/target_peer.json" \
  >"$res/target_peer.log" 2>&1 || { echo "peer failed: tail of $res/target_peer.log:"; tail -20 "$res/target_peer.log"
  [ -s "$res/target_peer.json" ] || exit 1; echo "(tabling the rows it finished)"; }
python3 - "$res" <<'PY'
import json, subprocess, sys, time
res = sys.argv[1]
ours = json.load(open(f"{res}/target_ours.json"))
peer = json.load(open(f"{res}/target_peer.json"))
eager, comp, fails = {}, {}, []
for r in peer["results"]:
    k = (r["model"], r["T"])
    if "error" in r:
        fails.append(r)
    elif r.get("mode", "none") == "none":
        eager[k] = r
    elif k not in comp or r["tok_s"] > comp[k]["tok_s"]:
        comp[k] = r  # the fastest compiled mode
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
rows, seen = [], set()
print(f"\ntarget forward, {ours['device']}: GEMM ceiling {ours['gemm_ceiling_tflops']:.0f} TFLOP/s (cuBLASLt, ours), "
      f"{peer['torch_matmul_ceiling_tflops']:.0f} (torch, peer)")
hdr = (f"{'model':11} {'layout':26} {'ours tok/s':>10} {'MFU':>6} {'B x T':>8} {'eager tok/s':>11} {'MFU':>6} "
       f"{'compiled':>9} {'MFU':>6} {'mode':>10} {'vs eager':>8} {'vs comp':>8}")
print(hdr); print("-" * len(hdr))
f = lambda v, fmt: (fmt % v) if v is not None else "-"
for r in ours["results"]:
    key = (r["model"], r["layout"])
    if key in seen:
        continue  # the table takes each layout's first variant
    seen.add(key)
    k = (r["model"], r["T"])
    e, c = (eager.get(k), comp.get(k)) if r["T"] else (None, None)
    se = r["tok_s"] / e["tok_s"] if e else None
    sc = r["tok_s"] / c["tok_s"] if c else None
    rows.append(dict(ours=r, peer_eager=e, peer_compiled=c, speedup_vs_eager=se, speedup_vs_compiled=sc))
    bt = f"{r['B']} x {r['T']}" if (e or c) else "-"
    print(f"{r['model']:11} {r['layout'][:26]:26} {r['tok_s']:10.0f} {100*r['mfu']:5.1f}% {bt:>8} "
          f"{f(e and e['tok_s'], '%.0f'):>11} {f(e and 100*e['mfu'], '%.1f%%'):>6} "
          f"{f(c and c['tok_s'], '%.0f'):>9} {f(c and 100*c['mfu'], '%.1f%%'):>6} {(c['mode'][:10] if c else '-'):>10} "
          f"{f(se, '%.2fx'):>8} {f(sc, '%.2fx'):>8}")
print("ours: layers 0..last captured (5 DFlash default layers), one packed row, CUDA graph; "
      "peers: all layers, model.model(use_cache=False, output_hidden_states=True), sdpa; compiled: "
      f"torch.compile scope {peer.get('compile_scope')}, compile time excluded:")
for c in sorted(comp.values(), key=lambda r: (r["model"], r["T"])):
    print(f"  {c['model']} T={c['T']} mode {c['mode']}: first call (compile) {c.get('compile_s')} s")
for x in fails:
    print(f"  FAILED peer {x['model']} T={x['T']} mode {x['mode']}: {x['error'][:300]}")
out = dict(bench="target_forward", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), commit=commit, device=ours["device"],
           gemm_ceiling_tflops=ours["gemm_ceiling_tflops"], peer=peer.get("peer"),
           compile_scope=peer.get("compile_scope"), peer_failures=fails, rows=rows)
with open(f"{res}/target.json", "w") as fo:
    json.dump(out, fo, indent=2)
print(f"wrote {res}/target.json")
PY
