#!/usr/bin/env python3
"""make_tiny_moe.py: a tiny random Qwen3-MoE checkpoint, standard library only.

    python3 tests/make_tiny_moe.py OUT_DIR [--seed N] [--layout per-expert|fused]

The stand-in for the transformers fixture (scripts/make_moe_fixture.py, made on the GPU
machine) where that fixture is absent: the same shape (4 layers, hidden 64, 4 q / 2 kv
heads of 16, vocab 300, 8 experts, top 2, expert width 32, dense width 96,
mlp_only_layers [0], decoder_sparse_step 2: layers 1 and 3 routed, 0 and 2 dense, tied
embeddings) and the same weight scales (norms near 1, embeddings N(0, 1), the router
3/sqrt(d) so routing is not flat, every other matrix 1/sqrt(fan_in)), written as an HF
directory (config.json + model.safetensors, F32, HF tensor names) that the C loader reads.
It checks nothing by itself: tests/test_moe_pipeline.sh runs the whole CPU path on it, and
tests/test_target_moe.c checks the MoE forward against the dense model and both layouts.
"""
import argparse
import json
import math
import os
import random
import struct

SHAPE = dict(vocab=300, d=64, dense=96, layers=4, heads=4, kv=2, hd=16, experts=8, top_k=2, moe=32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layout", choices=("per-expert", "fused"), default="per-expert")
    a = ap.parse_args()
    s, r = SHAPE, random.Random(a.seed)
    d, hd, E, F = s["d"], s["hd"], s["experts"], s["moe"]

    def normal(n, std):
        return [r.gauss(0.0, std) for _ in range(n)]

    tensors = {}  # name -> (shape, values)

    def mat(name, rows, cols, std=None):
        tensors[name] = ([rows, cols], normal(rows * cols, std if std is not None else 1.0 / math.sqrt(cols)))

    def norm(name, n):
        tensors[name] = ([n], [1.0 + x for x in normal(n, 0.1)])

    mat("model.embed_tokens.weight", s["vocab"], d, 1.0)
    sparse = []
    for l in range(s["layers"]):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", d)
        norm(p + "post_attention_layernorm.weight", d)
        mat(p + "self_attn.q_proj.weight", s["heads"] * hd, d)
        mat(p + "self_attn.k_proj.weight", s["kv"] * hd, d)
        mat(p + "self_attn.v_proj.weight", s["kv"] * hd, d)
        mat(p + "self_attn.o_proj.weight", d, s["heads"] * hd)
        norm(p + "self_attn.q_norm.weight", hd)
        norm(p + "self_attn.k_norm.weight", hd)
        if l != 0 and (l + 1) % 2 == 0:  # transformers' rule with mlp_only_layers [0], step 2
            sparse.append(l)
            mat(p + "mlp.gate.weight", E, d, 3.0 / math.sqrt(d))
            if a.layout == "per-expert":
                for e in range(E):
                    mat(p + f"mlp.experts.{e}.gate_proj.weight", F, d)
                    mat(p + f"mlp.experts.{e}.up_proj.weight", F, d)
                    mat(p + f"mlp.experts.{e}.down_proj.weight", d, F)
            else:  # [E, 2F, d] gate rows then up rows; [E, d, F]
                tensors[p + "mlp.experts.gate_up_proj"] = ([E, 2 * F, d], normal(E * 2 * F * d, 1.0 / math.sqrt(d)))
                tensors[p + "mlp.experts.down_proj"] = ([E, d, F], normal(E * d * F, 1.0 / math.sqrt(F)))
        else:
            mat(p + "mlp.gate_proj.weight", s["dense"], d)
            mat(p + "mlp.up_proj.weight", s["dense"], d)
            mat(p + "mlp.down_proj.weight", d, s["dense"])
    norm("model.norm.weight", d)

    os.makedirs(a.out, exist_ok=True)
    header, off = {"__metadata__": {"format": "pt", "made_by": "tests/make_tiny_moe.py"}}, 0
    for name, (shape, vals) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * len(vals)]}
        off += 4 * len(vals)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)  # the data starts 8-byte aligned
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for _, (_, vals) in tensors.items():
            f.write(struct.pack(f"<{len(vals)}f", *vals))
    cfg = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=s["vocab"],
               hidden_size=d, intermediate_size=s["dense"], num_hidden_layers=s["layers"],
               num_attention_heads=s["heads"], num_key_value_heads=s["kv"], head_dim=hd, rms_norm_eps=1e-6,
               rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False,
               num_experts=E, num_experts_per_tok=s["top_k"], moe_intermediate_size=F, norm_topk_prob=True,
               decoder_sparse_step=2, mlp_only_layers=[0], output_router_logits=False, router_aux_loss_coef=0.001,
               torch_dtype="float32", bos_token_id=None, eos_token_id=None)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print(f"make_tiny_moe: {a.out}: {len(tensors)} tensors ({off / 1e6:.1f} MB F32), layers {sparse} routed, "
          f"{a.layout} experts")


if __name__ == "__main__":
    main()
