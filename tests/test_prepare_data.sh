#!/usr/bin/env bash
# test_prepare_data: scripts/prepare_data.py turns chat JSONL (OpenAI and ShareGPT styles)
# into a shard the C reader accepts, with the loss mask on assistant bytes only, and
# refuses a malformed line naming the file and line.
set -euo pipefail
BUILD=${BUILD:-build}
tmp=$(mktemp -d /tmp/df_test_prep_XXXXXX); trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/in.jsonl" <<'J'
{"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "xyz"}]}
{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]}
J
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/s" "$tmp/in.jsonl"
out=$("$BUILD/tests/test_shard" "$tmp/s-000.dfs")
echo "$out"
# sample 1: bos user a b assistant x y z eos = 9 tokens, 4 labels (x y z eos)
# sample 2: bos user q assistant r eos = 6 tokens, 2 labels
[ "$out" = "samples 2 tokens 15 labels 6 vocab 264" ] || { echo "unexpected shard summary"; exit 1; }
echo '{"messages": [{"role": "robot", "content": "x"}]}' >"$tmp/bad.jsonl"
if python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/b" "$tmp/bad.jsonl" 2>"$tmp/err"; then
  echo "bad input accepted"; exit 1; fi
grep -q "bad.jsonl:1: message 0: expected role user|assistant|system" "$tmp/err" || { cat "$tmp/err"; exit 1; }
[ ! -e "$tmp/b-000.dfs" ] || { echo "partial shard written"; exit 1; }
echo "test_prepare_data: ok"
