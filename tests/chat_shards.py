"""chat_shards.py: functions for tests/test_prepare_chat.sh: read a .dfs shard in Python (the
format of common/io/shard.h, checksums verified) and look at its samples through the
builtin tokenizer (scripts/hf_tokenizer.py): the decoded text, the text under mask 1 as
runs, the text before the first mask-1 token."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from hf_tokenizer import HFDirTokenizer  # noqa: E402
from prepare_data import fnv1a64  # noqa: E402


def read_shard(path):
    """[(tokens, mask)] of a shard; asserts its header and checksums."""
    b = open(path, "rb").read()
    assert b[:8] == b"DFSHARD1", path
    version, vocab, n, nt, ck = struct.unpack_from("<IIQQQ", b, 8)
    assert fnv1a64(b[:40]) == struct.unpack_from("<Q", b, 40)[0], f"{path}: header checksum"
    assert fnv1a64(b[64:]) == ck, f"{path}: payload checksum"
    offs = struct.unpack_from(f"<{n + 1}Q", b, 64)
    to = 64 + 8 * (n + 1)
    toks = struct.unpack_from(f"<{nt}I", b, to)
    mo = to + 4 * nt + (-4 * nt) % 8
    mask = b[mo:mo + nt]
    return [(list(toks[offs[i]:offs[i + 1]]), list(mask[offs[i]:offs[i + 1]])) for i in range(n)]


class View:
    def __init__(self, tokenizer_dir):
        self.tok = HFDirTokenizer(tokenizer_dir)

    def text(self, sample):
        return self.tok.decode(sample[0])

    def runs(self, sample):
        """The decoded text of each maximal run of mask-1 tokens."""
        out, cur = [], None
        for t, m in zip(*sample):
            if m:
                cur = (cur or []) + [t]
            elif cur is not None:
                out.append(self.tok.decode(cur))
                cur = None
        if cur is not None:
            out.append(self.tok.decode(cur))
        return out

    def prompt(self, sample):
        """The decoded tokens before the first mask-1 token (what dflash_eval takes as the prompt)."""
        t, m = sample
        k = m.index(1)
        return self.tok.decode(t[:k])

    def render(self, messages, tools=None, gen=False, **kw):
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, **kw)


def lines(path):
    return [json.loads(x) for x in open(path, encoding="utf-8") if x.strip()]


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")
