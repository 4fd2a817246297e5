"""stdlib_corpus.py: the training text of this repository's tiny targets and of the tiny
chat target's tokenizer: the source files of the running Python's standard library (no
download needed).

load_corpus(with_tests) -> (train, held): lists of file contents (bytes). Files under 2 KiB
and installed packages are left out; a file whose path (relative to the stdlib) hashes to
0 mod 20 (CRC-32) is held out, never trained on by a target, a tokenizer or a drafter.
Used by scripts/train_target.py and scripts/train_bpe.py; standard library only.
"""
import glob
import os
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
