#!/usr/bin/env bash
# Runs every built benchmark (build*/bench/bench_*). Each prints a table and writes its
# JSON under bench/results/. GPU benches exist only in a CUDA=1 build.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
rc=0
for b in $(ls $BUILD/bench/bench_* 2>/dev/null | grep -v '\.d$'); do
  echo "== $(basename $b)"
  "$b" || { echo "bench $(basename $b) failed"; rc=1; }
done
exit $rc
