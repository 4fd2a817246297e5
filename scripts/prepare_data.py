#!/usr/bin/env python3
"""prepare_data.py: chat JSONL -> token shards (.dfs) for the pipeline.

    python3 scripts/prepare_data.py --tokenizer models/tiny-target --out data/tiny/train \\
        data/tiny/chat-train.jsonl [--max-samples N] [--max-len L] [--shard-tokens N]

Input lines are either OpenAI style {"messages": [{"role": ..., "content": ...}, ...]} or
ShareGPT style {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}.
The loss mask is 1 on the tokens of assistant turns (and the end-of-turn tokens the chat
template puts after them), 0 on everything else: prompts are context, never labels.

Tokenizers:
  * a directory with byte_tokenizer.json (the embedded default's byte-level vocabulary):
    pure Python, nothing to install; text is mapped to bytes with latin-1 (one char = one byte);
  * any Hugging Face tokenizer directory with a chat template (needs `transformers`): each
    turn's tokens are found by rendering the template for the conversation up to that turn
    and taking the difference, so any template works without special markers.

Output: <out>-000.dfs, <out>-001.dfs, ... each written to a temp name then renamed. The
format is documented in common/io/shard.h. A malformed input line is reported with the file
and line number and the run stops (exit 2) without writing a partial shard.
"""
import argparse
import json
import os
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


class HFTokenizer:
    def __init__(self, path):
        from transformers import AutoTokenizer  # only needed for real tokenizers
        self.tok = AutoTokenizer.from_pretrained(path)
        self.vocab_size = len(self.tok)

    def encode_chat(self, messages):
        toks, mask, prev = [], [], []
        for i in range(len(messages)):
            cur = self.tok.apply_chat_template(messages[: i + 1], tokenize=True)
            if cur[: len(prev)] != prev:
                raise ValueError("chat template is not prefix-stable; cannot find turn boundaries")
            new = cur[len(prev):]
            toks += new
            mask += [1 if messages[i]["role"] == "assistant" else 0] * len(new)
            prev = cur
        return toks, mask


def normalise(obj):
    if "messages" in obj:
        msgs = obj["messages"]
    elif "conversations" in obj:
        role = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "system": "system"}
        msgs = [{"role": role[m["from"]], "content": m["value"]} for m in obj["conversations"]]
    else:
        raise ValueError('expected a "messages" or "conversations" list')
    for i, m in enumerate(msgs):
        if not isinstance(m.get("content"), str) or m.get("role") not in ("user", "assistant", "system"):
            raise ValueError(f"message {i}: expected role user|assistant|system and a string content")
    return msgs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="chat JSONL files")
    ap.add_argument("--tokenizer", required=True, help="model dir (byte_tokenizer.json or an HF tokenizer)")
    ap.add_argument("--out", required=True, help="output prefix: <out>-000.dfs ...")
    ap.add_argument("--max-samples", type=int, default=0, help="stop after N samples (0 = all)")
    ap.add_argument("--max-len", type=int, default=4096, help="truncate samples to L tokens")
    ap.add_argument("--shard-tokens", type=int, default=50_000_000, help="tokens per shard")
    args = ap.parse_args()

    bt = os.path.join(args.tokenizer, "byte_tokenizer.json")
    tok = ByteTokenizer(json.load(open(bt))) if os.path.exists(bt) else HFTokenizer(args.tokenizer)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    samples, shard_i, n_total, tok_total, lab_total, cur_tokens, written = [], 0, 0, 0, 0, 0, []

    def flush():
        nonlocal samples, shard_i, cur_tokens
        if samples:
            path = f"{args.out}-{shard_i:03d}.dfs"
            write_shard(path, tok.vocab_size, samples)
            written.append(path)
            shard_i, samples, cur_tokens = shard_i + 1, [], 0

    for path in args.inputs:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    t, m = tok.encode_chat(normalise(json.loads(line)))
                except (ValueError, KeyError, TypeError) as e:
                    print(f"{path}:{lineno}: {e}", file=sys.stderr)
                    sys.exit(2)
                t, m = t[: args.max_len], m[: args.max_len]
                if sum(m) == 0:
                    continue  # nothing to learn from
                samples.append((t, m))
                n_total += 1
                tok_total += len(t)
                lab_total += sum(m)
                cur_tokens += len(t)
                if cur_tokens >= args.shard_tokens:
                    flush()
                if args.max_samples and n_total >= args.max_samples:
                    break
        if args.max_samples and n_total >= args.max_samples:
            break
    flush()
    print(f"prepare_data: {n_total} samples, {tok_total} tokens ({lab_total} with loss) -> {', '.join(written)}")


if __name__ == "__main__":
    main()
