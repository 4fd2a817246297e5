#!/usr/bin/env python3
"""report.py: end-to-end figures of one pipeline run, from its run directory.

    python3 bench/pipeline/report.py RUN_DIR [--json PATH] [--target-json F] [--drafter-json F] [--peer-json F]...

Reads metrics/<worker>.jsonl (the workers' "stage" lines: cumulative tokens, items, busy_s,
wait_s; the drafter's "step" lines), ledger_audit.json and train_summary.json, and prints:
end-to-end tokens/s and samples/s (drafter-trained tokens over the wall time from the first
worker line to the last drafter step), the steady state (the same over the steps after the
first 10%), and each stage's busy / waiting fractions. With --target-json / --drafter-json
(the JSON of bench_target / bench_drafter measured in the same call; for a mixture-of-experts
target, bench_moe's in bench_target's place) it adds the
stage-alone ceilings beside them. With --peer-json (bench/pipeline/peer_pipeline.py's result on
the same topology and shards) it prints ours beside the peer in one table: samples/s (documents
trained per second: the drafter's step lines count them, "docs"; the peer counts the documents
of its timed batches), tokens/s (the same documents' tokens) and ours / peer, for our steady
state (the steps after the first 10%, the peer's timed batches being after its warmup) and
end to end; the table goes into the JSON as "vs_peers" (the first one also as "vs_peer").
--peer-json may be repeated (e.g. the flex_attention + torch.compile step and the eager SDPA
step): one table per peer. It also reads where each drafter incarnation's start-up went (its
log: seconds from the orchestrator's start line to the worker's ready line, and the worker's
own "start-up:" split) and what checkpoints cost the loop (the "checkpoint" metrics lines:
count, the loop's wait, the writes): JSON "drafter_startup" and "checkpoints".
"""
import argparse
import datetime
import glob
import json
import os
import re
import sys


def lines(path):
    out = []
    with open(path) as f:
        for ln in f:
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass  # a torn last line of a killed writer
    return out


def log_time(ln):
    """The timestamp of a worker log line (2026-12-04T14:34:58.633Z ...) in seconds, or None."""
    try:
        return datetime.datetime.strptime(ln[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    except ValueError:
        return None


STARTUP = re.compile(r"start-up: weights and optimizer state \((\w+)\) ([\d.]+) s, (\w+) backend open ([\d.]+) s")


def startups(run_dir):
    """Per drafter incarnation, from its log: seconds from the orchestrator's start line to the
    worker's ready line, and the worker's own split (weights + optimizer state, backend open)."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "logs", "drafter*.log"))):
        name, start = os.path.basename(path)[:-4], None
        cur = None
        for ln in open(path, errors="replace"):
            t = log_time(ln)
            if "=== orchestrator: starting" in ln:
                start, cur = t, {"worker": name}
                out.append(cur)
            elif cur is not None and (m := STARTUP.search(ln)):
                cur.update(how=m.group(1), state_s=float(m.group(2)), backend=m.group(3), open_s=float(m.group(4)))
            elif cur is not None and f"{name}: ready:" in ln and start is not None and t is not None:
                cur["ready_s"] = t - start
    return out


def checkpoints(workers):
    """The drafters' "checkpoint" metrics lines: how many, and what they stopped the loop for."""
    cks = [l for ls in workers.values() for l in ls if l.get("ev") == "checkpoint"]
    if not cks:
        return None
    return {"n": len(cks), "ok": sum(1 for c in cks if c.get("ok")), "async": sum(1 for c in cks if c.get("async")),
            "wait_s": sum(c.get("wait_s") or 0 for c in cks), "max_wait_s": max(c.get("wait_s") or 0 for c in cks),
            "write_s": sum(c.get("write_s") or 0 for c in cks)}


def one_gpu_ceiling(res, stages, docs, run_dir):
    """The one-GPU ceiling of a pipeline whose target and drafter share a GPU: a document costs
    the target's time for its tokens plus the drafter's time for it, both measured alone in the
    same call (bench_target at the document length when it was run so, else its shortest
    documents; bench_drafter with as many documents packed per step as the pipeline's batches
    hold). Ours can only overlap the two on the GPU's idle gaps, so this is the bound."""
    tgt, dr = res.get("target_alone"), res.get("drafter_alone")
    if not tgt or not dr or not res.get("steady_samples_s"):
        return None
    seq = max((r.get("seq", 0) for r in dr), default=0)
    rows = [r for r in tgt if isinstance(r, dict) and r.get("tok_s") and r.get("T")]
    if not rows or not seq:
        return None
    exact = [r for r in rows if r["T"] == seq]
    trow = max(exact, key=lambda r: r["tok_s"]) if exact else min(rows, key=lambda r: r["T"])
    drow = max(dr, key=lambda r: (r.get("docs", 1), r.get("samples_per_s", 0)))
    t_ms = 1e3 * seq / trow["tok_s"]
    d_ms = 1e3 / drow["samples_per_s"]
    out = {"seq": seq, "target_T": trow["T"], "target_tok_s": trow["tok_s"], "target_ms_per_doc": t_ms,
           "drafter_alone_docs": drow.get("docs", 1), "drafter_alone_samples_s": drow["samples_per_s"],
           "drafter_ms_per_doc": d_ms, "samples_s": 1e3 / (t_ms + d_ms)}
    out["steady_frac"] = res["steady_samples_s"] / out["samples_s"]
    busy = [s for n, s in stages.items() if n.startswith("drafter") and s.get("busy_s")]
    if busy and docs:
        out["drafter_busy_samples_s"] = docs / sum(s["busy_s"] for s in busy)
        out["drafter_busy_frac_of_alone"] = out["drafter_busy_samples_s"] / drow["samples_per_s"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--json")
    ap.add_argument("--target-json")
    ap.add_argument("--drafter-json")
    ap.add_argument("--peer-json", action="append", default=[],
                    help="a peer_pipeline.py result; repeat for several peers (one row each)")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    mdir = os.path.join(a.run_dir, "metrics")
    workers = {}
    for p in sorted(glob.glob(os.path.join(mdir, "*.jsonl"))):
        name = os.path.basename(p)[:-6]
        if name in ("orchestrator", "summary"):
            continue
        workers[name] = lines(p)
    if not workers:
        sys.exit(f"report: no worker metrics in {mdir}")
    audit = json.load(open(os.path.join(a.run_dir, "ledger_audit.json")))
    summ_path = os.path.join(a.run_dir, "train_summary.json")
    summ = json.load(open(summ_path)) if os.path.exists(summ_path) else {}
    t0 = min(ls[0]["t"] for ls in workers.values() if ls)
    steps = [l for ls in workers.values() for l in ls if l.get("ev") == "step"]
    steps.sort(key=lambda l: l["t"])
    if not steps:
        sys.exit("report: no drafter step lines")
    t1 = steps[-1]["t"]
    tokens = sum(l["tokens"] for l in steps)
    wall = t1 - t0
    k = max(1, len(steps) // 10)
    ss_tokens = sum(l["tokens"] for l in steps[k:])
    ss_wall = steps[-1]["t"] - steps[k - 1]["t"]
    n_samples = audit.get("n_samples", 0)
    has_docs = all("docs" in l for l in steps)
    docs = sum(l["docs"] for l in steps) if has_docs else None
    ss_docs = sum(l["docs"] for l in steps[k:]) if has_docs else None
    stages = {}
    for name, ls in workers.items():
        st = [l for l in ls if l.get("ev") == "stage"]
        if not st:
            continue
        last = st[-1]
        span = st[-1]["t"] - ls[0]["t"]
        stages[name] = {
            "tokens": last.get("tokens"), "items": last.get("items"),
            "busy_s": last.get("busy_s"), "wait_s": last.get("wait_s"), "span_s": span,
            # fractions of the stage's own loop time (busy + waiting), so they add up to 1
            "busy_frac": (last.get("busy_s") or 0) / ((last.get("busy_s") or 0) + (last.get("wait_s") or 0) or 1),
            "wait_frac": (last.get("wait_s") or 0) / ((last.get("busy_s") or 0) + (last.get("wait_s") or 0) or 1),
            "busy_tok_s": last["tokens"] / last["busy_s"] if last.get("busy_s") else None,
        }
    res = {
        "label": a.label, "run_dir": a.run_dir, "steps": len(steps), "tokens": tokens, "samples": n_samples,
        "wall_s": wall, "tok_s": tokens / wall, "samples_s": n_samples / wall,
        "steady_tok_s": ss_tokens / ss_wall if ss_wall > 0 else None,
        "docs_trained": docs,
        "steady_samples_s": ss_docs / ss_wall if ss_docs is not None and ss_wall > 0 else None,
        "exactly_once": audit.get("exactly_once"), "loss_start": summ.get("loss_start"),
        "loss_end": summ.get("loss_end"), "expected_tau": summ.get("expected_tau"), "stages": stages,
    }
    print(f"pipeline {a.label}: {len(steps)} steps, {tokens} tokens, {n_samples} samples in {wall:.1f}s, "
          f"exactly once: {audit.get('exactly_once')}")
    print(f"  end to end: {res['tok_s']:,.0f} tok/s, {res['samples_s']:.1f} samples/s; "
          f"steady state (after the first 10% of steps): {res['steady_tok_s'] or 0:,.0f} tok/s")
    if summ:
        print(f"  drafter loss {summ.get('loss_start', 0):.3f} -> {summ.get('loss_end', 0):.3f}, "
              f"expected tau {summ.get('expected_tau', 0):.2f}")
    print(f"  {'stage':<12} {'busy':>6} {'wait':>6} {'tokens':>10} {'tok/s busy':>12}")
    for name, s in stages.items():
        print(f"  {name:<12} {s['busy_frac'] or 0:>6.1%} {s['wait_frac'] or 0:>6.1%} {s['tokens'] or 0:>10} "
              f"{s['busy_tok_s'] or 0:>12,.0f}")
    res["drafter_startup"] = startups(a.run_dir)
    for su in res["drafter_startup"]:
        if "ready_s" in su:
            split = (f" (weights and optimizer state, {su['how']}: {su['state_s']:.2f} s; {su['backend']} backend open "
                     f"{su['open_s']:.2f} s)" if "state_s" in su else "")
            print(f"  {su['worker']} start-up: ready {su['ready_s']:.2f} s after its start{split}")
    ck = checkpoints(workers)
    if ck:
        res["checkpoints"] = ck
        print(f"  checkpoints: {ck['n']} ({ck['async']} written beside training); the loop waited {ck['wait_s']:.2f} s "
              f"in all (at most {ck['max_wait_s']:.2f} s), writes took {ck['write_s']:.2f} s")
    if a.target_json:
        tj = json.load(open(a.target_json))
        rows = tj.get("results", tj) if isinstance(tj, dict) else tj
        res["target_alone"] = rows
        # bench_target's rows name their model; bench_moe's (one shape, --layers N) their experts kernel
        moe = isinstance(tj, dict) and tj.get("bench") == "target_forward_moe"
        for r in rows if isinstance(rows, list) else []:
            tok = r.get("tok_s") or r.get("tokens_per_s")
            if tok:
                what = (f"bench_moe {tj.get('shape', '')}, {tj.get('layers_run', '?')} layers, {r.get('kernel', '')} "
                        f"experts" if moe else f"bench_target {r.get('model', '')}")
                print(f"  ceiling: target alone ({what}, T={r.get('T', '')}): {tok:,.0f} tok/s")
    if a.drafter_json:
        dj = json.load(open(a.drafter_json))
        res["drafter_alone"] = dj
        for r in dj:
            print(f"  ceiling: drafter alone (bench_drafter {r['shape']}, S={r['seq']}, {r['anchors']} anchors): "
                  f"{r['seq'] * r['samples_per_s']:,.0f} tok/s ({r['ms_per_step']:.1f} ms/step, MFU {r['mfu']:.1%})")
            if r.get("optimizer_ms"):
                print(f"  drafter optimizer alone: {r['optimizer_ms']:.2f} ms/step, {r['optimizer_gb_s']:,.0f} GB/s = "
                      f"{r.get('optimizer_frac_of_copy') or 0:.1%} of a device copy ({r.get('copy_ceiling_gb_s') or 0:,.0f} GB/s)")
    ceil = one_gpu_ceiling(res, stages, docs, a.run_dir)
    if ceil:
        res["one_gpu_ceiling"] = ceil
        print(f"  one-GPU ceiling (target alone + drafter alone per document, run one after the other): "
              f"{ceil['target_ms_per_doc']:.1f} + {ceil['drafter_ms_per_doc']:.1f} ms = "
              f"{ceil['samples_s']:.2f} samples/s; ours steady = {ceil['steady_frac']:.1%} of it")
        if ceil.get("drafter_busy_frac_of_alone") is not None:
            print(f"  drafter in the pipeline: {ceil['drafter_busy_samples_s']:.2f} documents per busy second = "
                  f"{ceil['drafter_busy_frac_of_alone']:.1%} of its alone rate ({ceil['drafter_alone_samples_s']:.2f}, "
                  f"{ceil['drafter_alone_docs']} documents packed per step as in the pipeline; the target shares the GPU)")
    for i, pj_path in enumerate(a.peer_json):
        pj = json.load(open(pj_path))
        rows = [("ours, steady state", res["steady_samples_s"], res["steady_tok_s"]),
                ("ours, end to end", (docs if docs is not None else n_samples) / wall, res["tok_s"]),
                ("peer (timed batches)", pj["samples_per_s"], pj["tok_per_s"])]
        vs = {"peer_json": pj_path, "seq": pj.get("seq"), "anchors": pj.get("anchors"),
              "docs_per_batch": pj.get("docs_per_batch"), "peer_attention": pj.get("attention_note"),
              "peer_target_forward": pj.get("target_forward"), "rows": []}
        print(f"  ours vs peer {i + 1} (same topology and shards; S={pj.get('seq')}, {pj.get('anchors')} anchors per "
              f"document, {pj.get('docs_per_batch')} documents per step):")
        print(f"  {'':<22} {'samples/s':>10} {'tokens/s':>12} {'x peer':>7}")
        for label, sps, tps in rows:
            ratio = sps / pj["samples_per_s"] if sps and pj.get("samples_per_s") else None
            vs["rows"].append({"side": label, "samples_s": sps, "tok_s": tps, "ratio": ratio})
            print(f"  {label:<22} {sps or 0:>10.2f} {tps or 0:>12,.0f} {ratio or 0:>6.2f}x")
        experts = f", experts {pj['experts_backend']}" if pj.get("experts_backend") else ""
        print(f"  peer {i + 1}: {pj.get('attention_note')}; target {pj.get('target_forward')}{experts}; "
              f"per batch target {pj.get('target_ms', 0):.1f} ms + step {pj.get('step_ms', 0):.1f} ms")
        vs["ratio_steady"] = vs["rows"][0]["ratio"]
        vs["ratio_end_to_end"] = vs["rows"][1]["ratio"]
        res.setdefault("peers", []).append(pj)
        res.setdefault("vs_peers", []).append(vs)
        if i == 0:  # the first peer also under the names earlier results used
            res["peer"], res["vs_peer"] = pj, vs
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
        print(f"  -> {a.json}")


if __name__ == "__main__":
    main()
