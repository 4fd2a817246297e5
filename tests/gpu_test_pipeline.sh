#!/usr/bin/env bash
# gpu_test_pipeline: the real pipeline on the CUDA backend (configs/tiny-cuda.json: the tiny
# target, GPU arenas from cuda_helper, tmc forward into device slots, device copies in the
# postproc stage, the dfc drafter), one clean run and one run in which the target, the
# postproc stage and the drafter (after a checkpoint) are SIGKILLed once each. Both must end
# with every batch trained exactly once, the loss falling, a release export and metrics.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIPPED: gpu_test_pipeline: no CUDA device"; exit 77
fi
for b in orchestrator dfctl target_worker postproc_worker drafter_worker cuda_helper; do
  [ -x "$BUILD/bin/$b" ] || { echo "gpu_test_pipeline: $BUILD/bin/$b missing (make CUDA=1)"; exit 1; }
done
tmp=$(mktemp -d /tmp/gpu-pipe.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

run() { # run NAME KILLS: a run of the tiny CUDA topology in $tmp/NAME
  local name=$1 kills=$2
  python3 - configs/tiny-cuda.json "$tmp/$name.json" "$tmp/$name" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["run_dir"] = sys.argv[3]
t["drafter"]["checkpoint_every"] = 20
json.dump(t, open(sys.argv[2], "w"), indent=1)
PY
  "$BUILD/bin/orchestrator" "$tmp/$name.json" >"$tmp/$name.log" 2>&1 &
  local pid=$!
  if [ "$kills" = 1 ]; then
    local dfctl="$BUILD/bin/dfctl --run-dir $tmp/$name"
    for w in target0 postproc0; do
      for _ in $(seq 300); do [ -s "$tmp/$name/metrics/drafter0.jsonl" ] && break; sleep 0.1; done
      sleep 0.5; $dfctl kill "$w" >/dev/null 2>&1 || true
    done
    for _ in $(seq 600); do [ -e "$tmp/$name/checkpoints/latest" ] && break; sleep 0.1; done
    $dfctl kill drafter0 >/dev/null 2>&1 || true
  fi
  wait $pid || { tail -30 "$tmp/$name.log"; fail "$name: orchestrator exit $?"; }
  python3 - "$tmp/$name" "$name" <<'PY' || fail "$name: checks"
import json, os, sys
run, name = sys.argv[1], sys.argv[2]
a = json.load(open(f"{run}/ledger_audit.json"))
s = json.load(open(f"{run}/train_summary.json"))
assert a["exactly_once"] is True, a["counts"]
assert s["backend"] == "cuda", s
# a resumed drafter's "loss at start" is its own first steps: compare with the clean run's
start = json.load(open(os.path.join(os.path.dirname(run), "clean", "train_summary.json")))["loss_start"]
assert s["loss_end"] < 0.5 * start, (start, s["loss_end"])
for f in ("config.json", "model.safetensors"):
    assert os.path.getsize(f"{run}/drafter/{f}") > 0
print(f"ok: {name}: {a['n_batches']} batches exactly once, {s['steps']} steps, loss {s['loss_start']:.3f} -> "
      f"{s['loss_end']:.3f}, expected tau {s['expected_tau']:.2f}, {s['seconds']:.1f}s")
PY
}
run clean 0
run kills 1
n=$(grep -c '"restart"' "$tmp/kills/metrics/orchestrator.jsonl" 2>/dev/null || true)
echo "kills run: $n restart events in metrics/orchestrator.jsonl"
[ "${n:-0}" -ge 3 ] || fail "expected 3 restarts (target, postproc, drafter), saw ${n:-0}"
echo "gpu_test_pipeline: ok"
