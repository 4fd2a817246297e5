#!/usr/bin/env python3
"""peer_transformers.py: the peer for bench_target: transformers' Qwen3 body forward
(model.model(input_ids, output_hidden_states=True)), sdpa attention, bf16, random
weights, at the Qwen3-1.7B and Qwen3-8B shapes, batches of B sequences of T tokens with
B*T = --tokens (default 8192), the same token count as our packed row. All layers run
(the peer does not trim; that is part of what we compare). Also measures torch's bf16
8192^3 matmul for its MFU. Prints one JSON object on stdout (and --json PATH).
FLOP per docs/performance.md: 2 * body params per token + 2 * layers * T * heads * hd."""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

SHAPES = {
    "Qwen3-1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True),
    "Qwen3-8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
}


def layer_params(s):
    d, hd, H, KV, I = s["hidden_size"], s["head_dim"], s["num_attention_heads"], s["num_key_value_heads"], \
        s["intermediate_size"]
    return d * (H + 2 * KV) * hd + H * hd * d + 3 * d * I + 2 * d + 2 * hd


def timed(fn, iters):
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(iters):
        fn()
    ev1.record()
    torch.cuda.synchronize()
    return ev0.elapsed_time(ev1) / iters  # ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--models", default="1.7b,8b")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    ms = timed(lambda: x @ y, 20)
    ceiling = 2 * 8192 ** 3 / (ms * 1e-3) / 1e12
    del x, y
    out = dict(bench="target_forward_peer", peer="transformers %s + torch %s, sdpa, bf16, output_hidden_states"
               % (transformers.__version__, torch.__version__), device=torch.cuda.get_device_name(0),
               torch_matmul_ceiling_tflops=round(ceiling, 2), results=[])
    for name, s in SHAPES.items():
        if ("1.7b" if "1.7B" in name else "8b") not in a.models:
            continue
        cfg = Qwen3Config(**s, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
                          attn_implementation="sdpa")
        torch.set_default_dtype(torch.bfloat16)
        with torch.device(dev):
            model = Qwen3ForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
        model.eval()
        for T in (2048, 4096):
            B = a.tokens // T
            ids = torch.randint(0, s["vocab_size"], (B, T), device=dev)

            def fwd():
                with torch.inference_mode():
                    o = model.model(input_ids=ids, output_hidden_states=True)
                    return o.hidden_states

            for _ in range(2):
                fwd()
            torch.cuda.synchronize()
            ms = timed(fwd, a.iters)
            L = s["num_hidden_layers"]
            flop_tok = 2 * layer_params(s) * L + 2 * L * T * s["num_attention_heads"] * s["head_dim"]
            tok_s = B * T / (ms * 1e-3)
            out["results"].append(dict(model=name, T=T, B=B, layers_run=L, ms=round(ms, 3), tok_s=round(tok_s, 1),
                                       gflop_per_token=round(flop_tok / 1e9, 4),
                                       tflops=round(flop_tok * tok_s / 1e12, 2),
                                       mfu=round(flop_tok * tok_s / 1e12 / ceiling, 4)))
        del model
        torch.cuda.empty_cache()
    text = json.dumps(out, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
