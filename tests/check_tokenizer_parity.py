#!/usr/bin/env python3
"""check_tokenizer_parity.py: the builtin HF tokenizer reader (scripts/hf_tokenizer.py)
against transformers' AutoTokenizer on each fixture of tests/fixtures/tokenizers/.

    python3 tests/check_tokenizer_parity.py [TOKENIZER_DIR...]

For every directory (default: the two fixtures) it compares the vocabulary size, the token
ids of a set of texts (unicode, whitespace runs, digits, special tokens inside text,
contractions), the decoded text, and the chat templates rendered over several
conversations, with and without the generation prompt and the thinking switch (the
rendered strings and their token ids). Prints a table, one row per comparison; exit 0 when
all agree, 1 on any difference, 77 with "SKIPPED: transformers not installed" when
transformers cannot be imported. Not part of `make test` (transformers is not installed
there); run it where transformers is.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))

TEXTS = [
    "Hello world!",
    "The weather in Paris is sunny and 21 degrees.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tnewlines\n\n\nand \r\n crlf",
    "digits 1 12 123 1234 12345 3.14159 007 1,000,000",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 Gr\u00fc\u00dfe \u65e5\u672c\u8a9e \u4e2d\u6587 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \U0001F642\U0001F44D",
    "e\u0301 (a decomposed e-acute, which NFC composes)",
    "I'm sure you'll see it's THEY'RE and we'VE",
    "code:\n    def f(x):\n        return x * x\n",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "special <|im_start|>user\nin text<|im_end|> and <think>\nhmm\n</think>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<tool_call>\n{}\n</tool_call><tool_response>x</tool_response><|endoftext|>",
    "not special: <|im_start <think > </ think>",
    "",
    " ",
    "\n",
]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVS = [
    ("single turn", [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}], None),
    ("system + multi-turn", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Add 2+2"},
                             {"role": "assistant", "content": " 4 "}], None),
    ("multi-turn thinking", [{"role": "user", "content": "Hi, caf\u00e9?"},
                             {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
                             {"role": "user", "content": "Add 1234 + 5678"},
                             {"role": "assistant", "content": "<think>\nsum it\n</think>\n\n6912"}], None),
    ("tool call + response", [{"role": "user", "content": "Weather in Paris?"},
                              {"role": "assistant", "content": "", "tool_calls": [
                                  {"type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris"}}}]},
                              {"role": "tool", "content": "{\"t\": 21}"},
                              {"role": "assistant", "content": "Sunny, 21."}], TOOLS),
]
VARIANTS = [("", {}), (" +date", {"date_string": "01 Jan 2026"})]


def main():
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("SKIPPED: transformers not installed")
        return 77
    import transformers
    from hf_tokenizer import HFDirTokenizer
    dirs = sys.argv[1:] or [os.path.join(HERE, "fixtures", "tokenizers", d) for d in ("qwen3-style", "llama3-style")]
    rows, bad = [], 0

    def row(fx, what, a, b, na="", nb=""):
        nonlocal bad
        same = a == b
        bad += not same
        rows.append((fx, what, str(na), str(nb), "same" if same else "DIFFERENT"))
        if not same:
            detail = f"    builtin:      {a!r}\n    transformers: {b!r}"
            rows.append(("", detail, "", "", ""))

    for d in dirs:
        fx = os.path.basename(os.path.normpath(d))
        ours, hf = HFDirTokenizer(d), AutoTokenizer.from_pretrained(d)
        row(fx, "vocab size", ours.vocab_size, len(hf), ours.vocab_size, len(hf))
        for t in TEXTS:
            a, b = ours.encode(t), list(hf(t, add_special_tokens=False)["input_ids"])
            row(fx, f"encode {t[:28]!r}", a, b, len(a), len(b))
            if a == b:
                row(fx, f"decode {t[:28]!r}", ours.decode(a), hf.decode(b, skip_special_tokens=False,
                                                                        clean_up_tokenization_spaces=False))
        for name, msgs, tools in CONVS:
            for cut in sorted({len(msgs) - 1, len(msgs)}):
                for gen in (False, True):
                    for vname, kw in VARIANTS + ([(" no-thinking", {"enable_thinking": False})] if gen else []):
                        what = f"template {name} [:{cut}]{' +gen' if gen else ''}{vname}"
                        a = ours.apply_chat_template(msgs[:cut], tools=tools, add_generation_prompt=gen, **kw)
                        b = hf.apply_chat_template(msgs[:cut], tools=tools, add_generation_prompt=gen,
                                                   tokenize=False, **kw)
                        if tools and "date_string" not in kw and "Today Date" in a:
                            continue  # the date is strftime_now(): compared in the +date variant
                        row(fx, what, a, b, len(a), len(b))
                        ia, ib = ours.encode(a), list(hf(b, add_special_tokens=False)["input_ids"])
                        row(fx, what + " ids", ia, ib, len(ia), len(ib))
    w = max(len(r[1]) for r in rows if r[0])
    print(f"transformers {transformers.__version__}: builtin (scripts/hf_tokenizer.py) vs AutoTokenizer")
    print(f"{'fixture':<14} {'what':<{w}} {'builtin':>8} {'transf.':>8}  result")
    for r in rows:
        if r[0]:
            print(f"{r[0]:<14} {r[1]:<{w}} {r[2]:>8} {r[3]:>8}  {r[4]}")
        else:
            print(r[1])
    n = sum(1 for r in rows if r[0])
    print(f"parity: {n - bad} of {n} comparisons agree" + ("" if not bad else f", {bad} DIFFERENT"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
