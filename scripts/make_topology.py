#!/usr/bin/env python3
"""make_topology.py: write a topology (docs/topology.md) for your own target checkpoint.

    python3 scripts/make_topology.py --target DIR --data SHARD_OR_GLOB... --gpus N|0,1,2 \\
        [--backend cuda|cpu] [--out FILE] [--run-dir DIR] [--name NAME] [--drafter-layers 5]
        [--capture N | --capture-layers 1,9,17] [--block-size 16] [--anchors N] [--token-budget T]
        [--max-seq-len L] [--epochs E] [--lr LR] [--rates target=..,postproc=..,drafter=..]
        [--mask-token-id ID] [--checkpoint-every N | --checkpoint-minutes M] [--print]

Reads DIR/config.json (never the weights) and the shards' headers and offsets (format of
common/io/shard.h), and writes a topology the orchestrator accepts. The reasoning (shape,
data, rates, split, expected bottleneck, cadence) goes to stderr; --print also writes the
topology to stdout. Python 3 standard library only.

Targets: Qwen3ForCausalLM, Qwen3MoeForCausalLM (mixture of experts, e.g. Qwen3-30B-A3B and
Qwen3-Coder-30B-A3B: the expert fields are read as common/io/hfconfig.c reads them) and
LlamaForCausalLM.

What it decides, and from what:
  capture layers  the DFlash default spread for the target's depth L, the rule of
                  dflash_default_layer_ids (common/dflash/dflash_config.c, docs/dflash_spec.md):
                  n layers at round(1 + i*(L-4)/(n-1)) (halves away from zero), L/2 when n = 1.
                  n = --capture, by default the drafter's layer count (as the public drafters
                  do: 5 layers, 5 captured); 36 layers -> 1, 9, 17, 25, 33.
  mask token id   --mask-token-id, else per family: a byte-level target of this repository
                  (DIR/byte_tokenizer.json) uses its "mask" entry; a tokenizer directory
                  whose tokenizer_config.json names a mask_token (an added token of its
                  tokenizer.json, e.g. models/tiny-chat's <|MASK|>) uses that; Qwen3 and Qwen3-MoE (151936-row
                  vocabulary) uses 151669, the id of the public Qwen3 DFlash drafters (the
                  "<|MASK|>" token added after the tokenizer's 151669 entries). Llama has no
                  id we could confirm from the public drafters: --mask-token-id is required.
  slot sizes      the batch layout of common/io/batch.c (batch_layout) at the worst case:
                  T = token_budget tokens, 256 documents (BATCH_MAX_DOCS), the drafter's
                  anchors (pd ring only), features T x n_capture x hidden in bf16 (cuda) or
                  fp32 (cpu); rounded up to a MiB.
  gamma           dflash_default_gamma(block size): 7 for 16, 5 for 10, 4 for 8.
  memory          per GPU (stderr): the target's bf16 weights of the layers it runs (the
                  embedding and layers 0..max(capture); for a mixture of experts EVERY
                  expert of every sparse layer, since any token may be routed to any of
                  them: Qwen3-30B-A3B holds 30.5B parameters, 3.3B of them active per
                  token), a rough bound on its fp32 workspace for token_budget tokens, the
                  drafter (18 bytes a trained parameter: fp32 weights, gradient, AdamW m and
                  v, the bf16 mirror; plus the bf16 embedding / lm_head), and the ring slots
                  placed on that GPU. A GPU whose estimate passes --gpu-mem-gib (default 80,
                  an H100) is refused with the numbers (cuda backend).
  GPU split       from per-GPU stage rates in tokens/s: the H200 measurements of
                  bench/results/pipeline/ (Qwen3-1.7B: target 173K, drafter 29.8K; Qwen3-8B:
                  40.5K and 12.0K; postproc about 10M), scaled to this target by FLOPs per
                  token (a MoE target: its ACTIVE parameters, the router and k experts per
                  sparse layer; routing costs more than that count says, so take it as an
                  upper bound), or --rates. Two layouts are compared: "split" (t GPUs run targets,
                  the other n - t each a postproc + drafter rank) and "shared" (every GPU runs
                  a target, a postproc and a drafter rank); the higher predicted rate wins,
                  "shared" only by more than 10% (its processes also lose time to switching,
                  which the prediction leaves out). One GPU: everything shares it.
  steps, cadence  the epoch plan's batch count estimated as the orchestrator packs it
                  (length buckets, greedy up to token_budget), one optimizer step per batch
                  per drafter rank; checkpoint_every = the steps of about --checkpoint-minutes
                  (30) at the predicted rate, but at least 10 checkpoints per run.

Exit codes: 0 written; 2 bad input (no config.json, unknown family, unreadable shard, empty
GPU list, a shape the defaults cannot serve): one line naming the file and the field.
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

# --- constants mirrored from the C code (each names its source) -------------------------------
BATCH_HEADER_BYTES = 3184    # sizeof(batch_header), common/io/batch.h
BATCH_MAX_DOCS = 256         # common/io/batch.h
SHARD_HEADER_BYTES = 64      # common/io/shard.h
SHARD_MAGIC = b"DFSHARD1"
QWEN3_VOCAB = 151936
QWEN3_MASK = 151669          # "<|MASK|>" of the public Qwen3 DFlash drafters
SHARED_MARGIN = 1.10         # choose_split
MAX_GPU = 7                  # TOPOLOGY_MAX_GPU, common/io/topology.h

# Measured on one H200 (bench/results/pipeline/pipeline_{1.7b,8b}.json): target alone at
# T = 8192, drafter alone at S = 2048 with 512 anchors, postproc busy rate in the pipeline.
REFERENCE = {
    "Qwen3-1.7B": dict(shape=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                  num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                  vocab_size=QWEN3_VOCAB),
                       capture=[1, 7, 13, 19, 25], target=173_000, drafter=29_800, postproc=10_000_000),
    "Qwen3-8B": dict(shape=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                vocab_size=QWEN3_VOCAB),
                     capture=[1, 9, 17, 25, 33], target=40_500, drafter=12_000, postproc=10_000_000),
}


class Bad(Exception):
    """Bad input: the message names the file / field; exit 2."""


def log(msg=""):
    print(msg, file=sys.stderr)


# --- the rules ---------------------------------------------------------------------------------
def default_layer_ids(n, L):
    """dflash_default_layer_ids: lround is half away from zero (not Python's round)."""
    if n == 1:
        return [L // 2]
    return [int(math.floor(1.0 + i * (L - 4) / (n - 1) + 0.5)) for i in range(n)]


def default_gamma(B):
    """dflash_default_gamma."""
    if B == 16:
        return 7.0
    if B == 10:
        return 5.0
    if B == 8:
        return 4.0
    g = math.floor(B / 2.3 * 10.0 + 0.5) / 10.0
    return g if g > 0 else 1.0


def align(x, a):
    return (x + a - 1) // a * a


def batch_bytes(T, n_capture, d, esz, n_docs=0, anchors=0, pd=False):
    """batch_layout (common/io/batch.c): header, tokens, mask, [anchors, keep], features."""
    o = align(BATCH_HEADER_BYTES, 64)
    o += 4 * T
    o = align(o + T, 64)
    na = n_docs * anchors if pd else 0
    o += 4 * na
    o = align(o + na, 256)
    return o + T * n_capture * d * esz


def layer_params(c, layer=None, active=False):
    """Weights of one decoder layer (norms left out). A sparse MoE layer: the router and all E
    experts as stored, or (active) the router and the k experts one token runs."""
    d, hd = c["hidden_size"], c["head_dim"]
    H, KV, I = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    attn = d * H * hd * 2 + d * KV * hd * 2
    moe = c.get("moe")
    if moe and layer is not None and moe["sparse"][layer]:
        return attn + moe["E"] * d + (moe["k"] if active else moe["E"]) * 3 * d * moe["F"]
    return attn + 3 * d * I


def target_flops(c, capture):
    """Forward FLOPs per token up to the last captured layer (docs/performance.md); a MoE
    layer counts what one token runs (router + k experts)."""
    return 2 * sum(layer_params(c, l, active=True) for l in range(max(capture) + 1))


def drafter_params(c, layers, n_capture):
    """The drafter's trained weights: dense layers of the target's width and intermediate_size
    (drafter_worker/trainer.c build_config), the fc projection of the captured features."""
    return layers * layer_params(c) + n_capture * c["hidden_size"] * c["hidden_size"]


def drafter_flops(c, layers, n_capture):
    """Relative drafter cost per token: its layers, the fc projection and the vocabulary head."""
    return drafter_params(c, layers, n_capture) + c["hidden_size"] * c["vocab_size"]


def memory_per_gpu(c, capture, drafter_layers, budget, workers, rings, cpu):
    """{gpu: (total bytes, [(what, bytes)])}: the estimate the docstring describes."""
    d, V = c["hidden_size"], c["vocab_size"]
    wsz = 4 if cpu else 2  # the CPU target converts its weights to fp32
    run = max(capture) + 1
    tgt_params = V * d + sum(layer_params(c, l) for l in range(run))
    qd, kvd = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    moe = c.get("moe")
    wide = max(c["intermediate_size"], moe["k"] * moe["F"] if moe else 0)
    tgt_ws = budget * (4 * d + 2 * qd + 2 * kvd + 2 * wide + (2 * moe["E"] if moe else 0)) * 4
    n_emb = 1 if c["tie_word_embeddings"] else 2
    drf = 18 * drafter_params(c, drafter_layers, len(capture)) + 2 * n_emb * V * d
    out = {}
    for w in workers:
        items = out.setdefault(w["gpu"], [])
        if w["role"] == "target":
            what = f"target weights ({tgt_params / 1e9:.2f}B parameters of {run} layers"
            if moe:
                ns = sum(moe["sparse"][:run])
                what += f", all {moe['E']} experts of {ns} sparse layers"
            items.append((what + ")", tgt_params * wsz))
            items.append(("target workspace (rough)", tgt_ws))
        elif w["role"] == "drafter":
            items.append(("drafter (weights + AdamW, embedding / lm_head)", drf))
    for r in rings:
        out.setdefault(r["gpu"], []).append((f"ring {r['name']} slots", r["slots"] * r["slot_bytes"]))
    return {g: (sum(b for _, b in items), items) for g, items in out.items()}


# --- inputs ------------------------------------------------------------------------------------
def read_config(target):
    path = os.path.join(target, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise Bad(f"{path}: no config.json in the target directory (--target must be a Hugging Face model dir)")
    except (OSError, ValueError) as e:
        raise Bad(f"{path}: cannot read: {e}")
    if not isinstance(cfg, dict):
        raise Bad(f"{path}: expected a JSON object")
    arch = cfg.get("architectures")
    if not (isinstance(arch, list) and len(arch) == 1 and isinstance(arch[0], str)):
        raise Bad(f"{path}: architectures: expected a list of one string, got {json.dumps(arch)}")
    fam = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe", "LlamaForCausalLM": "llama"}.get(arch[0])
    if fam is None:
        raise Bad(f"{path}: architectures: unknown family {arch[0]} (the pipeline runs Qwen3ForCausalLM, "
                  f"Qwen3MoeForCausalLM and LlamaForCausalLM)")
    if cfg.get("model_type") != fam:
        raise Bad(f"{path}: model_type: expected \"{fam}\" for {arch[0]}, got {json.dumps(cfg.get('model_type'))}")
    if fam == "qwen3_moe" and "intermediate_size" not in cfg:
        cfg = dict(cfg, intermediate_size=6144)  # Qwen3MoeConfig's default; only dense layers use it
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        v = cfg.get(k)
        if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise Bad(f"{path}: {k}: expected a positive integer, got {json.dumps(v)}")
    H = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or (128 if fam == "qwen3" else cfg["hidden_size"] // H)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dtype not in ("bfloat16", "float16", "float32"):
        raise Bad(f"{path}: torch_dtype: unsupported {json.dumps(dtype)} (bfloat16, float16 or float32)")
    shape = dict(hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
                 num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=H, num_key_value_heads=kv,
                 head_dim=hd, vocab_size=cfg["vocab_size"], tie_word_embeddings=bool(cfg.get("tie_word_embeddings")))
    if fam == "qwen3_moe":
        shape["moe"] = read_moe(path, cfg)
    return path, cfg, fam, shape, dtype


def read_moe(path, cfg):
    """The qwen3_moe expert fields, as common/io/hfconfig.c reads them (it refuses the same)."""
    for k, off in (("shared_expert_intermediate_size", 0), ("n_shared_experts", 0), ("num_shared_experts", 0),
                   ("first_k_dense_replace", 0), ("n_group", 1), ("topk_group", 1), ("routed_scaling_factor", 1),
                   ("scoring_func", "softmax"), ("topk_method", "greedy")):
        if cfg.get(k) not in (None, off):
            raise Bad(f"{path}: {k}: {json.dumps(cfg[k])} is not supported (only qwen3_moe's routed experts are "
                      f"implemented)")
    key = "num_experts" if cfg.get("num_experts") is not None or cfg.get("num_local_experts") is None \
        else "num_local_experts"

    def pos(k, v):
        if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise Bad(f"{path}: {k}: expected a positive integer, got {json.dumps(v)}")
        return v
    E = pos(key, cfg.get(key))
    k = pos("num_experts_per_tok", cfg.get("num_experts_per_tok"))
    F = pos("moe_intermediate_size", cfg.get("moe_intermediate_size"))
    step = pos("decoder_sparse_step", cfg.get("decoder_sparse_step", 1))
    if k > E:
        raise Bad(f"{path}: num_experts_per_tok: {k} is more than num_experts ({E})")
    L = cfg["num_hidden_layers"]
    only = cfg.get("mlp_only_layers") or []
    if not (isinstance(only, list) and all(isinstance(x, int) and 0 <= x < L for x in only)):
        raise Bad(f"{path}: mlp_only_layers: expected a list of layer ids in [0, {L}), got {json.dumps(only)}")
    # transformers' rule (Qwen3MoeDecoderLayer): sparse iff not listed and (l + 1) % step == 0
    sparse = [l not in only and (l + 1) % step == 0 for l in range(L)]
    return dict(E=E, k=k, F=F, norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), sparse=sparse)


def tokenizer_mask(target, vocab):
    """(id, why) of the mask token a tokenizer directory names (tokenizer_config.json
    mask_token, an added token of tokenizer.json: models/tiny-chat's <|MASK|>), or None."""
    tc, tj = os.path.join(target, "tokenizer_config.json"), os.path.join(target, "tokenizer.json")
    if not (os.path.exists(tc) and os.path.exists(tj)):
        return None
    try:
        with open(tc, encoding="utf-8") as f:
            name = json.load(f).get("mask_token")
        if isinstance(name, dict):
            name = name.get("content")
        if not isinstance(name, str):
            return None
        with open(tj, encoding="utf-8") as f:
            added = json.load(f).get("added_tokens") or []
    except (OSError, ValueError, AttributeError) as e:
        raise Bad(f"{tc}: cannot read: {e}")
    ids = [t.get("id") for t in added if isinstance(t, dict) and t.get("content") == name]
    if not ids or not isinstance(ids[0], int) or not 0 <= ids[0] < vocab:
        raise Bad(f"{tc}: mask_token {json.dumps(name)} is not an added token of {tj} with an id 0..{vocab - 1}")
    return ids[0], f"the tokenizer's mask_token {name} ({tc})"


def mask_token(target, fam, vocab, given, cfg_path):
    """(id, why)."""
    if given is not None:
        if not 0 <= given < vocab:
            raise Bad(f"--mask-token-id: {given} is outside the vocabulary 0..{vocab - 1} of {cfg_path}")
        return given, "--mask-token-id"
    bt = os.path.join(target, "byte_tokenizer.json")
    if os.path.exists(bt):
        try:
            with open(bt) as f:
                m = json.load(f).get("mask")
        except (OSError, ValueError, AttributeError) as e:
            raise Bad(f"{bt}: cannot read: {e}")
        if not (isinstance(m, int) and 0 <= m < vocab):
            raise Bad(f"{bt}: mask: expected a token id 0..{vocab - 1}, got {json.dumps(m)}")
        return m, f"the byte tokenizer's mask token ({bt})"
    got = tokenizer_mask(target, vocab)
    if got is not None:
        return got
    if fam in ("qwen3", "qwen3_moe") and vocab == QWEN3_VOCAB:
        return QWEN3_MASK, "Qwen3 family (the MoE models share its tokenizer): <|MASK|> of the public Qwen3 DFlash " \
                           "drafters"
    if fam == "llama":
        raise Bad(f"{cfg_path}: architectures: Llama family: no mask token id could be confirmed from the public "
                  f"Llama DFlash drafters; pass --mask-token-id (an id of a token no text uses, e.g. a reserved "
                  f"special token of your tokenizer, or the dflash_config.mask_token_id of the drafter you want to "
                  f"match)")
    raise Bad(f"{cfg_path}: vocab_size: {vocab} is not the Qwen3 tokenizer's ({QWEN3_VOCAB}) and the directory has "
              f"no byte_tokenizer.json: unknown family for the mask token; pass --mask-token-id")


def read_shard(path):
    """(vocab_size, sample lengths) from the header and offsets of one shard."""
    try:
        with open(path, "rb") as f:
            h = f.read(SHARD_HEADER_BYTES)
            if len(h) < SHARD_HEADER_BYTES:
                raise Bad(f"{path}: offset 0: file is {len(h)} bytes, shorter than the {SHARD_HEADER_BYTES}-byte header")
            if h[:8] != SHARD_MAGIC:
                raise Bad(f"{path}: offset 0: bad magic (not a DFSHARD1 token shard)")
            version, vocab, n, ntok = struct.unpack_from("<IIQQ", h, 8)
            if version != 1:
                raise Bad(f"{path}: offset 8: version {version}, this script reads 1")
            if n == 0:
                raise Bad(f"{path}: offset 16: n_samples is 0")
            raw = f.read(8 * (n + 1))
    except OSError as e:
        raise Bad(f"{path}: cannot read the shard: {e.strerror}")
    if len(raw) != 8 * (n + 1):
        raise Bad(f"{path}: offset 64: offsets[] truncated ({len(raw)} of {8 * (n + 1)} bytes)")
    offs = struct.unpack(f"<{n + 1}Q", raw)
    if offs[0] != 0 or offs[-1] != ntok:
        raise Bad(f"{path}: offset 64: offsets[] do not run from 0 to n_tokens ({ntok})")
    lens = [offs[i + 1] - offs[i] for i in range(n)]
    if min(lens) < 0:
        raise Bad(f"{path}: offset 64: offsets[] decrease")
    return vocab, lens


def expand_data(specs):
    paths = []
    for s in specs:
        if any(ch in s for ch in "*?["):
            m = sorted(glob.glob(s))
            if not m:
                raise Bad(f"--data: {s}: no shard matches")
            paths += m
        else:
            paths.append(s)
    return paths


def plan_batches(lens, msl, budget):
    """The batch count of ledger_plan_build (common/ipc/ledger.c): samples truncated to msl,
    grouped by length bucket floor(2 log2 len), packed greedily up to the token budget. The
    real plan shuffles inside each bucket first, so the count can differ by a little."""
    buckets = {}
    for x in lens:
        x = min(x, msl)
        buckets.setdefault((x * x).bit_length() - 1, []).append(x)
    nb, tokens = 0, 0
    for b in buckets.values():
        fill = None
        for x in b:
            if fill is None or fill + x > budget:
                nb += 1
                fill = 0
            fill += x
            tokens += x
    return nb, tokens


def parse_gpus(s):
    s = s.strip()
    if not s:
        raise Bad("--gpus: empty GPU list (give a count N or ids like 0,1,2)")
    if "," not in s:
        try:
            n = int(s)
        except ValueError:
            raise Bad(f"--gpus: expected a count N or ids like 0,1,2, got {s!r}")
        if n < 1:
            raise Bad(f"--gpus: empty GPU list ({n} GPUs); give a count >= 1 or ids like 0,1,2")
        if n > MAX_GPU + 1:
            raise Bad(f"--gpus: {n} GPUs, the topology addresses at most {MAX_GPU + 1} (ids 0..{MAX_GPU})")
        return list(range(n))
    ids = []
    for part in s.split(","):
        if part.strip() == "":
            continue
        try:
            g = int(part)
        except ValueError:
            raise Bad(f"--gpus: {part!r} is not a GPU id")
        if not 0 <= g <= MAX_GPU:
            raise Bad(f"--gpus: GPU id {g} outside 0..{MAX_GPU}")
        if g in ids:
            raise Bad(f"--gpus: GPU {g} listed twice")
        ids.append(g)
    if not ids:
        raise Bad("--gpus: empty GPU list (give a count N or ids like 0,1,2)")
    return ids


def parse_rates(s):
    out = {}
    for part in s.split(","):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in ("target", "postproc", "drafter"):
            raise Bad(f"--rates: unknown stage {k!r} (target, postproc, drafter)")
        try:
            x = float(v)
        except ValueError:
            raise Bad(f"--rates: {k}: expected tokens/s, got {v!r}")
        if not x > 0:
            raise Bad(f"--rates: {k}: expected tokens/s > 0, got {v}")
        out[k] = x
    return out


# --- the split ---------------------------------------------------------------------------------
def choose_split(gpus, rt, rd, rp):
    """[(layout, targets, drafters, predicted tok/s, note)], best first."""
    n = len(gpus)
    shared_one = 1.0 / (1.0 / rt + 1.0 / rd + 1.0 / rp)  # one GPU time-shared by the three stages
    opts = [("shared", n, n, n * shared_one,
             f"every GPU runs target + postproc + drafter: {n} x 1/(1/{rt:.0f} + 1/{rd:.0f} + 1/{rp:.0f})")]
    if n >= 2:
        best = max(range(1, n), key=lambda t: (min(t * rt, (n - t) * min(rd, rp)), -t))
        d = n - best
        opts.append(("split", best, d, min(best * rt, d * min(rd, rp)),
                     f"{best} target GPU(s), {d} postproc + drafter GPU(s): min({best} x {rt:.0f}, {d} x {rd:.0f})"))
    # a GPU shared by three processes loses time to switching between them, which the sum of
    # reciprocals leaves out: "shared" must beat "split" by more than SHARED_MARGIN to be chosen
    opts.sort(key=lambda o: -o[3] / (SHARED_MARGIN if o[0] == "shared" and n >= 2 else 1.0))
    return opts


def build(a):
    cfg_path, cfg, fam, shape, dtype = read_config(a.target)
    L, d, V = shape["num_hidden_layers"], shape["hidden_size"], shape["vocab_size"]
    cpu = a.backend == "cpu"

    # capture layers
    if a.capture_layers:
        try:
            capture = [int(x) for x in a.capture_layers.split(",")]
        except ValueError:
            raise Bad(f"--capture-layers: expected integers like 1,9,17, got {a.capture_layers!r}")
        why_capture = "--capture-layers"
    else:
        n = a.capture if a.capture else a.drafter_layers
        capture = default_layer_ids(n, L)
        why_capture = f"DFlash default for {n} of {L} layers (dflash_default_layer_ids)"
    if any(x < 0 or x >= L for x in capture) or any(y <= x for x, y in zip(capture, capture[1:])):
        raise Bad(f"{cfg_path}: num_hidden_layers: capture layers {capture} ({why_capture}) are not distinct, "
                  f"increasing layers 0..{L - 1} of this {L}-layer target; capture fewer (--capture N) or name "
                  f"them (--capture-layers)")

    mask, why_mask = mask_token(a.target, fam, V, a.mask_token_id, cfg_path)

    # data
    shards = expand_data(a.data)
    lens = []
    for p in shards:
        vs, ls = read_shard(p)
        if vs > V:
            raise Bad(f"{p}: offset 12: vocab_size {vs} is larger than the target's {V} ({cfg_path}): "
                      f"the data was tokenised for another model")
        lens += ls
    if min(lens) == 0:
        raise Bad(f"--data: a sample of length 0 (the plan refuses empty samples)")
    longest = max(lens)
    mpe = cfg.get("max_position_embeddings") or 1 << 20
    msl = a.max_seq_len or min(longest, 512 if cpu else 3072, mpe)
    budget = a.token_budget or max(1024 if cpu else 8192, msl)
    if budget < msl:
        raise Bad(f"--token-budget: {budget} is below --max-seq-len {msl} (a batch holds at least one sample)")
    anchors = a.anchors or (32 if cpu else 512)
    gamma = default_gamma(a.block_size)

    # stage rates and split
    if cpu:
        gpus = [-1]
        layout, n_t, n_d, rate, why_split, ref_name = "cpu", 1, 1, None, "cpu backend: one worker per stage", None
        rt = rd = rp = None
    else:
        gpus = parse_gpus(a.gpus)
        ft = target_flops(shape, capture)
        ref_name = min(REFERENCE, key=lambda k: abs(math.log(ft / target_flops(REFERENCE[k]["shape"],
                                                                               REFERENCE[k]["capture"]))))
        ref = REFERENCE[ref_name]
        rt = ref["target"] * target_flops(ref["shape"], ref["capture"]) / ft
        rd = ref["drafter"] * drafter_flops(ref["shape"], 5, 5) / drafter_flops(shape, a.drafter_layers, len(capture))
        rp = ref["postproc"]
        given = parse_rates(a.rates) if a.rates else {}
        rt, rp, rd = given.get("target", rt), given.get("postproc", rp), given.get("drafter", rd)
        opts = choose_split(gpus, rt, rd, rp)
        layout, n_t, n_d, rate, why_split = opts[0]
    esz = 4 if cpu else 2
    tp_need = batch_bytes(budget, len(capture), d, esz)
    pd_need = batch_bytes(budget, len(capture), d, esz, BATCH_MAX_DOCS, anchors, pd=True)
    MiB = 1 << 20
    tp_bytes, pd_bytes = align(tp_need, MiB), align(pd_need, MiB)

    # rings and workers
    rings, workers = [], []

    def ring(name, slots, nbytes, g):
        rings.append({"name": name, "slots": slots, "slot_bytes": nbytes, "max_attempts": 3, "gpu": g})

    if layout in ("cpu", "shared") and n_t == 1:
        g = gpus[0]
        ring("tp", 8 if cpu else 4, tp_bytes, g)
        ring("pd", 8 if cpu else 4, pd_bytes, g)
        workers += [{"name": "target0", "role": "target", "gpu": g, "out": "tp"},
                    {"name": "postproc0", "role": "postproc", "gpu": g, "in": "tp", "out": "pd"},
                    {"name": "drafter0", "role": "drafter", "gpu": g, "in": "pd", "rank": 0}]
    elif layout == "shared":
        for i, g in enumerate(gpus):
            ring(f"tp{i}", 4, tp_bytes, g)
            ring(f"pd{i}", 3, pd_bytes, g)
            workers += [{"name": f"target{i}", "role": "target", "gpu": g, "out": f"tp{i}"},
                        {"name": f"postproc{i}", "role": "postproc", "gpu": g, "in": f"tp{i}", "out": f"pd{i}"},
                        {"name": f"drafter{i}", "role": "drafter", "gpu": g, "in": f"pd{i}", "rank": i}]
    else:  # split: targets on the first n_t GPUs, one postproc + drafter rank on each other GPU
        for i in range(n_t):
            ring(f"tp{i}", 4, tp_bytes, gpus[i])
            workers.append({"name": f"target{i}", "role": "target", "gpu": gpus[i], "out": f"tp{i}"})
        for r in range(n_d):
            g = gpus[n_t + r]
            ring(f"pd{r}", 3, pd_bytes, g)
            workers += [{"name": f"postproc{r}", "role": "postproc", "gpu": g, "in": f"tp{r % n_t}", "out": f"pd{r}"},
                        {"name": f"drafter{r}", "role": "drafter", "gpu": g, "in": f"pd{r}", "rank": r}]

    mem = memory_per_gpu(shape, capture, a.drafter_layers, budget, workers, rings, cpu)

    # steps and checkpoint cadence
    nb, tokens = plan_batches(lens, msl, budget)
    steps_epoch = -(-nb // n_d)
    steps = steps_epoch * a.epochs
    tok_step = tokens / nb * n_d
    if a.checkpoint_every:
        ck, why_ck = a.checkpoint_every, "--checkpoint-every"
    else:
        frac = max(1, -(-steps // 10))  # at least 10 checkpoints over the run
        if rate:
            per_min = rate * 60 / tok_step
            timed = max(1, int(per_min * a.checkpoint_minutes))
            ck = min(timed, frac)
            why_ck = (f"min(about {a.checkpoint_minutes:g} min at the predicted {per_min:.1f} steps/min = {timed}, "
                      f"a tenth of the {steps} steps = {frac})")
        else:
            ck = frac
            why_ck = f"a tenth of the {steps} steps (no rate on the cpu backend)"

    name = a.name or "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in
                             os.path.basename(os.path.normpath(a.target)))[:63] or "run"
    run_dir = a.run_dir or f"run/{name}"
    sliding = drafter_sliding(a)
    desc = (f"training run for {os.path.normpath(a.target)} ({arch_name(cfg)}, {L} layers, d {d}) written by "
            f"scripts/make_topology.py: {len(workers)} workers, {layout} layout on "
            f"{'the CPU' if cpu else 'GPUs ' + ','.join(map(str, gpus))}")
    topo = {
        "version": 1, "name": name, "description": desc[:1024], "run_dir": run_dir, "backend": a.backend,
        "seed": a.seed, "deterministic": False,
        "target": {"model_dir": a.target, "capture_layers": capture},
        "drafter": {"num_layers": a.drafter_layers, "block_size": a.block_size, "num_anchors": anchors,
                    "gamma": gamma, "lr": a.lr, "warmup_frac": 0.04, "weight_decay": 0.0, "grad_clip": 1.0,
                    "noise_std": 0.0, "epochs": a.epochs, "checkpoint_every": ck, "keep_checkpoints": 3,
                    "init_dir": None, "mask_token_id": mask, **sliding},
        "data": {"shards": shards, "token_budget": budget, "max_seq_len": msl},
        "rings": rings, "workers": workers,
        "supervision": {"backoff_initial_ms": 100, "backoff_max_ms": 5000, "stable_ms": 10000, "max_restarts": 5,
                        "restart_window_s": 60, "heartbeat_timeout_ms": 30000 if cpu else 60000,
                        "shutdown_timeout_ms": 10000, "metrics_interval_ms": 1000},
    }

    # the reasoning
    log(f"make_topology: target {cfg_path}: {arch_name(cfg)}, {L} layers, hidden {d}, heads "
        f"{shape['num_attention_heads']}/{shape['num_key_value_heads']}, vocab {V}, {dtype}")
    moe = shape.get("moe")
    if moe:
        total = V * d * (1 if shape["tie_word_embeddings"] else 2) + sum(layer_params(shape, l) for l in range(L))
        active = V * d * (1 if shape["tie_word_embeddings"] else 2) + \
            sum(layer_params(shape, l, active=True) for l in range(L))
        log(f"  mixture of experts: {sum(moe['sparse'])} of {L} layers sparse, {moe['E']} experts of width "
            f"{moe['F']}, top {moe['k']}{' renormalised' if moe['norm_topk_prob'] else ''}; {total / 1e9:.2f}B "
            f"parameters, {active / 1e9:.2f}B active per token")
        if not cpu:
            log("  note: the CUDA target runs the experts with its grouped kernels (docs/target_cuda.md, "
                "\"Mixture of experts\"); the rates below scale dense measurements by active FLOPs")
    log(f"  capture layers {capture}: {why_capture}")
    log(f"  mask token id {mask}: {why_mask}")
    log(f"  data: {len(shards)} shard(s), {len(lens)} samples, {sum(lens)} tokens, longest {longest}; "
        f"max_seq_len {msl}, token_budget {budget}")
    log(f"  plan: about {nb} batches per epoch ({tokens / nb:.0f} tokens each), {n_d} drafter rank(s) -> "
        f"{steps_epoch} steps per epoch, {steps} over {a.epochs} epoch(s)")
    log(f"  drafter: {a.drafter_layers} layers, block {a.block_size}, {anchors} anchors per document, gamma {gamma:g}, "
        f"lr {a.lr:g}")
    feat = "bf16" if esz == 2 else "fp32"
    log(f"  slots: tp {tp_need} bytes needed (header + {budget} tokens + {budget} x {len(capture)} x {d} {feat} "
        f"features) -> {tp_bytes}; pd {pd_need} bytes (+ {BATCH_MAX_DOCS} docs x {anchors} anchors) -> {pd_bytes}")
    if cpu:
        log(f"  split: {why_split}")
    else:
        src = "--rates" if a.rates else f"H200 measurements of {ref_name} scaled by FLOPs per token"
        log(f"  rates per GPU (tokens/s, {src}): target {rt:.0f}, postproc {rp:.0f}, drafter {rd:.0f}")
        for o in opts:
            log(f"  layout {o[0]:6}: {o[4]} = {o[3]:.0f} tok/s{'   <- chosen' if o is opts[0] else ''}")
        slow = min(("target", n_t * rt), ("postproc", n_d * rp), ("drafter", n_d * rd), key=lambda x: x[1])
        if layout == "shared":
            log(f"  expected bottleneck: the shared GPU(s) (the drafter's {rd:.0f} tok/s is most of each GPU's time); "
                f"about {rate:.0f} tok/s, {rate / tok_step * 3600:.0f} steps/hour")
        else:
            log(f"  expected bottleneck: {slow[0]} ({slow[1]:.0f} tok/s in all); about {rate:.0f} tok/s, "
                f"{rate / tok_step * 3600:.0f} steps/hour, {steps * tok_step / rate / 3600:.2f} h for the run")
    GiB = 1 << 30
    over = []
    for g, (tot, items) in sorted(mem.items()):
        where = "host (cpu backend)" if g < 0 else f"GPU {g}"
        log(f"  memory {where}: {tot / GiB:.1f} GiB = " + " + ".join(f"{w} {b / GiB:.2f}" for w, b in items))
        if not cpu and tot > a.gpu_mem_gib * GiB:
            over.append(f"GPU {g}: {tot / GiB:.1f} GiB")
    if over:
        raise Bad(f"{cfg_path}: the estimate passes --gpu-mem-gib {a.gpu_mem_gib:g} on {', '.join(over)} (see the "
                  f"lines above); use more GPUs (--gpus), fewer captured layers, a smaller --token-budget, or raise "
                  f"--gpu-mem-gib for a larger card")
    log(f"  checkpoint_every {ck}: {why_ck}")
    return topo


def arch_name(cfg):
    return cfg["architectures"][0]


def dumps(topo):
    """One key per line at the top, nested objects on one line, one ring / worker per line."""
    out = ["{"]
    keys = list(topo)
    for i, k in enumerate(keys):
        v = topo[k]
        end = "," if i < len(keys) - 1 else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            out.append(f'  "{k}": [')
            out += [f"    {json.dumps(x)}{',' if j < len(v) - 1 else ''}" for j, x in enumerate(v)]
            out.append(f"  ]{end}")
        else:
            out.append(f'  "{k}": {json.dumps(v)}{end}')
    out.append("}")
    return "\n".join(out) + "\n"


def drafter_sliding(a):
    """drafter.layer_types / sliding_window from --sliding-window and --layer-types (docs/topology.md)."""
    if a.sliding_window is None:
        if a.layer_types:
            raise Bad("--layer-types needs --sliding-window")
        return {}
    if a.sliding_window < 1:
        raise Bad(f"--sliding-window {a.sliding_window}: expected a width >= 1")
    n = a.drafter_layers
    kinds = a.layer_types or "S" * (n - 1) + "F"
    if len(kinds) != n or set(kinds) - set("SF"):
        raise Bad(f"--layer-types {kinds!r}: expected {n} letters (--drafter-layers), each S or F")
    if "S" not in kinds:
        raise Bad(f"--layer-types {kinds!r}: no sliding layer, so --sliding-window would be unused")
    return {"layer_types": ["sliding_attention" if k == "S" else "full_attention" for k in kinds],
            "sliding_window": a.sliding_window}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target model directory (config.json is read, weights are not)")
    ap.add_argument("--data", required=True, nargs="+", help="token shards (.dfs) or globs")
    ap.add_argument("--gpus", help="N (GPUs 0..N-1) or a list 0,1,2 (a single id: '3,'); cuda only")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", help="topology file to write (default: print only, with --print)")
    ap.add_argument("--run-dir", help="run directory (default run/<name>)")
    ap.add_argument("--name", help="run name (default: the target directory's name)")
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--capture", type=int, help="how many target layers to capture (default: --drafter-layers)")
    ap.add_argument("--capture-layers", help="explicit capture layers, e.g. 1,9,17,25,33")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--anchors", type=int, help="anchors per document (default 512 cuda, 32 cpu)")
    ap.add_argument("--token-budget", type=int, help="tokens per batch (default max(8192 cuda / 1024 cpu, max-seq-len))")
    ap.add_argument("--max-seq-len", type=int, help="default min(longest sample, 3072 cuda / 512 cpu)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--rates", help="per-GPU stage rates in tokens/s: target=..,postproc=..,drafter=..")
    ap.add_argument("--mask-token-id", type=int)
    ap.add_argument("--sliding-window", type=int,
                    help="sliding-window attention of this width in the drafter's layers (default: none, all full)")
    ap.add_argument("--layer-types",
                    help="with --sliding-window: which drafter layers slide, as one letter a layer (S sliding, "
                         "F full), e.g. SSSSF; default: all but the last")
    ap.add_argument("--checkpoint-every", type=int, help="optimizer steps between checkpoints")
    ap.add_argument("--checkpoint-minutes", type=float, default=30.0, help="target cadence in minutes (default 30)")
    ap.add_argument("--gpu-mem-gib", type=float, default=80.0,
                    help="memory of one GPU for the per-GPU estimate (default 80, an H100; 141 for an H200)")
    ap.add_argument("--print", action="store_true", help="also write the topology to stdout")
    a = ap.parse_args()
    try:
        for k, lo, hi in (("drafter_layers", 1, 64), ("block_size", 2, 1024), ("epochs", 1, 100000),
                          ("anchors", 1, 65536), ("capture", 1, 256), ("token_budget", 1, 2**31 - 1),
                          ("max_seq_len", 1, 1 << 20), ("checkpoint_every", 1, 10**9)):
            v = getattr(a, k)
            if v is not None and not lo <= v <= hi:
                raise Bad(f"--{k.replace('_', '-')}: expected {lo}..{hi}, got {v}")
        if a.backend == "cuda" and a.gpus is None:
            raise Bad("--gpus: required with --backend cuda (a count N or ids like 0,1,2)")
        if a.backend == "cpu" and a.gpus is not None:
            raise Bad("--gpus: the cpu backend runs every worker on the CPU; leave --gpus out")
        if not (a.lr > 0 and a.lr <= 10):
            raise Bad(f"--lr: expected a number in (0, 10], got {a.lr}")
        if not a.checkpoint_minutes > 0:
            raise Bad(f"--checkpoint-minutes: expected > 0, got {a.checkpoint_minutes}")
        topo = build(a)
    except Bad as e:
        print(f"make_topology: {e}", file=sys.stderr)
        return 2
    text = dumps(topo)
    if a.out:
        d = os.path.dirname(a.out)
        if d:
            os.makedirs(d, exist_ok=True)
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
        log(f"make_topology: wrote {a.out}; start it with: build/bin/orchestrator {a.out}")
    if a.print or not a.out:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
