#!/usr/bin/env python3
"""make_fixtures.py: tiny Qwen3 and Llama target models and transformers' hidden states.

Run on a machine with torch + transformers (the GPU machine; nothing is downloaded):
    python3 scripts/make_fixtures.py --out tests/fixtures

Writes, for each of tiny-qwen3 (bf16, tied embeddings, q/k norm, head_dim given) and
tiny-llama (fp32, untied, sharded with an index, llama3 rope scaling, GQA, head_dim
derived):
    <out>/<name>/            the HF model directory (save_pretrained)
    <out>/<name>-ref.safetensors
        input_ids  I32 [T]            a packed row of several documents
        doc_starts I32 [n_docs+1]     document boundaries (0 ... T)
        embed      F32 [T, d]         hidden_states[0]
        hidden.<l> F32 [T, d]         output of decoder layer l = hidden_states[l+1]
Each document is run through transformers on its own (positions from 0), in float32
from the saved (for qwen3: bf16-rounded) weights, so the packed C forward must match
it exactly up to fp32 rounding. The last layer's entry is BEFORE the final norm:
transformers applies the final norm to hidden_states[-1], so the script recomputes it
with a hook on the last decoder layer instead.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM


def doc_lengths():
    return [7, 13, 1, 9]


def reference(model, ids, starts, n_layers):
    """Per-document HF forward; returns embed [T,d] and per-layer outputs [T,d]."""
    layer_out = {}
    hooks = []
    for l, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, l=l):
            layer_out[l] = (out[0] if isinstance(out, tuple) else out).detach()
        hooks.append(layer.register_forward_hook(hook))
    embeds, hiddens = [], [[] for _ in range(n_layers)]
    with torch.no_grad():
        for d in range(len(starts) - 1):
            seg = ids[starts[d]:starts[d + 1]].unsqueeze(0)
            out = model.model(input_ids=seg, output_hidden_states=True)
            embeds.append(out.hidden_states[0][0].float())
            for l in range(n_layers):
                h = layer_out[l]
                hiddens[l].append(h[0].float())
                if l < n_layers - 1:  # sanity: hook == hidden_states[l+1] before the final norm
                    diff = (h.float() - out.hidden_states[l + 1].float()).abs().max().item()
                    if diff != 0.0:
                        print(f"warning: layer {l}: hook differs from hidden_states[{l + 1}] by {diff}")
    for h in hooks:
        h.remove()
    return torch.cat(embeds), [torch.cat(h) for h in hiddens]


def build(name, model_cls, cfg, dtype, out_dir, shard_size=None, seed=0):
    torch.manual_seed(seed)
    model = model_cls(cfg).to(dtype)
    path = os.path.join(out_dir, name)
    kw = {"safe_serialization": True}
    if shard_size:
        kw["max_shard_size"] = shard_size
    model.save_pretrained(path, **kw)
    # reload in fp32 from disk: the reference uses exactly the stored weights
    ref_model = model_cls.from_pretrained(path, dtype=torch.float32).eval()
    ref_model.config._attn_implementation = "eager"
    lens = doc_lengths()
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (starts[-1],), generator=g)
    embed, hiddens = reference(ref_model, ids, starts, cfg.num_hidden_layers)
    tensors = {
        "input_ids": ids.to(torch.int32),
        "doc_starts": torch.tensor(starts, dtype=torch.int32),
        "embed": embed.contiguous(),
    }
    for l, h in enumerate(hiddens):
        tensors[f"hidden.{l}"] = h.contiguous()
    save_file(tensors, os.path.join(out_dir, f"{name}-ref.safetensors"))
    print(f"{name}: {sum(p.numel() for p in model.parameters())} params, T={starts[-1]}, "
          f"files={sorted(os.listdir(path))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    qcfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=True,
                       attention_bias=False)
    build("tiny-qwen3", Qwen3ForCausalLM, qcfg, torch.bfloat16, args.out, seed=1)
    lcfg = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                       num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-5,
                       rope_theta=500000.0, max_position_embeddings=512, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    build("tiny-llama", LlamaForCausalLM, lcfg, torch.float32, args.out, shard_size="200KB", seed=2)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("Made by scripts/make_fixtures.py with transformers on the GPU machine; see that script.\n")


if __name__ == "__main__":
    main()
