#!/usr/bin/env bash
# test_prepare_chat: scripts/prepare_data.py on real chat templates, through the builtin
# HF tokenizer reader (scripts/hf_tokenizer.py) and the two fixture tokenizers
# (tests/fixtures/tokenizers/qwen3-style, llama3-style). Each case decodes the shards it
# wrote and compares them with the template rendered independently:
#   (a) Qwen3 multi-turn with thinking: one sample per assistant turn; the earlier turn's
#       <think> block is gone from the later sample's history; mask exactly on each turn's
#       reasoning + answer + <|im_end|>; --turns last keeps the last turn only
#   (b) Qwen3 thinking off: the empty think block the template inserts is mask 0, with and
#       without --no-thinking; the prompt part equals the generation prompt
#   (c) tool call + tool response (Qwen3 and Llama-3): tool calls labelled, tool results
#       context only; the date comes from --chat-template-kwargs
#   (d) unknown role, malformed message, invalid JSON, non-UTF-8: skipped with file:line and
#       reason, counted in the summary line, the good conversations still written; a file
#       of only bad lines: exit 100 and no shard; command-line errors: exit 2
#   (e) Llama-3 multi-turn: history not rewritten, so one sample labels both turns
#   (f) --prompts: every prompt ends with the assistant header (Qwen3 with and without
#       thinking, Llama-3); the byte tokenizer's prompts shard gives dflash_eval the same
#       prompts as the chat JSONL
#   (g) round trip: every sample written decodes to the rendered conversation (unicode,
#       whitespace runs, digits included)
#   (h) a mask edge inside a BPE token (the template's header newline merging with the
#       content's) is detected: that sample is skipped as boundary-merge, not mis-masked
set -euo pipefail
BUILD=${BUILD:-build}
tmp=$(mktemp -d /tmp/df_test_prep_chat_XXXXXX); trap 'rm -rf "$tmp"' EXIT
# the interpreter: python3 when it has jinja2 and regex, else Debian's (install_deps.sh installs them there)
PY=python3
if ! python3 -c 'import jinja2, regex' 2>/dev/null; then
  if /usr/bin/python3 -c 'import jinja2, regex' 2>/dev/null; then PY=/usr/bin/python3; else
    echo "FAIL: no python3 with jinja2 and regex (make deps installs python3-jinja2 python3-regex)"; exit 1; fi
fi
Q=tests/fixtures/tokenizers/qwen3-style
L=tests/fixtures/tokenizers/llama3-style
prep() { "$PY" scripts/prepare_data.py --tokenizer-impl builtin "$@"; }
export PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH}

cat >"$tmp/think.jsonl" <<'J'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, caf\u00e9 \u65e5\u672c\u8a9e?"}, {"role": "assistant", "content": "Hello!  \u00a1Gr\u00fc\u00dfe! \ud83d\ude42", "reasoning_content": "greet back 123"}, {"role": "user", "content": "Add 1234 + 5678"}, {"role": "assistant", "content": "<think>\nsum it\n</think>\n\n6912"}]}
J
cat >"$tmp/nothink.jsonl" <<'J'
{"messages": [{"role": "user", "content": "q  \t x"}, {"role": "assistant", "content": "fine\n\nthanks"}]}
J
cat >"$tmp/tools.jsonl" <<'J'
{"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "content": "{\"t\": 21}"}, {"role": "assistant", "content": "Sunny, 21."}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
J
cat >"$tmp/multi.jsonl" <<'J'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Add 2+2"}, {"role": "assistant", "content": " 4 "}]}
J

echo "== (a) Qwen3 multi-turn with thinking"
prep --tokenizer $Q --out "$tmp/a" "$tmp/think.jsonl"
prep --tokenizer $Q --out "$tmp/a_last" --turns last "$tmp/think.jsonl"
"$PY" - "$tmp" $Q <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, v = sys.argv[1], View(sys.argv[2])
msgs = lines(f"{t}/think.jsonl")[0]["messages"]
s = read_shard(f"{t}/a-000.dfs")
check(len(s) == 2, "two samples, one per assistant turn (the template rewrites history)")
check(v.text(s[0]) == v.render(msgs[:3]) and v.text(s[1]) == v.render(msgs), "(g) samples decode to the rendered turns")
check("greet back" in v.text(s[0]) and "greet back" not in v.text(s[1]), "turn 1's reasoning is dropped from turn 2's history")
check(v.runs(s[0]) == ["<think>\ngreet back 123\n</think>\n\nHello!  \u00a1Gr\u00fc\u00dfe! \U0001F642<|im_end|>"],
      "turn 1: mask exactly on its reasoning, answer and <|im_end|>")
check(v.runs(s[1]) == ["<think>\nsum it\n</think>\n\n6912<|im_end|>"], "turn 2: mask exactly on its reasoning, answer and <|im_end|>")
check(v.prompt(s[1]) == v.render(msgs[:4], gen=True), "turn 2: everything before the mask is the history + assistant header")
check(read_shard(f"{t}/a_last-000.dfs") == s[1:], "--turns last: only the last turn's sample")
PY

echo "== (b) Qwen3 thinking off: the empty think block is not labelled"
prep --tokenizer $Q --out "$tmp/b" "$tmp/nothink.jsonl"
prep --tokenizer $Q --out "$tmp/b_off" --no-thinking "$tmp/nothink.jsonl"
"$PY" - "$tmp" $Q <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, v = sys.argv[1], View(sys.argv[2])
msgs = lines(f"{t}/nothink.jsonl")[0]["messages"]
s = read_shard(f"{t}/b-000.dfs")
check(len(s) == 1 and v.text(s[0]) == v.render(msgs), "(g) the sample decodes to the rendered conversation")
check("<think>\n\n</think>\n\n" in v.text(s[0]), "the template inserted an empty think block")
check(v.runs(s[0]) == ["fine\n\nthanks<|im_end|>"], "mask on the answer and <|im_end|> only")
check(v.prompt(s[0]) == v.render(msgs[:1], gen=True, enable_thinking=False),
      "the unlabelled part is the no-thinking generation prompt (header + empty think block)")
check(read_shard(f"{t}/b_off-000.dfs") == s, "--no-thinking: same tokens and mask")
PY

echo "== (c) tool call + tool response"
prep --tokenizer $Q --out "$tmp/cq" "$tmp/tools.jsonl"
prep --tokenizer $L --out "$tmp/cl" --chat-template-kwargs '{"date_string": "01 Jan 2026"}' "$tmp/tools.jsonl"
"$PY" - "$tmp" $Q $L <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, q, l = sys.argv[1], View(sys.argv[2]), View(sys.argv[3])
c = lines(f"{t}/tools.jsonl")[0]
msgs, tools = c["messages"], c["tools"]
s = read_shard(f"{t}/cq-000.dfs")
check(len(s) == 2 and [q.text(x) for x in s] == [q.render(msgs[:2], tools), q.render(msgs, tools)],
      "(g) Qwen3: two samples, decoding to the rendered turns")
check(q.runs(s[0]) == ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'],
      "Qwen3: the tool call is labelled (not the empty think block before it)")
check(q.runs(s[1]) == ["Sunny, 21.<|im_end|>"] and "<tool_response>\n{\"t\": 21}\n</tool_response>" in q.prompt(s[1]),
      "Qwen3: the tool response is context (mask 0), the answer labelled")
s = read_shard(f"{t}/cl-000.dfs")
check(len(s) == 1 and l.text(s[0]) == l.render(msgs, tools, date_string="01 Jan 2026"),
      "(g) Llama-3: one sample, decoding to the rendered conversation (date from --chat-template-kwargs)")
check(l.runs(s[0]) == ['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>', "Sunny, 21.<|eot_id|>"],
      "Llama-3: tool call and answer labelled, the ipython turn not")
PY

echo "== (d) bad conversations are skipped and counted, the rest is written"
{ head -c -1 "$tmp/nothink.jsonl"; echo
  echo '{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}'
  echo '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "y"}]}'
  echo 'not json'
  printf '{"messages": [{"role": "user", "content": "\xff"}]}\n'
  echo '{"conversations": [{"from": "narrator", "value": "x"}]}'
  cat "$tmp/multi.jsonl"; } >"$tmp/mixed.jsonl"
prep --tokenizer $Q --out "$tmp/d" "$tmp/mixed.jsonl" >"$tmp/d.out" 2>"$tmp/d.err"
cat "$tmp/d.out" "$tmp/d.err"
grep -q "^$tmp/mixed.jsonl:2: skipped (unknown-role): message 0: role \"robot\"" "$tmp/d.err" || { echo "FAIL: line 2 not reported"; exit 1; }
grep -q "^$tmp/mixed.jsonl:3: skipped (malformed-message): message 0: content" "$tmp/d.err" || { echo "FAIL: line 3 not reported"; exit 1; }
grep -q "^$tmp/mixed.jsonl:4: skipped (invalid-json)" "$tmp/d.err" || { echo "FAIL: line 4 not reported"; exit 1; }
grep -q "^$tmp/mixed.jsonl:5: skipped (not-utf8)" "$tmp/d.err" || { echo "FAIL: line 5 not reported"; exit 1; }
grep -q "^$tmp/mixed.jsonl:6: skipped (unknown-role): message 0: from \"narrator\"" "$tmp/d.err" || { echo "FAIL: line 6 not reported"; exit 1; }
grep -qx "prepare_data: skipped 5: invalid-json 1, malformed-message 1, not-utf8 1, unknown-role 2" "$tmp/d.out" ||
  { echo "FAIL: summary line"; exit 1; }
echo "ok: each bad line named with its reason, the summary counts them per reason"
"$PY" - "$tmp" $Q <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, v = sys.argv[1], View(sys.argv[2])
m1 = lines(f"{t}/nothink.jsonl")[0]["messages"]
m7 = lines(f"{t}/multi.jsonl")[0]["messages"]
got = [v.text(x) for x in read_shard(f"{t}/d-000.dfs")]
check(got == [v.render(m1), v.render(m7[:3]), v.render(m7)], "the good lines 1 and 7 are written (3 samples)")
PY
sed -n 2,6p "$tmp/mixed.jsonl" >"$tmp/allbad.jsonl"
set +e
prep --tokenizer $Q --out "$tmp/e" "$tmp/allbad.jsonl" >/dev/null 2>"$tmp/e.err"; rc=$?
set -e
[ $rc -eq 100 ] && [ ! -e "$tmp/e-000.dfs" ] || { echo "FAIL: only bad lines: rc $rc (expected 100, no shard)"; exit 1; }
grep -q "no sample written" "$tmp/e.err" || { echo "FAIL: no message for an unusable file"; exit 1; }
echo "ok: a file with nothing usable: exit 100, no shard"
set +e
prep --tokenizer $Q --out "$tmp/x" "$tmp/none.jsonl" 2>"$tmp/x.err"; rc1=$?
prep --tokenizer models/tiny-target --no-thinking --out "$tmp/x" "$tmp/multi.jsonl" 2>"$tmp/x2.err"; rc2=$?
prep --tokenizer $Q --chat-template-kwargs '[1' --out "$tmp/x" "$tmp/multi.jsonl" 2>/dev/null; rc3=$?
prep --tokenizer "$tmp/nodir" --out "$tmp/x" "$tmp/multi.jsonl" 2>/dev/null; rc4=$?
set -e
[ $rc1 -eq 100 ] && grep -q "none.jsonl: cannot read" "$tmp/x.err" || { echo "FAIL: missing input: rc $rc1"; exit 1; }
[ $rc2 -eq 2 ] && grep -q "needs a tokenizer with a chat template" "$tmp/x2.err" || { echo "FAIL: --no-thinking with the byte tokenizer: rc $rc2"; exit 1; }
[ $rc3 -eq 2 ] && [ $rc4 -eq 100 ] || { echo "FAIL: bad --chat-template-kwargs rc $rc3 (2), missing tokenizer rc $rc4 (100)"; exit 1; }
mkdir "$tmp/uni" && cp $Q/* "$tmp/uni/"
"$PY" -c 'import json, sys; p = sys.argv[1]; j = json.load(open(p)); j["model"]["type"] = "Unigram"; json.dump(j, open(p, "w"))' "$tmp/uni/tokenizer.json"
set +e; prep --tokenizer "$tmp/uni" --out "$tmp/x" "$tmp/multi.jsonl" 2>"$tmp/x6.err"; rc6=$?; set -e
[ $rc6 -eq 100 ] && grep -q "uni/tokenizer.json: model.type = \"Unigram\" is not supported" "$tmp/x6.err" ||
  { echo "FAIL: a Unigram tokenizer: rc $rc6, expected 100 naming the file and field"; exit 1; }
# the template is code from the tokenizer directory: rendered in jinja2's sandbox
mkdir "$tmp/evil" && cp $L/* "$tmp/evil/"
echo "{{ messages[0].content.__class__.__mro__[1].__subclasses__() }}" >"$tmp/evil/chat_template.jinja"
set +e; prep --tokenizer "$tmp/evil" --out "$tmp/x" "$tmp/multi.jsonl" >/dev/null 2>"$tmp/x7.err"; rc7=$?; set -e
[ $rc7 -eq 100 ] && grep -q "skipped (template-error): SecurityError" "$tmp/x7.err" ||
  { cat "$tmp/x7.err"; echo "FAIL: a template reaching for Python internals: rc $rc7, expected a SecurityError skip"; exit 1; }
echo "ok: a template reaching for Python internals is stopped by the sandbox (template-error)"
# ... and it is code that may never end or allocate without bound: a 10 GB string in one
# step is refused, a loop of 10^10 iterations is cut by the time limit (each conversation
# skipped, counted; nothing is written, so exit 100); ulimit -v: a missing check fails
# here with a MemoryError instead of taking the machine's memory
echo "{{ 'x' * 10000000000 }}{{ messages[0].content }}" >"$tmp/evil/chat_template.jinja"
set +e; (ulimit -v 4000000; prep --tokenizer "$tmp/evil" --out "$tmp/x" "$tmp/multi.jsonl" >/dev/null 2>"$tmp/x8.err"); rc8=$?; set -e
[ $rc8 -eq 100 ] && grep -q "skipped (template-error): SecurityError: template: a repetition of 1 x 10000000000" "$tmp/x8.err" ||
  { cat "$tmp/x8.err"; echo "FAIL: a template building a 10 GB string: rc $rc8, expected a SecurityError skip"; exit 1; }
echo "{{ 7 ** 100000000 }}" >"$tmp/evil/chat_template.jinja"
set +e; prep --tokenizer "$tmp/evil" --out "$tmp/x" "$tmp/multi.jsonl" >/dev/null 2>"$tmp/x9.err"; rc9=$?; set -e
[ $rc9 -eq 100 ] && grep -q "skipped (template-error): SecurityError: template: 7 \*\* 100000000 has more than" "$tmp/x9.err" ||
  { cat "$tmp/x9.err"; echo "FAIL: a template computing 7 ** 10^8: rc $rc9, expected a SecurityError skip"; exit 1; }
printf '%s' "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" >"$tmp/evil/chat_template.jinja"
n_conv=$(grep -c . "$tmp/multi.jsonl")
set +e; prep --tokenizer "$tmp/evil" --template-timeout 0.5 --out "$tmp/x" "$tmp/multi.jsonl" >"$tmp/x10.err" 2>&1; rc10=$?; set -e
[ $rc10 -eq 100 ] && grep -q "skipped (template-timeout): rendering took longer than 0.5 s" "$tmp/x10.err" &&
  grep -q "template-timeout $n_conv" "$tmp/x10.err" ||
  { cat "$tmp/x10.err"; echo "FAIL: a template looping 10^10 times: rc $rc10, expected every conversation skipped as template-timeout"; exit 1; }
echo "ok: a template that allocates without bound is refused (SecurityError), one that loops is cut by --template-timeout"
if ! "$PY" -c 'import transformers' 2>/dev/null; then
  set +e; "$PY" scripts/prepare_data.py --tokenizer-impl transformers --tokenizer $Q --out "$tmp/x" "$tmp/multi.jsonl" 2>"$tmp/x5.err"; rc5=$?; set -e
  [ $rc5 -eq 2 ] && grep -q "pip install transformers" "$tmp/x5.err" || { echo "FAIL: --tokenizer-impl transformers without it: rc $rc5"; exit 1; }
fi
echo "ok: exit 100 for a missing input or tokenizer, 2 for bad flags"

echo "== (e) Llama-3 multi-turn"
prep --tokenizer $L --out "$tmp/l" "$tmp/multi.jsonl"
prep --tokenizer $L --out "$tmp/l_last" --turns last "$tmp/multi.jsonl"
"$PY" - "$tmp" $L <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, v = sys.argv[1], View(sys.argv[2])
msgs = lines(f"{t}/multi.jsonl")[0]["messages"]
s = read_shard(f"{t}/l-000.dfs")
check(len(s) == 1 and v.text(s[0]) == v.render(msgs), "(g) one sample (history unchanged), decoding to the rendered conversation")
check(v.runs(s[0]) == ["Hello!<|eot_id|>", "4<|eot_id|>"], "both assistant turns labelled (content + <|eot_id|>), headers not")
check(v.prompt(s[0]) == v.render(msgs[:2], gen=True), "everything before the first label is the history + assistant header")
s = read_shard(f"{t}/l_last-000.dfs")
check(len(s) == 1 and v.runs(s[0]) == ["4<|eot_id|>"], "--turns last: the last turn only")
PY

echo "== (f) evaluation prompts end with the assistant header"
prep --prompts --tokenizer $Q --out "$tmp/pq" "$tmp/think.jsonl" "$tmp/tools.jsonl"
prep --prompts --no-thinking --tokenizer $Q --out "$tmp/pqn" "$tmp/think.jsonl" "$tmp/tools.jsonl"
prep --prompts --tokenizer $L --out "$tmp/pl" --chat-template-kwargs '{"date_string": "01 Jan 2026"}' "$tmp/think.jsonl" "$tmp/tools.jsonl"
"$PY" - "$tmp" $Q $L <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, q, l = sys.argv[1], View(sys.argv[2]), View(sys.argv[3])
convs = lines(f"{t}/think.jsonl") + lines(f"{t}/tools.jsonl")
want = [(c["messages"][:2 if i == 0 else 1], c.get("tools")) for i, c in enumerate(convs)]
for name, v, kw, end in (("pq", q, {}, "<|im_start|>assistant\n"),
                         ("pqn", q, {"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
                         ("pl", l, {"date_string": "01 Jan 2026"}, "<|start_header_id|>assistant<|end_header_id|>\n\n")):
    s = read_shard(f"{t}/{name}-000.dfs")
    check(len(s) == 2 and all(x[1][-1] == 1 and sum(x[1]) == 1 for x in s), f"{name}: 2 prompts, one eos marker each")
    check([v.prompt(x) for x in s] == [v.render(m, tl, gen=True, **kw) for m, tl in want],
          f"{name}: the prompt is the history before the first assistant turn with the generation prompt")
    check(all(v.prompt(x).endswith(end) for x in s), f"{name}: every prompt ends with {end!r}")
PY
prep --prompts --tokenizer models/tiny-target --out "$tmp/pb" data/tiny/chat-heldout.jsonl
"$BUILD/bin/dflash_tool" init --out "$tmp/ck" --config tests/fixtures/dflash-release-tiny/config.json --seed 3 >/dev/null
for src in data/tiny/chat-heldout.jsonl "$tmp/pb-000.dfs"; do
  "$BUILD/bin/dflash_eval" --target models/tiny-target --drafter "$tmp/ck" --prompts "$src" --max-prompts 3 \
    --max-new 8 --no-plain --quiet --json "$tmp/ev_$(basename "$src").json" >/dev/null 2>&1
done
"$PY" - "$tmp/ev_chat-heldout.jsonl.json" "$tmp/ev_pb-000.dfs.json" <<'PY'
import json, sys
from chat_shards import check
a, b = (json.load(open(p))["prompts"] for p in sys.argv[1:])
check(len(a) == len(b) == 3 and [(p["prompt_tokens"], p["tokens"]) for p in a] == [(p["prompt_tokens"], p["tokens"]) for p in b],
      "byte tokenizer: dflash_eval reads the same prompts from the --prompts shard as from the chat JSONL")
PY

echo "== (h) a mask edge inside a token is detected"
printf '%s\n' '{"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "\nfoo"}]}' >"$tmp/merge.jsonl"
cat "$tmp/nothink.jsonl" >>"$tmp/merge.jsonl"
prep --tokenizer $Q --out "$tmp/h" "$tmp/merge.jsonl" >"$tmp/h.out" 2>"$tmp/h.err"
cat "$tmp/h.out" "$tmp/h.err"
grep -q "^$tmp/merge.jsonl:1: skipped (boundary-merge)" "$tmp/h.err" && grep -qx "prepare_data: skipped 1: boundary-merge 1" "$tmp/h.out" ||
  { echo "FAIL: the merged boundary was not detected"; exit 1; }
"$PY" - "$tmp" $Q <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, v = sys.argv[1], View(sys.argv[2])
check([v.text(x) for x in read_shard(f"{t}/h-000.dfs")] == [v.render(lines(f"{t}/nothink.jsonl")[0]["messages"])],
      "only the other conversation is written")
PY
echo "test_prepare_chat: ok"
