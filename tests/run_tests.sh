#!/usr/bin/env bash
# Runs the test suite: every built test binary and every tests/test_*.sh script, each
# under a timeout, from the repository root. Usage: tests/run_tests.sh cpu|gpu [filter]
#   cpu: build/tests/test_* and tests/test_*.sh           (make test)
#   gpu: build-cuda/tests/gpu_test_* and tests/gpu_test_*.sh (make test-gpu)
# A test prints what it checked; exit 0 = pass, 77 = skipped (with a reason), else fail.
# Per-test logs go to $BUILD/test-logs/. Env: TEST_TIMEOUT (seconds, default 600).
set -u
cd "$(dirname "$0")/.."
mode=${1:-cpu}; filter=${2:-}
BUILD=${BUILD:-build}
export BUILD
timeout_s=${TEST_TIMEOUT:-600}
logs=$BUILD/test-logs; mkdir -p "$logs"
case $mode in
  cpu) list=$(ls $BUILD/tests/test_* 2>/dev/null | grep -v '\.d$'; ls tests/test_*.sh 2>/dev/null) ;;
  gpu) list=$(ls $BUILD/tests/gpu_test_* 2>/dev/null | grep -v '\.d$'; ls tests/gpu_test_*.sh 2>/dev/null) ;;
  *) echo "usage: $0 cpu|gpu [filter]" >&2; exit 2 ;;
esac
pass=0; fail=0; skip=0; failed=()
t_all=$(date +%s)
for t in $list; do
  name=$(basename "$t")
  [ -n "$filter" ] && [[ $name != *$filter* ]] && continue
  t0=$(date +%s%N)
  timeout --kill-after=10 "$timeout_s" "$t" >"$logs/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 )); dt="$((ms/1000)).$(( (ms%1000)/100 ))"
  if [ $rc -eq 0 ]; then pass=$((pass+1)); printf 'PASS %-40s %6ss\n' "$name" "$dt"
  elif [ $rc -eq 77 ]; then skip=$((skip+1)); printf 'SKIP %-40s %6ss  %s\n' "$name" "$dt" "$(tail -n1 "$logs/$name.log")"
  else
    fail=$((fail+1)); failed+=("$name")
    [ $rc -eq 124 ] && why="timeout after ${timeout_s}s" || why="exit $rc"
    printf 'FAIL %-40s %6ss  (%s) last lines of %s:\n' "$name" "$dt" "$why" "$logs/$name.log"
    tail -n 25 "$logs/$name.log" | sed 's/^/    /'
  fi
done
echo "tests ($mode): $pass passed, $fail failed, $skip skipped in $(( $(date +%s) - t_all ))s"
[ $fail -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
