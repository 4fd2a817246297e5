#!/usr/bin/env bash
# Installs the Debian packages the CPU build and tests need, if any is missing:
# libuv1-dev, libjansson-dev, libssl-dev (build; libcrypto's SHA-256 for the checkpoint
# digests), spin (ring protocol model check), python3 (scripts),
# clang-format (tests/test_format.sh: the tree's layout, .clang-format),
# python3-jinja2 and python3-regex (scripts/hf_tokenizer.py: chat templates and BPE split
# patterns for scripts/prepare_data.py; tests/test_prepare_chat.sh), python3-numpy
# (bench/pipeline/peer_pipeline.py reads the shards with it; tests/test_peer_pipeline.sh),
# protobuf-compiler and python3-protobuf (tests/check_tfevents.py compiles tests/tfevents.proto
# with protoc and reads the workers' TensorBoard event files with the protobuf runtime).
# Not python3-matplotlib: 42 packages, 289 MB installed, for PNG curves only; the same figures
# are in the TensorBoard event files, and scripts/plot_run.py prints the command that gets it.
# Idempotent and quiet when everything is there. Skipped when DEPS_PREFIX is set
# (the GPU machine, which has no apt: see scripts/fetch_deps.sh).
set -euo pipefail
if [ -n "${DEPS_PREFIX:-}" ]; then exit 0; fi
missing=()
[ -f /usr/include/uv.h ]      || missing+=(libuv1-dev)
[ -f /usr/include/jansson.h ] || missing+=(libjansson-dev)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
command -v spin >/dev/null    || missing+=(spin)
command -v gcc >/dev/null     || missing+=(gcc)
command -v clang-format >/dev/null || missing+=(clang-format)
command -v python3 >/dev/null || missing+=(python3)
python3 -c 'import jinja2' 2>/dev/null || missing+=(python3-jinja2)
python3 -c 'import regex' 2>/dev/null  || missing+=(python3-regex)
# any Python with numpy will do: the test looks for one (a pyenv python3 does not see Debian's)
python3 -c 'import numpy' 2>/dev/null || /usr/bin/python3 -c 'import numpy' 2>/dev/null || missing+=(python3-numpy)
command -v protoc >/dev/null   || missing+=(protobuf-compiler)
python3 -c 'import google.protobuf' 2>/dev/null || /usr/bin/python3 -c 'import google.protobuf' 2>/dev/null ||
  missing+=(python3-protobuf)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
case " ${missing[*]} " in *python3-jinja2*|*python3-regex*|*python3-numpy*|*python3-protobuf*) [ -x /usr/bin/python3 ] || missing+=(python3) ;; esac
echo "install_deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "install_deps: not root and no sudo: install ${missing[*]} yourself" >&2; exit 1; fi
else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# a python3 that is not Debian's (pyenv, a venv) does not see Debian's modules: give it its own
if ! python3 -c 'import jinja2, regex' 2>/dev/null; then
  python3 -m pip install -q jinja2 regex >/dev/null 2>&1 ||
    echo "install_deps: python3 ($(command -v python3)) lacks jinja2/regex; tests use /usr/bin/python3 then" >&2
fi
echo "install_deps: done"
