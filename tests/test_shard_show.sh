#!/usr/bin/env bash
# test_shard_show: `dflash_tool shard show` on real shards, its output compared with what
# an independent decoder makes of the same shard:
#   (a) BPE (models/tiny-chat): shards prepare_data.py wrote from tests/fixtures/chat;
#       every sample's text equals the Python tokenizer's decoding of its runs of equal
#       mask, with ⟦ ⟧ exactly around the mask-1 runs; the marked spans are the assistant
#       turns of the JSONL (answer + <|im_end|>); the summary's counts equal the shard's
#   (b) byte vocabulary (models/tiny-target, data/tiny): latin-1 bytes and the named
#       specials (<|bos|> ...), the same comparison
#   (c) no tokenizer: the ids with marks; --ids: one line per token with id and mask
#   (d) colour: ANSI only with --color always (or a terminal), never when piped
#   (e) a control character in the data (ESC) is printed escaped, never raw
#   (f) bad input: not a shard / missing file / bad tokenizer -> 100, a bad or out of range
#       --sample and usage errors -> 2, each with a message naming the file or the option
set -euo pipefail
BUILD=${BUILD:-build}
TOOL=$BUILD/bin/dflash_tool
tmp=$(mktemp -d /tmp/df_test_shard_show_XXXXXX); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PY=python3
if ! python3 -c 'import jinja2, regex' 2>/dev/null; then
  if /usr/bin/python3 -c 'import jinja2, regex' 2>/dev/null; then PY=/usr/bin/python3; else
    echo "FAIL: no python3 with jinja2 and regex (make deps installs python3-jinja2 python3-regex)"; exit 1; fi
fi
export PYTHONPATH=tests${PYTHONPATH:+:$PYTHONPATH}
C=models/tiny-chat
J=tests/fixtures/chat/tiny-chat.jsonl

"$PY" scripts/prepare_data.py --tokenizer-impl builtin --tokenizer $C --out "$tmp/chat" $J >/dev/null
"$PY" scripts/prepare_data.py --tokenizer-impl builtin --tokenizer $C --out "$tmp/prompts" --prompts $J >/dev/null

# show FILE ARGS...: the tool's output into $tmp/out (exit status checked by set -e)
show() { "$TOOL" shard show "$@" >"$tmp/out"; }

echo "== (a) BPE shards: text and marks equal an independent decoding"
n=$("$PY" -c "import chat_shards as c, sys; print(len(c.read_shard(sys.argv[1])))" "$tmp/chat-000.dfs")
[ "$n" -ge 10 ] || fail "expected at least 10 samples, got $n"
for i in $(seq 0 $((n - 1))); do show "$tmp/chat-000.dfs" --tokenizer $C --sample "$i"; cp "$tmp/out" "$tmp/out.$i"; done
show "$tmp/chat-000.dfs" --tokenizer $C; cp "$tmp/out" "$tmp/summary"
show "$tmp/prompts-000.dfs" --tokenizer $C --sample 0; cp "$tmp/out" "$tmp/prompt.0"
"$PY" - "$tmp" $C $J "$n" <<'PY'
import sys
from chat_shards import View, read_shard, lines, check
t, tokdir, jsonl, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
v = View(tokdir)
OPEN, CLOSE = "\u27e6", "\u27e7"

def expected(sample):
    """The sample as the tool must print it: each run of equal mask decoded, mask-1 runs marked."""
    toks, mask = sample
    out, k = [], 0
    while k < len(toks):
        j = k
        while j < len(toks) and mask[j] == mask[k]:
            j += 1
        text = v.tok.decode(toks[k:j])
        out.append(OPEN + text + CLOSE if mask[k] else text)
        k = j
    s = "".join(out)
    return s if s.endswith("\n") else s + "\n"

samples = read_shard(f"{t}/chat-000.dfs")
for i, s in enumerate(samples):
    got = open(f"{t}/out.{i}", encoding="utf-8").read()
    head, body = got.split("\n", 1)
    check(head == f"--- sample {i} of {n}: {len(s[0])} tokens, {sum(s[1])} with loss in 1 span", f"sample {i}: header {head!r}")
    check(body == expected(s), f"sample {i}: text and marks equal the decoding of its mask runs")
# the marked spans are the assistant turns, in order: answer (+ reasoning) and <|im_end|>
marked = []
for i in range(n):
    body = open(f"{t}/out.{i}", encoding="utf-8").read().split("\n", 1)[1]
    check(body.count(OPEN) == 1 and body.count(CLOSE) == 1, f"sample {i}: one marked span")
    marked.append(body[body.index(OPEN) + 1:body.index(CLOSE)])
answers = [m for c in lines(jsonl) for m in c["messages"] if m["role"] == "assistant"]
check(len(answers) == n, f"one sample per assistant turn ({n})")
for i, (a, m) in enumerate(zip(answers, marked)):
    want = a["content"] + "<|im_end|>"
    check(m == want or (m.startswith("<think>\n" + a.get("reasoning_content", "")) and m.endswith("\n\n" + want)),
          f"sample {i}: the marked span is the assistant turn {a['content'][:24]!r}... + <|im_end|>")
# summary
toks = sum(len(s[0]) for s in samples)
loss = sum(sum(s[1]) for s in samples)
summ = open(f"{t}/summary", encoding="utf-8").read().split("\n")
check(summ[0].startswith(f"shard {t}/chat-000.dfs: {n} samples, {toks} tokens (") and summ[0].endswith("vocab_size 2048"),
      f"summary: samples, tokens, vocab ({summ[0]!r})")
check(summ[1] == f"loss mask: {loss} of {toks} tokens ({100 * loss / toks:.1f}%) in {n} spans", f"summary: {summ[1]!r}")
check(summ[2] == f"tokenizer: {tokdir}/tokenizer.json (byte-level BPE, 2048 ids)", f"summary: {summ[2]!r}")
check("\n".join(summ[4:]) == open(f"{t}/out.0", encoding="utf-8").read(), "summary: then sample 0")
# a prompt: everything before the eos is context, the eos alone is marked
p = read_shard(f"{t}/prompts-000.dfs")[0]
body = open(f"{t}/prompt.0", encoding="utf-8").read().split("\n", 1)[1]
check(body == v.tok.decode(p[0][:-1]) + OPEN + "<|im_end|>" + CLOSE + "\n" and
      body.startswith("<|im_start|>system\n") and "<|im_start|>assistant\n" + OPEN in body,
      "prompt shard: the rendered prompt ends with the assistant header, then the marked eos")
PY

echo "== (b) byte vocabulary"
show data/tiny/heldout-000.dfs --tokenizer models/tiny-target --sample 5
"$PY" - "$tmp/out" <<'PY'
import json, sys
from chat_shards import read_shard, check
spec = json.load(open("models/tiny-target/byte_tokenizer.json"))
names = {spec[k]: f"<|{k}|>" for k in ("bos", "eos", "user", "assistant", "pad", "mask")}
toks, mask = read_shard("data/tiny/heldout-000.dfs")[5]
want = ""
for k, (t, m) in enumerate(zip(toks, mask)):
    if m and (k == 0 or not mask[k - 1]):
        want += "\u27e6"
    if not m and k and mask[k - 1]:
        want += "\u27e7"
    want += names[t] if t in names else bytes([t]).decode("latin-1")
want += "\u27e7" if mask[-1] else ""
want += "" if want.endswith("\n") else "\n"
got = open(sys.argv[1], encoding="utf-8").read().split("\n", 1)[1]
check(got == want, "byte shard sample 5: latin-1 bytes, named specials, marks on the answer")
check(got.startswith("<|bos|><|user|>") and "<|assistant|>\u27e6" in got and got.endswith("<|eos|>\u27e7\n"),
      "byte shard: [bos][user] prompt [assistant] then the marked answer and eos")
PY

echo "== (c) no tokenizer; --ids"
show "$tmp/chat-000.dfs" --sample 1
"$PY" - "$tmp" <<'PY'
import sys
from chat_shards import read_shard, check
t = sys.argv[1]
toks, mask = read_shard(f"{t}/chat-000.dfs")[1]
words = []
for k, (x, m) in enumerate(zip(toks, mask)):
    if m and (k == 0 or not mask[k - 1]):
        words.append("\u27e6")
    if not m and k and mask[k - 1]:
        words.append("\u27e7")
    words.append(str(x))
if mask[-1]:
    words.append("\u27e7")
check(open(f"{t}/out", encoding="utf-8").read().split("\n", 1)[1] == " ".join(words) + "\n", "no tokenizer: ids with marks")
PY
show "$tmp/chat-000.dfs" --sample 1 --tokenizer $C --ids
"$PY" - "$tmp" $C <<'PY'
import sys
from chat_shards import View, read_shard, check
t, v = sys.argv[1], View(sys.argv[2])
toks, mask = read_shard(f"{t}/chat-000.dfs")[1]
rows = open(f"{t}/out", encoding="utf-8").read().split("\n")[1:-1]
check(len(rows) == len(toks), f"--ids: one line per token ({len(toks)})")
for k, (r, x, m) in enumerate(zip(rows, toks, mask)):
    f = r.split(None, 3)
    text = v.tok.decode([x]).replace("\n", "\\n").replace("\t", "\\t")
    assert [int(f[0]), int(f[1]), int(f[2])] == [k, x, m], (k, r)
    assert f[3] == f'"{text}"' + ("  (special)" if x >= 2038 else ""), (k, r, text)
print("ok: --ids: position, id, mask and the quoted token text on every line")
PY

echo "== (d) colour"
show "$tmp/chat-000.dfs" --tokenizer $C --sample 0 --color always
grep -q $'\033\[32m' "$tmp/out" || fail "--color always: no green span"
grep -q "⟦" "$tmp/out" && fail "--color always: marks printed as well"
show "$tmp/chat-000.dfs" --tokenizer $C --sample 0
grep -q $'\033' "$tmp/out" && fail "piped output (color auto) has escape sequences"
show "$tmp/chat-000.dfs" --tokenizer $C --sample 0 --color never
grep -q $'\033' "$tmp/out" && fail "--color never has escape sequences"
echo "ok: colour with --color always, marks when piped or --color never"

echo "== (e) a control character in the data is shown escaped"
printf '%s\n' '{"messages": [{"role": "user", "content": "red \u001b[31m here\r"}, {"role": "assistant", "content": "ok \u009b2J"}]}' >"$tmp/esc.jsonl"
"$PY" scripts/prepare_data.py --tokenizer models/tiny-target --out "$tmp/esc" "$tmp/esc.jsonl" >/dev/null
show "$tmp/esc-000.dfs" --tokenizer models/tiny-target --sample 0 --color never
grep -q $'\033' "$tmp/out" && fail "a raw ESC reached the output"
grep -qF 'red \x1b[31m here\x0d' "$tmp/out" || { cat "$tmp/out"; fail "ESC / CR not shown as \\x1b / \\x0d"; }
grep -qF '⟦ok \u009b2J<|eos|>⟧' "$tmp/out" || { cat "$tmp/out"; fail "C1 CSI not shown as \\u009b"; }
echo "ok: ESC, CR and C1 CSI printed as \\x1b, \\x0d, \\u009b"

echo "== (f) bad input"
expect() { # expect CODE PATTERN -- command...
  local code=$1 pat=$2; shift 3
  set +e; "$@" >"$tmp/e.out" 2>"$tmp/e.err"; local rc=$?; set -e
  [ $rc -eq "$code" ] || { cat "$tmp/e.err"; fail "$*: exit $rc, expected $code"; }
  grep -qF -- "$pat" "$tmp/e.err" || { cat "$tmp/e.err"; fail "$*: message lacks '$pat'"; }
  echo "error ok ($code): $(tail -n1 "$tmp/e.err")"
}
expect 100 "README.md: offset 0: bad magic" -- "$TOOL" shard show README.md
expect 100 "$tmp/none.dfs: cannot open" -- "$TOOL" shard show "$tmp/none.dfs"
head -c 200 "$tmp/chat-000.dfs" >"$tmp/cut.dfs"
expect 100 "$tmp/cut.dfs" -- "$TOOL" shard show "$tmp/cut.dfs"
expect 2 "--sample $n: the shard has $n samples (0..$((n - 1)))" -- "$TOOL" shard show "$tmp/chat-000.dfs" --sample "$n"
expect 2 "--sample: 'x' is not an integer" -- "$TOOL" shard show "$tmp/chat-000.dfs" --sample x
expect 2 "--sample: '-1' is not an integer" -- "$TOOL" shard show "$tmp/chat-000.dfs" --sample -1
expect 2 "--color: 'blue' is not auto, always or never" -- "$TOOL" shard show "$tmp/chat-000.dfs" --color blue
expect 2 "expected one shard FILE" -- "$TOOL" shard show
expect 2 "expected 'shard show FILE" -- "$TOOL" shard list
expect 100 "$tmp: no byte_tokenizer.json and no tokenizer.json" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp"
mkdir -p "$tmp/uni"
echo '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' >"$tmp/uni/tokenizer.json"
expect 100 "$tmp/uni/tokenizer.json: model.type: \"Unigram\" is not \"BPE\"" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo '{"model": {"type": "BPE", "vocab": {"a": 0, "\u0100\u0400": 1}}}' >"$tmp/uni/tokenizer.json"
expect 100 "U+0400 is not a byte-level character" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}}' >"$tmp/uni/tokenizer.json"
expect 100 "id 0 is given to another token too" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo '{"model": {"type": "BPE", "vocab": {"a": 99999999}}}' >"$tmp/uni/tokenizer.json"
expect 100 "model.vocab[\"a\"]: expected a token id in [0, 16777216)" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo '{"vocab_size": 264, "bos": 256, "eos": 999, "user": 258, "assistant": 259}' >"$tmp/uni/byte_tokenizer.json"
expect 100 "$tmp/uni/byte_tokenizer.json: eos: expected a token id in [256, 264)" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo '{"vocab_size": 264, "bos": 256, "eos": 257, "user": 258, "assistant": 263, "pad": 263}' >"$tmp/uni/byte_tokenizer.json"
expect 100 "byte_tokenizer.json: assistant and pad are the same token id 263" -- "$TOOL" shard show "$tmp/chat-000.dfs" --tokenizer "$tmp/uni"
echo "PASS: shard show"
