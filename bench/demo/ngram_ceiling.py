#!/usr/bin/env python3
"""ngram_ceiling.py: how predictable the embedded default's answers are from their last few
bytes alone, the yardstick for what a drafter of the demo could learn.

For each n (bytes of context before the position drafted: the anchor and the n-1 before it)
and each block position k, a lookup table is counted on the first SAMPLES training answers
(data/tiny/chat-train.jsonl: prompt + greedy answer of models/tiny-target): the most common
byte at k positions after every n-byte context inside the answers. Each held-out answer
(chat-heldout.jsonl) is then predicted with it, every answer byte as an anchor as dflash_eval
does (a context never seen: the most common byte). The accuracy is what a drafter that had
memorised these tables would score at position k; the drafter sees more than n bytes (the
target's features of the whole context) and has to learn it all in a few hundred steps.

    python3 bench/demo/ngram_ceiling.py [--data data/tiny] [--samples 1600] [--json OUT]

Prints a table (rows n, columns k) and writes the same as JSON. Standard library only.
"""
import argparse
import collections
import json
import os
import sys


def pairs(path, limit=None):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = json.loads(line)["messages"]
            out.append((m[0]["content"].encode(), m[1]["content"].encode()))
            if limit and len(out) == limit:
                break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/tiny", help="directory with chat-train.jsonl and chat-heldout.jsonl")
    ap.add_argument("--samples", type=int, default=1600, help="training answers counted (make run's shard: 1600 or 2400)")
    ap.add_argument("--ns", default="1,2,3,4,6,8", help="context lengths in bytes")
    ap.add_argument("--ks", default="1,2,3,4,8", help="block positions after the anchor")
    ap.add_argument("--json", help="write the table here")
    a = ap.parse_args()
    try:
        ns = [int(x) for x in a.ns.split(",")]
        ks = [int(x) for x in a.ks.split(",")]
    except ValueError:
        sys.exit("ngram_ceiling: --ns / --ks: expected comma-separated whole numbers")
    if a.samples < 1 or min(ns + ks) < 1:
        sys.exit("ngram_ceiling: --samples, --ns and --ks must be >= 1")
    try:
        train = pairs(os.path.join(a.data, "chat-train.jsonl"), a.samples)
        held = pairs(os.path.join(a.data, "chat-heldout.jsonl"))
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"ngram_ceiling: {a.data}: cannot read the chat files: {e}")
    uni = collections.Counter()
    for _, ans in train:
        uni.update(ans)
    top = uni.most_common(1)[0][0]
    table = {}
    print(f"ngram_ceiling: {len(train)} training answers, {len(held)} held-out answers ({a.data}); "
          f"most common byte {chr(top)!r} = {uni[top] / sum(uni.values()):.3f} of the answers")
    print("held-out accuracy of the most common byte k positions after each n-byte context (n = 1: the anchor)")
    print(f"{'n':>3} " + " ".join(f"{'k=' + str(k):>7}" for k in ks))
    for n in ns:
        row = {}
        for k in ks:
            counts = collections.defaultdict(collections.Counter)
            for p, ans in train:
                s, st = p + ans, len(p)
                for i in range(st, len(s) - k + 1):  # s[i-1] is the anchor, s[i+k-1] the byte drafted at k
                    counts[s[max(0, i - n):i]][s[i + k - 1]] += 1
            best = {c: cc.most_common(1)[0][0] for c, cc in counts.items()}
            ok = tot = 0
            for p, ans in held:
                s, st = p + ans, len(p)
                for i in range(st, len(s) - k + 1):
                    tot += 1
                    ok += best.get(s[max(0, i - n):i], top) == s[i + k - 1]
            row[k] = ok / tot if tot else None
        table[n] = row
        print(f"{n:>3} " + " ".join(f"{row[k]:7.3f}" for k in ks))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data": a.data, "samples": len(train), "heldout": len(held), "unigram_top": chr(top),
                       "acc": {str(n): {str(k): v for k, v in r.items()} for n, r in table.items()}}, f, indent=1)
        print(f"ngram_ceiling: wrote {a.json}")


if __name__ == "__main__":
    main()
