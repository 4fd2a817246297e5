#!/usr/bin/env bash
# Prepares libuv, jansson and libcrypto (OpenSSL: the checkpoint digests, common/sha256.c)
# for a machine without apt (the GPU machine): downloads the Debian -dev packages here and
# unpacks them into .deps/root (git-ignored). Then build with
#   make CUDA=1 DEPS_PREFIX=.deps/root
# which links all three statically (libuv_a.a, libjansson.a, libcrypto.a: the binaries
# need no libssl3 of the same version on that machine). Carry .deps along to that machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs .deps/root
cd .deps/debs
pkgs=(libuv1-dev libjansson-dev libssl-dev)
for p in "${pkgs[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
for p in "${pkgs[@]}"; do dpkg -x "$p"_*.deb ../root; done
lib=../root/usr/lib/x86_64-linux-gnu
ls -la $lib/libuv_a.a $lib/libjansson.a $lib/libcrypto.a ../root/usr/include/openssl/evp.h
echo "fetch_deps: ready: make CUDA=1 DEPS_PREFIX=.deps/root"
