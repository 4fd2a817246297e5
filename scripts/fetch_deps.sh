#!/usr/bin/env bash
# Prepares libuv and jansson for a machine without apt (the GPU machine): downloads the
# Debian -dev packages here and unpacks them into .deps/root (git-ignored). Then build with
#   make CUDA=1 DEPS_PREFIX=.deps/root
# which links both statically (libuv_a.a, libjansson.a). Carry .deps along to that machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs .deps/root
cd .deps/debs
if ! ls libuv1-dev_*.deb libjansson-dev_*.deb >/dev/null 2>&1; then
  apt-get download libuv1-dev libjansson-dev
fi
for f in libuv1-dev_*.deb libjansson-dev_*.deb; do dpkg -x "$f" ../root; done
ls -la ../root/usr/lib/x86_64-linux-gnu/libuv_a.a ../root/usr/lib/x86_64-linux-gnu/libjansson.a
echo "fetch_deps: ready: make CUDA=1 DEPS_PREFIX=.deps/root"
