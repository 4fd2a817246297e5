#!/usr/bin/env bash
# test_fuzz_replay: the fuzz targets of fuzz/ (their oracles and the parsers under them)
# replayed without libFuzzer, with ASan + UBSan (GCC's undefined set does not include
# float-cast-overflow: added; any sanitizer report or failed oracle aborts), over:
#   - the seed corpora scripts/fuzz.sh writes (FUZZ_SEEDS_ONLY=1): the repository's model
#     configs and topologies, crafted bad safetensors headers, small shards, checkpoint
#     manifests (versions 1 and 2, and ones a resume must refuse), chat JSONL with tokenizers,
#     prompt shards, the repository's tokenizers;
#   - fuzz/regress/<target>/: inputs a fuzzer found that broke a parser once;
#   - a real shard (data/tiny/heldout-000.dfs).
# Each target must accept at least one input (so its oracle ran) and refuse at least one.
# Then it must fail where it should: the hfconfig, dflash_config, prompts and tokvocab targets built
# over their parsers with the check that fuzz/regress/<target>/ is about taken out must
# abort on it.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp # the harnesses' own temp dirs (manifest, prompts): an aborted one leaves its dir here
fail() { echo "FAIL: $*"; exit 1; }
inc=()
[ -d .deps/root/usr/include ] && inc=(-I.deps/root/usr/include -L.deps/root/usr/lib/x86_64-linux-gnu)
FUZZ_DIR=$tmp/seeds FUZZ_SEEDS_ONLY=1 scripts/fuzz.sh 1 >/dev/null || fail "scripts/fuzz.sh could not write the seeds"

build() { # target output [parser source]
  local t=$1 out=$2 src=${3:-}
  case $t in
    safetensors) src=${src:-common/io/safetensors.c}; src="$src common/sha256.c common/par.c" ;; topology) src=${src:-common/io/topology.c} ;;
    shard) src=${src:-common/io/shard.c} ;; hfconfig) src=${src:-common/io/hfconfig.c} ;;
    dflash_config) src=${src:-common/dflash/dflash_config.c} ;;
    ledger) src=${src:-} ;; # the harness includes common/ipc/ledger.c
    manifest) src=${src:-common/dflash/dflash_manifest.c}; src="$src common/sha256.c common/par.c" ;;
    prompts) src=${src:-eval/eval_prompts.c}; src="$src common/io/shard.c" ;;
    tokvocab) src=${src:-common/io/tokvocab.c} ;;
  esac
  "$CC" -g -O1 -std=gnu11 -D_GNU_SOURCE -I. -Icommon "${inc[@]+"${inc[@]}"}" \
    -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer \
    "fuzz/fuzz_$t.c" fuzz/replay_main.c $src common/util.c -ljansson -lcrypto -lm -pthread -o "$out" 2>"$out.log" ||
    { cat "$out.log"; fail "$t: the replay build failed"; }
}

for t in safetensors topology shard hfconfig dflash_config ledger manifest prompts tokvocab; do
  build "$t" "$tmp/$t"
  inputs=("$tmp/seeds/$t/seeds")
  [ -d "fuzz/regress/$t" ] && inputs+=("fuzz/regress/$t")
  [ "$t" = shard ] && inputs+=(data/tiny/heldout-000.dfs)
  ASAN_OPTIONS=detect_leaks=1 "$tmp/$t" "${inputs[@]}" >"$tmp/$t.out" 2>&1 ||
    { tail -20 "$tmp/$t.out"; fail "$t: an input aborted the replay (sanitizer report or oracle)"; }
  line=$(tail -1 "$tmp/$t.out")
  read -r n _ acc _ ref _ <<<"$line"
  [ "${acc:-0}" -ge 1 ] && [ "${ref:-0}" -ge 1 ] || fail "$t: expected inputs both accepted and refused, got: $line"
  echo "ok: $t: $line"
done
grep -q "accepted" "$tmp/shard.out" && grep -q "heldout-000.dfs: accepted" "$tmp/shard.out" ||
  fail "shard: the real shard data/tiny/heldout-000.dfs was refused"

# the regression input must catch the bug it was found with
python3 - common/io/hfconfig.c "$tmp/hfconfig_old.c" <<'PY' || fail "could not take the check out of a copy of hfconfig.c"
import sys
s = open(sys.argv[1]).read()
a = "    if (!(vals[3] <= (double)(1 << 30)) || vals[3] != (double)(long long)vals[3])\n"
assert s.count(a) == 1, "the check is not where this test expects it"
i = s.index(a)
j = s.index(";\n", i) + 2  # the return statement that follows
s = s[:i] + s[j:]
open(sys.argv[2], "w").write(s)
PY
build hfconfig "$tmp/hfconfig_old" "$tmp/hfconfig_old.c"
if "$tmp/hfconfig_old" fuzz/regress/hfconfig >"$tmp/old.out" 2>&1; then
  fail "hfconfig without its check still passes fuzz/regress/hfconfig (the regression input catches nothing)"
fi
grep -q "runtime error" "$tmp/old.out" || { tail -5 "$tmp/old.out"; fail "hfconfig without its check failed, but not with UBSan's report"; }
echo "ok: without its check, hfconfig.c fails fuzz/regress/hfconfig (UBSan: $(grep -o 'runtime error: [^\n]*' "$tmp/old.out" | head -1 | cut -c1-70))"
# and the wrap of a config integer (fuzz/regress/dflash_config): dflash_config.c without its
# range check must fail the oracle (4294967424 read as 128), the fixed one passes it above
python3 - common/dflash/dflash_config.c "$tmp/dflash_config_old.c" <<'PY' || fail "could not take the range check out of a copy of dflash_config.c"
import sys
s = open(sys.argv[1]).read()
a = " || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)"
assert s.count(a) == 1, "the check is not where this test expects it"
open(sys.argv[2], "w").write(s.replace(a, ")"))
PY
build dflash_config "$tmp/dflash_config_old" "$tmp/dflash_config_old.c"
if ("$tmp/dflash_config_old" fuzz/regress/dflash_config >"$tmp/old.out" 2>&1; exit $?) 2>/dev/null; then # the subshell says "Aborted", into /dev/null
  fail "dflash_config without its range check still passes fuzz/regress/dflash_config"
fi
grep -q "oracle failed" "$tmp/old.out" || { tail -5 "$tmp/old.out"; fail "dflash_config without its check failed, but not by the oracle"; }
echo "ok: without its range check, dflash_config.c fails fuzz/regress/dflash_config ($(grep -m1 'the input says' "$tmp/old.out"))"
# and the prompts' shard vocabulary compared as int (fuzz/regress/prompts/shard_vocab_wraps.bin:
# a header vocab_size of 2^32 - 1 let token 4000000000 through as a negative id)
python3 - eval/eval_prompts.c "$tmp/eval_prompts_old.c" <<'PY' || fail "could not put the int comparison back in a copy of eval_prompts.c"
import sys
s = open(sys.argv[1]).read()
a = "if (vocab <= 0 || dataset_vocab_size(ds) > (uint32_t)vocab) {"
assert s.count(a) == 1, "the check is not where this test expects it"
open(sys.argv[2], "w").write(s.replace(a, "if ((int)dataset_vocab_size(ds) > vocab) {"))
PY
build prompts "$tmp/prompts_old" "$tmp/eval_prompts_old.c"
if ("$tmp/prompts_old" fuzz/regress/prompts/shard_vocab_wraps.bin >"$tmp/old.out" 2>&1; exit $?) 2>/dev/null; then
  fail "eval_prompts.c comparing the vocabulary as int still passes fuzz/regress/prompts/shard_vocab_wraps.bin"
fi
grep -q "oracle failed" "$tmp/old.out" || { tail -5 "$tmp/old.out"; fail "the old prompts reader failed, but not by the oracle"; }
echo "ok: with the int comparison, eval_prompts.c fails shard_vocab_wraps.bin ($(grep -m1 'outside' "$tmp/old.out"))"
# and two names of a byte_tokenizer.json on one id (fuzz/regress/tokvocab): tokvocab.c without
# its check writes "<|assistant|>" into the 7 bytes of "<|pad|>", past the end of the blob
python3 - common/io/tokvocab.c "$tmp/tokvocab_old.c" <<'PY' || fail "could not take the check out of a copy of tokvocab.c"
import sys
s = open(sys.argv[1]).read()
a = "            if (ids[q] == ids[k])\n"
assert s.count(a) == 1, "the check is not where this test expects it"
open(sys.argv[2], "w").write(s.replace(a, "            if (0)\n"))
PY
build tokvocab "$tmp/tokvocab_old" "$tmp/tokvocab_old.c"
if ("$tmp/tokvocab_old" fuzz/regress/tokvocab >"$tmp/old.out" 2>&1; exit $?) 2>/dev/null; then
  fail "tokvocab.c without its same-id check still passes fuzz/regress/tokvocab"
fi
grep -q "heap-buffer-overflow" "$tmp/old.out" || { tail -5 "$tmp/old.out"; fail "the old tokvocab.c failed, but not with ASan's report"; }
echo "ok: without its same-id check, tokvocab.c fails fuzz/regress/tokvocab (ASan: heap-buffer-overflow)"
echo "PASS: the fuzz targets replay clean over their seeds, the regression inputs and a real shard"
