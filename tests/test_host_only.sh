#!/usr/bin/env bash
# test_host_only.sh: the orchestrator and dfctl never load a CUDA library, in either build, so
# the CUDA build's orchestrator starts (and dfctl steers it) on a host without a GPU driver.
# The CUDA build linked every program with -lcublasLt -lcublas -lcudart -lcuda -lnccl, and the
# orchestrator pulled in the CUDA side of the arena and all-reduce seams: on a box without
# libcuda.so.1 it would not even print its --help.
#   1. always (make -n, nothing built): in a CUDA=1 build the link lines of orchestrator and
#      dfctl name no CUDA library and link the *_nocuda seam objects; cuda_helper's (the
#      orchestrator's hands on the GPU) still links CUDA
#   2. when a CUDA build is here (build-cuda/, $BUILD-cuda/ or test_cuda_build.sh's
#      build-cudacheck-cuda/): ldd of its orchestrator and dfctl shows no libcuda, libcudart,
#      libnccl or libcublas, and both run --help (exit 0) on this machine, GPU or not;
#      without one that part is skipped with a line (building the CUDA tree takes too long
#      for this test: test_cuda_build.sh builds it)
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
cuda_re='-l(cuda|cudart|nccl|cublas|cublasLt)( |$)'
tmp=$(mktemp -d /tmp/df_host_only.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

root=$tmp/b
make -n --no-print-directory CUDA=1 SANITIZE= BUILD_ROOT="$root" \
  "$root-cuda/bin/orchestrator" "$root-cuda/bin/dfctl" "$root-cuda/bin/cuda_helper" >"$tmp/n" 2>&1 \
  || { tail -5 "$tmp/n"; echo "FAIL: make -n CUDA=1 failed"; exit 1; }
for b in orchestrator dfctl cuda_helper; do
  line=$(grep -E -- "-o $root-cuda/bin/$b " "$tmp/n")
  [ -n "$line" ] || { echo "FAIL: no link line for $b in make -n CUDA=1"; exit 1; }
  if [ "$b" = cuda_helper ]; then
    echo "$line" | grep -Eq -- "$cuda_re" || { echo "FAIL: cuda_helper does not link CUDA: $line"; exit 1; }
  else
    if echo "$line" | grep -Eq -- "$cuda_re"; then echo "FAIL: $b links CUDA in a CUDA=1 build: $line"; exit 1; fi
    echo "$line" | grep -q "host/common/ipc/arena_cuda_nocuda.o" \
      || { echo "FAIL: $b does not link the nocuda arena seam: $line"; exit 1; }
  fi
done
echo "ok: make CUDA=1 links orchestrator and dfctl without a CUDA library (the *_nocuda seams instead); cuda_helper with CUDA"

found=
for d in $(printf '%s\n' build-cuda "$BUILD-cuda" "$BUILD-cudacheck-cuda" build-cudacheck-cuda | awk '!seen[$0]++'); do
  [ -x "$d/bin/orchestrator" ] && [ -x "$d/bin/dfctl" ] || continue
  found=1
  for b in orchestrator dfctl; do
    libs=$(ldd "$d/bin/$b" 2>&1)
    if echo "$libs" | grep -Eq 'lib(cuda|cudart|nccl|cublas|cublasLt)\.so'; then
      echo "$libs"; echo "FAIL: $d/bin/$b loads a CUDA library"; exit 1
    fi
    "$d/bin/$b" --help >"$tmp/h" 2>&1 || { cat "$tmp/h"; echo "FAIL: $d/bin/$b --help does not run here"; exit 1; }
  done
  echo "ok: $d: ldd of orchestrator and dfctl names no CUDA library; both run --help on this machine"
done
[ -n "$found" ] || echo "note: no CUDA build here (build-cuda/, $BUILD-cuda/, build-cudacheck-cuda/): the ldd part skipped"
echo "PASS test_host_only"
