#!/usr/bin/env bash
# bench/target/moe_gpu_call.sh: the one device call of the CUDA mixture-of-experts work, each
# step logged and timed, a failed step never stopping the independent ones after it:
#   build     make -j16 CUDA=1 (DEPS_PREFIX=.deps/root when it is there)
#   fixture   the transformers fixture tests/fixtures/tiny-qwen3-moe* when absent
#             (scripts/make_moe_fixture.py), packed into $OUT/moe_fixture.tgz to commit, and
#             checked by the CPU test (test_target_moe: it compares both layouts to it)
#   test      gpu_test_moe (kernels, models, fixture, decode), then the dense regressions
#             gpu_test_target and the gpu_test_eval_* programs while the time allows
#   bench     bench_moe: the forward at the Qwen3-30B-A3B shape, LAYERS layers (default 48)
#   peer      bench/target/moe_peer.py: transformers at the same shape and layers (eager and
#             the fast experts backends)
#   decode    bench_decode --models 30b-a3b --batch 1: plain and speculative decoding
#   table     the summary, printed last
# Usage: bench/target/moe_gpu_call.sh     (from anywhere; runs in the repository root)
# Environment: OUT (output folder, default /tmp/moe_gpu_out), BUDGET (seconds for the whole
#   call, default 530), STEPS (default "build fixture test bench peer decode"), LAYERS (48),
#   PEER_LAYERS (default LAYERS), JOBS (16).
# Output (at most 7 files): $OUT/moe_call.log (every step's output), moe_ours.json,
#   moe_peer.json, moe_decode.json, moe_table.txt, moe_fixture.tgz (when made), moe_steps.txt.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/moe_gpu_out}
mkdir -p "$OUT" || exit 2
BUDGET=${BUDGET:-530}
STEPS=${STEPS:-build fixture test bench peer decode}
LAYERS=${LAYERS:-48}
PEER_LAYERS=${PEER_LAYERS:-$LAYERS}
JOBS=${JOBS:-16}
BUILD=build-cuda
LOG=$OUT/moe_call.log
STEPLOG=$OUT/moe_steps.txt
: >"$LOG"
: >"$STEPLOG"
T0=$(date +%s)

left() { echo $((BUDGET - ($(date +%s) - T0))); }
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
note() { echo "$*" | tee -a "$LOG"; }

# run NAME MAX_S MIN_S CMD...: CMD under a time limit of min(MAX_S, what is left - 15 s for
# the table); skipped (logged) when less than MIN_S is left. Output to the log.
run() {
  local name=$1 max=$2 min=$3 lim rc t
  shift 3
  lim=$(($(left) - 15))
  [ "$lim" -gt "$max" ] && lim=$max
  if [ "$lim" -lt "$min" ]; then
    note "== $name: SKIPPED (only $(left) s of the budget left, it needs $min)"
    echo "$name skipped-no-time" >>"$STEPLOG"
    return 124
  fi
  note "== $name (limit ${lim} s, $(($(date +%s) - T0)) s into the call): $*"
  t=$(date +%s)
  timeout --kill-after=10 "$lim" "$@" >>"$LOG" 2>&1
  rc=$?
  note "== $name: exit $rc after $(($(date +%s) - t)) s$([ $rc -eq 124 ] && echo ' (TIME LIMIT)')"
  echo "$name $rc $(($(date +%s) - t))s" >>"$STEPLOG"
  return $rc
}

note "moe_gpu_call: $(git rev-parse --short HEAD 2>/dev/null) steps [$STEPS] budget ${BUDGET}s layers $LAYERS"
nvidia-smi -L >>"$LOG" 2>&1

if want build; then
  deps=""
  [ -f .deps/root/usr/include/uv.h ] && deps="DEPS_PREFIX=.deps/root"
  # make's command lines are long: keep them out of the log unless it fails
  if ! run build 330 60 bash -c "make -j$JOBS CUDA=1 $deps > $OUT/.build.out 2>&1 || { tail -60 $OUT/.build.out; exit 1; }"; then
    note "build failed: later steps use whatever binaries exist"
  fi
  rm -f "$OUT/.build.out"
fi

FIX=tests/fixtures
if want fixture; then
  if [ -f $FIX/tiny-qwen3-moe-ref.safetensors ] && [ -d $FIX/tiny-qwen3-moe ]; then
    note "== fixture: present, not remade"
  else
    if run fixture 150 30 python3 scripts/make_moe_fixture.py --out $FIX; then
      tar czf "$OUT/moe_fixture.tgz" $FIX/tiny-qwen3-moe $FIX/tiny-qwen3-moe-alt $FIX/tiny-qwen3-moe-ref.safetensors &&
        note "fixture packed: $OUT/moe_fixture.tgz ($(du -k "$OUT/moe_fixture.tgz" | cut -f1) KB)"
    fi
  fi
  # the CPU path against the fixture: what committing it will make test_target_moe check
  [ -x $BUILD/tests/test_target_moe ] && run cpu_test_target_moe 90 10 $BUILD/tests/test_target_moe
fi

if want test; then
  for t in gpu_test_moe gpu_test_target gpu_test_eval_target gpu_test_eval_drafter gpu_test_eval_lossless \
           gpu_test_eval_kernels gpu_test_eval_rows gpu_test_eval_batch; do
    if [ ! -x $BUILD/tests/$t ]; then
      note "== $t: MISSING ($BUILD/tests/$t not built)"
      echo "$t missing" >>"$STEPLOG"
      continue
    fi
    case $t in
    gpu_test_moe) run $t 240 60 $BUILD/tests/$t ;;
    *) run $t 150 20 $BUILD/tests/$t ;; # the dense regressions: only with time to spare
    esac
    # the test steps must leave the benches their time: stop after the MoE test when short
    [ "$t" = gpu_test_moe ] && [ "$(left)" -lt 330 ] && { note "== dense regression tests: SKIPPED (keeping time for the benches)"; break; }
  done
fi

if want bench; then
  if [ -x $BUILD/bench/bench_moe ]; then
    run bench_moe 180 40 $BUILD/bench/bench_moe --layers "$LAYERS" --json "$OUT/moe_ours.json"
  else
    note "== bench_moe: MISSING"
  fi
fi

if want peer; then
  run peer 200 60 python3 bench/target/moe_peer.py --layers "$PEER_LAYERS" --json "$OUT/moe_peer.json"
fi

if want decode; then
  if [ -x $BUILD/bench/bench_decode ]; then
    run decode 170 60 $BUILD/bench/bench_decode --models 30b-a3b --batch 1 --timeout 160 --json "$OUT/moe_decode.json"
  else
    note "== bench_decode: MISSING"
  fi
fi

python3 - "$OUT" "$STEPLOG" >"$OUT/moe_table.txt" 2>&1 <<'PY'
import json, os, sys
out, steplog = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(out, name)
    try:
        return json.load(open(p))
    except Exception as e:  # noqa: BLE001 - a missing or cut file: say so, table the rest
        print(f"({name}: {type(e).__name__}: {e})")
        return None
print("steps (name, exit code, time):")
for line in open(steplog):
    print("  " + line.rstrip())
ours, peer, dec = load("moe_ours.json"), load("moe_peer.json"), load("moe_decode.json")
if ours:
    print(f"\nforward, {ours['device']}: Qwen3-30B-A3B shape, ours {ours['layers_run']} layers"
          f"{' (asked ' + str(ours['layers_asked']) + ')' if ours['layers'] != ours['layers_asked'] else ''}, "
          f"{ours['tokens']} tokens a row; GEMM ceiling {ours['gemm_ceiling_tflops']:.0f} TFLOP/s")
    pe = {}
    if peer:
        print(f"peer {peer['peer']}: {peer.get('layers')} layers, default experts backend "
              f"{peer.get('default_backend')}")
        for r in peer["results"]:
            pe.setdefault(r["T"], []).append(r)
    hdr = f"{'layout':16} {'ours tok/s':>10} {'MFU act':>7} {'ms/layer':>8} | {'peer mode (ran)':24} {'tok/s':>8} {'MFU act':>7} {'ms/layer':>8} {'ours speed-up (per layer)':>25}"
    print(hdr)
    print("-" * len(hdr))
    for r in ours["results"]:
        rows = pe.get(r["T"], []) or [None]
        for i, p in enumerate(rows):
            left = (f"{r['layout'][:16]:16} {r['tok_s']:10.0f} {100 * r['mfu_active']:6.1f}% {r['per_layer_ms']:8.3f}"
                    if i == 0 else " " * 45)
            if p is None:
                print(left + " | -")
            elif "ms" not in p:
                why = p.get("skipped") or p.get("error") or "?"
                print(left + f" | {p['mode'][:24]:24} {why[:70]}")
            else:
                ran = f"{p['mode']} ({p.get('backend_ran')})"
                print(left + f" | {ran[:24]:24} {p['tok_s']:8.0f} {100 * p['mfu_active']:6.1f}% "
                      f"{p['per_layer_ms']:8.3f} {p['per_layer_ms'] / r['per_layer_ms']:24.2f}x")
        if not r.get("graph_bits_equal_eager", True):
            print("  !! graph replay differed from the eager forward")
    if ours.get("breakdown"):
        print(f"one sparse layer's MLP at {ours['tokens']} rows ({ours.get('breakdown_avg_active_experts', 0):.0f} "
              "experts active):")
        for b in ours["breakdown"]:
            print(f"  {b['op'][:40]:40} {b['ms']:8.3f} ms" + (f" {b['tflops']:6.1f} TFLOP/s" if b["tflops"] else ""))
if dec:
    for s in dec.get("shapes", []):
        print(f"\ndecode {s['shape']} ({dec.get('device')}): plain step {s['plain_step_ms']:.3f} ms "
              f"(floor {s['plain_floor_ms']:.3f}, {s['plain_pct_ceiling']:.0f}% of the copy ceiling), verify-16 "
              f"{s['verify16_ms']:.3f} ms, draft {s['draft_ms']:.3f} ms; plain loop {s['plain_tpot_ms']:.3f} ms/token")
        for q in s.get("spec", []):
            print(f"  speculative, drafts corrupted p = {q['corrupt']:.2f}: tau {q['tau']:.2f}, {q['tpot_ms']:.3f} "
                  f"ms/token ({q['speedup']:.2f}x plain), lossless {q['lossless']}")
PY
cat "$OUT/moe_table.txt" | tee -a "$LOG"
note "moe_gpu_call: done in $(($(date +%s) - T0)) s; files: $(ls "$OUT" | tr '\n' ' ')"
