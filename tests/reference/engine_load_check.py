#!/usr/bin/env python3
"""engine_load_check.py: does an exported drafter load and draft in the Python ecosystem as
it drafts in ours? (docs/export.md)

    python3 tests/reference/engine_load_check.py --export RELEASE_DIR --target TARGET_DIR \\
        [--zlab PATH_OF_THE_Z-LAB_DFLASH_REPO] [--logits-bin build/bin/dflash_logits] \\
        [--device cuda|cpu] [--context 48] [--seed 0] [--require-transformers] [--json OUT]

RELEASE_DIR is what `dflash_tool export` (dflash_export_release) wrote: config.json,
model.safetensors (bf16) and dflash.py. Parts, each a row of the table:

  files      config.json has every field the public loaders read (REQUIRED_FIELDS below),
             auto_map names dflash.DFlashDraftModel and dflash.py is there.
  C          dflash_logits (eval/dflash_logits_main.c: our dflash_infer on the CPU) computes
             the block logits for random inputs: context features H of S positions (rounded
             to bf16, so every implementation sees the same numbers), random tokens, several
             anchors p (context rows 0..p-1, block [tokens[p], MASK x (B-1)]). These are the
             logits everything else is compared with.
  reference  tests/reference/dflash_torch.py's drafter forward (float64, written from the
             spec independently of the C code) on the same inputs: relative L2 < 1e-4.
  ours       transformers.AutoModel.from_pretrained(RELEASE_DIR, trust_remote_code=True,
             dtype="auto"): our dflash.py. Loading must report no missing, unexpected or
             mismatched key and log no warning (the transformers logger and Python warnings
             are captured while loading), the class must come from RELEASE_DIR's dflash.py
             and the weights must come out bf16 (the config's dtype). Then the block logits
             in bf16 (as users run it: bf16 weights, activations and lm_head) and in fp32 (the
             same bf16 weights, fp32 arithmetic), and a two-step draft through a
             transformers DynamicCache (the public generation loop's way) against one step.
  z-lab      the reference implementation's class (z-lab's DFlashDraftModel, imported from the
             dflash repository at --zlab) loaded from RELEASE_DIR with from_pretrained, the
             same checks and comparisons. SKIPPED when --zlab is not given or absent, and for
             drafters with sliding-attention layers (that class applies no window under SDPA).

Tolerances (stated here and in docs/export.md):
  fp32 and float64 rows: pooled relative L2 of the logits (||x - c|| / ||c|| over every
    logit of every block) < 1e-4;
  bf16 rows: pooled relative L2 < 2e-2 and every block's own relative L2 < 5e-2;
  every row: a block row whose argmax differs from the C's must be a near tie: the C's own
    logits of the two tokens differ by at most 4 x the pooled RMS logit error of that
    comparison (a flip with a larger margin means a different function, not rounding).
    The argmax agreement is printed.

Without transformers (CPU machines with torch only) the transformers parts print SKIPPED
(FAIL with --require-transformers) and the rest runs. Exit status 0 when every part that
ran passed, 1 otherwise (a line starting "engine_load_check: FAIL" names each failure).
"""
import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# What the public loaders read from a DFlash drafter's config.json (docs/export.md):
# z-lab's DFlashDraftModel (transformers, Qwen3Config + these), SGLang and vLLM's DFlash
# drafters (architecture name, dflash_config, block size), transformers itself (model_type,
# auto_map, dtype, rope).
REQUIRED_FIELDS = ["architectures", "model_type", "auto_map", "dtype", "block_size", "num_target_layers",
                   "dflash_config.target_layer_ids", "dflash_config.mask_token_id", "hidden_size",
                   "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "hidden_act", "attention_bias",
                   "layer_types", "sliding_window", "use_sliding_window", "tie_word_embeddings",
                   "max_position_embeddings"]

TOL_EXACT = 1e-4
TOL_BF16 = 2e-2
TOL_BF16_BLOCK = 5e-2
TIE_FACTOR = 4.0

torch = None
failures = []
table = []


def log(msg):
    print(f"engine_load_check: {msg}", flush=True)


def fail(msg):
    failures.append(msg)
    print(f"engine_load_check: FAIL: {msg}", flush=True)


# --------------------------------------------------------------------------------------
# safetensors without the safetensors package (CPU machines have torch only)
# --------------------------------------------------------------------------------------

def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def st_read(path, names=None):
    """{name: float32 / int torch tensor} of the tensors in names (all when None)."""
    head, base = st_header(path)
    out = {}
    with open(path, "rb") as f:
        for k, v in head.items():
            if k == "__metadata__" or (names is not None and k not in names):
                continue
            a, b = v["data_offsets"]
            f.seek(base + a)
            buf = bytearray(f.read(b - a))
            dt = v["dtype"]
            if dt == "F32":
                t = torch.frombuffer(buf, dtype=torch.float32) if buf else torch.zeros(0)
            elif dt == "BF16":
                t = (torch.frombuffer(buf, dtype=torch.int16).to(torch.int32) << 16).view(torch.float32)
            elif dt == "F16":
                t = torch.frombuffer(buf, dtype=torch.float16).float()
            elif dt == "I32":
                t = torch.frombuffer(buf, dtype=torch.int32)
            elif dt == "I64":
                t = torch.frombuffer(buf, dtype=torch.int64)
            else:
                raise ValueError(f"{path}: {k}: dtype {dt} not handled")
            out[k] = t.reshape(v["shape"]).clone()
    return out


def st_write(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    names = {torch.float32: "F32", torch.int32: "I32"}
    for k, t in tensors.items():
        t = t.contiguous().cpu()
        b = t.numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def target_head(target_dir, tied):
    """(embed, lm_head) fp32 [V, d] of the target, reading only those tensors."""
    want = {"model.embed_tokens.weight", "lm_head.weight"}
    got = {}
    for fn in sorted(os.listdir(target_dir)):
        if fn.endswith(".safetensors"):
            p = os.path.join(target_dir, fn)
            head, _ = st_header(p)
            names = want & set(head)
            if names:
                got.update(st_read(p, names))
    if "model.embed_tokens.weight" not in got:
        raise SystemExit(f"engine_load_check: {target_dir}: no model.embed_tokens.weight")
    E = got["model.embed_tokens.weight"].float()
    W = E if tied or "lm_head.weight" not in got else got["lm_head.weight"].float()
    return E, W


# --------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------

def compare(name, dtype_name, got, ref, tol, tol_block=None):
    """got, ref [N, B-1, V] float tensors (ref: the C's). Appends a table row; records failures."""
    got = got.double().cpu()
    ref = ref.double().cpu()
    diff = got - ref
    pooled = (diff.norm() / ref.norm()).item()
    per_block = [(diff[j].norm() / ref[j].norm()).item() for j in range(ref.shape[0])]
    rms = diff.pow(2).mean().sqrt().item()
    ga, ra = got.argmax(-1), ref.argmax(-1)
    rows = ga.numel()
    agree = int((ga == ra).sum())
    unexplained = []
    for j, k in zip(*torch.nonzero(ga != ra, as_tuple=True)):
        j, k = int(j), int(k)
        margin = (ref[j, k, ra[j, k]] - ref[j, k, ga[j, k]]).item()
        if margin > TIE_FACTOR * rms:
            unexplained.append(f"block {j} row {k + 1}: {int(ga[j, k])} instead of {int(ra[j, k])}, "
                               f"C margin {margin:.3g} > {TIE_FACTOR:g} x RMS error {rms:.3g}")
    ok = pooled < tol and (tol_block is None or max(per_block) < tol_block) and not unexplained
    table.append(dict(part=name, dtype=dtype_name, rel_l2=pooled, worst_block=max(per_block), rms=rms,
                      agree=agree, rows=rows, unexplained=len(unexplained), ok=ok))
    if not ok:
        why = [f"pooled relative L2 {pooled:.3g} (limit {tol:g})"]
        if tol_block is not None:
            why.append(f"worst block {max(per_block):.3g} (limit {tol_block:g})")
        fail(f"{name} ({dtype_name}) vs C: " + ", ".join(why) + ("; " + "; ".join(unexplained[:4]) if unexplained
                                                                      else ""))
    return ok


def skip_row(name, why):
    table.append(dict(part=name, dtype="-", skipped=why))
    log(f"{name}: SKIPPED: {why}")


# --------------------------------------------------------------------------------------
# loading with transformers
# --------------------------------------------------------------------------------------

class Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def captured():
    """Collect transformers' log records at WARNING and above and every Python warning."""
    h = Capture()
    lg = logging.getLogger("transformers")
    lg.addHandler(h)
    err = io.StringIO()
    with warnings.catch_warnings(record=True) as ws, contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        yield h.records
    lg.removeHandler(h)
    h.records.extend(f"warning: {w.category.__name__}: {w.message}" for w in ws)
    # anything else written to stderr counts too, but for progress bars (tqdm: "NN%|...|")
    lines = [ln for ln in err.getvalue().replace("\r", "\n").splitlines()
             if ln.strip() and not re.search(r"\d+%\|", ln)]
    if lines:
        h.records.append("stderr: " + " / ".join(lines))


def check_loaded(name, model, info, records, export):
    ok = True
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        v = info.get(k) if isinstance(info, dict) else None
        if v:
            fail(f"{name}: loading reported {k}: {sorted(map(str, v))[:8]}")
            ok = False
    if records:
        fail(f"{name}: loading logged {len(records)} warning(s): " + " | ".join(records[:6]))
        ok = False
    cls = type(model)
    if cls.__name__ != "DFlashDraftModel":
        fail(f"{name}: built {cls.__module__}.{cls.__name__}, not DFlashDraftModel")
        ok = False
    dts = {p.dtype for p in model.parameters()}
    if dts != {torch.bfloat16}:
        fail(f"{name}: parameters load as {sorted(map(str, dts))}, the config's dtype says bfloat16")
        ok = False
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{name}: loaded {cls.__module__}.{cls.__name__} from {export}: {n_params} parameters, "
        f"dtypes {sorted(map(str, dts))}, {len(records)} warnings")
    return ok


def load_as(load, dtype, dev):
    """load(dtype) -> model, moved to dev the way users do (from_pretrained(dtype=...).to(dev)).
    Never model.to(dtype): that casts floating BUFFERS too, and a class that keeps its RoPE
    frequencies in an fp32 buffer (transformers' rotary embeddings, z-lab's class) would then
    rotate with bf16-rounded frequencies: a different function, not the one users run."""
    return load(dtype).to(dev).eval()


def hf_logits(model, H, toks, anchors, E, W, B, mask_id, dtype, dev):
    """[N, B-1, V] logits of a transformers-style DFlash model (ours or z-lab's) whose weights
    are already dtype and on dev (load_as)."""
    Ed, Wd = E.to(dev, dtype), W.to(dev, dtype)
    out = []
    with torch.no_grad():
        for p in anchors:
            ids = torch.tensor([int(toks[p])] + [mask_id] * (B - 1), device=dev)
            z = model(target_hidden=H[:p][None].to(dev, dtype), noise_embedding=Ed[ids][None],
                      position_ids=torch.arange(p + B, device=dev)[None], attention_mask=None,
                      past_key_values=None, use_cache=False, is_causal=False)
            out.append((z[0, 1:] @ Wd.T).float().cpu())
    return torch.stack(out)


def cache_check(name, model, H, toks, anchors, E, B, mask_id, dev):
    """Two drafts through one DynamicCache (context appended, block rows cropped off, as the
    public generation loop does) against the second draft computed in one call, fp32."""
    from transformers import DynamicCache
    Ed = E.to(dev)
    p1, p2 = anchors[0], anchors[-1]

    def block(p):
        return Ed[torch.tensor([int(toks[p])] + [mask_id] * (B - 1), device=dev)][None]

    with torch.no_grad():
        cache = DynamicCache()
        model(target_hidden=H[:p1][None].to(dev), noise_embedding=block(p1),
              position_ids=torch.arange(p1 + B, device=dev)[None], past_key_values=cache, use_cache=True,
              is_causal=False)
        cache.crop(p1)
        z2 = model(target_hidden=H[p1:p2][None].to(dev), noise_embedding=block(p2),
                   position_ids=torch.arange(p1, p2 + B, device=dev)[None], past_key_values=cache,
                   use_cache=True, is_causal=False)
        z1 = model(target_hidden=H[:p2][None].to(dev), noise_embedding=block(p2),
                   position_ids=torch.arange(p2 + B, device=dev)[None], is_causal=False)
    rel = ((z2 - z1).norm() / z1.norm()).item()
    ok = rel < TOL_EXACT
    table.append(dict(part=f"{name}: DynamicCache, 2 steps vs 1", dtype="fp32", rel_l2=rel, ok=ok))
    if not ok:
        fail(f"{name}: a draft through DynamicCache differs from one call: relative L2 {rel:.3g}")


# --------------------------------------------------------------------------------------

def main():
    global torch
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--export", required=True, help="release dir written by dflash_tool export")
    ap.add_argument("--target", required=True, help="the target model dir (embedding and lm_head)")
    ap.add_argument("--zlab", default=None, help="path of the z-lab dflash repository (its dflash/model.py)")
    ap.add_argument("--logits-bin", default=None,
                    help="dflash_logits program (default: $BUILD/bin/dflash_logits, BUILD defaulting to build)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--context", type=int, default=48, help="context rows S of the random inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--require-transformers", action="store_true",
                    help="fail (instead of skipping) when transformers cannot be imported")
    ap.add_argument("--json", default=None, help="write the table as JSON")
    args = ap.parse_args()
    try:
        import torch as _t
    except ImportError as e:
        print(f"engine_load_check: SKIPPED: needs torch ({e})")
        return 0
    torch = _t
    sys.path.insert(0, HERE)
    import dflash_torch
    dflash_torch.import_torch()
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_float32_matmul_precision("highest")

    # ---- files -------------------------------------------------------------------------
    conf_path = os.path.join(args.export, "config.json")
    conf = json.load(open(conf_path))
    missing = []
    for f in REQUIRED_FIELDS:
        o = conf
        for part in f.split("."):
            o = o.get(part, KeyError) if isinstance(o, dict) else KeyError
        if o is KeyError:
            missing.append(f)
    if missing:
        fail(f"{conf_path}: missing field(s) {missing}")
    if conf.get("architectures") != ["DFlashDraftModel"]:
        fail(f"{conf_path}: architectures is {conf.get('architectures')}, expected [\"DFlashDraftModel\"]")
    if (conf.get("auto_map") or {}).get("AutoModel") != "dflash.DFlashDraftModel":
        fail(f"{conf_path}: auto_map.AutoModel is not dflash.DFlashDraftModel")
    if not os.path.isfile(os.path.join(args.export, "dflash.py")):
        fail(f"{args.export}: dflash.py (the class auto_map names) is missing")
    table.append(dict(part="files: config.json fields, auto_map, dflash.py", dtype="-", ok=not failures))

    d = conf["hidden_size"]
    B = conf["block_size"]
    V = conf["vocab_size"]
    dc = conf["dflash_config"]
    ids, mask_id = dc["target_layer_ids"], dc["mask_token_id"]
    hd = conf.get("head_dim") or d // conf["num_attention_heads"]
    theta = conf.get("rope_theta") or (conf.get("rope_parameters") or {}).get("rope_theta")
    sliding = [t == "sliding_attention" and conf.get("use_sliding_window", True) for t in conf["layer_types"]]

    # ---- inputs and the C's logits -----------------------------------------------------
    S = args.context
    if S < 4:
        raise SystemExit("engine_load_check: --context must be >= 4")
    g = torch.Generator().manual_seed(args.seed)
    H = torch.randn(S, len(ids) * d, generator=g).to(torch.bfloat16).float()
    toks = torch.randint(0, V, (S,), generator=g, dtype=torch.int64)
    anchors = sorted({max(1, S // 4), max(2, S // 2), S - 1})
    bin_ = args.logits_bin or os.path.join(ROOT, os.environ.get("BUILD", "build"), "bin", "dflash_logits")
    with tempfile.TemporaryDirectory(prefix="engine_load_check.") as tmp:
        fin, fout = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        st_write(fin, {"H": H, "tokens": toks.to(torch.int32), "anchors": torch.tensor(anchors, dtype=torch.int32)})
        r = subprocess.run([bin_, "--target", args.target, "--drafter", args.export, "--in", fin, "--out", fout],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{bin_} exited {r.returncode}: {r.stderr.strip()}")
            return report(args)
        C = st_read(fout)["logits"]
    log(f"C (dflash_logits): {len(anchors)} blocks at anchors {anchors}, logits {list(C.shape)}")
    E, W = target_head(args.target, conf.get("tie_word_embeddings", False))

    # ---- float64 reference -------------------------------------------------------------
    P = {k: v.double().to(dev) for k, v in st_read(os.path.join(args.export, "model.safetensors")).items()}
    rc = dict(rms_norm_eps=conf["rms_norm_eps"], B=B, hd=hd, heads=conf["num_attention_heads"],
              kv=conf["num_key_value_heads"], mask_token_id=mask_id, rope_theta=theta,
              layer_types=[("sliding_attention" if s else "full_attention") for s in sliding],
              sliding_window=conf.get("sliding_window") or 0)
    an = torch.tensor(anchors, device=dev)
    z = dflash_torch.drafter_forward(P, rc, H.double().to(dev), toks.to(dev), an, torch.ones_like(an),
                                     E.double().to(dev), use_sdpa=False)
    ref = (z.view(len(anchors), B, d)[:, 1:] @ W.double().to(dev).T).cpu()
    compare("reference: dflash_torch.py", "float64", ref, C, TOL_EXACT)
    del P, z

    # ---- transformers ------------------------------------------------------------------
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    mod_cache = tempfile.mkdtemp(prefix="engine_load_check.hf.")
    os.environ.setdefault("HF_MODULES_CACHE", mod_cache)
    try:
        import transformers
        from transformers import AutoModel
    except ImportError as e:
        why = f"transformers cannot be imported ({e})"
        if args.require_transformers:
            fail(why)
        skip_row("ours: AutoModel + trust_remote_code", why)
        skip_row("z-lab DFlashDraftModel", why)
        return report(args)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {dev}")
    transformers.logging.set_verbosity_warning()  # a quieter setting would hide what we check
    transformers.logging.disable_progress_bar()

    with captured() as recs:
        model, info = AutoModel.from_pretrained(args.export, trust_remote_code=True, dtype="auto",
                                                output_loading_info=True)
    src = getattr(sys.modules.get(type(model).__module__), "__file__", "") or ""
    if os.path.basename(src) != "dflash.py":
        fail(f"ours: the class came from {src!r}, not the export's dflash.py")
    ok = check_loaded("ours", model, info, recs, args.export)
    table.append(dict(part="ours: AutoModel.from_pretrained, no missing/unexpected keys, no warnings",
                      dtype="bf16", ok=ok))
    model = model.to(dev).eval()
    model32 = load_as(lambda dt: AutoModel.from_pretrained(args.export, trust_remote_code=True, dtype=dt),
                      torch.float32, dev)
    compare("ours: dflash.py via AutoModel", "bf16", hf_logits(model, H, toks, anchors, E, W, B, mask_id,
                                                             torch.bfloat16, dev), C, TOL_BF16, TOL_BF16_BLOCK)
    compare("ours: dflash.py via AutoModel", "fp32", hf_logits(model32, H, toks, anchors, E, W, B, mask_id,
                                                             torch.float32, dev), C, TOL_EXACT)
    cache_check("ours", model32, H, toks, anchors, E, B, mask_id, dev)
    del model, model32

    if not args.zlab or not os.path.isfile(os.path.join(args.zlab, "dflash", "model.py")):
        skip_row("z-lab DFlashDraftModel", f"no z-lab repository at {args.zlab!r} (--zlab)")
    elif any(sliding):
        skip_row("z-lab DFlashDraftModel", "the drafter has sliding-attention layers, which that class does "
                                           "not window under SDPA")
    else:
        sys.path.insert(0, os.path.abspath(args.zlab))
        try:
            from dflash.model import DFlashDraftModel as ZDFlash
        except Exception as e:  # noqa: BLE001 (any import failure is the finding)
            fail(f"z-lab: cannot import dflash.model.DFlashDraftModel from {args.zlab} with transformers "
                 f"{transformers.__version__}: {type(e).__name__}: {e}")
            return report(args)
        with captured() as recs:
            zm, zinfo = ZDFlash.from_pretrained(args.export, dtype="auto", output_loading_info=True)
        ok = check_loaded("z-lab", zm, zinfo, recs, args.export)
        table.append(dict(part="z-lab: from_pretrained, no missing/unexpected keys, no warnings", dtype="bf16",
                          ok=ok))
        zm = zm.to(dev).eval()
        rot = getattr(zm, "rotary_emb", None)
        if rot is not None and hasattr(rot, "inv_freq"):
            log(f"z-lab: RoPE frequencies kept as {rot.inv_freq.dtype} (a buffer: model.to(bfloat16) would round them)")
        zm32 = load_as(lambda dt: ZDFlash.from_pretrained(args.export, dtype=dt), torch.float32, dev)
        compare("z-lab: DFlashDraftModel", "bf16", hf_logits(zm, H, toks, anchors, E, W, B, mask_id,
                                                             torch.bfloat16, dev), C, TOL_BF16, TOL_BF16_BLOCK)
        compare("z-lab: DFlashDraftModel", "fp32", hf_logits(zm32, H, toks, anchors, E, W, B, mask_id,
                                                             torch.float32, dev), C, TOL_EXACT)
        cache_check("z-lab", zm32, H, toks, anchors, E, B, mask_id, dev)
    return report(args)


def report(args):
    print()
    print(f"{'part':<72} {'dtype':<8} {'rel L2':>9} {'worst blk':>9} {'argmax':>9} {'flips':>5}  result")
    for r in table:
        if "skipped" in r:
            print(f"{r['part']:<72} {'-':<8} {'':>9} {'':>9} {'':>9} {'':>5}  SKIPPED ({r['skipped']})")
            continue
        rel = f"{r['rel_l2']:.2e}" if "rel_l2" in r else ""
        wb = f"{r['worst_block']:.2e}" if "worst_block" in r else ""
        am = f"{r['agree']}/{r['rows']}" if "agree" in r else ""
        fl = str(r["unexplained"]) if "unexplained" in r else ""
        print(f"{r['part']:<72} {r['dtype']:<8} {rel:>9} {wb:>9} {am:>9} {fl:>5}  {'ok' if r['ok'] else 'FAIL'}")
    print(f"tolerances: fp32/float64 relative L2 < {TOL_EXACT:g}; bf16 pooled < {TOL_BF16:g}, per block < "
          f"{TOL_BF16_BLOCK:g}; an argmax flip must be a near tie (C margin <= {TIE_FACTOR:g} x RMS error)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(export=args.export, target=args.target, rows=table, failures=failures), f, indent=1)
    if failures:
        print(f"engine_load_check: {len(failures)} failure(s)")
        return 1
    print("engine_load_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
