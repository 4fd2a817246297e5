#!/usr/bin/env python3
"""make_release_drafter.py: write a tiny drafter in the PUBLIC DFlash release format
(z-lab's DFlashDraftModel: config.json + model.safetensors), built with transformers, for a
given target, plus a reference draft computed in PyTorch. tests/test_spec_decode.c loads it
to check that dflash_eval reads a release made by the Python ecosystem, not only our own
export (dflash_export_release), and that our cached inference drafts what PyTorch drafts.

    python3 scripts/make_release_drafter.py --target models/tiny-target \\
        --out tests/fixtures/dflash-release-tiny [--block-size 16] [--layers 1] [--seed 0]

Needs torch, transformers (Qwen3) and safetensors: run on the GPU machine (CPU torch is
enough), then commit the output directory.

What it writes (docs/dflash_spec.md "Weights in the checkpoint", "config.json of a release"):
  config.json        transformers' Qwen3Config of the drafter's shape (to_dict(), so every
                     field transformers writes is there), plus architectures
                     ["DFlashDraftModel"], auto_map, block_size, num_target_layers,
                     dflash_config {target_layer_ids, mask_token_id}; rope_theta also at the
                     top level (transformers 5 nests it in rope_parameters; releases made
                     with transformers 4 have it at the top)
  model.safetensors  bf16, names without "model.": fc.weight, hidden_norm.weight,
                     layers.N.* of transformers' own Qwen3DecoderLayer modules (their
                     state_dict names ARE the release names), norm.weight; no embed_tokens,
                     no lm_head (taken from the target)
  reference.safetensors (not part of the format; ignored by loaders): a draft computed with
                     tests/reference/dflash_torch.py's drafter forward in float64 from these bf16
                     weights: H [S+1, n*d] f32 (random context features; row S unused),
                     tokens [S+1] (f32, small ints; tokens[S] is the anchor), logits
                     [B-1, V] f32 of block rows 1..B-1 for the anchor at position S.

--reference-only: keep the release in --out as it is and recompute only its
reference.safetensors (same H and tokens, new logits) for --target; needs only torch (no
transformers, no safetensors package). Used when the target's embeddings change.

Weights: transformers' init (normal std 0.02 for projections), then every norm weight set to
1 + U(-0.2, 0.2) so that a loader which ignored a norm would be caught by the reference.
Exit status 0, or 1 with a line starting "make_release_drafter: error:".
"""
import argparse
import json
import os
import sys


def die(msg):
    print(f"make_release_drafter: error: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", required=True, help="target model dir (HF Qwen3/Llama config.json)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=1, help="drafter decoder layers")
    ap.add_argument("--target-layer-ids", type=int, nargs="*", default=None,
                    help="captured target layers (default: 1 and L-1, as configs/tiny.json)")
    ap.add_argument("--mask-token-id", type=int, default=None,
                    help="default: the byte tokenizer's mask token, else vocab_size - 1")
    ap.add_argument("--context", type=int, default=40, help="context rows of the reference draft")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference-only", action="store_true",
                    help="recompute reference.safetensors of the release in --out for --target")
    args = ap.parse_args()
    if args.reference_only:
        return reference_only(args)

    try:
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm
    except ImportError as e:
        die(f"needs torch, safetensors and transformers with Qwen3 ({e})")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    import dflash_torch  # our PyTorch reference of the drafter forward
    dflash_torch.import_torch()

    t = json.load(open(os.path.join(args.target, "config.json")))
    L = t["num_hidden_layers"]
    d = t["hidden_size"]
    hd = t.get("head_dim") or d // t["num_attention_heads"]
    theta = t.get("rope_theta") or (t.get("rope_parameters") or {}).get("rope_theta") or 1e6
    ids = args.target_layer_ids or [1, L - 1]
    mask_id = args.mask_token_id
    bt = os.path.join(args.target, "byte_tokenizer.json")
    if mask_id is None:
        mask_id = json.load(open(bt))["mask"] if os.path.exists(bt) else t["vocab_size"] - 1
    torch.manual_seed(args.seed)

    cfg = Qwen3Config(hidden_size=d, intermediate_size=t["intermediate_size"], num_hidden_layers=args.layers,
                      num_attention_heads=t["num_attention_heads"],
                      num_key_value_heads=t.get("num_key_value_heads", t["num_attention_heads"]), head_dim=hd,
                      vocab_size=t["vocab_size"], rms_norm_eps=t.get("rms_norm_eps", 1e-6), rope_theta=theta,
                      max_position_embeddings=t.get("max_position_embeddings", 4096),
                      tie_word_embeddings=t.get("tie_word_embeddings", False), attention_bias=False,
                      layer_types=["full_attention"] * args.layers, use_sliding_window=False)
    cfg._attn_implementation = "eager"

    class Drafter(torch.nn.Module):
        """The release module layout: fc, hidden_norm, layers (Qwen3 decoder layers), norm."""

        def __init__(self, c):
            super().__init__()
            self.fc = torch.nn.Linear(len(ids) * d, d, bias=False)
            self.hidden_norm = Qwen3RMSNorm(d, eps=c.rms_norm_eps)
            self.layers = torch.nn.ModuleList([Qwen3DecoderLayer(c, i) for i in range(c.num_hidden_layers)])
            self.norm = Qwen3RMSNorm(d, eps=c.rms_norm_eps)

    m = Drafter(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 2:
                torch.nn.init.normal_(p, std=0.02)
            else:
                p.copy_(1 + 0.4 * (torch.rand_like(p) - 0.5))
    m = m.to(torch.bfloat16)
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    want = {n for n, _ in dflash_torch.param_shapes(dict(d=d, hd=hd, I=t["intermediate_size"],
                                                         heads=t["num_attention_heads"], kv=cfg.num_key_value_heads,
                                                         n_capture=len(ids), layer_types=cfg.layer_types))}
    if set(sd) != want:
        die(f"tensor names differ from the release format: extra {sorted(set(sd) - want)}, "
            f"missing {sorted(want - set(sd))}")

    conf = cfg.to_dict()
    conf.update(architectures=["DFlashDraftModel"], model_type="qwen3",
                auto_map={"AutoModel": "dflash.DFlashDraftModel"}, block_size=args.block_size,
                num_target_layers=L, dflash_config={"target_layer_ids": ids, "mask_token_id": mask_id},
                rope_theta=theta, torch_dtype="bfloat16")
    conf.pop("_attn_implementation", None)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})

    # reference draft in float64 from the saved bf16 weights and the target's embeddings
    tw = {}
    for fn in sorted(os.listdir(args.target)):
        if fn.endswith(".safetensors"):
            tw.update(load_file(os.path.join(args.target, fn)))
    embed = tw["model.embed_tokens.weight"].double()
    head = embed if cfg.tie_word_embeddings else tw["lm_head.weight"].double()
    P = {k: v.double() for k, v in sd.items()}
    B, S = args.block_size, args.context
    rc = dict(rms_norm_eps=cfg.rms_norm_eps, B=B, hd=hd, heads=cfg.num_attention_heads, kv=cfg.num_key_value_heads,
              mask_token_id=mask_id, rope_theta=theta, layer_types=cfg.layer_types, sliding_window=0)
    g = torch.Generator().manual_seed(args.seed + 1)
    H = torch.randn(S + 1, len(ids) * d, generator=g, dtype=torch.float32)
    toks = torch.randint(0, min(256, t["vocab_size"]), (S + 1,), generator=g)
    z = dflash_torch.drafter_forward(P, rc, H.double(), toks, torch.tensor([S]), torch.tensor([1]), embed,
                                     use_sdpa=False)
    logits = (z[1:] @ head.T).float()
    save_file({"H": H, "tokens": toks.float(), "logits": logits.contiguous()},
              os.path.join(args.out, "reference.safetensors"))
    print(f"make_release_drafter: wrote {args.out}: {len(sd)} tensors ({sum(v.numel() for v in sd.values())} "
          f"params, bf16), block size {B}, target layers {ids}, mask token {mask_id}; reference draft over "
          f"{S} context rows: tokens {logits.argmax(-1).tolist()}")


def read_safetensors(path):
    """{name: float64 torch tensor} from a safetensors file (F32 / BF16), plain struct + torch."""
    import struct
    import torch
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        buf = bytearray(raw[8 + n + a:8 + n + b])
        if v["dtype"] == "F32":
            t = torch.frombuffer(buf, dtype=torch.float32)
        elif v["dtype"] == "BF16":
            t = (torch.frombuffer(buf, dtype=torch.int16).to(torch.int32) << 16).view(torch.float32)
        else:
            die(f"{path}: {k}: dtype {v['dtype']} not handled")
        out[k] = t.reshape(v["shape"]).double()
    return out


def write_f32_safetensors(path, tensors):
    import struct
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k, t in tensors.items():
        b = t.float().contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(path + ".tmp", path)


def reference_only(args):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    import dflash_torch
    dflash_torch.import_torch()
    conf = json.load(open(os.path.join(args.out, "config.json")))
    P = read_safetensors(os.path.join(args.out, "model.safetensors"))
    ref = read_safetensors(os.path.join(args.out, "reference.safetensors"))
    tw = {}
    for fn in sorted(os.listdir(args.target)):
        if fn.endswith(".safetensors"):
            tw.update(read_safetensors(os.path.join(args.target, fn)))
    embed = tw["model.embed_tokens.weight"]
    head = embed if conf.get("tie_word_embeddings") else tw["lm_head.weight"]
    d = conf["hidden_size"]
    hd = conf.get("head_dim") or d // conf["num_attention_heads"]
    theta = conf.get("rope_theta") or (conf.get("rope_parameters") or {}).get("rope_theta")
    B = conf["block_size"]
    rc = dict(rms_norm_eps=conf["rms_norm_eps"], B=B, hd=hd, heads=conf["num_attention_heads"],
              kv=conf["num_key_value_heads"], mask_token_id=conf["dflash_config"]["mask_token_id"], rope_theta=theta,
              layer_types=conf["layer_types"], sliding_window=0)
    H, toks = ref["H"], ref["tokens"].long()
    S = H.shape[0] - 1
    z = dflash_torch.drafter_forward(P, rc, H, toks, torch.tensor([S]), torch.tensor([1]), embed, use_sdpa=False)
    logits = (z[1:] @ head.T).float()
    write_f32_safetensors(os.path.join(args.out, "reference.safetensors"),
                          {"H": H.float(), "tokens": toks.float(), "logits": logits})
    print(f"make_release_drafter: rewrote {args.out}/reference.safetensors for {args.target}: "
          f"tokens {logits.argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
