#!/usr/bin/env bash
# Builds and runs the libFuzzer targets (fuzz/fuzz_<target>.c) with ASan + UBSan, one after
# the other, each over the parser that reads one kind of untrusted input:
#   safetensors   safetensors_parse_header (model files)        common/io/safetensors.c
#   topology      topology_parse (the orchestrator's topology)   common/io/topology.c
#   shard         dataset_open (token shards, .dfs)              common/io/shard.c
#   hfconfig      hfconfig_parse (a model's config.json)         common/io/hfconfig.c
#   dflash_config dflash_config_read_release / _from_json (a drafter's config.json, the
#                 config of a checkpoint's trainer_state.json)  common/dflash/dflash_config.c
#   ledger        ledger_snapshot_open (ledger.bin, read at a resume) common/ipc/ledger.c
#   manifest      dflash_manifest_verify (a checkpoint step dir's manifest.json, read at a
#                 resume, over files the harness writes)        common/dflash/dflash_manifest.c
#   prompts       prompts_load (chat JSONL + byte_tokenizer.json, or a .dfs shard: what
#                 dflash_eval and target_generate decode)       eval/eval_prompts.c
#   tokvocab      tokvocab_parse (a byte_tokenizer.json or tokenizer.json, what
#                 dflash_tool shard show decodes with)          common/io/tokvocab.c
# Each target checks an oracle on every input it accepts (its file's header says which).
#
#   scripts/fuzz.sh [seconds] [target ...]   each target for `seconds` (default 60; all of
#                                            them when none is named); `make fuzz` calls this
#   FUZZ_DIR=dir                     build and corpus dir (default build-fuzz)
#   FUZZ_JOBS=n                      parallel fuzzing processes (default 1)
#   FUZZ_SEEDS_ONLY=1                only write the seed corpora (tests/test_fuzz_replay.sh
#                                    replays them without libFuzzer); no clang needed
#
# Seed corpora are regenerated each run into $FUZZ_DIR/<target>/seeds (valid inputs from the
# repository and crafted bad ones: for safetensors every file of tests/bad_safetensors/ in
# the target's input format, 8-byte data_len + header); what the fuzzer finds grows
# $FUZZ_DIR/<target>/corpus. A crash leaves $FUZZ_DIR/<target>/crash-* and exits non-zero;
# reproduce with: $FUZZ_DIR/<target>/fuzz_<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
all=(safetensors topology shard hfconfig dflash_config ledger manifest prompts tokvocab)
case $secs in ''|*[!0-9]*) echo "usage: $0 [seconds] [${all[*]} ...]" >&2; exit 2 ;; esac
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
root=${FUZZ_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-1}
CLANG=${CLANG:-clang}
seeds_only=${FUZZ_SEEDS_ONLY:-0}
[ "$seeds_only" = 1 ] || command -v "$CLANG" >/dev/null ||
  { echo "fuzz.sh: $CLANG not found (needs clang with libFuzzer)" >&2; exit 2; }
inc=()
[ -d .deps/root/usr/include ] && inc=(-I.deps/root/usr/include -L.deps/root/usr/lib/x86_64-linux-gnu)

seeds_safetensors() { # dir
python3 - "$1" <<'PY'
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

}

seeds_topology() { # dir: every topology of the repository, good and bad
  cp configs/*.json tests/topologies/good/*.json tests/topologies/bad/*.json "$1"/ 2>/dev/null || true
}

seeds_hfconfig() { # dir: every model config.json of the repository, and a few broken ones
  local n=0 f
  for f in models/*/config.json tests/fixtures/*/config.json; do
    [ -f "$f" ] && cp "$f" "$1/config_$((n += 1)).json"
  done
  printf '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}' > "$1/missing_sizes.json"
  printf '{"num_attention_heads": 0}' > "$1/zero_heads.json"
}

seeds_dflash_config() { # dir: the fixtures' release config (trainer_state.json holds the same form), broken ones
  cp tests/fixtures/dflash-release-tiny/config.json "$1/release.json"
  python3 - "$1" <<'PY'
import json, os, sys
out = sys.argv[1]
rel = json.load(open('tests/fixtures/dflash-release-tiny/config.json'))
bad = dict(rel); bad['num_attention_heads'] = 0
json.dump(bad, open(os.path.join(out, 'release_zero_heads.json'), 'w'))
open(os.path.join(out, 'not_json.json'), 'w').write('{"hidden": ')
PY
}

seeds_ledger() { # dir: snapshots of a small plan (fresh, mid-epoch, finished) from the harness's seed writer
  "${CC:-cc}" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Icommon -DFUZZ_LEDGER_SEEDS fuzz/fuzz_ledger.c common/util.c \
    -lm -pthread -o "$1/../seed_writer" && "$1/../seed_writer" "$1"
}

seeds_manifest() { # dir: manifests of the harness's step dir (version 2, 1, bad ones) from its seed writer
  "${CC:-cc}" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Icommon "${inc[@]+"${inc[@]}"}" -DFUZZ_MANIFEST_SEEDS \
    fuzz/fuzz_manifest.c ${src[manifest]} common/util.c -ljansson -lcrypto -lm -pthread -o "$1/../seed_writer" &&
    "$1/../seed_writer" "$1"
}

seeds_shard() { # dir: small valid shards (the harness writes their checksums) and broken ones
python3 - "$1" <<'PY'
import os, struct, sys
out = sys.argv[1]
def shard(name, vocab, samples, magic=b'DFSHARD1', version=1):
    offs = [0]
    for s in samples:
        offs.append(offs[-1] + len(s))
    toks = [t for s in samples for t, _ in s]
    mask = bytes(m for s in samples for _, m in s)
    b = magic + struct.pack('<IIQQQQ', version, vocab, len(samples), len(toks), 0, 0) + bytes(16)
    b += struct.pack('<%dQ' % len(offs), *offs) + struct.pack('<%dI' % len(toks), *toks)
    b += bytes(-len(b) % 8) + mask + bytes(-len(mask) % 8)
    open(os.path.join(out, name), 'wb').write(b)
shard('empty', 10, [])
shard('one', 300, [[(5, 0), (17, 1), (299, 1)]])
shard('three', 64, [[(1, 0)], [], [(2, 1), (3, 1), (63, 0), (0, 1)]])
shard('bad_token', 8, [[(9, 1)]])
shard('bad_mask', 8, [[(1, 2)]])
shard('bad_version', 8, [[(1, 1)]], version=2)
# prompt-shaped (a prompt, then a loss-1 response) for the prompts target too: one in the
# tiny target's vocabulary, one whose header vocab_size (2^32 - 1) lets a token past int in
shard('prompt_pair', 264, [[(256, 0), (258, 0), (65, 0), (259, 0), (66, 1), (257, 1)], [(256, 0), (7, 1)]])
shard('prompt_vocab_wraps', 0xFFFFFFFF, [[(4000000000, 0), (5, 1)]])
PY
}

seeds_prompts() { # dir: chat JSONL (the tiny tokenizer; others given before a NUL) and 'S' + shards
  head -n 3 data/tiny/chat-heldout.jsonl > "$1/chat3.jsonl"
  printf '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "h\u00e9\u4e16"}]}\n' \
    > "$1/system_user.jsonl"
  printf '{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]}\n' > "$1/sharegpt.jsonl"
  printf '{"messages": [{"role": "robot", "content": "a"}]}\n' > "$1/bad_role.jsonl"
  local tok='{"type": "bytes", "vocab_size": 264, "bos": 256, "eos": 257, "user": 258, "assistant": 259}'
  local b
  for b in 256 -1 4294967552 '"x"'; do
    { printf '%s' "${tok/\"bos\": 256/\"bos\": $b}"; printf '\0{"messages": [{"role": "user", "content": "hi"}]}\n'; } \
      > "$1/tok_bos_${b//\"/}.bin"
  done
  mkdir -p "$1/../shards" && seeds_shard "$1/../shards"
  local f
  for f in "$1"/../shards/*; do { printf S; cat "$f"; } > "$1/S_$(basename "$f")"; done
}

seeds_tokvocab() { # dir: the repository's tokenizers ('B' + a byte_tokenizer.json) and broken ones
  local n=0 f
  for f in models/*/byte_tokenizer.json; do { printf B; cat "$f"; } > "$1/bytes_$((n += 1)).json"; done
  for f in models/*/tokenizer.json tests/fixtures/tokenizers/*/tokenizer.json; do
    [ -f "$f" ] && cp "$f" "$1/bpe_$((n += 1)).json"
  done
  printf 'B{"vocab_size": 264, "bos": 256, "eos": 257, "user": 258, "assistant": 259, "pad": 257}' > "$1/bytes_same_id.json"
  printf '{"model": {"type": "BPE", "vocab": {"a": 0, "\\u00ff\\u0120b": 3}}, "added_tokens": [{"id": 1, "content": "\\u001b[2J"}]}' \
    > "$1/bpe_small.json"
  printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}}' > "$1/bpe_same_id.json"
  printf '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' > "$1/unigram.json"
}

dict_args() { # target: its dictionary, when it has one
  [ -f "fuzz/$1.dict" ] && echo "-dict=$PWD/fuzz/$1.dict"
  return 0
}

declare -A src=(
  [safetensors]="common/io/safetensors.c common/sha256.c common/par.c" [topology]="common/io/topology.c"
  [shard]="common/io/shard.c" [hfconfig]="common/io/hfconfig.c" [dflash_config]="common/dflash/dflash_config.c"
  [ledger]=" " # the ledger harness includes common/ipc/ledger.c itself
  [manifest]="common/dflash/dflash_manifest.c common/sha256.c common/par.c"
  [prompts]="eval/eval_prompts.c common/io/shard.c" [tokvocab]="common/io/tokvocab.c")
declare -A maxlen=([safetensors]=4096 [topology]=8192 [shard]=4096 [hfconfig]=4096 [dflash_config]=4096 [ledger]=4096
  [manifest]=4096 [prompts]=4096 [tokvocab]=4096)
for t in "${targets[@]}"; do
  [ -n "${src[$t]:-}" ] || { echo "fuzz.sh: no target '$t' (${all[*]})" >&2; exit 2; }
done

for t in "${targets[@]}"; do
  dir=$root/$t
  mkdir -p "$dir/seeds" "$dir/corpus"
  if [ "$seeds_only" = 1 ]; then "seeds_$t" "$dir/seeds"; continue; fi
  "$CLANG" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Icommon "${inc[@]+"${inc[@]}"}" \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "fuzz/fuzz_$t.c" ${src[$t]} common/util.c -ljansson -lcrypto -lm -pthread -o "$dir/fuzz_$t"
  "seeds_$t" "$dir/seeds"
  echo "fuzz.sh: fuzzing $t for ${secs}s ($jobs job(s)), corpus $dir/corpus"
  par=()
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs")
  d=$(dict_args "$t")
  (cd "$dir" && ./"fuzz_$t" -max_total_time="$secs" ${d:+"$d"} -max_len="${maxlen[$t]}" -print_final_stats=1 \
    "${par[@]+"${par[@]}"}" corpus seeds)   # crash-* files land in $dir
done
