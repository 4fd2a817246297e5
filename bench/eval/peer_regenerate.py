#!/usr/bin/env python3
"""peer_regenerate.py: transformers' generate on the prompts target_generate answered, batch 1,
exactly --max-new tokens, greedy and sampled; prints the table beside our figures (read from
target_generate's JSON) and writes it as JSON. Also compares the greedy tokens: ours are bf16
with our kernels, transformers' bf16 with its own, so near-ties may differ; the share of
identical leading tokens is reported, not asserted. Called by bench/eval/generate.sh."""
import argparse
import json
import os
import struct
import sys
import time

import torch


def read_shard(path):
    b = open(path, "rb").read()
    n, nt = struct.unpack_from("<QQ", b, 16)
    off = struct.unpack_from("<%dQ" % (n + 1), b, 64)
    tp = 64 + 8 * (n + 1)
    tok = struct.unpack_from("<%dI" % nt, b, tp)
    mp = tp + (4 * nt + 7) // 8 * 8
    mk = b[mp:mp + nt]
    out = []
    for i in range(n):
        t, m = tok[off[i]:off[i + 1]], mk[off[i]:off[i + 1]]
        k = m.index(1) if 1 in m else len(m)
        out.append((list(t[:k]), list(t[k:])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--ours-greedy", required=True, help="target_generate's output prefix (greedy run)")
    ap.add_argument("--ours-json", required=True)
    ap.add_argument("--ours-sampled-json", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    prompts = [p for p, _ in read_shard(a.prompts)][:a.n]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    rows = {}
    for label, kw in (("greedy", dict(do_sample=False)),
                      ("sampled", dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=20))):
        for cache in ("dynamic", "static"):
            # static cache without torch.compile: transformers compiles a static-cache generate
            # on its own, which costs minutes per shape; the decode bench (bench/eval/decode.sh)
            # has the compiled peer
            extra = {} if cache == "dynamic" else dict(cache_implementation="static", disable_compile=True)
            try:
                gen_kw = dict(max_new_tokens=a.max_new, min_new_tokens=a.max_new, pad_token_id=0, **kw, **extra)
                ids = torch.tensor([prompts[0]], device="cuda")
                model.generate(ids, **dict(gen_kw, max_new_tokens=8, min_new_tokens=8))  # warm-up
                torch.cuda.synchronize()
                outs, t0 = [], time.perf_counter()
                for p in prompts:
                    ids = torch.tensor([p], device="cuda")
                    outs.append(model.generate(ids, **gen_kw)[0, len(p):].tolist())
                torch.cuda.synchronize()
                s = time.perf_counter() - t0
                rows[f"transformers {cache} cache, {label}"] = dict(tokens=sum(map(len, outs)), seconds=s,
                                                                   tokens_per_s=sum(map(len, outs)) / s)
                print(f"peer: transformers {cache} cache, {label}: {sum(map(len, outs)) / s:.0f} tok/s", flush=True)
                if label == "greedy" and cache == "dynamic":
                    peer_greedy = outs
            except Exception as e:  # noqa: BLE001 - report why a configuration could not run
                rows[f"transformers {cache} cache, {label}"] = dict(error=f"{type(e).__name__}: {e}"[:200])
    for label, path in (("greedy", a.ours_json), ("sampled", a.ours_sampled_json)):
        j = json.load(open(path))
        rows[f"target_generate (ours), {label}"] = dict(tokens=j["response_tokens"], seconds=j["seconds"],
                                                        tokens_per_s=j["tokens_per_s"])
    ours = [r for _, r in read_shard(a.ours_greedy + "-000.dfs")]
    same = []
    for o, p in zip(ours, peer_greedy):
        k = 0
        while k < min(len(o), len(p)) and o[k] == p[k]:
            k += 1
        same.append(k)
    print(f"\nregeneration at the Qwen3-1.7B shape (random weights, bf16), {len(prompts)} prompts x {a.max_new} "
          f"new tokens, batch 1, H200")
    print(f"{'':44s} {'tokens':>8s} {'seconds':>8s} {'tok/s':>8s}")
    for k, r in rows.items():
        if "error" in r:
            print(f"{k:44s} could not run: {r['error']}")
        else:
            print(f"{k:44s} {r['tokens']:8d} {r['seconds']:8.2f} {r['tokens_per_s']:8.0f}")
    print(f"greedy agreement with transformers (bf16 both): mean identical leading tokens "
          f"{sum(same) / len(same):.1f} of {a.max_new}")
    json.dump(dict(shape="qwen3-1.7b", prompts=len(prompts), max_new=a.max_new, rows=rows,
                   greedy_identical_prefix=same), open(a.json, "w"), indent=2)


if __name__ == "__main__":
    sys.exit(main())
