#!/usr/bin/env bash
# test_chat_path: the chat-template path end to end on the CPU, with the tiny chat target
# (models/tiny-chat: a byte-level BPE tokenizer with a ChatML template, Qwen3-shaped):
#   chat JSONL (tests/fixtures/chat: system prompts, multi-turn, one turn with reasoning)
#   -> scripts/prepare_data.py --tokenizer models/tiny-chat (the HF-tokenizer path, through
#      the builtin reader): training shards and --prompts shards
#   -> scripts/make_topology.py (the mask token from the tokenizer's mask_token, <|MASK|>)
#   -> a real orchestrator run (target_worker + postproc_worker + drafter_worker on the CPU,
#      a few steps) that ends with every batch committed exactly once (ledger audit) and a
#      release-format drafter whose mask token is the tokenizer's <|MASK|>
#   -> build/bin/dflash_eval on the prompt shards: every prompt ends with the assistant
#      header, the eos is <|im_end|> (config.json), and speculative decoding gives exactly
#      the plain greedy output (lossless)
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker dflash_eval; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
PY=python3
if ! python3 -c 'import jinja2, regex' 2>/dev/null; then
  if /usr/bin/python3 -c 'import jinja2, regex' 2>/dev/null; then PY=/usr/bin/python3; else
    fail "no python3 with jinja2 and regex (make deps installs python3-jinja2 python3-regex)"; fi
fi
export PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
M=$PWD/models/tiny-chat
J=tests/fixtures/chat/tiny-chat.jsonl

"$PY" scripts/prepare_data.py --tokenizer "$M" --out "$T/train" $J >"$T/prep.out" || { cat "$T/prep.out"; fail "prepare_data"; }
grep -q "chat template and tokenizer by" "$T/prep.out" || fail "prepare_data did not take the chat-template path"
grep -q "skipped 0$" "$T/prep.out" || { cat "$T/prep.out"; fail "prepare_data skipped conversations"; }
"$PY" scripts/prepare_data.py --tokenizer "$M" --out "$T/prompts" --prompts $J >/dev/null || fail "prepare_data --prompts"
read -r MASK EOS < <("$PY" -c "
import json, sys
sys.path.insert(0, 'scripts')
from hf_tokenizer import HFDirTokenizer
t = HFDirTokenizer(sys.argv[1])
print(t.added_by_content[t.special_token('mask_token')], t.added_by_content['<|im_end|>'])" "$M")
[ "$(pyjson "$M/config.json" "d['eos_token_id']")" = "$EOS" ] || fail "config.json eos_token_id is not <|im_end|> ($EOS)"
ok "shards: $(grep -o '[0-9]* samples, [0-9]* tokens ([0-9]* with loss)' "$T/prep.out"); mask token $MASK, eos $EOS"

# the topology as a newcomer makes it (scripts/make_topology.py: the mask token from the
# tokenizer's mask_token), at the cheapest real settings: a 1-layer drafter, block 8, 16
# anchors, batches of <= 512 tokens, one epoch (a handful of steps), a checkpoint at the end
RUN=$T/run; TOPO=$T/chat.json
python3 scripts/make_topology.py --target "$M" --data "$T/train-000.dfs" --backend cpu --drafter-layers 1 \
  --capture-layers 1,3 --block-size 8 --anchors 16 --token-budget 512 --max-seq-len 256 --checkpoint-every 1000 \
  --seed 7 --run-dir "$RUN" --out "$TOPO" 2>"$T/topo.err" || { cat "$T/topo.err"; fail "make_topology"; }
grep -q "mask token id $MASK: the tokenizer's mask_token <|MASK|>" "$T/topo.err" || { cat "$T/topo.err"; fail "make_topology: mask token"; }
[ "$(pyjson "$TOPO" "d['drafter']['mask_token_id']")" = "$MASK" ] || fail "topology: mask_token_id"
start_orch; wait_orch 120
[ "$ORCH_RC" = 0 ] || fail "training run exited $ORCH_RC"
audit_exactly_once
n_b=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n_b" ] || fail "not every batch committed"
steps=$(grep -c '"ev":"step"' "$RUN/metrics/drafter0.jsonl" || true)
[ "$steps" -ge 2 ] || fail "only $steps training steps"
[ -f "$RUN/drafter/model.safetensors" ] || fail "no release drafter in $RUN/drafter"
[ "$(pyjson "$RUN/drafter/config.json" "d['dflash_config']['mask_token_id']")" = "$MASK" ] || fail "release drafter: mask_token_id"
[ "$(pyjson "$RUN/drafter/config.json" "d['vocab_size']")" = "$(pyjson "$M/config.json" "d['vocab_size']")" ] || fail "release drafter: vocab_size"
ok "pipeline: $n_b batches committed exactly once in $steps steps; release drafter in run/drafter"

"$BIN/dflash_eval" --target "$M" --drafter "$RUN/drafter" --prompts "$T/prompts-000.dfs" --max-prompts 4 --max-new 32 \
  --json "$T/eval.json" >"$T/eval.out" 2>&1 || { cat "$T/eval.out"; fail "dflash_eval"; }
grep -q "lossless: 4 of 4 outputs identical" "$T/eval.out" || { cat "$T/eval.out"; fail "dflash_eval: not lossless"; }
"$PY" - "$T" "$M" "$EOS" <<'PY' || fail "dflash_eval report"
import json, sys
from chat_shards import View, read_shard, check
t, m, eos = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(f"{t}/eval.json"))
v = View(m)
prompts = read_shard(f"{t}/prompts-000.dfs")
check(r["eos"] == eos and r["overall"]["n_prompts"] == 4 and r["overall"]["mismatches"] == 0,
      "eos <|im_end|>, 4 prompts, no mismatch")
for p, (toks, mask) in zip(r["prompts"], prompts):
    k = mask.index(1)
    check(p["prompt_tokens"] == k and p["lossless"] and p["first_diff"] == -1,
          f"{p['source']}: the {k} tokens before the prompt shard's mask, lossless")
    text = v.tok.decode(toks[:k])
    check(text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n"),
          f"{p['source']}: a ChatML prompt ending with the assistant header")
    print(f"   answer: {v.tok.decode(p['tokens'])[:70]!r}")
PY
ok "dflash_eval: 4 chat prompts, speculative == plain greedy"
