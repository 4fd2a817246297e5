#!/usr/bin/env python3
"""peer_transformers.py: the peer for bench_target: transformers' Qwen3 body forward
(model.model(input_ids, use_cache=False, output_hidden_states=True)), sdpa attention, bf16,
random weights, at the Qwen3-1.7B and Qwen3-8B shapes, batches of B sequences of T tokens
with B*T = --tokens (default 8192), the same token count as our packed row. All layers run
(the peer does not trim; that is part of what we compare). Also measures torch's bf16
8192^3 matmul for its MFU. Prints one JSON object on stdout (and --json PATH).

--compile MODES (comma list, default "none"): each mode is one peer row per shape:
  none                          eager PyTorch (the plain transformers forward)
  default                       torch.compile(mode="default"), static shapes
  max-autotune-no-cudagraphs    torch.compile with Triton GEMM autotuning, no CUDA graphs
--compile-scope layers|model (default layers): "layers" compiles every decoder layer's
  forward (the regional compilation PyTorch recommends for repeated blocks: the layers
  share one code object, so the compile is paid about once, in seconds), "model" compiles
  the whole body forward (one graph over all layers; minutes at 36 layers).
Compile time (the first call at a new shape) is reported separately ("compile_s") and is
not in the timing. A mode that fails (compile error, out of memory) is reported with the
reason ("error") and the next one runs. The eager peer runs use_cache=False, as a strong
user extracting hidden states would (no KV cache copies).
FLOP per docs/performance.md: 2 * body params per token + 2 * layers * T * heads * hd."""
import argparse
import sys

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

from peer_common import matmul_ceiling_tflops, time_forward, write_json

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


def set_compile_limits(torch):
    """Room for one compiled graph per input shape (dynamo's default limit is 8)."""
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--models", default="1.7b,8b")
    ap.add_argument("--compile", default="none",
                    help="comma list of: none, default, max-autotune-no-cudagraphs (see above)")
    ap.add_argument("--compile-scope", default="layers", choices=("layers", "model"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    modes = [m for m in a.compile.split(",") if m]
    for m in modes:
        if m not in ("none", "default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune"):
            ap.error(f"--compile: unknown mode '{m}'")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ceiling = matmul_ceiling_tflops(dev)
    out = dict(bench="target_forward_peer", peer="transformers %s + torch %s, sdpa, bf16, output_hidden_states, "
               "use_cache=False" % (transformers.__version__, torch.__version__), device=torch.cuda.get_device_name(0),
               torch_matmul_ceiling_tflops=round(ceiling, 2), compile_scope=a.compile_scope, results=[])
    if any(m != "none" for m in modes):
        set_compile_limits(torch)

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
        L = s["num_hidden_layers"]
        for mode in modes:
            fwd_model = None
            if mode != "none":
                torch._dynamo.reset()
                if a.compile_scope == "layers":
                    # compile each layer's forward (not its __call__): the hooks / wrappers
                    # transformers puts around a layer to record hidden states stay outside
                    # the compiled code, so they cannot force a recompile per call
                    for layer in model.model.layers:
                        layer.__dict__.pop("forward", None)
                        layer.forward = torch.compile(layer.forward, mode=mode, dynamic=False)
                else:
                    fwd_model = torch.compile(model.model, mode=mode, dynamic=False)
            else:
                for layer in model.model.layers:  # undo an earlier mode's compile
                    layer.__dict__.pop("forward", None)
            body = fwd_model if fwd_model is not None else model.model
            for T in (2048, 4096):
                B = a.tokens // T
                ids = torch.randint(0, s["vocab_size"], (B, T), device=dev)
                row = dict(model=name, T=T, B=B, layers_run=L, mode=mode,
                           compile_scope=a.compile_scope if mode != "none" else None)

                def fwd():
                    with torch.inference_mode():
                        o = body(input_ids=ids, use_cache=False, output_hidden_states=True)
                        return o.hidden_states

                try:
                    ms = time_forward(fwd, row, 2, a.iters)
                except Exception as e:  # report the reason, run the next mode
                    row["error"] = ("%s: %s" % (type(e).__name__, e))[:600]
                    print(f"peer {name} T={T} mode={mode}: FAILED: {row['error']}", file=sys.stderr, flush=True)
                    out["results"].append(row)
                    write_json(out, a.json)
                    torch.cuda.empty_cache()
                    continue
                if mode != "none":
                    row["compile_s"] = row["first_call_s"]
                    try:
                        row["dynamo_unique_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
                    except Exception:  # counters are internal: optional
                        pass
                flop_tok = 2 * layer_params(s) * L + 2 * L * T * s["num_attention_heads"] * s["head_dim"]
                tok_s = B * T / (ms * 1e-3)
                row.update(ms=round(ms, 3), tok_s=round(tok_s, 1), gflop_per_token=round(flop_tok / 1e9, 4),
                           tflops=round(flop_tok * tok_s / 1e12, 2),
                           mfu=round(flop_tok * tok_s / 1e12 / ceiling, 4))
                print(f"peer {name} T={T} mode={mode}: {ms:.2f} ms, {tok_s:.0f} tok/s, first call "
                      f"{row['first_call_s']} s", file=sys.stderr, flush=True)
                out["results"].append(row)
                write_json(out, a.json)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    print(write_json(out, a.json))


if __name__ == "__main__":
    sys.exit(main())
