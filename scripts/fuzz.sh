#!/usr/bin/env bash
# Builds and runs the libFuzzer target for the safetensors header parser
# (fuzz/fuzz_safetensors.c over common/io/safetensors.c) with ASan + UBSan.
#
#   scripts/fuzz.sh [seconds]        run for `seconds` (default 60); `make fuzz` calls this
#   FUZZ_DIR=dir                     build and corpus dir (default build-fuzz)
#   FUZZ_JOBS=n                      parallel fuzzing processes (default 1)
#
# The seed corpus (valid headers, plus every crafted bad file of tests/bad_safetensors/
# turned into the target's input format: 8-byte data_len + header) is regenerated each
# run into $FUZZ_DIR/seeds; what the fuzzer finds grows $FUZZ_DIR/corpus. A crash leaves
# $FUZZ_DIR/crash-* and exits non-zero; reproduce with: $FUZZ_DIR/fuzz_safetensors <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
case $secs in ''|*[!0-9]*) echo "usage: $0 [seconds]" >&2; exit 2 ;; esac
dir=${FUZZ_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-1}
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null || { echo "fuzz.sh: $CLANG not found (needs clang with libFuzzer)" >&2; exit 2; }
mkdir -p "$dir/seeds" "$dir/corpus"

"$CLANG" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Icommon \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  fuzz/fuzz_safetensors.c common/io/safetensors.c common/util.c \
  -ljansson -lm -o "$dir/fuzz_safetensors"

python3 - "$dir/seeds" <<'PY'
import os, struct, sys
out = sys.argv[1]
def seed(name, header, data_len):
    with open(os.path.join(out, name), 'wb') as f:
        f.write(struct.pack('<Q', data_len) + header.encode())
seed('empty_object', '{}', 0)
seed('one_f32', '{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}', 24)
seed('two_mixed', '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},'
     '"b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}}', 16)
seed('scalar_and_empty', '{"s":{"dtype":"U8","shape":[],"data_offsets":[0,1]},'
     '"e":{"dtype":"F16","shape":[0,5],"data_offsets":[1,1]}}', 1)
seed('padded', '{"x":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}      ', 8)
bad = 'tests/bad_safetensors'
for f in sorted(os.listdir(bad)):
    if f.endswith('.safetensors'):
        b = open(os.path.join(bad, f), 'rb').read()
        if len(b) >= 8:
            n = int.from_bytes(b[:8], 'little')
            h = b[8:8 + n]
            seed('bad_' + f, '', 0)
            with open(os.path.join(out, 'bad_' + f), 'wb') as g:
                g.write(struct.pack('<Q', max(0, len(b) - 8 - len(h))) + h)
PY

echo "fuzz.sh: fuzzing safetensors_parse_header for ${secs}s ($jobs job(s)), corpus $dir/corpus"
par=()
[ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
dict=$PWD/fuzz/safetensors.dict
cd "$dir"   # crash-* files land here
./fuzz_safetensors -max_total_time="$secs" -dict="$dict" -max_len=4096 -print_final_stats=1 \
  "${par[@]+"${par[@]}"}" corpus seeds
