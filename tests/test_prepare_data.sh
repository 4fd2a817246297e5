#!/usr/bin/env bash
# test_prepare_data: scripts/prepare_data.py turns chat JSONL (OpenAI and ShareGPT styles)
# into a shard the C reader accepts, with the loss mask on assistant bytes only; skips a
# malformed line naming the file and line (a file of nothing else: exit 100, no shard); and
# rebuilds the embedded default's shards (data/tiny/*.dfs, as scripts/run_default.sh makes
# them) byte for byte. Chat templates: tests/test_prepare_chat.sh.
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
set +e
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/b" "$tmp/bad.jsonl" 2>"$tmp/err"; rc=$?
set -e
[ $rc -eq 100 ] || { echo "a file with no usable line: exit $rc, expected 100"; exit 1; }
grep -q "bad.jsonl:1: skipped (unknown-role): message 0: role \"robot\"" "$tmp/err" || { cat "$tmp/err"; exit 1; }
[ ! -e "$tmp/b-000.dfs" ] || { echo "partial shard written"; exit 1; }
# the embedded default's data: the same bytes as the committed shards
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/train" \
  data/tiny/chat-train.jsonl --max-samples 1600 --max-len 512
cmp "$tmp/train-000.dfs" data/tiny/train-000.dfs || { echo "data/tiny/train-000.dfs not reproduced"; exit 1; }
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/train2400" \
  data/tiny/chat-train.jsonl --max-samples 2400 --max-len 512
cmp "$tmp/train2400-000.dfs" data/tiny/train2400-000.dfs || { echo "data/tiny/train2400-000.dfs not reproduced"; exit 1; }
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/held" data/tiny/chat-heldout.jsonl
cmp "$tmp/held-000.dfs" data/tiny/heldout-000.dfs || { echo "data/tiny/heldout-000.dfs not reproduced"; exit 1; }
echo "data/tiny shards reproduced byte for byte"
echo "test_prepare_data: ok"
