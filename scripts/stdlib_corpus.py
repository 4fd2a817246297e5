"""stdlib_corpus.py: the training text of this repository's tiny targets and of the tiny
chat target's tokenizer: the source files of the running Python's standard library (no
download needed).

load_corpus(with_tests) -> (train, held): lists of file contents (bytes). Files under 2 KiB
and installed packages are left out; a file whose path (relative to the stdlib) hashes to
0 mod 20 (CRC-32) is held out, never trained on by a target, a tokenizer or a drafter.

draw_prompts(corpus, n, rng, lens) -> prompts cut from those documents at line starts,
grouped by length (prompt_from cuts one). A length L is cut only from documents of more
than max(400, L + 100) bytes (prompt_min_doc): every file qualifies for the default lengths
(64, 96, 128; files are >= 2 KiB), long prompts skip the files too short for them.
Used by scripts/train_target.py and scripts/train_bpe.py; standard library only (the
prompts can be drawn without torch, e.g. for a dry run with a target already trained).
"""
import glob
import os
import sys
import sysconfig
import zlib


def stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def load_corpus(with_tests=False):
    root = stdlib_root()
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    train, held = [], []
    for f in files:
        rel = os.path.relpath(f, root)
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        if not with_tests and ("test" in rel.split(os.sep)[0] or "/test" in rel):
            continue
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        if len(b) < 2048:
            continue
        (held if zlib.crc32(rel.encode()) % 20 == 0 else train).append(b)
    return train, held


def prompt_min_doc(n):
    """Documents a prompt of n bytes is cut from are longer than this (prompt_from's margins)."""
    return max(400, n + 100)


def prompt_from(doc, rng, n):
    """n bytes of doc starting at a line start (so prompts read like code); doc must be longer
    than prompt_min_doc(n). For n <= 300 the draws are those of the fixed margins of old
    (start below len - 400, line start below len - 300)."""
    head, tail = prompt_min_doc(n), max(300, n)
    for _ in range(20):
        s = rng.randrange(0, len(doc) - head)
        nl = doc.find(b"\n", s)
        if 0 <= nl < len(doc) - tail:
            return doc[nl + 1:nl + 1 + n]
    return doc[:n]


def prompt_docs(corpus, n, what="corpus"):
    """The documents of corpus a prompt of n bytes can be cut from; exits with a message
    naming the longest document when none is long enough."""
    docs = [d for d in corpus if len(d) > prompt_min_doc(n)]
    if not docs:
        sys.exit(f"prompts of {n} bytes need documents of more than {prompt_min_doc(n)} bytes; the longest of "
                 f"the {len(corpus)} {what} documents has {max(map(len, corpus), default=0)}")
    return docs


def draw_prompts(corpus, n, rng, lens, what="corpus"):
    """n prompts whose lengths are drawn from `lens`, grouped by length (shortest first). A
    prompt of length L comes from a document longer than prompt_min_doc(L) (prompt_docs):
    when every document is (the default lengths), the draws are those of the whole corpus."""
    by_len, fit = {}, {}
    for _ in range(n):
        L = rng.choice(lens)
        if L not in fit:
            fit[L] = prompt_docs(corpus, L, what)
        docs = fit[L]
        p = prompt_from(docs[rng.randrange(len(docs))], rng, L)
        assert len(p) == L  # prompt_from never cuts short: docs are longer than prompt_min_doc(L)
        by_len.setdefault(L, []).append(p)
    return [by_len[L] for L in sorted(by_len)]
