#!/usr/bin/env python3
"""train_target.py: train a byte-level Qwen3 target on real text, then let it answer prompts.

    python3 scripts/train_target.py --shape tiny --out models/tiny-target --data data/tiny
    python3 scripts/train_target.py --shape 0.6b --out gpu/models/qwen3-0.6b-bytes \\
        --data gpu/data/qwen3-0.6b-bytes --time-budget 240 --n-train 8000

Why: a drafter can only be judged against a target whose text means something, and no
weights can be downloaded on the GPU machine. So the target is trained here, from scratch,
on the source of Python's standard library (shipped with every Python, offline), with a
byte vocabulary (the tokenizer is 256 bytes + 8 specials: nothing to download either).

The model is written in plain torch (no transformers needed): Qwen3 decoder layers
(GQA, q_norm/k_norm, RoPE, SwiGLU, tied embeddings), saved as a Hugging Face directory
(config.json + model.safetensors with HF's tensor names, bf16), which the project's C/CUDA
target loads and which transformers' Qwen3ForCausalLM loads too.

Then the target answers prompts GREEDILY (the DFlash recipe: train on the target's own
responses; greedy, because evaluation decodes greedily): prompts are cut at line starts
from training files (chat-train.jsonl) and from held-out files (chat-heldout.jsonl, files
whose path hashes to 0 mod 20, never trained on by target or drafter).

Writes
    <out>/config.json, generation_config.json, model.safetensors, byte_tokenizer.json
    <data>/chat-train.jsonl, <data>/chat-heldout.jsonl   {"messages": [user, assistant]}
Text fields hold bytes decoded as latin-1, so every byte maps to one character and back.

--prompts-only: the same prompts, but no answers here: <data>/prompts-train.jsonl and
<data>/prompts-heldout.jsonl ({"messages": [user]}) for the product's own target_generate
to answer (eval/target_generate_main.c, docs/generate.md; bench/eval/trained_target.sh
does so). PyTorch's KV-cached loop below is fine for the tiny target on a CPU but far too
slow for the 0.6B shape on a GPU (4000 answers did not finish in 200 s on an H100).

Memory: --batch sequences make one optimizer step; --micro-batch of them go through the
model at a time and their gradients are summed (gradient accumulation), so the step's
math does not depend on the card. The 0.6B shape steps on 32 x 1024 bytes in micro-batches
of 8: its autocast activations cost about 2.7 GiB per sequence (docs/drafter_quality.md
has the arithmetic), so 32 at once need ~87 GiB and run out of memory on an 80 GB H100,
while 8 need ~22 GiB beside ~7.4 GiB of weights, gradients, AdamW state and bf16 copies.

Byte vocabulary: ids 0..255 are bytes; 256 <|bos|>, 257 <|eos|>, 258 <|user|>,
259 <|assistant|>, 260 <|pad|>, 261 <|mask|> (DFlash's mask token); vocab_size 264.
Chat layout: <|bos|> <|user|> prompt <|assistant|> response <|eos|>.

With a BPE tokenizer (--tokenizer DIR, made by scripts/train_bpe.py on the same text):
the model learns the corpus through that tokenizer (windows of --seq tokens) and is written
into --out beside the tokenizer files (copied there when --out is another directory):
config.json with the tokenizer's vocabulary size, bos/pad <|endoftext|>, eos <|im_end|>
(generation_config.json: eos <|im_end|> and <|endoftext|>, as Qwen3's), no byte_tokenizer.json;
the mask token's row (tokenizer_config.json mask_token, <|MASK|>) gets a fresh random draw
(reset_mask_row); no answers are generated (target_generate answers prompts in C). The tiny chat
target models/tiny-chat was made on one CPU core (docs/data.md):
    python3 scripts/train_bpe.py --out models/tiny-chat
    python3 scripts/train_target.py --tokenizer models/tiny-chat --out models/tiny-chat \
        --shape tiny --batch 16 --time-budget 900

Seeded (--seed): corpus split, batches, init and prompts are drawn from it; GPU kernels
are not bit-deterministic, so two runs on a GPU agree in quality, not in bits.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stdlib_corpus import draw_prompts, load_corpus, prompt_docs, stdlib_root  # noqa: E402

BOS, EOS, USER, ASSISTANT, PAD, MASK, VOCAB = 256, 257, 258, 259, 260, 261, 264

# Shapes. "tiny" is the embedded default's target (make run); "0.6b" is Qwen3-0.6B's
# body (28 layers, 1024 wide, 16/8 heads of 128, 3072 MLP) with the byte vocabulary.
SHAPES = {
    "tiny": dict(hidden=128, inter=384, layers=4, heads=4, kv=2, head_dim=32, max_pos=1024,
                 seq=256, batch=128, lr=3e-3, steps=3000, theta=10000.0),
    "tiny-deep": dict(hidden=128, inter=384, layers=6, heads=4, kv=2, head_dim=32, max_pos=1024,
                      seq=256, batch=128, lr=2e-3, steps=6000, theta=10000.0),
    "0.6b": dict(hidden=1024, inter=3072, layers=28, heads=16, kv=8, head_dim=128, max_pos=4096,
                 seq=1024, batch=32, micro=8, lr=6e-4, steps=0, theta=1000000.0),
}
EPS = 1e-6


def log(msg):
    print(f"train_target: {msg}", flush=True)


# ---- the model ------------------------------------------------------------------------

class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):  # HF Qwen3RMSNorm: normalise in fp32, scale in the input dtype
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * x.to(dt)


def rope_tables(head_dim, theta, n, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    f = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()  # [n, head_dim] each


def rope(x, cos, sin):  # x [B, H, T, hd]; HF rotate_half convention
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def attend(q, k, v, causal_offset):
    """q [B,H,Tq,hd], k/v [B,H,Tk,hd] (kv heads already repeated). Query i sits at key
    position causal_offset + i and sees keys 0..causal_offset+i."""
    Tq, Tk = q.shape[2], k.shape[2]
    if hasattr(F, "scaled_dot_product_attention"):
        if Tq == Tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if Tq == 1:
            return F.scaled_dot_product_attention(q, k, v)
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = torch.arange(Tk, device=q.device)[None, :] <= (causal_offset + torch.arange(Tq, device=q.device))[:, None]
    s = s.masked_fill(~allowed, float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H, KV, hd = c["hidden"], c["heads"], c["kv"], c["head_dim"]
        self.H, self.KV, self.hd = H, KV, hd
        self.input_layernorm = RMSNorm(d)
        self.post_attention_layernorm = RMSNorm(d)
        self.q_proj = torch.nn.Linear(d, H * hd, bias=False)
        self.k_proj = torch.nn.Linear(d, KV * hd, bias=False)
        self.v_proj = torch.nn.Linear(d, KV * hd, bias=False)
        self.o_proj = torch.nn.Linear(H * hd, d, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)
        self.gate_proj = torch.nn.Linear(d, c["inter"], bias=False)
        self.up_proj = torch.nn.Linear(d, c["inter"], bias=False)
        self.down_proj = torch.nn.Linear(c["inter"], d, bias=False)

    def forward(self, x, cos, sin, cache=None):
        """x [B, T, d]; cos/sin for the T positions; cache: None, or a dict holding this
        layer's K/V so far ("k", "v": [B, KV, n, hd]) that gets the new rows appended."""
        B, T, _ = x.shape
        a = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(a).view(B, T, self.H, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(a).view(B, T, self.KV, self.hd)).transpose(1, 2)
        v = self.v_proj(a).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        off = 0
        if cache is not None:
            if "k" in cache:
                off = cache["k"].shape[2]
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        rep = self.H // self.KV
        o = attend(q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), off)
        x = x + self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.hd))
        n = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Embedding(c.get("vocab", VOCAB), c["hidden"])
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std = 0.02 / math.sqrt(2 * c["layers"])  # residual branches: keep the stream's scale
                torch.nn.init.normal_(p, std=std)

    def forward(self, ids, pos0=0, caches=None):
        """ids [B, T] -> logits [B, T, VOCAB] (tied head); positions pos0..pos0+T-1."""
        x = self.embed_tokens(ids)
        cos, sin = self.rope[0][pos0:pos0 + ids.shape[1]], self.rope[1][pos0:pos0 + ids.shape[1]]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i])
        return self.norm(x) @ self.embed_tokens.weight.t()

    def set_rope(self, device):
        self.rope = rope_tables(self.c["head_dim"], self.c["theta"], self.c["max_pos"], device)


def reset_mask_row(model, seed, mask=MASK):
    """Give the mask token's embedding row a fresh random draw (std 0.02), as an unused
    row of a real vocabulary has. Training never feeds the mask token, but the tied head
    pushes every unused row towards the mean of the byte embeddings (measured on the
    tiny target: cosine 0.99, norm 3.4), so a drafter whose block starts from that row
    predicts with logits of ~38 and starts at a loss of ~41 instead of ~5. Greedy text
    is unchanged: the mask token's logit only drops, and answers never choose it."""
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        w = model.embed_tokens.weight
        w[mask] = (torch.randn(w.shape[1], generator=g) * 0.02).to(w.device, w.dtype)


def hf_state(model):
    """Tensors under Hugging Face's Qwen3ForCausalLM names (tied head: no lm_head)."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight, "model.norm.weight": model.norm.weight}
    for i, L in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[p + n + ".weight"] = getattr(L, n).weight
        for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            out[p + "self_attn." + n + ".weight"] = getattr(L, n).weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            out[p + "mlp." + n + ".weight"] = getattr(L, n).weight
    return out


def save_safetensors(path, tensors):
    """bf16 safetensors, written to a temp name then renamed."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu", torch.bfloat16).contiguous()
        b = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def save_model(model, out, shape, bpe=None):
    """config.json, generation_config.json, model.safetensors; byte_tokenizer.json for the
    byte vocabulary, or, with bpe (a BpeVocab), the ids of its tokenizer (already in out)."""
    c = model.c
    os.makedirs(out, exist_ok=True)
    bos, eos, pad = (BOS, EOS, PAD) if bpe is None else (bpe.endoftext, bpe.eos, bpe.endoftext)
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "dtype": "bfloat16",
        "torch_dtype": "bfloat16", "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "hidden_act": "silu",
        "hidden_size": c["hidden"], "intermediate_size": c["inter"], "num_hidden_layers": c["layers"],
        "num_attention_heads": c["heads"], "num_key_value_heads": c["kv"], "head_dim": c["head_dim"],
        "initializer_range": 0.02, "max_position_embeddings": c["max_pos"], "max_window_layers": c["layers"],
        "rms_norm_eps": EPS, "rope_theta": c["theta"],
        "rope_parameters": {"rope_theta": c["theta"], "rope_type": "default"},
        "layer_types": ["full_attention"] * c["layers"], "sliding_window": None,
        "use_sliding_window": False, "tie_word_embeddings": True, "use_cache": True,
        "vocab_size": c.get("vocab", VOCAB), ("byte_target_shape" if bpe is None else "bpe_target_shape"): shape,
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        # Qwen3's generation config stops at <|im_end|> and <|endoftext|>
        json.dump({"bos_token_id": bos, "eos_token_id": eos if bpe is None else [eos, bpe.endoftext],
                   "pad_token_id": pad, "do_sample": False}, f, indent=2)
    if bpe is None:
        with open(os.path.join(out, "byte_tokenizer.json"), "w") as f:
            json.dump({"type": "bytes", "vocab_size": VOCAB, "bos": BOS, "eos": EOS, "user": USER,
                       "assistant": ASSISTANT, "pad": PAD, "mask": MASK,
                       "chat": "<|bos|> <|user|> prompt <|assistant|> response <|eos|>"}, f, indent=1)
    save_safetensors(os.path.join(out, "model.safetensors"), hf_state(model))


# ---- data -----------------------------------------------------------------------------

def batches(corpus, seq, bs, rng):
    """Windows of seq tokens at random places of random documents: bytes (the byte
    vocabulary) or token tensors (a BPE tokenizer's ids)."""
    while True:
        out = torch.empty((bs, seq), dtype=torch.long)
        for i in range(bs):
            doc = corpus[rng.randrange(len(corpus))]
            s = rng.randrange(0, len(doc) - seq)
            if isinstance(doc, bytes):
                out[i] = torch.frombuffer(bytearray(doc[s:s + seq]), dtype=torch.uint8).long()
            else:
                out[i] = doc[s:s + seq]
        yield out


class BpeVocab:
    """A byte-level BPE tokenizer directory (scripts/train_bpe.py): the ids the model needs."""

    def __init__(self, path):
        from hf_tokenizer import HFDirTokenizer
        self.tok = HFDirTokenizer(path)
        self.size = self.tok.vocab_size
        ids = self.tok.added_by_content
        mask = self.tok.special_token("mask_token")
        for name in ("<|endoftext|>", "<|im_end|>", mask):
            if name not in ids:
                sys.exit(f"train_target: {path}/tokenizer.json: no added token {name!r} (make it with "
                         "scripts/train_bpe.py)")
        self.endoftext, self.eos, self.mask = ids["<|endoftext|>"], ids["<|im_end|>"], ids[mask]

    def encode_docs(self, docs, min_len):
        """Each document's ids as a tensor (documents of fewer than min_len tokens left out)."""
        out = []
        for d in docs:
            t = torch.tensor(self.tok.encode(d.decode("utf-8", errors="replace")), dtype=torch.long)
            if len(t) >= min_len:
                out.append(t)
        return out


@torch.no_grad()
def answer(model, prompts, n_new, dev):
    """Greedy continuations of equal-length prompts (no padding needed), KV-cached.
    Special tokens are never chosen (the target only ever saw bytes)."""
    ids = torch.tensor([[BOS, USER] + list(p) + [ASSISTANT] for p in prompts], device=dev)
    caches = [dict() for _ in model.layers]
    logits = model(ids, 0, caches)[:, -1]
    pos, out = ids.shape[1], []
    for _ in range(n_new):
        logits = logits.float()
        logits[:, 256:] = float("-inf")
        nxt = logits.argmax(-1)
        out.append(nxt)
        logits = model(nxt[:, None], pos, caches)[:, -1]
        pos += 1
    return [bytes(r) for r in torch.stack(out, 1).tolist()]


def write_chat(path, prompts, answers):
    with open(path + ".tmp", "w") as f:
        for p, a in zip(prompts, answers):
            f.write(json.dumps({"messages": [{"role": "user", "content": p.decode("latin-1")},
                                             {"role": "assistant", "content": a.decode("latin-1")}]}) + "\n")
    os.replace(path + ".tmp", path)


def make_chat(model, corpus, n, rng, lens, n_new, batch, dev, path, what="corpus"):
    """n prompts (draw_prompts); prompts of one length are answered together (so no padding
    is needed)."""
    prompts, answers, t0 = [], [], time.time()
    for group in draw_prompts(corpus, n, rng, lens, what):
        for i in range(0, len(group), batch):
            chunk = group[i:i + batch]
            prompts += chunk
            answers += answer(model, chunk, n_new, dev)
    write_chat(path, prompts, answers)
    log(f"{path}: {len(prompts)} prompts, {n_new} greedy bytes each, {time.time() - t0:.0f}s")


def write_prompts(corpus, n, rng, lens, path, what="corpus"):
    """The prompts make_chat would answer (the same draws from rng), as chat JSONL with the
    user turn only: target_generate and dflash_eval render them as <|bos|> <|user|> prompt
    <|assistant|>, the layout the answers of make_chat follow."""
    prompts = [p for group in draw_prompts(corpus, n, rng, lens, what) for p in group]
    with open(path + ".tmp", "w") as f:
        for p in prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": p.decode("latin-1")}]}) + "\n")
    os.replace(path + ".tmp", path)
    log(f"{path}: {len(prompts)} prompts (no answers: target_generate writes them)")


# ---- main -----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--out", required=True, help="model directory to write")
    ap.add_argument("--data", help="directory for chat-train.jsonl / chat-heldout.jsonl (byte vocabulary)")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="a byte-level BPE tokenizer directory (scripts/train_bpe.py): train on its tokens "
                         "instead of bytes; --out gets the model beside the tokenizer files; no answers")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the shape's)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds of training: the step count is set from the first steps' speed")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None, help="sequences per optimizer step (default: the shape's)")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="sequences per forward/backward pass; --batch / this many passes are summed into "
                         "one step (gradient accumulation; default: the shape's, 8 for 0.6b, else --batch)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--with-tests", action="store_true", help="train on the stdlib's test files too")
    ap.add_argument("--corpus", default="stdlib",
                    help="stdlib (default), or demo:F: F of the documents are structured text from "
                         "scripts/demo_corpus.py (logs, tables, records, generated code), drawn with --seed")
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--n-heldout", type=int, default=64)
    ap.add_argument("--prompts-only", action="store_true",
                    help="write the prompts only (prompts-train.jsonl, prompts-heldout.jsonl: chat JSONL with "
                         "the user turn) for target_generate to answer; no answers here")
    ap.add_argument("--prompt-lens", default="64,96,128", metavar="L1,L2,...",
                    help="prompt lengths in bytes, each prompt's drawn from these (default 64,96,128); a prompt "
                         "of L bytes is cut from a document of more than max(400, L + 100) bytes, shorter ones "
                         "are skipped for it")
    ap.add_argument("--resp-len", type=int, default=224, help="greedy bytes per answer")
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if not a.tokenizer and not a.data:
        ap.error("--data is required (the byte target answers prompts into it)")
    c = dict(SHAPES[a.shape])
    seq, bs, lr = a.seq or c["seq"], a.batch or c["batch"], a.lr or c["lr"]
    mb = a.micro_batch or min(bs, c.get("micro", bs))
    if mb < 1 or bs % mb:
        ap.error(f"--micro-batch {mb} must divide the batch {bs}")
    if a.prompts_only and a.tokenizer:
        ap.error("--prompts-only writes byte-vocabulary prompts; a --tokenizer target writes none")
    try:
        lens = [int(x) for x in a.prompt_lens.split(",")]
    except ValueError:
        lens = []
    if not lens or min(lens) < 1:
        ap.error(f"--prompt-lens {a.prompt_lens!r}: expected lengths >= 1 separated by commas")
    if seq > c["max_pos"]:
        ap.error(f"--seq {seq} is longer than the shape's max_position_embeddings {c['max_pos']}")
    dev = a.device
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    train, held = load_corpus(a.with_tests)
    if not train or not held:
        sys.exit("train_target: no Python standard library sources found")
    log(f"corpus: {len(train)} train files ({sum(map(len, train)) / 1e6:.1f} MB), {len(held)} held-out "
        f"({sum(map(len, held)) / 1e6:.1f} MB) from {stdlib_root()}")
    if a.corpus != "stdlib":  # structured documents beside (or instead of) the stdlib
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import demo_corpus
        try:
            train, held = demo_corpus.mix(a.corpus, train, held, a.seed)
        except ValueError as e:
            ap.error(str(e))
    bpe, unit = None, "bytes"
    if not a.tokenizer:
        for L in sorted(set(lens)):  # before training: every length can be cut from both sets
            prompt_docs(train, L, "training")
            prompt_docs(held, L, "held-out")
        # training windows of seq + 1 bytes: documents shorter than seq + 2 cannot hold one
        # (every file can at the default --seq: files are >= 2 KiB)
        nt, nh = len(train), len(held)
        train_w, held_w = [d for d in train if len(d) >= seq + 2], [d for d in held if len(d) >= seq + 2]
        if not train_w or not held_w:
            sys.exit(f"train_target: no {'training' if not train_w else 'held-out'} document holds a window of "
                     f"--seq {seq} + 1 bytes")
        if len(train_w) < nt or len(held_w) < nh:
            log(f"--seq {seq}: windows from the {len(train_w)} of {nt} training and {len(held_w)} of {nh} held-out "
                f"files of at least {seq + 2} bytes (prompts still from all that fit them)")
    else:
        train_w = held_w = None
    if a.tokenizer:
        bpe, unit = BpeVocab(a.tokenizer), "tokens"
        n_bytes = sum(map(len, train))
        train, held = bpe.encode_docs(train, seq + 2), bpe.encode_docs(held, seq + 2)
        train_w, held_w = train, held
        n_tok = sum(map(len, train))
        log(f"{a.tokenizer}: vocab {bpe.size}; {n_tok} training tokens ({n_bytes / max(n_tok, 1):.2f} bytes "
            f"per token), {len(train)} + {len(held)} files of at least {seq + 2} tokens")
        if not train or not held:
            sys.exit("train_target: no document is long enough for --seq")
        c["vocab"] = bpe.size
    V = c.get("vocab", VOCAB)
    model = Model(c).to(dev)
    model.set_rope(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: shape {a.shape}, {n_params / 1e6:.2f}M params on {dev}; batch {bs} x {seq} {unit}"
        + (f" in micro-batches of {mb}" if mb < bs else "") + f", lr {lr}")
    kw = {"fused": True} if dev.startswith("cuda") else {}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    it = batches(train_w, seq + 1, bs, rng)
    steps = a.steps or c["steps"] or 1000
    warm = max(10, min(200, steps // 15))
    t0, t_probe = time.time(), None
    step = 0
    while step < steps:
        frac = step / steps
        cur = lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = cur
        b = next(it).to(dev, non_blocking=True)  # the whole batch: the same draws whatever mb is
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for m in range(0, bs, mb):  # gradient accumulation: the mean over bs is the sum of mean/(bs/mb)
            with torch.autocast("cuda" if dev.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                                enabled=dev.startswith("cuda")):
                logits = model(b[m:m + mb, :-1])
            part = F.cross_entropy(logits.float().reshape(-1, V), b[m:m + mb, 1:].reshape(-1)) * (mb / bs)
            part.backward()
            loss += part.detach()
            del logits, part  # this micro-batch's activations go before the next one's
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 1 and dev.startswith("cuda"):  # what the recipe's memory arithmetic predicts
            free, total = torch.cuda.mem_get_info()
            log(f"GPU memory: peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated in the first step "
                f"({mb} sequences of {seq} at a time), {free / 2**30:.1f} of {total / 2**30:.1f} GiB free after it")
        if a.time_budget and step == 20:  # 20 steps timed after the first 10 (warm-up)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            dt = (time.time() - t_probe) / 10
            steps = max(40, int(a.time_budget / dt))
            warm = max(10, min(200, steps // 15))
            log(f"{dt * 1e3:.0f} ms/step: {steps} steps fit the {a.time_budget:.0f}s budget")
        if a.time_budget and step == 10:
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            t_probe = time.time()
        if step % max(1, steps // 12) == 0 or step == steps:
            log(f"step {step:5d}/{steps} loss {loss.item():.3f} ({loss.item() / math.log(2):.2f} bits/{unit[:-1]}) "
                f"lr {cur:.2e} {time.time() - t0:.0f}s")
    model.eval()
    # held-out loss on a fixed sample of held-out files
    hrng = random.Random(a.seed + 1)
    with torch.no_grad(), torch.autocast("cuda" if dev.startswith("cuda") else "cpu", dtype=torch.bfloat16,
                                         enabled=dev.startswith("cuda")):
        hb = next(batches(held_w, seq + 1, min(bs, 64), hrng)).to(dev)
        hl = sum(F.cross_entropy(model(hb[m:m + mb, :-1]).float().reshape(-1, V), hb[m:m + mb, 1:].reshape(-1),
                                 reduction="sum").item() for m in range(0, len(hb), mb)) / hb[:, 1:].numel()
    log(f"held-out loss {hl:.3f} ({hl / math.log(2):.2f} bits/{unit[:-1]})")
    reset_mask_row(model, a.seed, MASK if bpe is None else bpe.mask)
    if bpe is not None and os.path.realpath(a.out) != os.path.realpath(a.tokenizer):
        os.makedirs(a.out, exist_ok=True)
        for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(a.tokenizer, fn)):
                shutil.copyfile(os.path.join(a.tokenizer, fn), os.path.join(a.out, fn))
    save_model(model, a.out, a.shape, bpe)
    log(f"wrote {a.out} (bf16)")
    if bpe is not None:  # the chat target answers through target_generate or dflash_eval, in C
        log(f"done in {time.time() - t0:.0f}s")
        return

    os.makedirs(a.data, exist_ok=True)
    if a.prompts_only:  # target_generate answers them from the saved weights
        write_prompts(train, a.n_train, rng, lens, os.path.join(a.data, "prompts-train.jsonl"), "training")
        write_prompts(held, a.n_heldout, rng, lens, os.path.join(a.data, "prompts-heldout.jsonl"), "held-out")
        log(f"done in {time.time() - t0:.0f}s")
        return
    # the target answers, greedily, from its bf16 weights (what the pipeline will load)
    model = model.to(torch.bfloat16) if dev.startswith("cuda") else model
    make_chat(model, train, a.n_train, rng, lens, a.resp_len, a.gen_batch, dev,
              os.path.join(a.data, "chat-train.jsonl"), "training")
    make_chat(model, held, a.n_heldout, rng, lens, a.resp_len, a.gen_batch, dev,
              os.path.join(a.data, "chat-heldout.jsonl"), "held-out")
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
