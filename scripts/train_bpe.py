#!/usr/bin/env python3
"""train_bpe.py: train a byte-level BPE tokenizer (Hugging Face tokenizer.json, Qwen2/3 style)
on the text the tiny targets learn from, and write it with a ChatML chat template.

    python3 scripts/train_bpe.py --out models/tiny-chat [--vocab-size 2048]
        [--chat-template tests/fixtures/tokenizers/qwen3-style.jinja] [--with-tests]

Why: the chat-template path (scripts/prepare_data.py with an HF tokenizer -> pipeline ->
dflash_eval) needs a target whose tokenizer is a real BPE with a chat template; none can be
downloaded here, so the tokenizer is trained from scratch, on the training split of the
Python standard library's sources (scripts/stdlib_corpus.py, the corpus of
scripts/train_target.py), with the standard library only. scripts/train_target.py
--tokenizer DIR then trains the model on the same text through this tokenizer.

The vocabulary (ids in this order):
  0..255        the 256 bytes, as GPT-2's printable byte characters (hf_tokenizer.bytes_to_unicode)
  256..V-11     merges, most frequent pair first (ties: the pair's text, smallest first)
  V-10..V-1     added tokens: <|endoftext|>, <|im_start|>, <|im_end|> (special), <think>,
                </think>, <tool_call>, </tool_call>, <tool_response>, </tool_response>
                (not special, as in Qwen3), and <|MASK|> (special): DFlash's mask token,
                which no text the template renders contains (tokenizer_config.json names it
                mask_token)
V = --vocab-size (default 2048: 1782 merges). Training counts the words of the corpus once
(the Qwen2/3 split pattern, NFC), then merges with pair counts kept up to date incrementally
(only the words holding the merged pair are recounted), so 1.8K merges over ~10 MB take
well under a minute.

The split pattern written to tokenizer.json is Qwen2/3's, with \\p{L} / \\p{N} classes (the
`regex` module reads it when encoding). Python's `re` has no such classes, so training
splits with an equivalent that is exact on ASCII (letters: [^\\W\\d_], numbers: \\d): the
corpus is source code, nearly all ASCII; a rare non-ASCII word split differently only
changes which merges are learned, never whether the tokenizer is valid.

Writes <out>/tokenizer.json, tokenizer_config.json (chat_template inlined, eos <|im_end|>,
pad <|endoftext|>, no bos, mask_token <|MASK|>) and special_tokens_map.json, each to a
temporary name, then renamed. Deterministic for one standard library: rerunning rewrites
the same bytes.
"""
import argparse
import collections
import heapq
import json
import os
import re
import sys
import time
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_tokenizer import bytes_to_unicode  # noqa: E402  (standard library only at import)
from stdlib_corpus import load_corpus, stdlib_root  # noqa: E402

# Qwen2/3's split pattern, as tokenizer.json carries it (the `regex` module's syntax)
QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# the same with Python's re: \p{L} -> [^\W\d_] (word characters less digits and '_'),
# \p{N} -> \d, "not letter, number, CR or LF" -> (?:[^\r\n\w]|_), "not space, letter or
# number" -> (?:[^\s\w]|_)
STDLIB_RE = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")

ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<think>", False),
         ("</think>", False), ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False),
         ("</tool_response>", False), ("<|MASK|>", True)]
MASK_TOKEN = "<|MASK|>"
DEFAULT_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                                "tokenizers", "qwen3-style.jinja")


def log(msg):
    print(f"train_bpe: {msg}", flush=True)


def count_words(docs):
    """Counter of the corpus's pre-tokenized words, each as its byte characters."""
    enc = bytes_to_unicode()
    counts = collections.Counter()
    for d in docs:
        text = unicodedata.normalize("NFC", d.decode("utf-8", errors="replace"))
        counts.update(STDLIB_RE.findall(text))
    return collections.Counter({"".join(enc[b] for b in w.encode("utf-8")): c for w, c in counts.items()})


def train(words, n_tokens):
    """(vocab {token: id}, merges [(a, b)]) with n_tokens BPE entries in all (bytes included).

    Each word is a list of symbols with a count; pair counts and the words each pair occurs
    in are kept current. A heap holds (-count, pair) entries; an entry whose count is no
    longer the pair's is stale and skipped when popped (lazy deletion)."""
    enc = bytes_to_unicode()
    vocab = {enc[b]: b for b in range(256)}
    syms = [list(w) for w in words]
    cnt = list(words.values())
    pairs = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for i, s in enumerate(syms):
        for p in zip(s, s[1:]):
            pairs[p] += cnt[i]
            where[p].add(i)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while len(vocab) < n_tokens and heap:
        negn, best = heapq.heappop(heap)
        if pairs.get(best, 0) != -negn:
            continue  # stale
        if -negn < 2:
            break  # nothing left that occurs twice
        a, b = best
        merged = a + b
        merges.append(best)
        if merged not in vocab:  # ("ab", "c") and ("a", "bc") make one token
            vocab[merged] = len(vocab)
        delta = collections.defaultdict(int)
        for i in where.pop(best):
            s, c = syms[i], cnt[i]
            out, k = [], 0
            while k < len(s):
                if k + 1 < len(s) and s[k] == a and s[k + 1] == b:
                    out.append(merged)
                    k += 2
                else:
                    out.append(s[k])
                    k += 1
            if len(out) == len(s):
                continue  # the word no longer holds the pair (an earlier merge took it)
            for p in zip(s, s[1:]):
                delta[p] -= c
            for p in zip(out, out[1:]):
                delta[p] += c
                where[p].add(i)
            syms[i] = out
        for p, d in delta.items():
            if d:
                pairs[p] += d
                if pairs[p] > 0:
                    heapq.heappush(heap, (-pairs[p], p))
                else:
                    pairs.pop(p)
        pairs.pop(best, None)
    return vocab, merges


def write_json(path, obj):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory to write the tokenizer files into")
    ap.add_argument("--vocab-size", type=int, default=2048,
                    help="ids in all: bytes + merges + the %d added tokens (default 2048)" % len(ADDED))
    ap.add_argument("--chat-template", default=DEFAULT_TEMPLATE, help="Jinja chat template (ChatML, Qwen3 style)")
    ap.add_argument("--max-len", type=int, default=1024, help="model_max_length (the target's positions)")
    ap.add_argument("--with-tests", action="store_true", help="train on the stdlib's test files too")
    a = ap.parse_args()
    if a.vocab_size < 256 + len(ADDED) + 1:
        ap.error(f"--vocab-size must be at least {256 + len(ADDED) + 1}")
    try:
        with open(a.chat_template, encoding="utf-8") as f:
            template = f.read()
    except OSError as e:
        print(f"train_bpe: {a.chat_template}: {e.strerror}", file=sys.stderr)
        sys.exit(100)
    t0 = time.time()
    docs, _ = load_corpus(a.with_tests)
    if not docs:
        print("train_bpe: no Python standard library sources found", file=sys.stderr)
        sys.exit(100)
    words = count_words(docs)
    log(f"corpus: {len(docs)} files ({sum(map(len, docs)) / 1e6:.1f} MB) from {stdlib_root()}: "
        f"{sum(words.values())} words, {len(words)} distinct, {time.time() - t0:.1f}s")
    n_bpe = a.vocab_size - len(ADDED)
    vocab, merges = train(words, n_bpe)
    if len(vocab) < n_bpe:
        print(f"train_bpe: only {len(vocab)} BPE tokens could be learned (wanted {n_bpe}): corpus too small",
              file=sys.stderr)
        sys.exit(100)
    log(f"{len(merges)} merges -> {len(vocab)} BPE tokens, {time.time() - t0:.1f}s")

    added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": QWEN_RE}, "behavior": "Isolated", "invert": False}, dict(bl)]},
          "post_processor": dict(bl), "decoder": dict(bl),
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": [[x, y] for x, y in merges]}}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "mask_token": MASK_TOKEN,
           "clean_up_tokenization_spaces": False, "errors": "replace", "model_max_length": a.max_len,
           "split_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
           "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                     "single_word", "special")} for t in added},
           "chat_template": template}
    special = {k: cfg[k] for k in ("eos_token", "pad_token", "mask_token")}
    os.makedirs(a.out, exist_ok=True)
    write_json(os.path.join(a.out, "tokenizer.json"), tj)
    write_json(os.path.join(a.out, "tokenizer_config.json"), cfg)
    write_json(os.path.join(a.out, "special_tokens_map.json"), special)
    ids = {t["content"]: t["id"] for t in added}
    log(f"wrote {a.out}: vocab {a.vocab_size} ({len(vocab)} BPE + {len(added)} added); <|endoftext|> "
        f"{ids['<|endoftext|>']}, <|im_start|> {ids['<|im_start|>']}, <|im_end|> {ids['<|im_end|>']}, "
        f"{MASK_TOKEN} {ids[MASK_TOKEN]}")


if __name__ == "__main__":
    main()
