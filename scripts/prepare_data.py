#!/usr/bin/env python3
"""prepare_data.py: chat JSONL -> token shards (.dfs) for the pipeline.

    python3 scripts/prepare_data.py --tokenizer models/tiny-target --out data/tiny/train \\
        data/tiny/chat-train.jsonl [--max-samples N] [--max-len L] [--shard-tokens N]
    python3 scripts/prepare_data.py --tokenizer DIR --out OUT [--turns each|last]
        [--enable-thinking | --no-thinking] [--chat-template-kwargs JSON]
        [--tokenizer-impl auto|transformers|builtin] [--prompts] FILE.jsonl...

Input lines are either OpenAI style {"messages": [{"role": ..., "content": ...}, ...],
"tools": [...]} or ShareGPT style {"conversations": [{"from": "human"|"gpt"|"system"|
"tool"|"observation"|"function_call", "value": ...}, ...]}. The loss mask is 1 on what the
assistant generates (its content, reasoning, tool calls and its end-of-turn token), 0 on
everything else: prompts, tool results and template scaffolding are context, never labels.
docs/data.md has the whole story; in short:

Tokenizers:
  * a directory with byte_tokenizer.json (the embedded default's byte-level vocabulary):
    pure Python; text is mapped to bytes with latin-1 (one char = one byte); one sample per
    conversation, every assistant turn labelled (this path is unchanged, bit for bit);
  * any Hugging Face tokenizer directory with a chat template: rendered and tokenised by
    transformers' AutoTokenizer when it is installed (optional), else by the builtin reader
    scripts/hf_tokenizer.py (byte-level BPE; needs the Python modules regex and jinja2).
    --tokenizer-impl picks one (auto: transformers if importable, else builtin).

Chat templates (HF tokenizers): assistant turn i is trained on the template rendered over
messages[:i+1], so its history is exactly what the template shows at that point (Qwen3
drops the <think> blocks of turns before the last user query). Its labelled span is the
text after render(messages[:i], add_generation_prompt=True) (the invariant: that rendering
is a prefix of render(messages[:i+1])), less a leading empty <think></think> block and the
layout after its final end-of-turn token. Each span must be a whole number of tokens:
the text is tokenised in pieces cut at the span edges and as a whole, and the two must
agree, else the sample is skipped as "boundary-merge" (never mis-masked). --turns each
(default) labels every assistant turn once; a turn whose rendering extends the previous
sample verbatim (a template that does not rewrite history, e.g. Llama-3) joins it, so
such a conversation costs one sample. --turns last: only the last assistant turn.

A conversation that cannot be used (not JSON, not UTF-8, unknown role, malformed message,
template error, a template rendering for longer than --template-timeout seconds, prefix
mismatch, boundary merge, nothing left to learn after --max-len)
is skipped, reported on stderr as FILE:LINE: skipped (reason): detail, and counted; the
last line printed sums the skips per reason. Exit codes: 0 done; 2 bad command line;
100 an input file or the tokenizer directory cannot be read, or no sample was written.

--prompts: evaluation prompts for dflash_eval instead of training samples: per
conversation, the messages before its first assistant turn rendered with the generation
prompt (so the prompt ends with the assistant header; --enable-thinking / --no-thinking
reach the template), followed by one eos token with mask 1 (dflash_eval takes the tokens
before the first mask-1 token as the prompt).

Output: <out>-000.dfs, <out>-001.dfs, ... each written to a temp name then renamed. The
format is documented in common/io/shard.h.
"""
import argparse
import collections
import contextlib
import json
import os
import re
import signal
import struct
import sys

MAGIC = b"DFSHARD1"
VERSION = 1


def fnv1a64(data, seed=0):
    h = 0xcbf29ce484222325 ^ seed
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_shard(path, vocab_size, samples):
    """samples: list of (tokens list, mask list)."""
    offsets = [0]
    for t, _ in samples:
        offsets.append(offsets[-1] + len(t))
    n_tokens = offsets[-1]
    toks = bytearray()
    mask = bytearray()
    for t, m in samples:
        toks += struct.pack(f"<{len(t)}I", *t)
        mask += bytes(m)
    toks += b"\0" * (-len(toks) % 8)
    mask += b"\0" * (-len(mask) % 8)
    payload = struct.pack(f"<{len(offsets)}Q", *offsets) + bytes(toks) + bytes(mask)
    head = MAGIC + struct.pack("<IIQQQ", VERSION, vocab_size, len(samples), n_tokens, fnv1a64(payload))
    head += struct.pack("<Q", fnv1a64(head[:40])) + b"\0" * 16
    assert len(head) == 64
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


class ByteTokenizer:
    def __init__(self, spec):
        self.spec = spec
        self.vocab_size = spec["vocab_size"]

    def encode_chat(self, messages):
        s = self.spec
        toks, mask = [s["bos"]], [0]
        for m in messages:
            data = m["content"].encode("latin-1", errors="replace")
            if m["role"] == "assistant":
                toks += [s["assistant"]] + list(data) + [s["eos"]]
                mask += [0] + [1] * len(data) + [1]
            else:
                toks += [s["user"]] + list(data)
                mask += [0] * (1 + len(data))
        return toks, mask


KNOWN_ROLES = ("system", "user", "assistant", "tool")
ROLE_ALIASES = {"function": "tool", "ipython": "tool"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool", "function_call": "assistant"}
EMPTY_THINK = re.compile(r"<think>\s*</think>\n*")
SHOWN_PER_REASON = 20


class Skip(Exception):
    """A conversation (or one sample of it) that cannot be used: counted by reason, not fatal."""

    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def normalise(obj):
    """(messages, tools) of one JSONL object; Skip when it is not a usable conversation."""
    if not isinstance(obj, dict):
        raise Skip("malformed-line", "expected a JSON object")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list):
            raise Skip("malformed-line", '"messages" is not a list')
    elif "conversations" in obj:
        conv = obj["conversations"]
        if not isinstance(conv, list):
            raise Skip("malformed-line", '"conversations" is not a list')
        msgs = []
        for i, m in enumerate(conv):
            if not isinstance(m, dict) or not isinstance(m.get("from"), str):
                raise Skip("malformed-message", f'message {i}: expected an object with "from" and "value"')
            if m["from"] not in SHAREGPT_ROLES:
                raise Skip("unknown-role", f'message {i}: from "{m["from"]}" is not one of '
                           + ", ".join(sorted(SHAREGPT_ROLES)))
            msgs.append({"role": SHAREGPT_ROLES[m["from"]], "content": m.get("value")})
    else:
        raise Skip("malformed-line", 'expected a "messages" or "conversations" list')
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise Skip("malformed-line", '"tools" is not a list')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise Skip("malformed-message", f'message {i}: expected an object with a string "role"')
        role = ROLE_ALIASES.get(m["role"], m["role"])
        if role not in KNOWN_ROLES:
            raise Skip("unknown-role", f'message {i}: role "{m["role"]}" is not system, user, assistant or tool')
        n = {"role": role}
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list) or not all(
                    isinstance(c, dict) and isinstance((c.get("function") or c).get("name"), str) for c in calls):
                raise Skip("malformed-message", f"message {i}: tool_calls must be a list of calls with a "
                           "function name, on an assistant message")
            if calls:
                n["tool_calls"] = calls
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                             isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)
        if content is None and "tool_calls" in n:
            content = ""
        if not isinstance(content, str):
            raise Skip("malformed-message", f"message {i}: content must be a string (or text parts)")
        n["content"] = content
        reasoning = m.get("reasoning_content", m.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str) or role != "assistant":
                raise Skip("malformed-message", f"message {i}: reasoning_content must be a string, "
                           "on an assistant message")
            n["reasoning_content"] = reasoning
        for k in ("name", "tool_call_id"):
            if isinstance(m.get(k), str):
                n[k] = m[k]
        out.append(n)
    return out, tools


def byte_messages(msgs, tools):
    """The byte tokenizer knows user, system and assistant text only."""
    for i, m in enumerate(msgs):
        if m["role"] == "tool" or "tool_calls" in m or "reasoning_content" in m or tools:
            raise Skip("unsupported-role", f"message {i}: the byte tokenizer has no tool, tool-call or "
                       "reasoning rendering (use an HF tokenizer with a chat template)")
    return msgs


def last_turn_only(mask):
    """Mask of the last run of 1s only (the last assistant turn of a byte-tokenizer sample)."""
    ones = [k for k, v in enumerate(mask) if v]
    if not ones:
        return mask
    end, start = ones[-1], ones[-1]
    while start > 0 and mask[start - 1]:
        start -= 1
    return [1 if start <= k <= end else 0 for k in range(len(mask))]


class TransformersBackend:
    name = "transformers"

    def __init__(self, path):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tok, "chat_template", None):
            raise ValueError("no chat template (tokenizer_config.json chat_template or chat_template.jinja)")
        self.vocab_size = len(self.tok)
        self.eos_id = self.tok.eos_token_id
        self.added = set(getattr(self.tok, "all_special_tokens", []))
        for t in (getattr(self.tok, "added_tokens_decoder", None) or {}).values():
            self.added.add(getattr(t, "content", str(t)))

    def render(self, messages, tools, add_generation_prompt, kwargs):
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            tokenize=False, **kwargs)

    def encode(self, text):
        return list(self.tok(text, add_special_tokens=False)["input_ids"])


class BuiltinBackend:
    name = "builtin"

    def __init__(self, path):
        from hf_tokenizer import HFDirTokenizer
        self.tok = HFDirTokenizer(path)
        self.tok.check_template()  # no template, no jinja2 or a syntax error: refused now
        self.vocab_size = self.tok.vocab_size
        eos = self.tok.special_token("eos_token")
        self.eos_id = self.tok.added_by_content.get(eos, self.tok.vocab.get(eos)) if eos else None
        self.added = self.tok.token_strings()

    def render(self, messages, tools, add_generation_prompt, kwargs):
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            **kwargs)

    def encode(self, text):
        return self.tok.encode(text)


class TemplateTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    """Raise TemplateTimeout in the main thread after `seconds` of wall time (SIGALRM; 0 or
    less: no limit). A chat template is code from the tokenizer directory: a loop that never
    ends, or grows its output for minutes, costs one skipped conversation, not the run."""
    if not seconds or seconds <= 0:
        yield
        return

    def fire(signum, frame):
        raise TemplateTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class ChatTemplateTokenizer:
    """An HF tokenizer directory with a chat template; see the module doc for the masking."""

    def __init__(self, backend, template_kwargs, turns, timeout=10.0):
        self.b = backend
        self.timeout = timeout
        self.vocab_size = backend.vocab_size
        self.kw = template_kwargs
        self.turns = turns
        self.end_strings = sorted(backend.added, key=len, reverse=True)

    def render(self, msgs, tools, gen):
        try:
            with time_limit(self.timeout):
                return self.b.render([dict(m) for m in msgs], tools, gen, self.kw)
        except TemplateTimeout:
            raise Skip("template-timeout", f"rendering took longer than {self.timeout:g} s (--template-timeout)")
        except Exception as e:  # a template may raise anything (raise_exception, undefined, type errors)
            raise Skip("template-error", f"{type(e).__name__}: {e}")

    def turn_span(self, msgs, tools, i):
        """(text, (start, end)): the rendering of msgs[:i+1] and the labelled chars of turn i."""
        head = self.render(msgs[:i], tools, True)
        text = self.render(msgs[: i + 1], tools, False)
        if not text.startswith(head):
            k = next((j for j, (a, b) in enumerate(zip(head, text)) if a != b), min(len(head), len(text)))
            raise Skip("template-prefix-mismatch", f"assistant turn {i}: the template's generation prompt for the "
                       f"history is not a prefix of the rendered turn (they differ at char {k}: {head[k:k + 24]!r} "
                       f"vs {text[k:k + 24]!r})")
        start, end = len(head), len(text)
        m = EMPTY_THINK.match(text, start)
        if m:
            start = m.end()
        body = text.rstrip()
        if len(body) > start and any(body.endswith(s) for s in self.end_strings):
            end = len(body)
        if end <= start:
            raise Skip("empty-assistant-turn", f"assistant turn {i}: the template rendered nothing for it")
        return text, (start, end)

    def tokenise(self, text, spans):
        """(tokens, mask) of text with mask 1 on the char spans; Skip when a span edge splits a token."""
        cuts = sorted({0, len(text)} | {c for sp in spans for c in sp})
        toks, mask = [], []
        for a, b in zip(cuts, cuts[1:]):
            piece = self.b.encode(text[a:b])
            inside = any(s <= a and b <= e for s, e in spans)
            toks += piece
            mask += [1 if inside else 0] * len(piece)
        whole = self.b.encode(text)
        if whole != toks:
            for c in cuts[1:-1]:
                pre = self.b.encode(text[:c])
                if whole[: len(pre)] != pre:
                    break
            raise Skip("boundary-merge", f"the tokens across char {c} ({text[max(0, c - 12):c]!r} | "
                       f"{text[c:c + 12]!r}) differ when the text is cut there: a token spans the mask edge")
        return toks, mask

    def encode_samples(self, msgs, tools):
        turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if not turns:
            raise Skip("no-assistant-turn", "the conversation has no assistant turn")
        if self.turns == "last":
            turns = turns[-1:]
        groups = []  # [text, [spans]]
        for i in turns:
            text, span = self.turn_span(msgs, tools, i)
            if groups and text.startswith(groups[-1][0]):
                groups[-1] = [text, groups[-1][1] + [span]]
            else:
                groups.append([text, [span]])
        return [self.tokenise(text, spans) for text, spans in groups]

    def encode_prompt(self, msgs, tools):
        k = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
        if k == 0:
            raise Skip("empty-prompt", "nothing before the first assistant turn")
        toks = self.b.encode(self.render(msgs[:k], tools, True))
        return toks + [self.b.eos_id], [0] * len(toks) + [1]


def load_tokenizer(args):
    """The byte tokenizer, or a ChatTemplateTokenizer; exits 2 / 100 with a message."""
    def die(code, msg):
        print(f"prepare_data: {msg}", file=sys.stderr)
        sys.exit(code)

    bt = os.path.join(args.tokenizer, "byte_tokenizer.json")
    if os.path.exists(bt):
        for flag, v in (("--enable-thinking/--no-thinking", args.thinking), ("--chat-template-kwargs", args.chat_kwargs)):
            if v is not None:
                die(2, f"{flag} needs a tokenizer with a chat template; {args.tokenizer} has the byte tokenizer")
        try:
            with open(bt) as f:
                return ByteTokenizer(json.load(f))
        except (OSError, ValueError) as e:
            die(100, f"{bt}: {e}")
    if not os.path.isdir(args.tokenizer):
        die(100, f"{args.tokenizer}: not a tokenizer directory")
    impl = args.tokenizer_impl
    if impl in ("auto", "transformers"):
        try:
            import transformers  # noqa: F401
        except ImportError:
            if impl == "transformers":
                die(2, "--tokenizer-impl transformers: the Python package `transformers` is not installed "
                    "(pip install transformers), or use --tokenizer-impl builtin")
            impl = "builtin"
        else:
            impl = "transformers"
    try:
        if impl == "transformers":
            backend = TransformersBackend(args.tokenizer)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from hf_tokenizer import TokenizerError
            try:
                backend = BuiltinBackend(args.tokenizer)
            except TokenizerError as e:
                die(100, str(e))
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, ... for a bad directory
        die(100, f"{args.tokenizer}: {type(e).__name__}: {e}")
    print(f"prepare_data: {args.tokenizer}: chat template and tokenizer by {backend.name}")
    kw = dict(args.chat_kwargs or {})
    if args.thinking is not None:
        kw["enable_thinking"] = args.thinking
    if args.prompts and backend.eos_id is None:
        die(100, f"{args.tokenizer}: no eos_token: --prompts ends each prompt with it")
    return ChatTemplateTokenizer(backend, kw, args.turns, args.template_timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="chat JSONL files")
    ap.add_argument("--tokenizer", required=True, help="model dir (byte_tokenizer.json or an HF tokenizer)")
    ap.add_argument("--out", required=True, help="output prefix: <out>-000.dfs ...")
    ap.add_argument("--max-samples", type=int, default=0, help="stop after N samples (0 = all)")
    ap.add_argument("--max-len", type=int, default=4096, help="truncate samples to L tokens")
    ap.add_argument("--shard-tokens", type=int, default=50_000_000, help="tokens per shard")
    ap.add_argument("--tokenizer-impl", choices=("auto", "transformers", "builtin"), default="auto",
                    help="HF tokenizers: transformers' AutoTokenizer or scripts/hf_tokenizer.py (auto: "
                         "transformers when importable)")
    ap.add_argument("--turns", choices=("each", "last"), default="each",
                    help="label every assistant turn (each) or only the last one per conversation")
    th = ap.add_mutually_exclusive_group()
    th.add_argument("--enable-thinking", dest="thinking", action="store_const", const=True, default=None,
                    help="pass enable_thinking=true to the chat template")
    th.add_argument("--no-thinking", dest="thinking", action="store_const", const=False,
                    help="pass enable_thinking=false to the chat template (Qwen3: empty think block)")
    ap.add_argument("--chat-template-kwargs", dest="chat_kwargs", default=None, metavar="JSON",
                    help='extra template variables, a JSON object, e.g. \'{"date_string": "01 Jan 2026"}\'')
    ap.add_argument("--template-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="skip a conversation whose chat template renders for longer (template-timeout; "
                         "0 = no limit; default 10)")
    ap.add_argument("--prompts", action="store_true",
                    help="write evaluation prompts (ending with the assistant header) instead of training samples")
    args = ap.parse_args()
    if args.max_len < 1 or args.max_samples < 0 or args.shard_tokens < 1:
        ap.error("--max-len and --shard-tokens must be >= 1, --max-samples >= 0")
    if args.chat_kwargs is not None:
        try:
            args.chat_kwargs = json.loads(args.chat_kwargs)
        except ValueError as e:
            ap.error(f"--chat-template-kwargs: {e}")
        if not isinstance(args.chat_kwargs, dict):
            ap.error("--chat-template-kwargs: expected a JSON object")

    tok = load_tokenizer(args)
    byte = isinstance(tok, ByteTokenizer)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    samples, shard_i, n_total, tok_total, lab_total, cur_tokens, written = [], 0, 0, 0, 0, 0, []
    skips = collections.Counter()

    def skip(path, lineno, reason, detail):
        skips[reason] += 1
        if skips[reason] <= SHOWN_PER_REASON:
            print(f"{path}:{lineno}: skipped ({reason}): {detail}", file=sys.stderr)
            if skips[reason] == SHOWN_PER_REASON:
                print(f"prepare_data: further '{reason}' skips are counted, not shown", file=sys.stderr)

    def flush():
        nonlocal samples, shard_i, cur_tokens
        if samples:
            path = f"{args.out}-{shard_i:03d}.dfs"
            write_shard(path, tok.vocab_size, samples)
            written.append(path)
            shard_i, samples, cur_tokens = shard_i + 1, [], 0

    def encode(msgs, tools):
        if byte:
            msgs = byte_messages(msgs, tools)
            if args.prompts:
                k = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
                if k == 0:
                    raise Skip("empty-prompt", "nothing before the first assistant turn")
                t, m = tok.encode_chat(msgs[:k])
                return [(t + [tok.spec["assistant"], tok.spec["eos"]], m + [0, 1])]
            t, m = tok.encode_chat(msgs)
            if sum(m) == 0:
                raise Skip("no-assistant-turn", "the conversation has no assistant turn")
            return [(t, last_turn_only(m) if args.turns == "last" else m)]
        if args.prompts:
            return [tok.encode_prompt(msgs, tools)]
        return tok.encode_samples(msgs, tools)

    done = False
    for path in args.inputs:
        try:
            f = open(path, "rb")
        except OSError as e:
            print(f"prepare_data: {path}: cannot read: {e.strerror}", file=sys.stderr)
            sys.exit(100)
        with f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    skip(path, lineno, "not-utf8", f"byte {e.start}: not UTF-8")
                    continue
                if not line.strip():
                    continue
                try:
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise Skip("invalid-json", str(e))
                    got = encode(*normalise(obj))
                except Skip as e:
                    skip(path, lineno, e.reason, str(e))
                    continue
                for t, m in got:
                    t, m = t[: args.max_len], m[: args.max_len]
                    if sum(m) == 0:
                        skip(path, lineno, "truncated-away", f"no labelled token within --max-len {args.max_len}")
                        continue
                    samples.append((t, m))
                    n_total += 1
                    tok_total += len(t)
                    lab_total += sum(m)
                    cur_tokens += len(t)
                    if cur_tokens >= args.shard_tokens:
                        flush()
                    if args.max_samples and n_total >= args.max_samples:
                        done = True
                        break
                if done:
                    break
        if done:
            break
    flush()
    what = "prompts" if args.prompts else "samples"
    print(f"prepare_data: {n_total} {what}, {tok_total} tokens ({lab_total} with loss) -> {', '.join(written)}")
    print(f"prepare_data: skipped {sum(skips.values())}" +
          (": " + ", ".join(f"{r} {n}" for r, n in sorted(skips.items())) if skips else ""))
    if not written:
        print("prepare_data: no sample written: nothing in the input could be used", file=sys.stderr)
        sys.exit(100)


if __name__ == "__main__":
    main()
