#!/usr/bin/env bash
# test_cuda_build: `make CUDA=1` compiles and links the whole CUDA path (kernels, GPU
# tests, GPU benches) with warnings treated as failures, on any machine that has nvcc,
# GPU or not. Running those binaries is `make test-gpu`'s job on the GPU machine.
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if [ ! -x "$NVCC" ] && ! command -v nvcc >/dev/null 2>&1; then
  echo "SKIPPED: no nvcc on this machine (set CUDA_HOME)"; exit 77
fi
root=${BUILD:-build}-cudacheck
log=$(mktemp /tmp/df_cuda_build.XXXXXX)
trap 'rm -f "$log"' EXIT
# SANITIZE= : a `make test SANITIZE=...` passes its variables down (MAKEFLAGS); this check
# compiles the plain CUDA build wherever it is run from
if ! make --no-print-directory -j2 CUDA=1 SANITIZE= BUILD_ROOT="$root" all >"$log" 2>&1; then
  tail -n 40 "$log"; echo "FAIL: make CUDA=1 failed"; exit 1
fi
if grep -E 'warning|error' "$log" | grep -v -- '-Werror' >/dev/null; then
  grep -E 'warning|error' "$log" | head -20; echo "FAIL: make CUDA=1 printed warnings"; exit 1
fi
for b in tests/gpu_test_arena tests/gpu_test_nn tests/gpu_test_target tests/gpu_test_dflash \
         tests/gpu_test_allreduce bench/bench_target bench/bench_drafter bin/target_worker bin/drafter_worker; do
  [ -x "$root-cuda/$b" ] || { echo "FAIL: $root-cuda/$b was not built"; exit 1; }
done
echo "make CUDA=1: $(ls "$root-cuda"/tests/gpu_test_* | grep -vc '\.d$') GPU tests and $(ls "$root-cuda"/bench/ | grep -vc '\.d$') benches built, no warnings"
