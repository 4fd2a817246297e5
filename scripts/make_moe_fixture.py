#!/usr/bin/env python3
"""make_moe_fixture.py: a tiny Qwen3-MoE target and transformers' reference outputs for it.

Run on a machine with torch + transformers 5.x (the GPU machine; nothing is downloaded):
    python3 scripts/make_moe_fixture.py --out tests/fixtures

The model (Qwen3MoeConfig): 4 layers, hidden 64, 4 q / 2 kv heads, head_dim 16, vocab 300,
8 experts, top-2, moe_intermediate_size 32, norm_topk_prob, intermediate_size 96 for the
dense layers, mlp_only_layers [0], decoder_sparse_step 2. transformers' rule: layer l is
sparse iff l not in mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step
== 0, so layers 1 and 3 are sparse and 0 (listed) and 2 ((2+1) % 2 != 0) are dense.

Weights are random (seeded), stored bf16, scaled to about 1/sqrt(fan_in) so every layer
moves the residual stream, with the router scaled so its logits spread (std ~3): the seed is
then advanced until, over every token the references touch, the k-th and (k+1)-th routing
probabilities differ by at least --min-gap (relative), and likewise the greedy decode's best
and second logits, so no top-k or argmax near-tie can flip between torch and the C code.

Writes:
    <out>/tiny-qwen3-moe/             save_pretrained (whatever layout transformers writes)
    <out>/tiny-qwen3-moe-alt/         the same weights in the OTHER expert layout, sharded
                                      in two files with model.safetensors.index.json:
          per-expert: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
                      [F, d], [F, d], [d, F]
          fused:      model.layers.L.mlp.experts.gate_up_proj [E, 2F, d] (gate rows first,
                      then up: transformers' forward does linear(x, gate_up[e]).chunk(2))
                      model.layers.L.mlp.experts.down_proj [E, d, F]
          the router is model.layers.L.mlp.gate.weight [E, d] in both.
    <out>/tiny-qwen3-moe-ref.safetensors (metadata: layout, alt_layout, seed)
        input_ids  I32 [T]            a packed row of several documents
        doc_starts I32 [n_docs+1]     document boundaries (0 ... T)
        embed      F32 [T, d]         hidden_states[0]
        hidden.<l> F32 [T, d]         output of decoder layer l (before the final norm)
        logits     F32 [T, V]         the LM head's logits
        router.<l>.logits F32 [T, E]  router logits of sparse layer l
        router.<l>.idx    I32 [T, k]  top-k experts, by descending probability
        router.<l>.w      F32 [T, k]  their weights (renormalised: norm_topk_prob)
        decode.<i>.prompt I32 [P]     greedy decode prompts
        decode.<i>.tokens I32 [N]     model.generate(do_sample=False), KV-cached
        decode.<i>.logits F32 [N, V]  the logits that chose each generated token
Each document is run through transformers on its own (positions from 0), in float32 from
the saved (bf16-rounded) weights, eager attention and eager experts.
"""
import argparse
import copy
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

N_DECODE = 16


def doc_lengths():
    return [7, 13, 1, 9, 6]


def decode_prompts(vocab, seed):
    g = torch.Generator().manual_seed(seed + 7)
    return [torch.randint(0, vocab, (n,), generator=g) for n in (5, 11)]


def make_config():
    return Qwen3MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                          rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=True,
                          attention_bias=False, num_experts=8, num_experts_per_tok=2,
                          moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=2,
                          mlp_only_layers=[0], output_router_logits=False, router_aux_loss_coef=0.001)


def is_sparse(cfg, l):
    return l not in cfg.mlp_only_layers and cfg.num_experts > 0 and (l + 1) % cfg.decoder_sparse_step == 0


def init_weights(model, seed):
    """Seeded weights at a scale where attention, the MLPs and the router all matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("mlp.gate.weight"):  # the router [E, d]; its input is RMS-normed
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[-1] ** 0.5))
            else:  # [out, in] or fused [E, out, in]: fan_in is the last dim
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


class Capture:
    """Forward hooks: each decoder layer's output and each sparse layer's router output."""

    def __init__(self, model, cfg):
        self.cfg = cfg
        self.layer_out, self.router = {}, {}
        self.hooks = []
        self.router_kind = None
        for l, layer in enumerate(model.model.layers):
            self.hooks.append(layer.register_forward_hook(self._layer_hook(l)))
            if is_sparse(cfg, l):
                self.hooks.append(layer.mlp.gate.register_forward_hook(self._router_hook(l)))

    def _layer_hook(self, l):
        def hook(mod, inp, out):
            self.layer_out[l] = (out[0] if isinstance(out, tuple) else out).detach().float()
        return hook

    def _router_hook(self, l):
        E, k = self.cfg.num_experts, self.cfg.num_experts_per_tok

        def hook(mod, inp, out):
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            ints = [t for t in outs if torch.is_tensor(t) and not t.is_floating_point()]
            flts = [t for t in outs if torch.is_tensor(t) and t.is_floating_point()]
            # the logits from the router's own input and weight: some transformers 5 versions
            # return the softmax probabilities in the "router_logits" slot
            x = inp[0].detach().float().reshape(-1, mod.weight.shape[-1])
            logits = x @ mod.weight.detach().float().t()
            if ints:  # transformers 5.x: the router returns (logits or probs, weights or scores, indices)
                idx = ints[0].detach().reshape(-1, k).long()
                w = None
                for t in flts[1:]:
                    if t.shape[-1] == k:
                        w = t.detach().float().reshape(-1, k)
                    elif t.shape[-1] == E:  # scores scattered over all experts
                        w = t.detach().float().reshape(-1, E).gather(1, idx)
                self.router_kind = "router module (logits, weights, indices)"
            else:  # transformers 4.x: the gate is a plain Linear (its output: the logits)
                logits = flts[0].detach().float().reshape(-1, E)
                probs = torch.softmax(logits, dim=-1, dtype=torch.float)
                w, idx = torch.topk(probs, k, dim=-1)
                if self.cfg.norm_topk_prob:
                    w = w / w.sum(dim=-1, keepdim=True)
                self.router_kind = "linear gate (softmax + topk computed here as the block does)"
            self.router[l] = (logits, idx, w)
        return hook

    def remove(self):
        for h in self.hooks:
            h.remove()


def routing_gap(logits, k):
    """Smallest relative gap between the k-th and (k+1)-th softmax probabilities."""
    p = torch.sort(torch.softmax(logits.double(), dim=-1), dim=-1, descending=True).values
    return ((p[:, k - 1] - p[:, k]) / p[:, k - 1]).min().item()


def argmax_gap(logits):
    top = torch.topk(logits.double(), 2, dim=-1).values
    return ((top[:, 0] - top[:, 1]) / top[:, 0].abs().clamp(min=1.0)).min().item()


def run_docs(model, cap, ids, starts):
    """Per-document forward; returns embed, per-layer outputs, logits and router outputs [T, ...]."""
    cfg = cap.cfg
    embeds, logits = [], []
    hiddens = [[] for _ in range(cfg.num_hidden_layers)]
    routers = {l: ([], [], []) for l in range(cfg.num_hidden_layers) if is_sparse(cfg, l)}
    with torch.no_grad():
        for d in range(len(starts) - 1):
            seg = ids[starts[d]:starts[d + 1]].unsqueeze(0)
            out = model(input_ids=seg, output_hidden_states=True)
            embeds.append(out.hidden_states[0][0].float())
            logits.append(out.logits[0].float())
            for l in range(cfg.num_hidden_layers):
                h = cap.layer_out[l][0]
                hiddens[l].append(h)
                if l < cfg.num_hidden_layers - 1:  # sanity: hook == hidden_states[l+1]
                    diff = (h - out.hidden_states[l + 1][0].float()).abs().max().item()
                    if diff != 0.0:
                        print(f"warning: layer {l}: hook differs from hidden_states[{l + 1}] by {diff}")
            for l, (lg, ix, w) in routers.items():
                lg.append(cap.router[l][0])
                ix.append(cap.router[l][1])
                w.append(cap.router[l][2])
    cat = torch.cat
    return (cat(embeds), [cat(h) for h in hiddens], cat(logits),
            {l: (cat(a), cat(b), cat(c)) for l, (a, b, c) in routers.items()})


def run_decode(model, prompt):
    with torch.no_grad():
        out = model.generate(input_ids=prompt.unsqueeze(0), max_new_tokens=N_DECODE,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
    toks = out.sequences[0, prompt.numel():]
    assert toks.numel() == N_DECODE, f"generate returned {toks.numel()} tokens"
    logits = torch.stack([x[0].float() for x in out.logits])
    # the cached decode must agree with one uncached forward over prompt + generated tokens
    with torch.no_grad():
        full = model(input_ids=torch.cat([prompt, toks[:-1]]).unsqueeze(0)).logits[0].float()
    diff = (full[prompt.numel() - 1:] - logits).abs().max().item()
    print(f"  decode P={prompt.numel()}: cached vs uncached logits max diff {diff:.3g}; tokens {toks.tolist()}")
    return toks, logits


def check_gaps(model, cfg, ids, starts, prompts):
    """Smallest routing and argmax gaps over everything the references will run."""
    cap = Capture(model, cfg)
    _, _, _, routers = run_docs(model, cap, ids, starts)
    rgap = min(routing_gap(r[0], cfg.num_experts_per_tok) for r in routers.values())
    agap = 1.0
    for p in prompts:
        toks, lg = run_decode(model, p)
        agap = min(agap, argmax_gap(lg))
        seq = torch.cat([p, toks]).unsqueeze(0)
        with torch.no_grad():
            model(input_ids=seq)
        rgap = min(rgap, min(routing_gap(cap.router[l][0], cfg.num_experts_per_tok) for l in routers))
    cap.remove()
    return rgap, agap


def layout_of(path):
    """'fused' or 'per-expert', from the tensor names save_pretrained wrote."""
    names = set()
    for f in os.listdir(path):
        if f.endswith(".safetensors"):
            names |= set(load_file(os.path.join(path, f)).keys())
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
    per = any(".mlp.experts.0.gate_proj.weight" in n for n in names)
    if fused == per:
        raise SystemExit(f"{path}: cannot tell the expert layout from {sorted(names)[:20]}")
    return ("fused" if fused else "per-expert"), names


def write_other_layout(src, dst, cfg, layout):
    """Copies src's weights to dst in the other expert layout, sharded in two files."""
    sd = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(src, f)))
    out = {}
    E = cfg.num_experts
    F = cfg.moe_intermediate_size
    for name, t in sd.items():
        if layout == "fused" and name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            for e in range(E):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :F].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = t[e, F:].contiguous()
        elif layout == "fused" and name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(E):
                out[f"{pre}{e}.down_proj.weight"] = t[e].contiguous()
        elif layout == "per-expert" and ".mlp.experts." in name:
            pre, rest = name.split(".mlp.experts.")
            e, proj = rest.split(".", 1)
            if e != "0":
                continue
            get = lambda p: torch.stack([sd[f"{pre}.mlp.experts.{i}.{p}.weight"] for i in range(E)])
            if proj == "gate_proj.weight":
                out[f"{pre}.mlp.experts.gate_up_proj"] = torch.cat([get("gate_proj"), get("up_proj")], 1).contiguous()
            elif proj == "down_proj.weight":
                out[f"{pre}.mlp.experts.down_proj"] = get("down_proj").contiguous()
        else:
            out[name] = t
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    names = sorted(out)
    half = len(names) // 2
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        save_file({n: out[n] for n in part}, os.path.join(dst, files[i]), metadata={"format": "pt"})
        weight_map.update({n: files[i] for n in part})
    total = sum(t.numel() * t.element_size() for t in out.values())
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def load_ref_model(path):
    kw = {"dtype": torch.float32, "attn_implementation": "eager"}
    try:
        m = Qwen3MoeForCausalLM.from_pretrained(path, experts_implementation="eager", **kw)
    except Exception as e:  # noqa: BLE001 - an older transformers without the option
        print(f"  (experts_implementation not taken: {e}; default experts)")
        m = Qwen3MoeForCausalLM.from_pretrained(path, **kw)
    m.config._attn_implementation = "eager"
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return m.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--seed", type=int, default=11, help="first seed tried")
    ap.add_argument("--min-gap", type=float, default=2e-3, help="smallest relative top-k / argmax gap accepted")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = make_config()
    sparse = [l for l in range(cfg.num_hidden_layers) if is_sparse(cfg, l)]
    print(f"sparse layers {sparse}, dense layers "
          f"{[l for l in range(cfg.num_hidden_layers) if l not in sparse]}")

    lens = doc_lengths()
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)

    for seed in range(args.seed, args.seed + 64):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(cfg)
        init_weights(model, seed)
        model = model.to(torch.bfloat16)
        probe = copy.deepcopy(model).float().eval()
        probe.config._attn_implementation = "eager"
        probe.generation_config.eos_token_id = None
        probe.generation_config.pad_token_id = 0
        ids = torch.randint(0, cfg.vocab_size, (starts[-1],), generator=torch.Generator().manual_seed(seed + 1))
        prompts = decode_prompts(cfg.vocab_size, seed)
        rgap, agap = check_gaps(probe, cfg, ids, starts, prompts)
        print(f"seed {seed}: smallest routing gap {rgap:.3g}, argmax gap {agap:.3g}")
        if rgap >= args.min_gap and agap >= args.min_gap:
            break
    else:
        raise SystemExit("no seed gave clear routing and argmax gaps")

    path = os.path.join(args.out, "tiny-qwen3-moe")
    if os.path.exists(path):
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    layout, names = layout_of(path)
    print(f"save_pretrained wrote the {layout} expert layout: "
          f"{sorted(n for n in names if '.layers.1.mlp.' in n)[:6]} ...")
    alt = os.path.join(args.out, "tiny-qwen3-moe-alt")
    write_other_layout(path, alt, cfg, layout)
    alt_layout, _ = layout_of(alt)
    print(f"wrote the {alt_layout} layout to {alt}")

    ref_model = load_ref_model(path)
    cap = Capture(ref_model, cfg)
    embed, hiddens, logits, routers = run_docs(ref_model, cap, ids, starts)
    print(f"router hook saw: {cap.router_kind}")
    cap.remove()
    tensors = {
        "input_ids": ids.to(torch.int32),
        "doc_starts": torch.tensor(starts, dtype=torch.int32),
        "embed": embed.contiguous(),
        "logits": logits.contiguous(),
    }
    for l, h in enumerate(hiddens):
        tensors[f"hidden.{l}"] = h.contiguous()
    hist = torch.zeros(cfg.num_experts, dtype=torch.long)
    for l, (lg, ix, w) in routers.items():
        tensors[f"router.{l}.logits"] = lg.contiguous()
        tensors[f"router.{l}.idx"] = ix.to(torch.int32).contiguous()
        tensors[f"router.{l}.w"] = w.contiguous()
        hist += torch.bincount(ix.reshape(-1), minlength=cfg.num_experts)
        # the hook's top-k must be what softmax + topk + renormalise of its logits gives
        p = torch.softmax(lg, dim=-1)
        w2, ix2 = torch.topk(p, cfg.num_experts_per_tok, dim=-1)
        w2 = w2 / w2.sum(-1, keepdim=True)
        assert torch.equal(ix2, ix), f"layer {l}: router indices differ from softmax+topk"
        print(f"  layer {l}: router weights vs recomputed max diff {(w2 - w).abs().max().item():.3g}")
    print(f"expert use over the documents (all sparse layers): {hist.tolist()}")
    for i, p in enumerate(decode_prompts(cfg.vocab_size, seed)):
        toks, lg = run_decode(ref_model, p)
        tensors[f"decode.{i}.prompt"] = p.to(torch.int32)
        tensors[f"decode.{i}.tokens"] = toks.to(torch.int32)
        tensors[f"decode.{i}.logits"] = lg.contiguous()

    # the other layout must load in transformers to the same model
    try:
        alt_model = load_ref_model(alt)
        with torch.no_grad():
            seg = ids[: starts[2]].unsqueeze(0)
            d = (alt_model(input_ids=seg).logits - ref_model(input_ids=seg).logits).abs().max().item()
        print(f"transformers loads {alt} ({alt_layout}): logits max diff vs {layout} {d:.3g}")
        assert d == 0.0, "the two layouts differ"
    except Exception as e:  # noqa: BLE001 - report, the C tests still check both layouts
        print(f"warning: transformers did not load {alt}: {e}")

    meta = {"layout": layout, "alt_layout": alt_layout, "seed": str(seed),
            "sparse_layers": ",".join(map(str, sparse))}
    save_file(tensors, os.path.join(args.out, "tiny-qwen3-moe-ref.safetensors"), metadata=meta)
    print(f"tiny-qwen3-moe: {sum(p.numel() for p in model.parameters())} params, T={starts[-1]}, seed {seed}, "
          f"files={sorted(os.listdir(path))}, alt={sorted(os.listdir(alt))}")


if __name__ == "__main__":
    main()
