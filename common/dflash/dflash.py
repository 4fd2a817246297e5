"""dflash.py: the modeling file of a dflash-pipe release directory. `dflash_tool export`
(dflash_export_release) writes this file, byte for byte, beside config.json and
model.safetensors; the build compiles it into the export code (scripts/embed_file.sh), so
an exported directory carries the code it was exported with. config.json's
auto_map {"AutoModel": "dflash.DFlashDraftModel"} points here, so

    model = transformers.AutoModel.from_pretrained(release_dir, trust_remote_code=True)

builds a DFlashDraftModel and loads model.safetensors into it (bf16 by default, from the
config's dtype). Written from docs/dflash_spec.md ("Forward"); the math is that of
tests/reference/dflash_torch.py (the float64 reference of the C code) in module form, with
the inference-time mask of dflash_infer (eval/dflash_infer.h).

The drafter has no embedding and no lm_head: both are the target's. One draft, for a
block anchored at position p with the target's captured features H of positions 0..p-1:

    z = model(target_hidden=H[None],                       # [1, p, n*d] (n captured layers)
              noise_embedding=E[[x_p, MASK, ..., MASK]][None],  # [1, B, d], the target's embedding
              position_ids=torch.arange(p + B)[None])       # context rows, then the block
    logits = z[:, 1:] @ lm_head.T                          # block rows 1..B-1 predict x_{p+1..p+B-1}

The call signature is the public DFlash one (target_hidden, noise_embedding, position_ids,
attention_mask, past_key_values, use_cache), so generation loops written for the public
drafters drive this class too: with a transformers Cache in past_key_values, every call
appends its context rows and block rows to the cache (the caller crops the block rows off
afterwards) and position_ids covers the new context rows and the block.

Masks (no attention_mask is taken: the mask is fixed by the model): a full-attention layer
lets every block row see every context row and the whole block; a sliding-attention layer
(config.layer_types[l] == "sliding_attention", window W = config.sliding_window) lets block
row k at position p+k see context rows at positions >= p+k-(W-1) and block rows 0..k.

Needs torch >= 2.0 and transformers (Qwen3Config). Not part of the C build's behaviour:
tests/reference/engine_load_check.py loads exported directories with it and compares its
logits with the C inference's.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel, Qwen3Config

try:  # transformers 5: init helpers that leave tensors loaded from the checkpoint alone
    from transformers import initialization as _hf_init
except ImportError:
    _hf_init = None


def _rope_theta(config):
    theta = getattr(config, "rope_theta", None)
    rp = getattr(config, "rope_parameters", None) or {}
    if theta is None:
        theta = rp.get("rope_theta", 1e6)
    rtype = rp.get("rope_type", "default") if isinstance(rp, dict) else "default"
    scaling = getattr(config, "rope_scaling", None)
    if rtype != "default" or (isinstance(scaling, dict) and scaling.get("rope_type", "default") != "default"):
        raise NotImplementedError(f"dflash.py: rope type {rtype!r} / {scaling!r} is not supported (plain RoPE only)")
    return float(theta)


class DFlashRMSNorm(nn.Module):
    """RMSNorm as Qwen3's: statistics in fp32, the gain applied in the input's dtype."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _rope_tables(pos, head_dim, theta, dtype):
    """cos, sin [T, hd] for positions pos [T], computed in fp32 (rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x, cos, sin):
    """x [b, heads, T, hd]; cos, sin [T, hd]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class DFlashAttention(nn.Module):
    """Queries from the block; keys and values from the context rows followed by the block
    rows through the same projections; per-head q/k RMSNorm, RoPE, grouped kv heads."""

    def __init__(self, config, layer_idx):
        super().__init__()
        d = config.hidden_size
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or d // self.heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, d, bias=bias)
        self.q_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = DFlashRMSNorm(self.head_dim, config.rms_norm_eps)
        types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        sliding = types[layer_idx] == "sliding_attention" and getattr(config, "use_sliding_window", True) is not False
        self.window = int(config.sliding_window) if sliding and config.sliding_window else 0

    def forward(self, h, ctx, cos, sin, past_key_values=None):
        b, q_len, _ = h.shape
        c_len = ctx.shape[1]
        hd = self.head_dim
        q = self.q_norm(self.q_proj(h).view(b, q_len, self.heads, hd)).transpose(1, 2)
        x = torch.cat([ctx, h], dim=1)
        k = self.k_norm(self.k_proj(x).view(b, c_len + q_len, self.kv_heads, hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, c_len + q_len, self.kv_heads, hd).transpose(1, 2)
        q = _rotate(q, cos[-q_len:], sin[-q_len:])
        k = _rotate(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        T = k.shape[2]
        mask = None
        if self.window > 0:
            # keys: context at positions 0..T-q_len-1, then the block; query k sits at T-q_len+k
            kq = torch.arange(q_len, device=h.device)[:, None]
            kk = torch.arange(T, device=h.device)[None, :]
            ctx_ok = (kk < T - q_len) & (kk >= T - q_len + kq - (self.window - 1))
            blk_ok = (kk >= T - q_len) & (kk - (T - q_len) <= kq)
            mask = ctx_ok | blk_ok
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            o = torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)
        return self.o_proj(o.transpose(1, 2).reshape(b, q_len, self.heads * hd))


class DFlashMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config, layer_idx)
        self.post_attention_layernorm = DFlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DFlashMLP(config)

    def forward(self, h, ctx, cos, sin, past_key_values=None):
        h = h + self.self_attn(self.input_layernorm(h), ctx, cos, sin, past_key_values)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraftModel(PreTrainedModel):
    """The DFlash drafter: fc + hidden_norm over the captured target features, decoder
    layers over the block, final norm. Parameter names are the release's tensor names."""

    config_class = Qwen3Config
    base_model_prefix = "model"
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        dc = getattr(config, "dflash_config", None) or {}
        if "target_layer_ids" not in dc or "mask_token_id" not in dc:
            raise ValueError("dflash.py: config.json needs dflash_config.target_layer_ids and "
                             "dflash_config.mask_token_id")
        self.target_layer_ids = list(dc["target_layer_ids"])
        self.mask_token_id = int(dc["mask_token_id"])
        self.block_size = int(config.block_size)
        self.rope_theta = _rope_theta(config)
        d = config.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = DFlashRMSNorm(d, config.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = DFlashRMSNorm(d, config.rms_norm_eps)
        self.post_init()

    def _init_weights(self, module):
        init = _hf_init or nn.init
        if isinstance(module, nn.Linear):
            if not getattr(module.weight, "_is_hf_initialized", False):
                init.normal_(module.weight, mean=0.0, std=getattr(self.config, "initializer_range", 0.02))
            if module.bias is not None and not getattr(module.bias, "_is_hf_initialized", False):
                init.zeros_(module.bias)
        elif isinstance(module, DFlashRMSNorm) and not getattr(module.weight, "_is_hf_initialized", False):
            init.ones_(module.weight)

    def forward(self, position_ids, attention_mask=None, noise_embedding=None, target_hidden=None,
                past_key_values=None, use_cache=False, **kwargs):
        """target_hidden [b, c, n*d]: captured features of the c new context rows;
        noise_embedding [b, B, d]: the target's embeddings of [anchor, MASK x (B-1)];
        position_ids [b, c + B] (or [c + B]): the new context rows' positions, then the block's.
        Returns the final-normed block rows [b, B, d] (apply the target's lm_head)."""
        if attention_mask is not None:
            raise ValueError("dflash.py: attention_mask is not taken; the mask is fixed by the model")
        h = noise_embedding
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        pos = position_ids[0] if position_ids.dim() == 2 else position_ids
        if pos.shape[0] != ctx.shape[1] + h.shape[1]:
            raise ValueError(f"dflash.py: position_ids has {pos.shape[0]} entries, expected context rows "
                             f"{ctx.shape[1]} + block rows {h.shape[1]}")
        cos, sin = _rope_tables(pos, self.layers[0].self_attn.head_dim, self.rope_theta, h.dtype)
        for layer in self.layers:
            h = layer(h, ctx, cos, sin, past_key_values)
        return self.norm(h)
