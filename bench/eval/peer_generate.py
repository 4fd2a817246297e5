#!/usr/bin/env python3
"""bench/eval/peer_generate.py: the peer of bench_decode's plain decoding, transformers
`generate` (greedy, batch 1) at the Qwen3-1.7B and Qwen3-8B shapes with random bf16
weights on the GPU: the default dynamic cache, the static cache, and the static cache
with torch.compile (--compile; it costs a minute or more of compilation per shape).
Prints ms per new token and tokens/s per variant and writes JSON (--json).

    python3 bench/eval/peer_generate.py [--models 1.7b,8b] [--prompt 128] [--new 128] [--compile]
"""
import argparse
import json
import time

SHAPES = {
    "1.7b": dict(name="Qwen3-1.7B", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, intermediate_size=6144, tie_word_embeddings=True),
    "8b": dict(name="Qwen3-8B", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1.7b,8b")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json", default="bench/results/eval/decode_peer.json")
    a = ap.parse_args()
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "prompt": a.prompt, "new": a.new, "shapes": []}
    for key in a.models.split(","):
        sh = dict(SHAPES[key])
        name = sh.pop("name")
        cfg = Qwen3Config(vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                          **sh)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
        ids = torch.randint(0, 151935, (1, a.prompt), device="cuda")
        gc = model.generation_config
        # transformers compiles the forward by itself when the cache is static unless
        # disable_compile is set: the "static cache" row is then already a compiled peer
        res = {"shape": name, "generate_auto_compile": not getattr(gc, "disable_compile", True),
               "compile_config": str(getattr(gc, "compile_config", None))}
        variants = [("dynamic cache", {}), ("static cache", {"cache_implementation": "static"})]
        if a.compile:
            variants.append(("static cache + torch.compile", {"cache_implementation": "static", "compile": True}))
        for label, kw in variants:
            if kw.pop("compile", False):
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            try:
                def run(n):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
                    torch.cuda.synchronize()
                    return time.perf_counter() - t
                run(a.new)  # warm-up (and compilation)
                run(a.new)
                t_full, t_one = run(a.new), run(1)
                ms = (t_full - t_one) * 1e3 / (a.new - 1)  # per token after the first (prefill out)
                res[label] = {"ms_per_token": ms, "tokens_per_s": 1e3 / ms}
                print(f"peer {name} generate, {label}: {ms:.3f} ms/token, {1e3 / ms:.1f} tokens/s", flush=True)
            except Exception as e:  # a variant that does not work here is reported, not fatal
                res[label] = {"error": str(e)[:300]}
                print(f"peer {name} generate, {label}: failed: {str(e)[:200]}", flush=True)
        out["shapes"].append(res)
        del model
        torch.cuda.empty_cache()
        with open(a.json, "w") as f:  # after every shape: a run cut off by a timeout keeps what it measured
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
