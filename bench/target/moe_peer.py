#!/usr/bin/env python3
"""moe_peer.py: the transformers peer of bench_moe: Qwen3MoeForCausalLM's body forward
(model.model(input_ids, use_cache=False, output_hidden_states=True)), sdpa attention, bf16,
random weights made on the GPU, at the Qwen3-30B-A3B shape (d 2048, 32 q / 4 kv heads of 128,
128 experts of width 768, top 8, renormalised) with --layers N (default 48), batches of B
sequences of T tokens (T = 2048 and 4096) with B*T = --tokens (default 8192): the token
count of bench_moe's packed row.

Experts backends (transformers 5: model.set_experts_implementation / the
experts_implementation setting): "eager" (the reference loop over experts) and the fast
ones, probed in order: "grouped_mm" (tokens sorted by expert, torch's grouped GEMM) and
"batched_mm" (every (token, expert) pair's weights gathered for one bmm: it duplicates the
expert weights per pair, so it is skipped with its reason when that copy cannot fit). Each
row records the backend the model's config reports after the switch (what ran), the first
call's time apart, and the error of a mode that failed (the next mode still runs). The
default backend the model was built with is reported too.

FLOP per token as bench_moe counts it: 2 * active parameters (attention projections, norms,
the router, the k experts) per layer + the causal attention term 2 * T * H * hd per layer.
MFU: the active-parameter FLOP alone over 780 TFLOP/s (nominal dense bf16), and all FLOP
over torch's bf16 8192^3 matmul measured here. Prints one JSON object on stdout (and
--json PATH)."""
import argparse
import sys
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from peer_common import matmul_ceiling_tflops, time_forward, write_json

NOMINAL_TFLOPS = 780.0
SHAPE = dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             vocab_size=151936, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
             decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, rms_norm_eps=1e-6,
             rope_theta=1e6, max_position_embeddings=40960)


def active_layer_params(s):
    d, hd, H, KV = s["hidden_size"], s["head_dim"], s["num_attention_heads"], s["num_key_value_heads"]
    E, k, F = s["num_experts"], s["num_experts_per_tok"], s["moe_intermediate_size"]
    return d * (H + 2 * KV) * hd + H * hd * d + 2 * d + 2 * hd + E * d + k * 3 * d * F


def backend_of(model):
    """The experts backend the model's config says it runs (None when it has no such setting)."""
    for obj in (model.config, getattr(model, "model", None) and model.model.config):
        if obj is not None:
            for name in ("_experts_implementation", "experts_implementation"):
                v = getattr(obj, name, None)
                if v is not None:
                    return str(v)
    return None


def set_backend(model, mode):
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(mode)
    else:
        model.config._experts_implementation = mode  # older 5.x: the attribute the experts read
    return backend_of(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--modes", default="eager,grouped_mm,batched_mm",
                    help="experts backends to time, in order (default eager,grouped_mm,batched_mm)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ceiling = matmul_ceiling_tflops(dev)
    out = dict(bench="target_forward_moe_peer",
               peer="transformers %s + torch %s, sdpa, bf16, output_hidden_states, use_cache=False"
               % (transformers.__version__, torch.__version__),
               device=torch.cuda.get_device_name(0), torch_matmul_ceiling_tflops=round(ceiling, 2),
               nominal_tflops=NOMINAL_TFLOPS, shape="Qwen3-30B-A3B", layers_asked=a.layers, results=[])

    L = a.layers
    model = None
    while model is None:
        cfg = Qwen3MoeConfig(num_hidden_layers=L, attn_implementation="sdpa", **SHAPE)
        torch.set_default_dtype(torch.bfloat16)
        try:
            t0 = time.time()
            with torch.device(dev):
                model = Qwen3MoeForCausalLM(cfg)
            out["build_s"] = round(time.time() - t0, 1)
        except torch.cuda.OutOfMemoryError as e:
            model = None
            torch.cuda.empty_cache()
            if L <= 4:
                out["error"] = "model build: %s" % str(e)[:300]
                print(write_json(out, a.json))
                return 1
            print(f"moe_peer: {L} layers do not fit ({str(e)[:120]}); trying {L * 3 // 4}", file=sys.stderr)
            L = L * 3 // 4
        finally:
            torch.set_default_dtype(torch.float32)
    model.eval()
    out["layers"] = L
    out["default_backend"] = backend_of(model)
    out["has_set_experts_implementation"] = hasattr(model, "set_experts_implementation")
    act = active_layer_params(SHAPE)
    H, hd = SHAPE["num_attention_heads"], SHAPE["head_dim"]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out["weight_bytes"] = weight_bytes
    for mode in [m for m in a.modes.split(",") if m]:
        for T in (2048, 4096):
            B = a.tokens // T
            row = dict(T=T, B=B, layers_run=L, mode=mode)
            if mode == "batched_mm":
                # its gathered weights: one [2F, d] + [d, F] copy per (token, expert) pair
                need = a.tokens * SHAPE["num_experts_per_tok"] * 3 * SHAPE["hidden_size"] * \
                    SHAPE["moe_intermediate_size"] * 2
                free, _ = torch.cuda.mem_get_info()
                if need > free:
                    row["skipped"] = ("batched_mm gathers the experts' weights per (token, expert) pair: %.0f GB "
                                      "for %d tokens x top %d, %.1f GB free" % (need / 1e9, a.tokens,
                                                                                 SHAPE["num_experts_per_tok"],
                                                                                 free / 1e9))
                    out["results"].append(row)
                    continue
            try:
                row["backend_ran"] = set_backend(model, mode)
            except Exception as e:  # noqa: BLE001 - report the reason, run the next mode
                row["error"] = ("set backend: %s: %s" % (type(e).__name__, e))[:600]
                out["results"].append(row)
                continue
            ids = torch.randint(0, SHAPE["vocab_size"], (B, T), device=dev)

            def fwd():
                with torch.inference_mode():
                    return model.model(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states

            try:
                ms = time_forward(fwd, row, 1, a.iters)
            except Exception as e:  # noqa: BLE001 - out of memory, an unsupported backend: next mode
                row["error"] = ("%s: %s" % (type(e).__name__, e))[:600]
                torch.cuda.empty_cache()
                out["results"].append(row)
                continue
            flops = 2.0 * act * L * a.tokens + B * (T * 2.0 * L * T * H * hd)
            row.update(ms=round(ms, 3), tok_s=round(a.tokens / (ms * 1e-3), 1),
                       tflops=round(flops / (ms * 1e-3) / 1e12, 2),
                       mfu_active=round(2.0 * act * L * a.tokens / (ms * 1e-3) / 1e12 / NOMINAL_TFLOPS, 4),
                       mfu_all=round(flops / (ms * 1e-3) / 1e12 / ceiling, 4), per_layer_ms=round(ms / L, 4))
            out["results"].append(row)
            print(f"{mode:10} ran {row.get('backend_ran')}: {B} x {T}: {ms:.2f} ms, {row['tok_s']:.0f} tok/s, "
                  f"MFU active {100 * row['mfu_active']:.1f}%", file=sys.stderr)
            write_json(out, a.json)  # what is done so far survives a timeout
    print(write_json(out, a.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
