#!/usr/bin/env python3
"""dflash_torch.py: an independent PyTorch implementation of the DFlash drafter's training
forward, loss and backward, written from docs/dflash_spec.md (not from any public trainer).

It exists for two jobs:

  fixture     the numerical ground truth for the C CPU reference (common/dflash/dflash_*):
              a TINY drafter with seeded random weights and inputs, evaluated in float64
              on the CPU, saved with the loss, per-position accuracy and the gradient of the
              loss w.r.t. every trainable tensor and w.r.t. the target features H into ONE
              safetensors file that tests/test_dflash_torch.c replays.
                  python3 tests/reference/dflash_torch.py fixture --out tests/fixtures/dflash-torch.safetensors
              (also writes <out stem>-tied.safetensors: tied embeddings, other mask rules).
              With --loss dpace the objective is D-PACE (below) instead of the decay loss:
                  python3 tests/reference/dflash_torch.py fixture --loss dpace \
                      --out tests/fixtures/dflash-torch-dpace.safetensors
              (alpha 0.5 untied, 0.3 tied: at 0.5 the smoothing (1-a) q + a cannot tell a from
              1-a, so the tied case uses another value).
              Before writing, it checks itself: SDPA against an explicit masked softmax,
              the chunked head+CE against a plain full-logits autograd loss, a two-sided
              finite difference of the loss along a random direction, its vectorised mask
              against a loop written from the spec text, and exact zeros for padding blocks.

  step-bench  the eager PyTorch peer of the drafter training step (docs/performance.md, "Peers"):
              fwd + bwd + grad clip + fused AdamW, fp32 master weights, bf16 autocast,
              SDPA with a dense bool mask (--attn flex: flex_attention with a BlockMask
              under torch.compile, the public trainers' way), chunked frozen lm_head + CE, at the
              Qwen3-8B-DFlash-b16 shape; CUDA-event timing, median of N; FLOPs per the
              docs/performance.md formulas; MFU against an 8192^3 bf16 GEMM measured in the same
              process. One JSON object per configuration on stdout.
                  python3 tests/reference/dflash_torch.py step-bench --seq 768 2048 --anchors 256 512

Model (docs/dflash_spec.md): C = RMSNorm_hidden(fc(H)); block j input E[x[a_j]], E[MASK] x (B-1)
with RoPE positions a_j + k (context rows 0..S-1); per layer a = RMSNorm_in(h),
Q = RoPE(q_norm(a Wq)), K = RoPE(k_norm([C;a] Wk)), V = [C;a] Wv, GQA attention under the
training mask (context kv < a_j strictly, own block bidirectional; sliding layers add
kv >= a_j + k - (W-1) and in-block causality; padding blocks see nothing and output exact
zeros), o_proj residual, SwiGLU residual; z = RMSNorm_final(h); logits = z W_lm^T with the
frozen target head. Labels y_{j,k} = x[a_j + k] (no shift), weights
w = keep * [a_j+k < S] * loss_mask[a_j+k] * exp(-(k-1)/gamma), k >= 1; L = sum(w CE)/sum(w).

D-PACE (docs/dflash_spec.md, "Loss weights"; the paper's equations, written here from their
text): per block, over k = 1..B-1 while position k is a loss position (w > 0 above; the walk
stops at the first one that is not), q_k = exp(-CE_k) detached, s_k = (1 - alpha) q_k + alpha,
P_m = prod_{i <= m} s_i, weight u_k = sum_{m >= k} P_m (0 past the stop, at k = 0, in padding
blocks); L = sum(u CE) / A with A the blocks whose position 1 is a loss position. The weights
are constants of the gradient.

Exit status: 0 on success, 1 on any failure (with a line starting "dflash_torch: error:").
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

torch = None  # imported in main() so that --help works without torch
F = None


def die(msg):
    print(f"dflash_torch: error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"dflash_torch: {msg}", file=sys.stderr, flush=True)


def import_torch():
    global torch, F
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:
        die(f"cannot import torch ({e}); run this on the machine with PyTorch installed")
    torch, F = _torch, _F


# ---------------------------------------------------------------------------------------
# configuration and parameters
# ---------------------------------------------------------------------------------------

def tiny_config(tied):
    """The fixture drafter. Untied: layer 1 sliding W=6. Tied: layer 0 sliding W=3 (< B,
    so late block slots see no context at all), other gamma."""
    cfg = dict(d=32, heads=4, kv=2, hd=8, I=64, V=50, B=4, n_capture=2, S=24, N=5,
               rms_norm_eps=1e-6, rope_theta=1e6, mask_token_id=49,
               target_layer_ids=[1, 4], num_target_layers=6)
    if not tied:
        cfg.update(layer_types=["full_attention", "sliding_attention"], sliding_window=6,
                   gamma=7.0, tie_word_embeddings=False)
    else:
        cfg.update(layer_types=["sliding_attention", "full_attention"], sliding_window=3,
                   gamma=2.5, tie_word_embeddings=True)
    return cfg


def qwen3_8b_b16_config():
    return dict(d=4096, heads=32, kv=8, hd=128, I=12288, V=151936, B=16, n_capture=5,
                rms_norm_eps=1e-6, rope_theta=1e6, mask_token_id=151669,
                target_layer_ids=[1, 9, 17, 25, 33], num_target_layers=36,
                layer_types=["full_attention"] * 5, sliding_window=0, gamma=7.0,
                tie_word_embeddings=False)


SHAPES = {"qwen3-8b-b16": qwen3_8b_b16_config,
          "tiny": lambda: tiny_config(False)}  # tiny: a CPU smoke test of the bench code path


def param_shapes(cfg):
    """Release names and [out, in] shapes, in checkpoint order (no embed / lm_head)."""
    d, hd, I = cfg["d"], cfg["hd"], cfg["I"]
    qd, kvd = cfg["heads"] * hd, cfg["kv"] * hd
    out = [("fc.weight", (d, cfg["n_capture"] * d)), ("hidden_norm.weight", (d,))]
    for l in range(len(cfg["layer_types"])):
        p = f"layers.{l}."
        out += [(p + "input_layernorm.weight", (d,)),
                (p + "post_attention_layernorm.weight", (d,)),
                (p + "self_attn.q_proj.weight", (qd, d)),
                (p + "self_attn.k_proj.weight", (kvd, d)),
                (p + "self_attn.v_proj.weight", (kvd, d)),
                (p + "self_attn.o_proj.weight", (d, qd)),
                (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)),
                (p + "mlp.gate_proj.weight", (I, d)),
                (p + "mlp.up_proj.weight", (I, d)),
                (p + "mlp.down_proj.weight", (d, I))]
    out.append(("norm.weight", (d,)))
    return out


# ---------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """HF Qwen3 RMSNorm: statistics in >= fp32, weight after normalisation, back to x's dtype."""
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.to(y.dtype)).to(x.dtype)


def rope_cos_sin(pos, hd, theta, dtype):
    """cos, sin [T, hd] for positions pos [T] (rotate_half layout: frequencies repeated)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=pos.device) / hd))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [T, heads, hd]; pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def build_mask(S, anchors, keep, B, window):
    """Training mask [R, S+R] (True = may attend) for R = N*B block queries over keys
    [context 0..S-1 ; block rows], vectorised. window <= 0: full attention."""
    dev = anchors.device
    N = anchors.shape[0]
    a = anchors.repeat_interleave(B)                       # [R] anchor of each query row
    kq = torch.arange(B, device=dev).repeat(N)             # [R] offset in its block
    jq = torch.arange(N, device=dev).repeat_interleave(B)  # [R] block index
    kv = torch.arange(S, device=dev)
    ctx = kv[None, :] < a[:, None]                         # strictly before the anchor
    blk = jq[:, None] == jq[None, :]                       # own block only
    if window > 0:
        ctx = ctx & (kv[None, :] >= (a + kq - (window - 1))[:, None])
        blk = blk & (kq[None, :] <= kq[:, None])           # causal inside the block
    m = torch.cat([ctx, blk], dim=1)
    return m & keep.repeat_interleave(B).bool()[:, None]


def build_mask_loop(S, anchors, keep, B, window):
    """The same mask by the letter of docs/dflash_spec.md, one (query, key) at a time (tests only)."""
    N = len(anchors)
    R = N * B
    m = [[False] * (S + R) for _ in range(R)]
    for j in range(N):
        if not keep[j]:
            continue
        aj = anchors[j]
        for k in range(B):
            q = j * B + k
            for c in range(S):
                ok = c < aj
                if window > 0:
                    ok = ok and c >= aj + k - (window - 1)
                m[q][c] = ok
            for k2 in range(B):
                m[q][S + j * B + k2] = (k2 <= k) if window > 0 else True
    return m


class Masks:
    """A layer type's mask plus what is needed to keep fully masked rows finite: those rows
    get one dummy key (key 0) and their output is multiplied by 0, so they are exact zeros
    with exact-zero gradients (SDPA would give NaN for an all-False row)."""

    def __init__(self, mask):
        self.mask = mask
        self.row_any = mask.any(dim=-1)                    # [R]
        safe = mask.clone()
        safe[:, 0] |= ~self.row_any
        self.safe = safe


_FLEX = {}


def flex_attention_fn():
    """(compiled flex_attention, create_block_mask): the attention public DFlash trainers use
    (torch >= 2.5), compiled once per process; SystemExit with the reason when unavailable."""
    if "fn" not in _FLEX:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except ImportError as e:
            die(f"--attn flex needs torch >= 2.5 (torch.nn.attention.flex_attention), this is torch "
                f"{torch.__version__}: {e}")
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["mask"] = create_block_mask
    return _FLEX["fn"], _FLEX["mask"]


def flex_block_mask(masks, dev, slot=""):
    """The training mask as a flex BlockMask: its 128 x 128 tiles with no allowed pair are
    skipped, the rest masked per element (the dense `safe` mask read inside mask_mod).
    mask_mod is made once per (shape, device, slot) and reads a buffer this call refills:
    the compiled flex_attention sees the same function every step (a new closure per step
    could make it recompile). One slot per mask alive at once (drafter_forward: one per layer
    type); stream order keeps a step's backward before the next step's refill."""
    _, create_block_mask = flex_attention_fn()
    safe = masks.safe
    R, T = safe.shape
    key = ("mask", R, T, str(dev), slot)
    if key not in _FLEX:
        buf = torch.empty_like(safe)

        def mask_mod(b, h, q_idx, kv_idx):
            return buf[q_idx, kv_idx]

        _FLEX[key] = (buf, mask_mod)
    buf, mask_mod = _FLEX[key]
    buf.copy_(safe)
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=R, KV_LEN=T, device=dev)


def attention(q, k, v, masks, use_sdpa):
    """q [R, H, hd]; k, v [T, KV, hd]; GQA (query head h uses kv head h // (H/KV)).
    use_sdpa: True (SDPA, dense bool mask), False (explicit softmax) or "flex" (compiled
    flex_attention over masks.block_mask, GQA native)."""
    R, H, hd = q.shape
    T, KV, _ = k.shape
    rep = H // KV
    if use_sdpa == "flex":
        fn, _ = flex_attention_fn()
        o = fn(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
               block_mask=masks.block_mask, enable_gqa=rep > 1)
        o = o[0].transpose(0, 1)                            # [R, H, hd]
        return o * masks.row_any.to(o.dtype)[:, None, None]
    # expand, not enable_gqa: keeps the memory-efficient SDPA kernel eligible
    k = k[:, :, None, :].expand(T, KV, rep, hd).reshape(T, H, hd)
    v = v[:, :, None, :].expand(T, KV, rep, hd).reshape(T, H, hd)
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if use_sdpa:
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=masks.safe[None, None])
    else:
        s = torch.matmul(qh, kh.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~masks.safe[None, None], float("-inf"))
        p = torch.softmax(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1).to(vh.dtype)
        o = torch.matmul(p, vh)
    o = o[0].transpose(0, 1)                                # [R, H, hd]
    return o * masks.row_any.to(o.dtype)[:, None, None]


def drafter_forward(P, cfg, H, ids, anchors, keep, embed, use_sdpa, probe=None):
    """Returns z [N*B, d] (final-norm output). P: name -> tensor; H [S, n*d]; ids [S] long;
    anchors, keep [N] long; embed [V, d] frozen. probe: optional dict collecting attention
    outputs per layer (for the self-checks)."""
    eps, B, hd = cfg["rms_norm_eps"], cfg["B"], cfg["hd"]
    Hh, KV = cfg["heads"], cfg["kv"]
    S, N = H.shape[0], anchors.shape[0]
    R = N * B
    dev = H.device
    C = rms_norm(F.linear(H, P["fc.weight"]), P["hidden_norm.weight"], eps)   # [S, d], once
    blk_ids = torch.full((N, B), cfg["mask_token_id"], dtype=torch.long, device=dev)
    blk_ids[:, 0] = ids[anchors]
    h = embed[blk_ids.reshape(-1)]                                              # [R, d]
    pos_q = (anchors[:, None] + torch.arange(B, device=dev)[None, :]).reshape(-1)
    pos_k = torch.cat([torch.arange(S, device=dev), pos_q])
    cdt = h.dtype  # cos/sin in the activation dtype, as HF does
    cos_q, sin_q = rope_cos_sin(pos_q, hd, cfg["rope_theta"], cdt)
    cos_k, sin_k = rope_cos_sin(pos_k, hd, cfg["rope_theta"], cdt)
    masks = {}
    for lt in set(cfg["layer_types"]):
        window = cfg["sliding_window"] if lt == "sliding_attention" else 0
        masks[lt] = Masks(build_mask(S, anchors, keep, B, window))
        if use_sdpa == "flex":
            masks[lt].block_mask = flex_block_mask(masks[lt], dev, lt)
    for l, lt in enumerate(cfg["layer_types"]):
        p = f"layers.{l}."
        a = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = F.linear(a, P[p + "self_attn.q_proj.weight"]).view(R, Hh, hd)
        q = apply_rope(rms_norm(q, P[p + "self_attn.q_norm.weight"], eps), cos_q, sin_q)
        X = torch.cat([C.to(a.dtype), a], dim=0)                               # [S+R, d]
        k = F.linear(X, P[p + "self_attn.k_proj.weight"]).view(S + R, KV, hd)
        k = apply_rope(rms_norm(k, P[p + "self_attn.k_norm.weight"], eps), cos_k, sin_k)
        v = F.linear(X, P[p + "self_attn.v_proj.weight"]).view(S + R, KV, hd)
        o = attention(q.to(v.dtype), k.to(v.dtype), v, masks[lt], use_sdpa)
        if probe is not None:
            probe.setdefault("att", []).append(o.detach())
        h = h + F.linear(o.reshape(R, Hh * hd), P[p + "self_attn.o_proj.weight"])
        n = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = F.linear(n, P[p + "mlp.gate_proj.weight"])
        u = F.linear(n, P[p + "mlp.up_proj.weight"])
        h = h + F.linear(F.silu(g) * u, P[p + "mlp.down_proj.weight"])
    if probe is not None:
        probe["masks"] = masks
    return rms_norm(h, P["norm.weight"], eps)


def labels_weights(ids, loss_mask, anchors, keep, B, gamma):
    """labels [N*B] (x[a_j+k], -1 for k = 0 / past S / padding), weights [N*B] float64."""
    S = ids.shape[0]
    dev = ids.device
    kk = torch.arange(B, device=dev)
    p = anchors[:, None] + kk[None, :]                       # [N, B]
    inside = p < S
    pc = p.clamp(max=S - 1)
    has = inside & keep.bool()[:, None] & (kk[None, :] >= 1)
    labels = torch.where(has, ids[pc], torch.full_like(pc, -1))
    decay = torch.exp(-(kk.to(torch.float64) - 1.0) / gamma)
    decay[0] = 0.0
    w = has.to(torch.float64) * loss_mask[pc].to(torch.float64) * decay[None, :]
    return labels.reshape(-1), w.reshape(-1)


def make_head_ce():
    """Chunked frozen lm_head + softmax + weighted CE. The forward computes, chunk by chunk,
    the loss contribution and dL/dz (only one chunk's logits exist at a time); the backward
    just scales the stored dL/dz. No gradient to the frozen head."""

    class _HeadCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z, W, labels, w, norm, chunk):
            acc_dt = torch.float64 if W.dtype == torch.float64 else torch.float32
            M = z.shape[0]
            dz = torch.empty_like(z)
            total = torch.zeros((), dtype=acc_dt, device=z.device)
            correct = torch.zeros(M, dtype=torch.bool, device=z.device)
            for s in range(0, M, chunk):
                e = min(M, s + chunk)
                zc = z[s:e].to(W.dtype)
                logits = torch.matmul(zc, W.t()).to(acc_dt)                  # [c, V]
                yc = labels[s:e]
                wc = w[s:e].to(acc_dt)
                correct[s:e] = logits.argmax(dim=-1) == yc
                logp = torch.log_softmax(logits, dim=-1)
                del logits
                ce = -logp.gather(1, yc[:, None])[:, 0]
                total = total + (wc * ce).sum()
                g = logp.exp_()                                  # softmax, in place
                g[torch.arange(e - s, device=z.device), yc] -= 1.0
                g.mul_((wc / norm)[:, None])                     # dL/dlogits
                dz[s:e] = torch.matmul(g.to(W.dtype), W).to(z.dtype)
                del logp, g
            ctx.save_for_backward(dz)
            ctx.mark_non_differentiable(correct)
            return total / norm, correct

        @staticmethod
        def backward(ctx, gloss, gcorrect):
            (dz,) = ctx.saved_tensors
            return dz * gloss.to(dz.dtype), None, None, None, None, None

    return _HeadCE


def sample_anchors(loss_mask, num_anchors, gen):
    """The bench recipe's anchors for one sequence: num_anchors distinct positions i with
    loss_mask[i] and loss_mask[i + 1] (a label follows), drawn uniformly without replacement
    (randperm from gen) and sorted; fewer candidates than anchors leave padding anchors
    (position 0, keep 0). Returns anchors [N] long, keep [N] long, the real count."""
    dev = loss_mask.device
    cand = torch.nonzero(loss_mask[:-1].bool() & loss_mask[1:].bool())[:, 0]
    n = min(num_anchors, cand.numel())
    pick = cand[torch.randperm(cand.numel(), device=dev, generator=gen)[:n]].sort().values
    anchors = torch.zeros(num_anchors, dtype=torch.long, device=dev)
    keep = torch.zeros(num_anchors, dtype=torch.long, device=dev)
    anchors[:n] = pick
    keep[:n] = 1
    return anchors, keep, n


def select_rows(w):
    """The rows that carry loss (w > 0) and the normaliser sum(w). Done once per batch, like
    a trainer's collate step (torch.nonzero synchronises the device)."""
    sel = torch.nonzero(w > 0)[:, 0]
    return sel, w[sel].sum()


def head_loss(z, lm_head, labels, w, sel, norm, chunk, head_ce):
    """L = sum(w CE) / norm over the selected rows; also the per-row argmax hits."""
    return head_ce.apply(z[sel], lm_head, labels[sel], w[sel], norm, chunk)


def accuracy(correct, sel, B):
    """acc [B-1] and row counts [B-1] for block positions k = 1..B-1 (0 where no rows)."""
    kpos = sel % B
    count = torch.bincount(kpos, minlength=B).to(torch.float64)
    hits = torch.bincount(kpos, weights=correct.to(torch.float64), minlength=B)
    acc = torch.where(count > 0, hits / count.clamp(min=1), torch.zeros_like(count))
    return acc[1:], count[1:]


def dpace_weights_loop(ce, w, B, alpha):
    """D-PACE weights [N*B] float64 by the letter of the equations, one block and one position
    at a time (plain Python floats): walk k = 1.. while w > 0, s_k = (1 - alpha) exp(-CE_k) +
    alpha, P_m the running product, u_k = P_k + ... + P_L. Also returns A, the blocks with a
    loss position at k = 1."""
    ce, w = ce.tolist(), w.tolist()
    u = [0.0] * len(ce)
    A = 0
    for j in range(len(ce) // B):
        P = []
        k = 1
        while k < B and w[j * B + k] > 0:
            q = math.exp(-ce[j * B + k])
            P.append((P[-1] if P else 1.0) * ((1.0 - alpha) * q + alpha))
            k += 1
        for i in range(len(P)):                 # position i + 1
            u[j * B + i + 1] = sum(P[i:])
        A += len(P) > 0
    return torch.tensor(u, dtype=torch.float64), A


def dpace_weights(ce, w, B, alpha):
    """The same weights with tensor ops (cumulative product / reversed cumulative sum), the way
    a trainer would write them; checked against dpace_weights_loop."""
    ce, w = ce.detach().to(torch.float64).view(-1, B), w.view(-1, B)
    loss_pos = w > 0
    loss_pos[:, 0] = False
    run = torch.cumprod(loss_pos[:, 1:].to(torch.float64), dim=1)     # 1 up to the first gap
    s = (1.0 - alpha) * torch.exp(-ce[:, 1:]) + alpha
    P = torch.cumprod(torch.where(run > 0, s, torch.ones_like(s)), dim=1) * run
    u = torch.flip(torch.cumsum(torch.flip(P, [1]), dim=1), [1]) * run
    out = torch.zeros_like(ce)
    out[:, 1:] = u
    return out.reshape(-1), int((run[:, 0] > 0).sum().item())


def dpace_loss_plain(z, lm_head, labels, w, B, alpha):
    """D-PACE over full logits under autograd: CE of every loss row, the detached weights,
    L = sum(u CE) / A. Returns loss, per-row hits, the weights u [N*B] and A."""
    sel = torch.nonzero(w > 0)[:, 0]
    logits = z[sel] @ lm_head.t()
    ce_sel = F.cross_entropy(logits, labels[sel], reduction="none")
    ce = torch.zeros(w.shape[0], dtype=ce_sel.dtype)
    ce = ce.index_put((sel,), ce_sel.detach())
    with torch.no_grad():
        u, A = dpace_weights(ce, w, B, alpha)
    loss = (u[sel] * ce_sel).sum() / A
    return loss, logits.argmax(-1) == labels[sel], u, A


def loss_plain(z, lm_head, labels, w):
    """Unchunked reference: full logits and F.cross_entropy under autograd (self-check only)."""
    sel = torch.nonzero(w > 0)[:, 0]
    logits = z[sel] @ lm_head.t()
    ce = F.cross_entropy(logits, labels[sel], reduction="none")
    return (w[sel] * ce).sum() / w[sel].sum()


# ---------------------------------------------------------------------------------------
# safetensors output
# ---------------------------------------------------------------------------------------

def save_safetensors(path, tensors, metadata):
    """Atomic write (tmp + rename). Uses the safetensors package when present, otherwise a
    small writer (header padded to 8 bytes, tensors by element size then name, no gaps)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    tmp = f"{path}.tmp.{os.getpid()}"
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    try:
        from safetensors.torch import save_file
        save_file(tensors, tmp, metadata=metadata)
    except ImportError:
        names = {torch.float64: "F64", torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}
        order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
        header, blobs, off = {}, [], 0
        for n in order:
            t = tensors[n]
            if t.dtype not in names:
                raise ValueError(f"tensor {n}: dtype {t.dtype} not supported by the fallback writer")
            b = t.numpy().tobytes()
            header[n] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        header["__metadata__"] = metadata
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(tmp, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# fixture
# ---------------------------------------------------------------------------------------

FIXTURE_INPUTS = {
    # untied: prompt 0..5, a prompt hole at 15; anchors cover normal, hole, overlap, past-S
    False: dict(prompt=6, holes=[15], anchors=[7, 12, 13, 22]),
    # tied: prompt 0..3, hole at 11
    True: dict(prompt=4, holes=[11], anchors=[6, 9, 16, 20]),
}


def make_fixture_case(tied, seed, chunk, loss_kind="decay", alpha=0.5):
    cfg = tiny_config(tied)
    dpace = loss_kind == "dpace"
    if dpace:
        cfg.update(loss="dpace", dpace_alpha=alpha)
    S, N, B, d, V = cfg["S"], cfg["N"], cfg["B"], cfg["d"], cfg["V"]
    gen = torch.Generator().manual_seed(seed + (1 if tied else 0))
    # weights: F32 values are the truth; the math runs on their exact float64 upcast
    w32 = {}
    for name, shape in param_shapes(cfg):
        if len(shape) == 1:
            w32[name] = (1.0 + 0.2 * torch.randn(shape, generator=gen)).float()
        else:
            w32[name] = (torch.randn(shape, generator=gen) / math.sqrt(shape[1])).float()
    # scales keep logits at std ~1.4 (a peaked but not saturated softmax)
    embed32 = (0.25 * torch.randn(V, d, generator=gen)).float()
    lm32 = embed32 if tied else (0.25 * torch.randn(V, d, generator=gen)).float()
    H32 = torch.randn(S, cfg["n_capture"] * d, generator=gen).float()
    ids = torch.randint(0, cfg["mask_token_id"], (S,), generator=gen)   # never the mask token
    spec = FIXTURE_INPUTS[tied]
    loss_mask = torch.ones(S, dtype=torch.long)
    loss_mask[:spec["prompt"]] = 0
    for i in spec["holes"]:
        loss_mask[i] = 0
    anchors = torch.tensor(spec["anchors"] + [0] * (N - len(spec["anchors"])), dtype=torch.long)
    keep = torch.tensor([1] * len(spec["anchors"]) + [0] * (N - len(spec["anchors"])), dtype=torch.long)
    for a in spec["anchors"]:
        if not (loss_mask[a] and loss_mask[a + 1]):
            raise AssertionError(f"fixture anchor {a} is not a candidate")

    P = {n: t.double().requires_grad_(True) for n, t in w32.items()}
    Hd = H32.double().requires_grad_(True)
    embed, lm_head = embed32.double(), lm32.double()
    # z depends on ids only at the anchors: set the token at some label positions (never an
    # anchor) to the model's own argmax, so that the accuracy check sees hits and misses
    labels, w = labels_weights(ids, loss_mask, anchors, keep, B, cfg["gamma"])
    with torch.no_grad():
        pred = (drafter_forward(P, cfg, Hd, ids, anchors, keep, embed, False) @ lm_head.t()).argmax(-1)
    anchor_set = set(anchors[keep.bool()].tolist())
    for r in range(N * B):
        j, k = divmod(r, B)
        pos = int(anchors[j]) + k
        if w[r] > 0 and (j + k) % 2 == 0 and pos not in anchor_set:
            ids[pos] = pred[r]
    labels, w = labels_weights(ids, loss_mask, anchors, keep, B, cfg["gamma"])
    sel, norm = select_rows(w)
    head_ce = make_head_ce()
    tag = "tied" if tied else "untied"
    names = [n for n, _ in param_shapes(cfg)]

    # self-check 3 (first, it decides the attention path): SDPA == explicit masked softmax
    use_sdpa = hasattr(F, "scaled_dot_product_attention")
    sdpa_diff = None
    if use_sdpa:
        try:
            with torch.no_grad():
                z_s = drafter_forward(P, cfg, Hd, ids, anchors, keep, embed, True)
                z_e = drafter_forward(P, cfg, Hd, ids, anchors, keep, embed, False)
            sdpa_diff = (z_s - z_e).abs().max().item()
            if not sdpa_diff <= 1e-10:  # also catches NaN
                log(f"WARNING: {tag}: SDPA and the explicit softmax differ by {sdpa_diff:g} in float64; "
                    f"the fixture uses the explicit softmax (the spec's math)")
                use_sdpa = False
            else:
                log(f"{tag}: SDPA vs explicit attention: max |dz| = {sdpa_diff:.2e}")
        except Exception as e:  # noqa: BLE001 - report and fall back: the math is identical
            log(f"WARNING: {tag}: SDPA failed on the CPU in float64 ({e}); using the explicit softmax")
            use_sdpa = False
    else:
        log(f"{tag}: torch {torch.__version__} has no SDPA: explicit softmax attention used")

    # primary evaluation: loss, accuracy, gradients w.r.t. every trainable tensor and H
    # (decay: the chunked head; D-PACE: full logits under autograd, weights detached)
    dp = {}

    def run(sdpa):
        probe_ = {}
        z_ = drafter_forward(P, cfg, Hd, ids, anchors, keep, embed, sdpa, probe_)
        if dpace:
            loss_, correct, dp["u"], dp["A"] = dpace_loss_plain(z_, lm_head, labels, w, B, alpha)
        else:
            loss_, correct = head_loss(z_, lm_head, labels, w, sel, norm, chunk, head_ce)
        acc_, cnt_ = accuracy(correct, sel, B)
        grads_ = torch.autograd.grad(loss_, [P[n] for n in names] + [Hd])
        return probe_, z_, loss_, acc_, cnt_, grads_

    try:
        probe, z, loss, acc, cnt, grads = run(use_sdpa)
    except Exception as e:  # noqa: BLE001
        if not use_sdpa:
            raise
        log(f"WARNING: {tag}: SDPA backward failed on the CPU in float64 ({e}); using the explicit softmax")
        use_sdpa = False
        probe, z, loss, acc, cnt, grads = run(False)
    g = dict(zip(names, grads[:-1]))
    gH = grads[-1]
    if not torch.isfinite(loss) or any(not torch.isfinite(t).all() for t in grads):
        raise AssertionError(f"{tag}: non-finite loss or gradient")

    # self-check 1: the vectorised mask == the spec written as loops
    for lt, m in probe["masks"].items():
        window = cfg["sliding_window"] if lt == "sliding_attention" else 0
        ref = torch.tensor(build_mask_loop(S, anchors.tolist(), keep.tolist(), B, window))
        if not torch.equal(ref, m.mask.cpu()):
            raise AssertionError(f"{tag}: vectorised {lt} mask differs from the loop version")
    # self-check 2: padding blocks' attention rows are exact zeros; no other row is empty
    pad_rows = (keep.repeat_interleave(B) == 0)
    for l, o in enumerate(probe["att"]):
        if o[pad_rows].abs().max().item() != 0.0:
            raise AssertionError(f"{tag}: layer {l}: padding-block attention output is not exactly zero")
    for lt, m in probe["masks"].items():
        if not torch.equal(m.row_any.cpu(), ~pad_rows):
            raise AssertionError(f"{tag}: {lt}: a kept query row has no key (or a padding row has one)")
    # self-check 4: chunked head+CE vs plain autograd over full logits (loss and grads).
    # D-PACE: the chunked head with the detached weights as row weights and A as the
    # normaliser is the same loss and gradient (how the C code computes it: a row's gradient
    # is linear in its weight)
    z3 = drafter_forward(P, cfg, Hd, ids, anchors, keep, embed, use_sdpa)
    if dpace:
        u, A = dp["u"], dp["A"]
        # the weights: tensor ops == the loop version; alpha = 1 gives the remaining run length
        ce_all = torch.zeros(N * B, dtype=torch.float64)
        with torch.no_grad():
            lg = z3[sel] @ lm_head.t()
            ce_all[sel] = F.cross_entropy(lg, labels[sel], reduction="none")
        u_loop, A_loop = dpace_weights_loop(ce_all, w, B, alpha)
        werr = (u - u_loop).abs().max().item()
        if A != A_loop or werr > 1e-14:
            raise AssertionError(f"{tag}: D-PACE weights: tensor ops vs loop differ by {werr:g} (A {A} vs {A_loop})")
        u1, _ = dpace_weights(ce_all, w, B, 1.0)
        u1_loop, _ = dpace_weights_loop(ce_all, w, B, 1.0)
        if not torch.equal(u1, u1_loop) or any(x != round(x) for x in u1.tolist()):
            raise AssertionError(f"{tag}: D-PACE weights at alpha = 1 are not the remaining run lengths")
        log(f"{tag}: D-PACE weights: tensor ops vs loop max |du| = {werr:.1e}, A = {A}, "
            f"weights {[round(x, 4) for x in u.tolist()]}")
        lp, _ = head_ce.apply(z3[sel], lm_head, labels[sel], u[sel], torch.tensor(float(A), dtype=torch.float64),
                              chunk)
    else:
        lp = loss_plain(z3, lm_head, labels, w)
    gp = torch.autograd.grad(lp, [P[n] for n in names] + [Hd])
    worst = max(((a - b).norm() / b.norm().clamp(min=1e-300)).item() for a, b in zip(grads, gp))
    if abs(lp.item() - loss.item()) > 1e-12 * abs(lp.item()) or worst > 1e-10:
        raise AssertionError(f"{tag}: chunked CE differs from plain CE: loss {loss.item()} vs {lp.item()}, "
                             f"worst grad rel err {worst:g}")
    log(f"{tag}: chunked vs plain CE: |dloss| = {abs(lp.item() - loss.item()):.2e}, worst grad rel {worst:.2e}")
    # self-check 5: two-sided finite difference along a random direction (params and H).
    # D-PACE: of the loss with the weights frozen at their values here (what "detached"
    # means); the finite difference of the full D-PACE loss, whose weights move with the
    # parameters, is another number (logged, not a check)
    dgen = torch.Generator().manual_seed(seed + 99)
    dirs = [torch.randn(t.shape, generator=dgen, dtype=torch.float64) for t in grads]
    analytic = sum((a * u).sum().item() for a, u in zip(grads, dirs))
    eps = 1e-6

    def loss_at(sign):
        with torch.no_grad():
            Pm = {n: P[n] + sign * eps * u for n, u in zip(names, dirs[:-1])}
            Hm = Hd + sign * eps * dirs[-1]
            zz = drafter_forward(Pm, cfg, Hm, ids, anchors, keep, embed, use_sdpa)
            if dpace:
                return (loss_plain(zz, lm_head, labels, dp["u"]) * dp["u"].sum() / dp["A"]).item()
            return loss_plain(zz, lm_head, labels, w).item()

    def dpace_full_at(sign):
        with torch.no_grad():
            Pm = {n: P[n] + sign * eps * u for n, u in zip(names, dirs[:-1])}
            zz = drafter_forward(Pm, cfg, Hd + sign * eps * dirs[-1], ids, anchors, keep, embed, use_sdpa)
            return dpace_loss_plain(zz, lm_head, labels, w, B, alpha)[0].item()

    numeric = (loss_at(+1) - loss_at(-1)) / (2 * eps)
    if dpace:
        full = (dpace_full_at(+1) - dpace_full_at(-1)) / (2 * eps)
        log(f"{tag}: D-PACE: finite difference of the loss with weights frozen {numeric:.10g}, with weights "
            f"recomputed {full:.10g}, gradient {analytic:.10g}")
    fd_rel = abs(numeric - analytic) / max(abs(analytic), 1e-30)
    if fd_rel > 1e-6:
        raise AssertionError(f"{tag}: finite difference {numeric:.12g} vs analytic {analytic:.12g} "
                             f"(rel {fd_rel:g})")
    log(f"{tag}: finite difference along a random direction: rel err {fd_rel:.2e}")

    R = N * B
    out = {}
    for n in names:
        out[n] = w32[n]
        out["grad." + n] = g[n].float()
    out["embed_tokens"] = embed32
    if not tied:
        out["lm_head"] = lm32
    out["H"] = H32
    out["input_ids"] = ids.to(torch.int32)
    out["loss_mask"] = loss_mask.to(torch.int32)
    out["anchors"] = anchors.to(torch.int32)
    out["keep"] = keep.to(torch.int32)
    out["labels"] = labels.to(torch.int32)
    out["weights"] = w.float()
    out["sum_w"] = w.sum().reshape(1)
    if dpace:
        out["dpace_weights"] = dp["u"].float()
        out["dpace_norm"] = torch.tensor([float(dp["A"])], dtype=torch.float64)
    out["loss"] = loss.detach().reshape(1).double()
    out["acc"] = acc.float()
    out["acc_count"] = cnt.float()
    out["grad.H"] = gH.float()
    out["z"] = z.detach().float().reshape(R, d)
    meta_cfg = dict(cfg)
    meta_cfg.update(n_layers=len(cfg["layer_types"]), chunk=chunk, seed=seed,
                    attention="sdpa" if use_sdpa else "explicit", sdpa_vs_explicit=sdpa_diff,
                    torch_version=torch.__version__, fd_rel_err=fd_rel, made_by="tests/reference/dflash_torch.py fixture")
    log(f"{tag}: loss {loss.item():.10f}, sum_w {w.sum().item():.6f}, acc {[round(x, 4) for x in acc.tolist()]}, "
        f"||grad.H|| {gH.norm().item():.4e}")
    return out, {"config": json.dumps(meta_cfg, sort_keys=True)}


def cmd_fixture(args):
    import_torch()
    if not 0.0 < args.alpha <= 1.0 or not 0.0 < args.alpha_tied <= 1.0:
        die(f"--alpha {args.alpha} / --alpha-tied {args.alpha_tied}: D-PACE's alpha must be in (0, 1]")
    t0 = time.time()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.manual_seed(args.seed)
    outs = [(args.out, False)]
    if not args.no_tied:
        stem, ext = os.path.splitext(args.out)
        outs.append((f"{stem}-tied{ext or '.safetensors'}", True))
    for path, tied in outs:
        log(f"building the {'tied' if tied else 'untied'} {args.loss} fixture (float64, CPU) ...")
        try:
            tensors, meta = make_fixture_case(tied, args.seed, args.chunk, args.loss,
                                              args.alpha_tied if tied else args.alpha)
        except AssertionError as e:
            die(f"self-check failed, nothing written: {e}")
        try:
            save_safetensors(path, tensors, meta)
        except (OSError, ValueError) as e:
            die(f"cannot write {path}: {e}")
        log(f"wrote {path} ({len(tensors)} tensors, {os.path.getsize(path)} bytes)")
    log(f"fixture done in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------------------------------
# step benchmark
# ---------------------------------------------------------------------------------------

def time_ms(fn, warmup, iters, dev):
    """Median and all per-call times (ms) of fn(): CUDA events on a GPU, wall clock on the CPU
    (the CPU path only exists to exercise this code on a machine without a GPU)."""
    for _ in range(warmup):
        fn()
    if dev.type != "cuda":
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts), ts
    torch.cuda.synchronize()
    evs = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    ts = [s.elapsed_time(e) for s, e in evs]
    return statistics.median(ts), ts


def gemm_ceiling_tflops(dev, n):
    """bf16 n^3 matmul throughput (the MFU denominator), median of 20."""
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    med, _ = time_ms(lambda: torch.matmul(a, b, out=c), 5, 20, dev)
    del a, b, c
    return 2.0 * n ** 3 / (med * 1e-3) / 1e12


def step_flops(cfg, S, n_block_positions, attn_pairs):
    """docs/performance.md: per block position 6 * trainable + 4 * lm_head; per context token
    6 * (fc + n_layers * (k_proj + v_proj)); attention 3 x forward (QK^T and PV: 4 FLOP per
    allowed (query, key) pair per head per head_dim element)."""
    d, hd, L = cfg["d"], cfg["hd"], len(cfg["layer_types"])
    p_train = sum(math.prod(s) for _, s in param_shapes(cfg))
    p_head = cfg["V"] * d
    p_fc = d * cfg["n_capture"] * d
    p_kv = L * 2 * cfg["kv"] * hd * d
    dense = n_block_positions * (6 * p_train + 4 * p_head) + S * 6 * (p_fc + p_kv)
    attn = 3 * 4 * attn_pairs * cfg["heads"] * hd
    return dense + attn, dict(trainable_params=p_train, lm_head_params=p_head, attention_flops=attn)


def bench_one(cfg, shape, S, num_anchors, args, ceiling, dev):
    B, d, V = cfg["B"], cfg["d"], cfg["V"]
    cuda = dev.type == "cuda"
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    params = {}
    for name, shape_ in param_shapes(cfg):
        if len(shape_) == 1:
            t = torch.ones(shape_, device=dev, dtype=torch.float32)
        else:
            t = torch.randn(shape_, device=dev, dtype=torch.float32, generator=gen) * 0.02
        params[name] = torch.nn.Parameter(t)
    # the frozen target tensors stay bf16 (no master copy: they never change)
    embed = (torch.randn(V, d, device=dev, dtype=torch.float32, generator=gen) * 0.02).to(torch.bfloat16)
    lm_head = (torch.randn(V, d, device=dev, dtype=torch.float32, generator=gen) * 0.02).to(torch.bfloat16)
    H = torch.randn(S, cfg["n_capture"] * d, device=dev, dtype=torch.float32, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, V - 1, (S,), device=dev, generator=gen)
    loss_mask = torch.ones(S, dtype=torch.long, device=dev)
    loss_mask[: S // 8] = 0                                   # a prompt
    anchors, keep, n = sample_anchors(loss_mask, num_anchors, gen)
    labels, w = labels_weights(ids, loss_mask, anchors, keep, B, cfg["gamma"])
    sel, norm = select_rows(w)
    head_ce = make_head_ce()
    use_sdpa = "flex" if args.attn == "flex" else hasattr(F, "scaled_dot_product_attention")
    if use_sdpa == "flex":
        flex_attention_fn()  # the reason, before any step, when it cannot run here
    plist = list(params.values())
    fused = False
    if cuda:
        try:
            opt = torch.optim.AdamW(plist, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
            fused = True
        except (TypeError, RuntimeError, ValueError) as e:
            log(f"WARNING: fused AdamW unavailable ({e}); using the default implementation")
    if not fused:
        opt = torch.optim.AdamW(plist, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    last = {}
    phase_ev = []  # per step, CUDA events at the phase boundaries (recording them syncs nothing)

    def mark(ev, i):
        if ev is not None:
            ev[i].record()

    def step():
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)] if cuda else None
        mark(ev, 0)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            z = drafter_forward(params, cfg, H, ids, anchors, keep, embed, use_sdpa)
            mark(ev, 1)
            loss, _ = head_loss(z, lm_head, labels, w, sel, norm, args.chunk, head_ce)
            mark(ev, 2)
        loss.backward()
        mark(ev, 3)
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        mark(ev, 4)
        if ev is not None:
            phase_ev.append(ev)
        last["loss"] = loss.detach()
        last.setdefault("first_loss", last["loss"])  # before any update: what two recipes must agree on

    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    try:
        step()  # first step: allocations, kernel selection; a failing SDPA backend shows here
    except oom:
        raise
    except RuntimeError as e:
        if not (cuda and hasattr(torch.backends.cuda, "enable_cudnn_sdp")):
            raise
        log(f"WARNING: the first step failed ({e}); retrying with the cuDNN SDPA backend disabled")
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.cuda.synchronize()
        step()
    med, ts = time_ms(step, args.warmup, args.iters, dev)
    loss_val = last["loss"].item()
    phase_ms = None
    if phase_ev:  # the timed steps' phases, median of each (time_ms synchronised at its end)
        per = [[e[i].elapsed_time(e[i + 1]) for e in phase_ev[-args.iters:]] for i in range(4)]
        phase_ms = {k: round(statistics.median(v), 3) for k, v in zip(("forward", "loss", "backward", "optimizer"), per)}
    if not math.isfinite(loss_val):
        raise RuntimeError(f"non-finite loss {loss_val}")
    pairs = 0
    for lt in cfg["layer_types"]:
        window = cfg["sliding_window"] if lt == "sliding_attention" else 0
        pairs += int(build_mask(S, anchors, keep, B, window).sum().item())
    flops, parts = step_flops(cfg, S, num_anchors * B, pairs)
    tflops = flops / (med * 1e-3) / 1e12
    return dict(bench="drafter_step_torch", shape=shape, seq=S, anchors=num_anchors, block_size=B,
                real_anchors=n, ms_per_step=round(med, 3), ms_per_sample=round(med, 3),
                samples_per_s=round(1000.0 / med, 3), step_ms_all=[round(t, 3) for t in ts],
                tflop_per_step=round(flops / 1e12, 4), tflops=round(tflops, 2),
                mfu=round(tflops / ceiling, 4), gemm_ceiling_tflops=round(ceiling, 2),
                peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None,
                loss=round(loss_val, 4), first_loss=round(last["first_loss"].item(), 5), fused_adamw=fused,
                sdpa=use_sdpa is True, attention=args.attn,
                chunk_rows=args.chunk, warmup=args.warmup, iters=args.iters, attention_pairs=pairs, **parts,
                phase_ms=phase_ms,
                phase_note="forward = drafter layers; loss = chunked head + CE with dL/dz (as ours); "
                           "backward = loss.backward() (the layers); optimizer = clip + AdamW",
                recipe=("flex_attention (BlockMask, torch.compile)" if args.attn == "flex" else
                        "eager: SDPA dense bool mask") +
                       ", chunked head+CE, fp32 master + bf16 autocast, clip 1.0, AdamW (0.9, 0.95)",
                device=torch.cuda.get_device_name(dev) if cuda else "cpu", torch=torch.__version__,
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def cmd_step_bench(args):
    import_torch()
    if args.device == "cuda" and not torch.cuda.is_available():
        die("step-bench needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu only for a smoke test")
    if args.shape not in SHAPES:
        die(f"unknown --shape {args.shape}; known: {', '.join(SHAPES)}")
    for S in args.seq:
        if S < 2:
            die(f"--seq {S}: need at least 2 tokens")
    for na in args.anchors:
        if na < 1:
            die(f"--anchors {na}: need at least 1")
    if args.pairs and len(args.seq) != len(args.anchors):
        die(f"--pairs: {len(args.seq)} --seq values but {len(args.anchors)} --anchors values")
    combos = list(zip(args.seq, args.anchors)) if args.pairs else [(S, na) for S in args.seq for na in args.anchors]
    dev = torch.device(args.device)
    cfg = SHAPES[args.shape]()
    t0 = time.time()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    n = 8192 if dev.type == "cuda" else 512
    log(f"torch {torch.__version__}, {name}: measuring the {n}^3 bf16 GEMM ceiling ...")
    ceiling = gemm_ceiling_tflops(dev, n)
    log(f"GEMM ceiling {ceiling:.2f} TFLOP/s")
    results = []
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    for S, na in combos:
        log(f"shape {args.shape}: S={S} anchors={na}: warmup {args.warmup}, timing {args.iters} steps ...")
        try:
            r = bench_one(cfg, args.shape, S, na, args, ceiling, dev)
        except oom as e:
            die(f"S={S} anchors={na}: out of memory ({e}); try a smaller --chunk")
        results.append(r)
        gc.collect()                 # the step closure and optimizer state are gone now
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps(r), flush=True)
        log(f"S={S} anchors={na}: {r['ms_per_step']:.1f} ms/step, {r['tflops']:.1f} TFLOP/s, "
            f"MFU {100 * r['mfu']:.1f}%, peak {r['peak_mem_gib']} GiB")
    if args.json_out:
        try:
            d = os.path.dirname(os.path.abspath(args.json_out))
            os.makedirs(d, exist_ok=True)
            tmp = f"{args.json_out}.tmp.{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(results, f, indent=1)
                f.write("\n")
            os.replace(tmp, args.json_out)
        except OSError as e:
            die(f"cannot write {args.json_out}: {e}")
        log(f"wrote {args.json_out}")
    log(f"step-bench done in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="dflash_torch.py",
        description="PyTorch reference of the DFlash drafter (docs/dflash_spec.md): test fixture and step benchmark.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python3 tests/reference/dflash_torch.py fixture --out tests/fixtures/dflash-torch.safetensors\n"
               "  python3 tests/reference/dflash_torch.py fixture --loss dpace "
               "--out tests/fixtures/dflash-torch-dpace.safetensors\n"
               "  python3 tests/reference/dflash_torch.py step-bench --seq 768 2048 --anchors 256 512 \\\n"
               "      --json-out bench/results/drafter-torch.json\n")
    sub = ap.add_subparsers(dest="cmd")
    fx = sub.add_parser("fixture", help="write the float64 ground-truth fixture(s) for tests/test_dflash_torch.c")
    fx.add_argument("--out", required=True, help="output .safetensors (the tied variant goes to <stem>-tied.safetensors)")
    fx.add_argument("--seed", type=int, default=1234, help="weights/inputs seed (default 1234)")
    fx.add_argument("--chunk", type=int, default=7, help="rows per lm_head chunk (default 7: several chunks)")
    fx.add_argument("--no-tied", action="store_true", help="do not write the tied-embedding variant")
    fx.add_argument("--loss", default="decay", choices=["decay", "dpace"],
                    help="the objective: decay (default; exp(-(k-1)/gamma)) or dpace (D-PACE)")
    fx.add_argument("--alpha", type=float, default=0.5, help="D-PACE smoothing of the untied case (default 0.5)")
    fx.add_argument("--alpha-tied", type=float, default=0.3,
                    help="D-PACE smoothing of the tied case (default 0.3: not 0.5, where a and 1-a look alike)")
    sb = sub.add_parser("step-bench", help="time the eager PyTorch training step on one GPU (JSON lines on stdout)")
    sb.add_argument("--shape", default="qwen3-8b-b16", help="model shape: qwen3-8b-b16 (default) or tiny")
    sb.add_argument("--seq", type=int, nargs="+", default=[768], help="context lengths S (default 768)")
    sb.add_argument("--anchors", type=int, nargs="+", default=[256], help="anchors per sequence (default 256)")
    sb.add_argument("--pairs", action="store_true",
                    help="pair the i-th --seq with the i-th --anchors (default: every combination)")
    sb.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    sb.add_argument("--iters", type=int, default=10, help="timed steps, median reported (default 10)")
    sb.add_argument("--chunk", type=int, default=1024, help="lm_head+CE rows per chunk (default 1024)")
    sb.add_argument("--seed", type=int, default=0)
    sb.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (default); cpu only to smoke-test the code path with --shape tiny")
    sb.add_argument("--json-out", default=None, help="also write all results as a JSON list to this file")
    sb.add_argument("--attn", default="sdpa", choices=["sdpa", "flex"],
                    help="sdpa (default: SDPA with the dense bool mask) or flex (flex_attention with a BlockMask "
                         "under torch.compile, as the public DFlash trainers run it; torch >= 2.5)")
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help()
        return 2
    if getattr(args, "chunk", 1) <= 0 or getattr(args, "iters", 1) <= 0 or getattr(args, "warmup", 0) < 0:
        die("--chunk and --iters must be > 0, --warmup >= 0")
    if args.cmd == "fixture":
        cmd_fixture(args)
    else:
        cmd_step_bench(args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        die("interrupted")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one clear line plus the traceback for the log
        import traceback
        traceback.print_exc()
        die(f"{type(e).__name__}: {e}")
