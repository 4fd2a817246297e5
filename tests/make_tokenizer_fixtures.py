#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: writes the two small HF tokenizer directories the chat-data
tests use, tests/fixtures/tokenizers/{qwen3-style,llama3-style}/.

    python3 tests/make_tokenizer_fixtures.py     (deterministic: rerunning rewrites the same bytes)

Each is a byte-level BPE trained here on the short text below (the family's own split
regex, the 256 byte symbols, then the N most frequent pair merges; ties broken by the
pair's text), plus the family's special tokens as added tokens after the BPE ids:

  qwen3-style   Qwen2/3 split regex, NFC normalizer, 320 merges; <|endoftext|>,
                <|im_start|>, <|im_end|> (special), <tool_call>, </tool_call>, <think>,
                </think>, <tool_response>, </tool_response>; eos <|im_end|>, pad
                <|endoftext|>; chat template tests/fixtures/tokenizers/qwen3-style.jinja
                inlined as tokenizer_config.json's chat_template
  llama3-style  Llama-3 split regex (digits in runs of 1..3), no normalizer,
                ignore_merges, 300 merges; <|begin_of_text|>, <|end_of_text|>,
                <|start_header_id|>, <|end_header_id|>, <|eot_id|>, <|eom_id|>,
                <|python_tag|>, <|finetune_right_pad_id|>; bos <|begin_of_text|>, eos
                <|eot_id|>; chat template in llama3-style/chat_template.jinja (the file
                form of a template, which transformers prefers to the config field)

Both name tokenizer_class PreTrainedTokenizerFast, so AutoTokenizer loads tokenizer.json
as it is (tests/check_tokenizer_parity.py compares it with scripts/hf_tokenizer.py).
"""
import collections
import json
import os
import sys

import regex

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from hf_tokenizer import bytes_to_unicode  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tokenizers")

QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """\
The user asks a question and the assistant answers it. The assistant thinks first, then
writes the answer. When the question needs a tool, the assistant calls the tool with a
JSON object and waits for the result; then it answers with the result in mind.

What is the weather in Paris today? It is sunny and 21 degrees in Paris.

Can you add 1234 and 5678? The sum of 1234 and 5678 is 6912.

Please write a function that returns the square of a number.
def square(x):
    return x * x

for i in range(10):
    print(i, square(i))
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"temperature": 21, "condition": "sunny"}
Let me think about this step by step. First, the question is about the weather.
I need to call the weather tool. The answer is that the weather is sunny.

Hello! How can I help you today? Thank you, that is all I needed.
The pipeline trains a drafter against a frozen target model on one machine.
Speculative decoding drafts a block of tokens and the target verifies them at once.

Un café crème, s'il vous plaît. Naïve résumé, déjà vu. Grüße aus München!
日本語のテキストと中文的句子。 Ελληνικά και русский текст. 🙂 👍
    indented line with four spaces
\ttab\tseparated\tvalues
numbers: 3.14159 2.71828 1000000 42 007
Dear reader

Thank you for the note

Best regards

Answer

Yes

No
"""

QWEN_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
              ("<tool_call>", False), ("</tool_call>", False), ("<think>", False), ("</think>", False),
              ("<tool_response>", False), ("</tool_response>", False)]
LLAMA_ADDED = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
               ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|eom_id|>", True), ("<|python_tag|>", True),
               ("<|finetune_right_pad_id|>", True)]


def train(pattern, n_merges):
    enc = bytes_to_unicode()
    words = collections.Counter("".join(enc[b] for b in w.encode("utf-8"))
                                for w in regex.findall(pattern, CORPUS))
    vocab = {enc[b]: b for b in range(256)}
    split = {w: list(w) for w in words}
    merges = []
    while len(merges) < n_merges:
        pairs = collections.Counter()
        for w, c in words.items():
            p = split[w]
            for a, b in zip(p, p[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda k: (-pairs[k], k))
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        for w in words:
            p, out, i = split[w], [], 0
            while i < len(p):
                if i + 1 < len(p) and (p[i], p[i + 1]) == best:
                    out.append(p[i] + p[i + 1])
                    i += 2
                else:
                    out.append(p[i])
                    i += 1
            split[w] = out
    return vocab, merges


def write(name, pattern, n_merges, nfc, ignore_merges, added, trim_offsets, config, post_processor_bos):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    vocab, merges = train(pattern, n_merges)
    added_tokens = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": s} for i, (c, s) in enumerate(added)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": False}
    post = dict(bl)
    if post_processor_bos:
        bos_id = len(vocab) + [c for c, _ in added].index(post_processor_bos)
        post = {"type": "Sequence", "processors": [dict(bl), {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": post_processor_bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": post_processor_bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": post_processor_bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {post_processor_bos: {"id": post_processor_bos, "ids": [bos_id],
                                                    "tokens": [post_processor_bos]}}}]}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
          "normalizer": {"type": "NFC"} if nfc else None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, dict(bl)]},
          "post_processor": post, "decoder": dict(bl),
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": ignore_merges, "vocab": vocab, "merges": [[a, b] for a, b in merges]}}
    config = dict(config)
    config["added_tokens_decoder"] = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                        "single_word", "special")}
                                      for t in added_tokens}
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token") if config.get(k)}
    files = {"tokenizer.json": tj, "tokenizer_config.json": config, "special_tokens_map.json": special}
    for fn, obj in files.items():
        with open(os.path.join(d, fn), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"{d}: {len(vocab)} BPE tokens ({len(merges)} merges) + {len(added)} added tokens")


def main():
    with open(os.path.join(HERE, "qwen3-style.jinja"), encoding="utf-8") as f:
        qwen_template = f.read()
    write("qwen3-style", QWEN_RE, 320, True, False, QWEN_ADDED, False, {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "clean_up_tokenization_spaces": False,
        "errors": "replace", "model_max_length": 40960, "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": qwen_template}, None)
    write("llama3-style", LLAMA_RE, 300, False, True, LLAMA_ADDED, True, {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"}, "<|begin_of_text|>")


if __name__ == "__main__":
    main()
