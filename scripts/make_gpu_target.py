#!/usr/bin/env python3
"""make_gpu_target.py: a random-weight Qwen3 / Qwen3-MoE target of a real shape, and data for it (GPU machine).

    python3 scripts/make_gpu_target.py --shape 1.7b --out gpu/models/qwen3-1.7b \\
        --data gpu/data/qwen3-1.7b --train 1024 --heldout 32 --generate 256
    python3 scripts/make_gpu_target.py --shape 30b-a3b --out gpu/models/qwen3-30b-a3b \\
        --data gpu/data/qwen3-30b-a3b --train 1024 --heldout 32 --generate 0

Nothing can be downloaded on the GPU machine, so the big targets are made there with
transformers (Qwen3Config + Qwen3ForCausalLM, or Qwen3MoeConfig + Qwen3MoeForCausalLM for the
mixture-of-experts shapes; HF's own random init, std 0.02), in bf16, on the GPU, and saved
with save_pretrained (config.json + safetensors). The 30b-a3b shape is Qwen3-30B-A3B's (and
Qwen3-Coder-30B-A3B's): 48 layers, all sparse, 128 experts of width 768, top 8, 30.5B
parameters, about 61 GB in bf16, so it needs a GPU with that much free memory (an H100 holds
it); HF's expert loop makes its --generate slow: use --generate 0 (random tokens) for
throughput runs. The expert layout written is whatever this transformers saves (the loader
reads both, docs/target.md).

Data (token shards, the format of common/io/shard.h, written by prepare_data.write_shard):
  --generate M   each sample is a random prompt of --prompt-len tokens followed by the
                 target's own greedy continuation of M tokens (loss mask on the continuation),
                 generated in batches on the GPU. Measured at the 1.7b shape (HF's init,
                 std 0.02): the greedy text is NOT repetitive (119-126 distinct tokens in
                 128), so a drafter trained on it reaches tau 1.0: such runs measure the
                 machinery (throughput, lossless decoding), not a drafter's quality.
  --generate 0   random tokens, lengths uniform in [--min-len, --max-len], loss mask on the
                 second half (throughput runs only).
Writes <data>-train-000.dfs and <data>-heldout-000.dfs (and a chat-free prompts file is not
needed: dflash_eval reads the held-out shard's prompts).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_data import write_shard  # noqa: E402

SHAPES = {
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    # Qwen3-30B-A3B / Qwen3-Coder-30B-A3B (mixture of experts: the "moe" entries)
    "30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                    num_key_value_heads=4, head_dim=128, tie_word_embeddings=False,
                    moe=dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[])),
}


def log(msg):
    print(f"make_gpu_target: {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--data", required=True, help="shard prefix: <data>-train-000.dfs, <data>-heldout-000.dfs")
    ap.add_argument("--train", type=int, default=1024, help="training samples")
    ap.add_argument("--heldout", type=int, default=32, help="held-out samples (prompts for dflash_eval)")
    ap.add_argument("--generate", type=int, default=256, help="greedy tokens per sample (0 = random tokens)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256, help="generation batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0,
                    help="keep the shape but make only this many decoder layers (0: the shape's own); "
                         "a shape-faithful model that fits the disk (30b-a3b: about 1.26 GB a layer)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("make_gpu_target: needs a GPU (this is a GPU-machine script)")
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(a.seed)
    shape = dict(SHAPES[a.shape])
    moe = shape.pop("moe", None)
    if a.layers < 0 or a.layers > shape["num_hidden_layers"]:
        sys.exit(f"make_gpu_target: --layers {a.layers}: expected 1..{shape['num_hidden_layers']} (0: all)")
    if a.layers:
        shape["num_hidden_layers"] = a.layers
    cfg_cls, model_cls = (Qwen3MoeConfig, Qwen3MoeForCausalLM) if moe else (Qwen3Config, Qwen3ForCausalLM)
    cfg = cfg_cls(vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  torch_dtype="bfloat16", **shape, **(moe or {}))
    t0 = time.time()
    with torch.device("cuda"):
        model = model_cls(cfg).to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    log(f"Qwen3-{a.shape} shape ({model_cls.__name__}, {cfg.num_hidden_layers} layers), {n / 1e9:.2f}B parameters, made in {time.time() - t0:.1f}s")
    if not os.path.exists(os.path.join(a.out, "config.json")):
        t0 = time.time()
        model.save_pretrained(a.out, safe_serialization=True)
        log(f"saved {a.out} in {time.time() - t0:.1f}s")
    os.makedirs(os.path.dirname(a.data) or ".", exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)

    def samples(count):
        out = []
        if a.generate == 0:
            lens = torch.randint(a.min_len, a.max_len + 1, (count,), generator=g, device="cuda").tolist()
            for L in lens:
                toks = torch.randint(0, cfg.vocab_size, (L,), generator=g, device="cuda").tolist()
                out.append((toks, [0] * (L // 2) + [1] * (L - L // 2)))
            return out
        for i in range(0, count, a.batch):
            b = min(a.batch, count - i)
            prompt = torch.randint(0, cfg.vocab_size, (b, a.prompt_len), generator=g, device="cuda")
            t1 = time.time()
            with torch.no_grad():
                seq = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=a.generate,
                                     min_new_tokens=a.generate, do_sample=False, pad_token_id=0)
            log(f"generated {i + b}/{count} samples ({b} x {a.generate} tokens in {time.time() - t1:.1f}s)")
            for row in seq.tolist():
                out.append((row, [0] * a.prompt_len + [1] * (len(row) - a.prompt_len)))
        return out

    for split, count in (("train", a.train), ("heldout", a.heldout)):
        path = f"{a.data}-{split}-000.dfs"
        s = samples(count)
        write_shard(path, cfg.vocab_size, s)
        log(f"wrote {path}: {len(s)} samples, {sum(len(t) for t, _ in s)} tokens")


if __name__ == "__main__":
    main()
