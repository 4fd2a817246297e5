#!/usr/bin/env bash
# test_eval: the dflash_eval program end to end on the tiny target: a randomly initialised
# drafter (exported to the release format with dflash_tool, and as our checkpoint) decodes
# held-out prompts from chat JSONL and from the shard; the JSON report is consistent
# (speculative output == plain output, tau in [1, B], histogram sums, same prompts from
# both sources give the same tokens); --batch N decodes N prompts together with the same
# per-prompt tokens and the lossless check per prompt; errors name the file/field and use the documented
# exit codes (2 usage, 100 bad drafter/target/prompts).
set -euo pipefail
BUILD=${BUILD:-build}
EVAL=$BUILD/bin/dflash_eval
tmp=$(mktemp -d /tmp/df_test_eval_XXXXXX); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$EVAL" --help | grep -q -- "--json PATH" || fail "--help does not describe --json"
set +e
"$EVAL" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no arguments: expected exit 2"
"$EVAL" --target models/tiny-target --drafter x --prompts y --max-new 0 2>/dev/null; [ $? -eq 2 ] || fail "--max-new 0: expected exit 2"
set -e

# a drafter of the make-run shape (1 layer, block 16, layers 1 and 3 of the 4-layer target)
python3 - "$tmp/cfg.json" <<'PY'
import json, sys
json.dump({"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
           "num_target_layers": 4, "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 261},
           "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 264, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": True, "layer_types": ["full_attention"]},
          open(sys.argv[1], "w"))
PY
"$BUILD/bin/dflash_tool" init --out "$tmp/ck" --config "$tmp/cfg.json" --seed 11 >/dev/null
"$BUILD/bin/dflash_tool" export "$tmp/ck" "$tmp/rel" >/dev/null

"$EVAL" --target models/tiny-target --drafter "$tmp/rel" --prompts data/tiny/chat-heldout.jsonl \
  --max-prompts 3 --max-new 40 --json "$tmp/a.json" >"$tmp/a.out" 2>"$tmp/a.err"
cat "$tmp/a.out"
grep -q "^\[3/3\] data/tiny/chat-heldout.jsonl:3: prompt" "$tmp/a.err" || { cat "$tmp/a.err"; fail "no progress line per prompt"; }
grep -q "lossless: 3 of 3 outputs identical" "$tmp/a.out" || fail "table: lossless summary missing"
# the same prompts from the shard and from our checkpoint directory
"$EVAL" --target models/tiny-target --drafter "$tmp/ck" --prompts data/tiny/heldout-000.dfs \
  --max-prompts 3 --max-new 40 --quiet --json "$tmp/b.json" >/dev/null 2>&1
"$EVAL" --target models/tiny-target --drafter "$tmp/rel" --random-drafter 5 --prompts data/tiny/heldout-000.dfs \
  --max-prompts 2 --max-new 20 --no-plain --quiet --json "$tmp/c.json" >/dev/null 2>&1
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
a, b, c = (json.load(open(f"{t}/{n}.json")) for n in "abc")
def check(r, n, plain=True):
    o, B = r["overall"], r["block_size"]
    assert B == 16 and o["n_prompts"] == n == len(r["prompts"]), (B, o["n_prompts"])
    assert 1.0 <= o["tau"] <= B, o["tau"]
    assert sum(o["hist"]) == o["steps"] and o["hist"][0] == 0
    assert abs(sum(i * h for i, h in enumerate(o["hist"])) / o["steps"] - o["tau_token_weighted"]) < 1e-9
    taus = []
    for p in r["prompts"]:
        assert len(p["tokens"]) == p["new_tokens"] == p["spec"]["new_tokens"]
        assert sum(p["hist"]) == p["spec"]["steps"]
        taus.append(p["tau"])
        if plain:
            assert p["lossless"] and p["first_diff"] == -1 and p["plain"]["new_tokens"] == p["new_tokens"]
            assert p["plain"]["steps"] == p["new_tokens"] - 1 or p["tokens"][-1] == r["eos"]
    assert abs(sum(taus) / len(taus) - o["tau"]) < 1e-9
    if plain:
        assert o["mismatches"] == 0 and o["speedup"] > 0
check(a, 3); check(b, 3); check(c, 2, plain=False)
assert c["random_init_seed"] == 5 and "plain" not in c["prompts"][0]
# JSONL and shard prompts are the same conversations: same prompt, same greedy output
for pa, pb in zip(a["prompts"], b["prompts"]):
    assert pa["prompt_tokens"] == pb["prompt_tokens"] and pa["tokens"] == pb["tokens"]
print(f"json ok: tau {a['overall']['tau']:.3f} (random drafter), hist {a['overall']['hist'][:4]}..., "
      f"speedup {a['overall']['speedup']:.2f}x on this CPU")
PY

# batches: 4 prompts through 3 sequences (a queue: the fourth is prefilled into the first
# sequence that frees up); same tokens as decoding them one by one, lossless per prompt; an
# eos that stops some prompts early
"$EVAL" --target models/tiny-target --drafter "$tmp/rel" --prompts data/tiny/chat-heldout.jsonl \
  --max-prompts 4 --max-new 40 --quiet --eos 101 --json "$tmp/d1.json" >/dev/null 2>&1
"$EVAL" --target models/tiny-target --drafter "$tmp/rel" --prompts data/tiny/chat-heldout.jsonl \
  --max-prompts 4 --max-new 40 --quiet --eos 101 --batch 3 --json "$tmp/d3.json" >"$tmp/d3.out" 2>&1
grep -q "batch of 3: speculative" "$tmp/d3.out" || { cat "$tmp/d3.out"; fail "--batch 3: no batch line"; }
python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
one, three = (json.load(open(f"{t}/{n}.json")) for n in ("d1", "d3"))
assert one["batch"] == 1 and three["batch"] == 3, (one["batch"], three["batch"])
assert len(three["prompts"]) == 4
for a, b in zip(one["prompts"], three["prompts"]):
    assert a["tokens"] == b["tokens"] and b["lossless"] and b["first_diff"] == -1, (a["source"], b["first_diff"])
    assert a["hist"] == b["hist"], (a["hist"], b["hist"])
o = three["overall"]
assert o["mismatches"] == 0 and o["plain_batch_tokens_per_s"] > 0 and o["spec_tokens_per_s"] > 0
ends = [len(p["tokens"]) for p in three["prompts"]]
print(f"--batch 3: 4 prompts ({ends} new tokens) == one at a time, lossless per prompt; "
      f"{o['spec_tokens_per_s']:.0f} spec / {o['plain_batch_tokens_per_s']:.0f} plain tokens/s batched on this CPU")
PY

# errors: exit code and a message naming the file / field
expect() { # expect CODE PATTERN -- command...
  local code=$1 pat=$2; shift 3
  set +e; "$@" >"$tmp/e.out" 2>"$tmp/e.err"; local rc=$?; set -e
  [ $rc -eq "$code" ] || { cat "$tmp/e.err"; fail "$*: exit $rc, expected $code"; }
  grep -q -- "$pat" "$tmp/e.err" || { cat "$tmp/e.err"; fail "$*: message lacks '$pat'"; }
  echo "error ok ($code): $(tail -n1 "$tmp/e.err")"
}
expect 2 "--batch: '0' is not an integer in \[1, " -- "$EVAL" --target models/tiny-target --drafter "$tmp/rel" \
  --prompts data/tiny/heldout-000.dfs --batch 0
expect 2 "--batch: 65 prompts, at most 64" -- "$EVAL" --target models/tiny-target --drafter "$tmp/rel" \
  --prompts data/tiny/heldout-000.dfs --batch 65
expect 2 "--batch: 'two' is not an integer" -- "$EVAL" --target models/tiny-target --drafter "$tmp/rel" \
  --prompts data/tiny/heldout-000.dfs --batch two
expect 2 "--max-new: '4294967297' is not an integer in \[1, 2147483647\]" -- "$EVAL" --target models/tiny-target \
  --drafter "$tmp/rel" --prompts data/tiny/heldout-000.dfs --max-new 4294967297
expect 100 "$tmp/none/config.json" -- "$EVAL" --target models/tiny-target --drafter "$tmp/none" --prompts data/tiny/heldout-000.dfs
expect 100 "hidden_size = 128 does not match the target tests/fixtures/tiny-qwen3" -- \
  "$EVAL" --target tests/fixtures/tiny-qwen3 --drafter "$tmp/rel" --prompts data/tiny/heldout-000.dfs
printf '%s\n%s\n' '{"messages": [{"role": "user", "content": "a"}]}' '{"messages": [{"role": "robot", "content": "a"}]}' >"$tmp/bad.jsonl"
expect 100 "bad.jsonl:2: message 0: role \"robot\"" -- \
  "$EVAL" --target models/tiny-target --drafter "$tmp/rel" --prompts "$tmp/bad.jsonl"
# chat JSONL needs the byte tokenizer: tiny-qwen3 has none (a drafter of its shape)
sed -e 's/"hidden_size": 128/"hidden_size": 64/; s/"intermediate_size": 384/"intermediate_size": 128/' \
    -e 's/"head_dim": 32/"head_dim": 16/; s/"vocab_size": 264/"vocab_size": 300/' "$tmp/cfg.json" >"$tmp/cfg64.json"
"$BUILD/bin/dflash_tool" init --out "$tmp/ck64" --config "$tmp/cfg64.json" >/dev/null
expect 100 "tiny-qwen3/byte_tokenizer.json" -- \
  "$EVAL" --target tests/fixtures/tiny-qwen3 --drafter "$tmp/ck64" --prompts data/tiny/chat-heldout.jsonl
# a token id in byte_tokenizer.json that is not a row of the embedding: refused, never
# read before the table (-1) or wrapped (2^32 + 256 read as 256)
for bad in -1 4294967552; do
  mkdir -p "$tmp/tt$bad" && ln -sf "$PWD"/models/tiny-target/{config.json,model.safetensors} "$tmp/tt$bad/"
  sed "s/\"bos\": 256/\"bos\": $bad/" models/tiny-target/byte_tokenizer.json >"$tmp/tt$bad/byte_tokenizer.json"
  grep -q "\"bos\": $bad" "$tmp/tt$bad/byte_tokenizer.json" || fail "could not plant bos $bad"
  expect 100 "byte_tokenizer.json: field \"bos\" missing or not a token id" -- \
    "$EVAL" --target "$tmp/tt$bad" --drafter "$tmp/rel" --prompts data/tiny/chat-heldout.jsonl --max-new 4
done
# a prompt shard whose header vocab_size is past 2^31 (read as a negative int, it passed the
# vocabulary check and let token 4000000000 through as a negative id): refused
python3 -c "
import sys; sys.path.insert(0, 'scripts'); from prepare_data import write_shard
write_shard('$tmp/wide.dfs', 0xFFFFFFFF, [([4000000000, 5], [0, 1])])"
expect 100 "wide.dfs: header vocab_size 4294967295 exceeds the target's vocab_size 264" -- \
  "$EVAL" --target models/tiny-target --drafter "$tmp/rel" --prompts "$tmp/wide.dfs" --max-new 4
if [[ $BUILD != *cuda* ]]; then # a CPU-only build refuses the cuda backend
  expect 2 "this build has no CUDA" -- "$EVAL" --target models/tiny-target --drafter "$tmp/rel" \
    --prompts data/tiny/heldout-000.dfs --backend cuda
fi
echo "test_eval: ok"
