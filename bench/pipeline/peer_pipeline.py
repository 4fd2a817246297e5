#!/usr/bin/env python3
"""peer_pipeline.py: the single-process peer of the whole pipeline (an online trainer on one GPU).

    python3 bench/pipeline/peer_pipeline.py --topology configs/qwen3-8b-s768.json \\
        [--seq 768] [--anchors 256] [--docs-per-batch N] [--warmup 2] [--batches 8] \\
        [--attn auto|flex|sdpa] [--compile] [--experts MODE] [--json PATH]

What it runs, batch after batch, in one process (what a PyTorch online trainer does):
  1. the target forward with transformers (bf16, attn_implementation "sdpa"; --compile wraps
     it in torch.compile, falling back to eager with the reason printed) on a batch of
     documents [docs, S]; forward hooks on exactly the topology's capture layers keep their
     outputs, and the decoder stops after the last capture layer (as our target_worker does:
     no later layer, no lm_head); a mixture-of-experts target (Qwen3MoeForCausalLM) runs the
     same way, its experts on the backend --experts names (transformers 5: eager,
     grouped_mm, batched_mm; default: transformers' own choice), the one that ran recorded;
  2. per document: anchors as the recipe (tests/reference/dflash_torch.py sample_anchors),
     labels and weights (labels_weights), the PyTorch DFlash forward + chunked head/CE +
     backward (drafter_forward, head_loss: flex_attention under torch.compile when it runs,
     else SDPA, the reason printed), gradients accumulated over the batch with one loss
     normaliser (the sum of the batch's weights, as the drafter worker does);
  3. clip the global norm (topology grad_clip) and one fused AdamW step (topology lr and
     weight_decay, betas 0.9 / 0.95, eps 1e-8; constant lr: a schedule costs nothing here).
Documents come from the topology's data.shards (.dfs, docs/data.md), in file order; a
document shorter than S is skipped (counted), a longer one is cut to its first S tokens. A
batch holds --docs-per-batch documents (default: data.token_budget // S, the number our
orchestrator packs into one batch of documents of exactly S tokens). --warmup batches
untimed, then --batches timed: samples/s = documents trained / timed wall time, tokens/s =
samples/s * S, per-phase ms (target forward, drafter step incl. optimizer) per batch,
median. Prints a summary line and writes JSON (--json).

Exit status: 0 done; 1 a failure while running; 2 bad command line / topology (the file and
field named); 100 bad data (the shard, and the byte offset, named).
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import dflash_torch as dt  # noqa: E402  (the recipe's functions, imported, not copied)

SHARD_MAGIC = b"DFSHARD1"
SHARD_HEADER = 64
EXIT_USAGE, EXIT_DATA = 2, 100


class Bad(Exception):
    """A message naming the file and the field / byte offset, and the exit status."""

    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


def log(msg):
    print(f"peer_pipeline: {msg}", flush=True)


def fnv1a64(data, seed=0):
    h = 0xcbf29ce484222325 ^ seed
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---------------------------------------------------------------------------------------
# .dfs shards (docs/data.md; written by scripts/prepare_data.py write_shard)
# ---------------------------------------------------------------------------------------

def read_dfs(path):
    """(vocab_size, [(tokens, loss_mask)]) of one shard, as numpy arrays (uint32, uint8).
    Checks the magic, version, header checksum, the payload size, offsets running from 0 to
    n_tokens without decreasing, and every token below vocab_size; Bad(EXIT_DATA) otherwise."""
    import numpy as np
    try:
        with open(path, "rb") as f:
            b = f.read()
    except OSError as e:
        raise Bad(f"{path}: cannot read the shard: {e.strerror}", EXIT_DATA)
    if len(b) < SHARD_HEADER:
        raise Bad(f"{path}: offset 0: file is {len(b)} bytes, shorter than the {SHARD_HEADER}-byte header", EXIT_DATA)
    if b[:8] != SHARD_MAGIC:
        raise Bad(f"{path}: offset 0: bad magic (not a DFSHARD1 token shard)", EXIT_DATA)
    version, vocab, n, ntok, _payload_hash, head_hash = struct.unpack_from("<IIQQQQ", b, 8)
    if fnv1a64(b[:40]) != head_hash:
        raise Bad(f"{path}: offset 40: header checksum mismatch (the first 40 bytes are damaged)", EXIT_DATA)
    if version != 1:
        raise Bad(f"{path}: offset 8: version {version}, this reader reads 1", EXIT_DATA)
    tok_off = SHARD_HEADER + 8 * (n + 1)
    mask_off = tok_off + (4 * ntok + 7) // 8 * 8
    end = mask_off + (ntok + 7) // 8 * 8
    if len(b) != end:
        raise Bad(f"{path}: offset {min(len(b), end)}: file is {len(b)} bytes, the header's n_samples {n} and "
                  f"n_tokens {ntok} need {end}", EXIT_DATA)
    offs = np.frombuffer(b, dtype="<u8", count=n + 1, offset=SHARD_HEADER).astype(np.int64)
    if n == 0 or offs[0] != 0 or offs[-1] != ntok or (np.diff(offs) < 0).any():
        bad = 0 if n == 0 or offs[0] != 0 else int(np.argmax(np.diff(offs) < 0)) + 1 if (np.diff(offs) < 0).any() else n
        raise Bad(f"{path}: offset {SHARD_HEADER + 8 * bad}: offsets[{bad}]: offsets must run from 0 to n_tokens "
                  f"({ntok}) without decreasing", EXIT_DATA)
    toks = np.frombuffer(b, dtype="<u4", count=ntok, offset=tok_off)
    if ntok and int(toks.max()) >= vocab:
        i = int(np.argmax(toks >= vocab))
        raise Bad(f"{path}: offset {tok_off + 4 * i}: token {int(toks[i])} is outside the vocabulary (size {vocab})",
                  EXIT_DATA)
    mask = np.frombuffer(b, dtype=np.uint8, count=ntok, offset=mask_off)
    docs = [(toks[offs[i]:offs[i + 1]], mask[offs[i]:offs[i + 1]]) for i in range(n)]
    return vocab, docs


def cut_documents(shard_docs, S):
    """Documents of at least S tokens, cut to their first S: (list of (tokens, mask), skipped)."""
    out, skipped = [], 0
    for toks, mask in shard_docs:
        if len(toks) < S:
            skipped += 1
            continue
        out.append((toks[:S], mask[:S]))
    return out, skipped


# ---------------------------------------------------------------------------------------
# topology and the drafter's shape
# ---------------------------------------------------------------------------------------

def load_topology(path):
    """The fields the peer uses, with paths resolved against the repository root (the
    orchestrator's working directory); Bad(EXIT_USAGE) naming the file and JSON path."""
    try:
        t = json.load(open(path))
    except OSError as e:
        raise Bad(f"{path}: cannot read the topology: {e.strerror}", EXIT_USAGE)
    except ValueError as e:
        raise Bad(f"{path}: not valid JSON: {e}", EXIT_USAGE)

    def get(*keys, kind=None, default=None):
        v, where = t, "$"
        for k in keys:
            where += f".{k}"
            if not isinstance(v, dict) or k not in v:
                if default is not None:
                    return default
                raise Bad(f"{path}: {where}: missing", EXIT_USAGE)
            v = v[k]
        if kind is not None and (not isinstance(v, kind) or isinstance(v, bool)):
            raise Bad(f"{path}: {where}: expected {getattr(kind, '__name__', kind)}, got {json.dumps(v)}", EXIT_USAGE)
        return v

    def at_root(p):
        return p if os.path.isabs(p) else os.path.join(ROOT, p)

    topo = dict(
        model_dir=at_root(get("target", "model_dir", kind=str)),
        capture=get("target", "capture_layers", kind=list),
        shards=[at_root(s) for s in get("data", "shards", kind=list)],
        max_seq_len=get("data", "max_seq_len", kind=int),
        token_budget=get("data", "token_budget", kind=int),
        num_layers=get("drafter", "num_layers", kind=int),
        block_size=get("drafter", "block_size", kind=int),
        num_anchors=get("drafter", "num_anchors", kind=int),
        gamma=float(get("drafter", "gamma", kind=(int, float))),
        lr=float(get("drafter", "lr", kind=(int, float))),
        weight_decay=float(get("drafter", "weight_decay", kind=(int, float), default=0.0)),
        grad_clip=float(get("drafter", "grad_clip", kind=(int, float), default=1.0)),
        mask_token_id=t.get("drafter", {}).get("mask_token_id"),
        layer_types=t.get("drafter", {}).get("layer_types"),
        sliding_window=t.get("drafter", {}).get("sliding_window"),
    )
    lt = topo["layer_types"]
    if lt is None:
        topo["layer_types"] = ["full_attention"] * topo["num_layers"]
    elif (not isinstance(lt, list) or len(lt) != topo["num_layers"]
          or any(x not in ("full_attention", "sliding_attention") for x in lt)):
        raise Bad(f"{path}: $.drafter.layer_types: expected {topo['num_layers']} entries (drafter.num_layers), each "
                  f"\"full_attention\" or \"sliding_attention\", got {json.dumps(lt)}", EXIT_USAGE)
    sw = topo["sliding_window"]
    if "sliding_attention" in topo["layer_types"]:
        if not isinstance(sw, int) or isinstance(sw, bool) or sw < 1:
            raise Bad(f"{path}: $.drafter.sliding_window: expected an integer >= 1 (a layer is sliding), got "
                      f"{json.dumps(sw)}", EXIT_USAGE)
    else:
        topo["sliding_window"] = 0
    loss = t.get("drafter", {}).get("loss", "decay")
    if loss != "decay":  # the peer is the bench's comparison for the decay objective only
        raise Bad(f"{path}: $.drafter.loss: the peer trains the decay loss only, got {json.dumps(loss)}", EXIT_USAGE)
    for i, c in enumerate(topo["capture"]):
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise Bad(f"{path}: $.target.capture_layers[{i}]: expected a layer index >= 0, got {json.dumps(c)}",
                      EXIT_USAGE)
    if not topo["capture"]:
        raise Bad(f"{path}: $.target.capture_layers: empty", EXIT_USAGE)
    if not topo["shards"]:
        raise Bad(f"{path}: $.data.shards: empty", EXIT_USAGE)
    return topo


def drafter_config(topo, hf):
    """dflash_torch's config dict of the drafter the pipeline trains (drafter_worker
    build_config): the target's width and heads, the topology's depth, block, capture layers
    and gamma, the topology's layer kinds and window (all full attention when it names none),
    mask token from the topology or vocab - 1."""
    hd = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    mask = topo["mask_token_id"]
    return dict(d=hf["hidden_size"], heads=hf["num_attention_heads"], kv=hf["num_key_value_heads"], hd=hd,
                I=hf["intermediate_size"], V=hf["vocab_size"], B=topo["block_size"], n_capture=len(topo["capture"]),
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=hf.get("rope_theta", 1e6),
                mask_token_id=mask if isinstance(mask, int) and mask >= 0 else hf["vocab_size"] - 1,
                target_layer_ids=list(topo["capture"]), num_target_layers=hf["num_hidden_layers"],
                layer_types=list(topo["layer_types"]), sliding_window=topo["sliding_window"], gamma=topo["gamma"],
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)))


# ---------------------------------------------------------------------------------------
# the drafter's training step over one batch
# ---------------------------------------------------------------------------------------

class Drafter:
    """fp32 master parameters (dflash_torch param_shapes, the bench's init), the frozen bf16
    embedding / lm_head of the target, fused AdamW when the device has it."""

    def __init__(self, cfg, topo, embed, lm_head, dev, seed, attn, chunk=1024):
        torch = dt.torch
        self.cfg, self.dev, self.chunk = cfg, dev, chunk
        self.embed, self.lm_head = embed, lm_head
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.gen = torch.Generator(device=dev).manual_seed(seed + 1)  # anchors
        self.params = {}
        for name, shape in dt.param_shapes(cfg):
            if len(shape) == 1:
                t = torch.ones(shape, device=dev, dtype=torch.float32)
            else:
                t = torch.randn(shape, device=dev, dtype=torch.float32, generator=gen) * 0.02
            self.params[name] = torch.nn.Parameter(t)
        plist = list(self.params.values())
        self.plist = plist
        kw = dict(lr=topo["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=topo["weight_decay"])
        self.fused = False
        if dev.type == "cuda":
            try:
                self.opt = torch.optim.AdamW(plist, fused=True, **kw)
                self.fused = True
            except (TypeError, RuntimeError, ValueError) as e:
                log(f"fused AdamW unavailable ({e}); the default implementation")
        if not self.fused:
            self.opt = torch.optim.AdamW(plist, **kw)
        self.clip = topo["grad_clip"]
        self.head_ce = dt.make_head_ce()
        self.num_anchors = topo["num_anchors"]
        self.attn = attn  # "flex" or "sdpa"

    def batch_step(self, H_list, ids_list, mask_list):
        """One optimizer step over a batch of documents: H_list[k] [S, n*d] bf16, ids [S]
        long, mask [S] long. Returns (loss, anchors used)."""
        torch = dt.torch
        cfg, B = self.cfg, self.cfg["B"]
        prepared, total_w = [], 0.0
        for H, ids, mask in zip(H_list, ids_list, mask_list):
            anchors, keep, n = dt.sample_anchors(mask, self.num_anchors, self.gen)
            labels, w = dt.labels_weights(ids, mask, anchors, keep, B, cfg["gamma"])
            sel, norm = dt.select_rows(w)
            prepared.append((H, ids, anchors, keep, labels, w, sel, n))
            total_w += float(norm)  # the batch's normaliser, as the drafter worker's
        self.opt.zero_grad(set_to_none=True)
        use = "flex" if self.attn == "flex" else hasattr(dt.F, "scaled_dot_product_attention")
        loss_sum, n_anchors = 0.0, 0
        norm_t = torch.tensor(total_w, dtype=torch.float64, device=self.dev)
        for H, ids, anchors, keep, labels, w, sel, n in prepared:
            if sel.numel() == 0:
                continue  # no loss position: contributes nothing
            with torch.autocast(device_type=self.dev.type, dtype=torch.bfloat16, enabled=self.dev.type == "cuda"):
                z = dt.drafter_forward(self.params, cfg, H, ids, anchors, keep, self.embed, use)
                loss, _ = dt.head_loss(z, self.lm_head, labels, w, sel, norm_t, self.chunk, self.head_ce)
            loss.backward()
            loss_sum += loss.detach()
            n_anchors += n
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.plist, self.clip)
        self.opt.step()
        return loss_sum, n_anchors


# ---------------------------------------------------------------------------------------
# the target
# ---------------------------------------------------------------------------------------

def experts_backend(model, want):
    """The experts backend a mixture-of-experts model runs (transformers 5), after switching it
    to want when given (a switch that fails is logged and the default stays); None for a
    dense model."""
    cfg = model.config
    if getattr(cfg, "num_experts", None) is None and getattr(cfg, "num_local_experts", None) is None:
        return None
    if want:
        try:
            if hasattr(model, "set_experts_implementation"):
                model.set_experts_implementation(want)
            else:
                cfg._experts_implementation = want  # older 5.x: the attribute the experts read
        except Exception as e:  # noqa: BLE001 (any reason is printed, then the default)
            log(f"experts backend {want} not set ({type(e).__name__}: {e}); transformers' default")
    for name in ("_experts_implementation", "experts_implementation"):
        v = getattr(cfg, name, None)
        if v is not None:
            return str(v)
    return "default"


class Target:
    """The transformers model, decoder cut after the last capture layer, hooks on exactly the
    capture layers; forward(ids [b, S]) -> [b, S, n_capture * d] bf16."""

    def __init__(self, model_dir, capture, dev, compile_, experts=""):
        torch = dt.torch
        from transformers import AutoModelForCausalLM
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
        self.experts = experts_backend(model, experts)
        model = model.to(dev).eval()
        base = model.model
        n_layers = len(base.layers)
        last = max(capture)
        if last >= n_layers:
            raise Bad(f"capture layer {last} but {model_dir} has {n_layers} layers", EXIT_USAGE)
        base.layers = base.layers[:last + 1]  # later layers and the lm_head are never needed
        if hasattr(base.config, "num_hidden_layers"):
            base.config.num_hidden_layers = last + 1
        if getattr(base.config, "layer_types", None):
            base.config.layer_types = base.config.layer_types[:last + 1]
        self.model, self.base, self.capture, self.out = model, base, list(capture), {}
        for i in capture:
            base.layers[i].register_forward_hook(self._hook(i))
        self.embed = base.embed_tokens.weight.detach()
        self.lm_head = model.get_output_embeddings().weight.detach()
        self.fn, self.compiled, self.compile_note = base, False, "eager (no --compile)"
        if compile_:
            try:
                self.fn = torch.compile(base)
                self.compiled, self.compile_note = True, "torch.compile"
            except Exception as e:  # noqa: BLE001 (any reason is printed, then eager)
                self.compile_note = f"eager: torch.compile failed ({type(e).__name__}: {e})"
        log(f"target {model_dir}: {n_layers} layers, run up to layer {last} (capture {capture}), "
            f"loaded in {time.time() - t0:.1f}s, {self.compile_note}"
            + (f", experts backend {self.experts}" if self.experts else ""))

    def _hook(self, i):
        def hook(_mod, _inp, out):
            self.out[i] = out[0] if isinstance(out, (tuple, list)) else out
        return hook

    def forward(self, ids):
        torch = dt.torch
        self.out.clear()
        with torch.no_grad():
            try:
                self.fn(input_ids=ids, use_cache=False)
            except Exception as e:  # noqa: BLE001
                if not self.compiled:
                    raise
                self.fn, self.compiled = self.base, False
                self.compile_note = f"eager: the compiled forward failed ({type(e).__name__}: {str(e)[:200]})"
                log(self.compile_note)
                self.out.clear()
                self.fn(input_ids=ids, use_cache=False)
            return torch.cat([self.out[i] for i in self.capture], dim=-1)


# ---------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", required=True, help="the pipeline's topology (target, capture layers, shards)")
    ap.add_argument("--seq", type=int, default=768, help="tokens per document S (default 768)")
    ap.add_argument("--anchors", type=int, default=256, help="anchors per document (default 256)")
    ap.add_argument("--docs-per-batch", type=int, default=0,
                    help="documents per optimizer step (default: data.token_budget // S)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches first (default 2)")
    ap.add_argument("--batches", type=int, default=8, help="timed batches (default 8)")
    ap.add_argument("--attn", choices=["auto", "flex", "sdpa"], default="auto",
                    help="drafter attention: flex (flex_attention + torch.compile), sdpa, or auto (flex when it "
                         "runs here, else sdpa; default)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the target forward (eager on failure)")
    ap.add_argument("--experts", default="",
                    help="a mixture-of-experts target's experts backend (eager, grouped_mm, batched_mm; default: "
                         "transformers' own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args(argv)
    try:
        return run(a)
    except Bad as e:
        print(f"peer_pipeline: error: {e}", file=sys.stderr)
        return e.code


def run(a):
    for name, v, lo in (("--seq", a.seq, 2), ("--anchors", a.anchors, 1), ("--warmup", a.warmup, 0),
                        ("--batches", a.batches, 1), ("--docs-per-batch", a.docs_per_batch, 0)):
        if v < lo:
            raise Bad(f"{name} {v}: must be >= {lo}", EXIT_USAGE)
    topo = load_topology(a.topology)
    topo["num_anchors"] = a.anchors
    S = a.seq
    per_batch = a.docs_per_batch or max(1, topo["token_budget"] // S)
    need = per_batch * (a.warmup + a.batches)
    docs, skipped, vocab = [], 0, None
    for p in topo["shards"]:
        vocab, sd = read_dfs(p)
        d, s = cut_documents(sd, S)
        docs += d
        skipped += s
    if not docs:
        raise Bad(f"{a.topology}: $.data.shards: no document of at least S={S} tokens ({skipped} shorter)", EXIT_DATA)
    log(f"{len(docs)} documents of >= {S} tokens cut to {S} ({skipped} shorter skipped) from {len(topo['shards'])} "
        f"shard(s); {per_batch} per batch, {a.warmup} warmup + {a.batches} timed batches = {need} documents"
        + (" (the data is read again from the start)" if need > len(docs) else ""))

    import numpy as np
    dt.import_torch()
    torch = dt.torch
    if not torch.cuda.is_available():
        print("SKIPPED: peer_pipeline: no CUDA device (the peer is a GPU benchmark)")
        return 77
    dev = torch.device("cuda")
    try:
        hf = json.load(open(os.path.join(topo["model_dir"], "config.json")))
    except (OSError, ValueError) as e:
        raise Bad(f"{topo['model_dir']}/config.json: cannot read: {e}", EXIT_DATA)
    cfg = drafter_config(topo, hf)
    if vocab is not None and vocab > cfg["V"]:
        raise Bad(f"{topo['shards'][0]}: offset 12: vocab_size {vocab} is larger than the target's {cfg['V']}",
                  EXIT_DATA)
    target = Target(topo["model_dir"], topo["capture"], dev, a.compile, a.experts)

    attn, attn_note = a.attn, ""
    if attn in ("auto", "flex"):
        try:
            dt.flex_attention_fn()
            attn = "flex"
        except SystemExit:  # dflash_torch.die printed why
            if a.attn == "flex":
                return 1
            attn, attn_note = "sdpa", "flex_attention is not available in this torch"
    drafter = Drafter(cfg, topo, target.embed, target.lm_head, dev, a.seed, attn)

    def batch(k):
        sel = [docs[(k * per_batch + j) % len(docs)] for j in range(per_batch)]
        ids = torch.from_numpy(np.stack([t for t, _ in sel]).astype(np.int64)).to(dev)
        mask = torch.from_numpy(np.stack([m for _, m in sel]).astype(np.int64)).to(dev)
        return ids, mask

    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    t_target, t_step, losses = [], [], []
    wall0 = None
    for k in range(a.warmup + a.batches):
        if k == a.warmup:
            torch.cuda.synchronize()
            wall0 = time.perf_counter()
        ids, mask = batch(k)
        e0, e1, e2 = ev(), ev(), ev()
        e0.record()
        feats = target.forward(ids)                                   # [b, S, n*d] bf16
        e1.record()
        H_list = [feats[j] for j in range(per_batch)]
        try:
            loss, _ = drafter.batch_step(H_list, [ids[j] for j in range(per_batch)],
                                         [mask[j] for j in range(per_batch)])
        except Exception as e:  # noqa: BLE001
            if drafter.attn != "flex" or a.attn == "flex" or k > 0 or isinstance(e, torch.cuda.OutOfMemoryError):
                raise
            attn_note = f"the flex step failed ({type(e).__name__}: {str(e)[:300]})"
            log(f"{attn_note}; SDPA instead")
            drafter.attn = "sdpa"
            torch.cuda.synchronize()
            loss, _ = drafter.batch_step(H_list, [ids[j] for j in range(per_batch)],
                                         [mask[j] for j in range(per_batch)])
        e2.record()
        if k >= a.warmup:
            t_target.append((e0, e1))
            t_step.append((e1, e2))
            losses.append(loss)
        else:
            torch.cuda.synchronize()
            log(f"warmup batch {k + 1}/{a.warmup}: loss {float(loss):.4f} (attention {drafter.attn}, "
                f"target {target.compile_note})")
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall0
    ms_target = [s.elapsed_time(e) for s, e in t_target]
    ms_step = [s.elapsed_time(e) for s, e in t_step]
    n_docs = per_batch * a.batches
    loss_last = float(losses[-1])
    if loss_last != loss_last:
        log(f"non-finite loss {loss_last}")
        return 1
    attn_desc = ("flex_attention (BlockMask, torch.compile)" if drafter.attn == "flex" else
                 "SDPA dense bool mask" + (f" ({attn_note})" if attn_note else ""))
    res = dict(bench="peer_pipeline", topology=a.topology, model_dir=topo["model_dir"], seq=S, anchors=a.anchors,
               docs_per_batch=per_batch, warmup_batches=a.warmup, timed_batches=a.batches, samples=n_docs,
               tokens=n_docs * S, wall_s=round(wall, 3), samples_per_s=round(n_docs / wall, 3),
               tok_per_s=round(n_docs * S / wall, 1), target_ms=round(statistics.median(ms_target), 3),
               step_ms=round(statistics.median(ms_step), 3), target_ms_all=[round(x, 3) for x in ms_target],
               step_ms_all=[round(x, 3) for x in ms_step], loss_last=round(loss_last, 4),
               attention=drafter.attn, attention_note=attn_desc, target_forward=target.compile_note,
               experts_backend=target.experts,
               target_layers_run=max(topo["capture"]) + 1, capture_layers=topo["capture"], fused_adamw=drafter.fused,
               skipped_short_docs=skipped, device=torch.cuda.get_device_name(dev), torch=torch.__version__,
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        import transformers
        res["transformers"] = transformers.__version__
    except ImportError:
        pass
    log(f"S={S} anchors={a.anchors}, {per_batch} docs/batch: {res['samples_per_s']:.2f} samples/s, "
        f"{res['tok_per_s']:,.0f} tok/s; per batch: target {res['target_ms']:.1f} ms, drafter step "
        f"{res['step_ms']:.1f} ms (median of {a.batches}); attention {attn_desc}; target {target.compile_note}; "
        f"loss {loss_last:.4f}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        tmp = f"{a.json}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.json)
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
