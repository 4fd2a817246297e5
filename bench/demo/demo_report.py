#!/usr/bin/env python3
"""demo_report.py: the table and JSON of bench/demo/train_demo_target.sh.

    python3 bench/demo/demo_report.py --work gpu/demo_target --variants "A demo:0.75 128" \\
        --samples "1600 2400" --out OUT

Reads, under --work: logs/target-V.log (scripts/train_target.py's output), per run
runs/V-N/{train_summary.json, ledger_audit.json, eval_untrained.json, eval_trained.json}
and logs/{wall,eval_untrained_s,eval_trained_s}-V-N. Writes OUT/demo_results.json,
OUT/demo_results.txt (also printed) and OUT/demo_best.txt (the chosen run's name, V-N).
A run that failed or never started appears with what it has (missing figures: "-").

Tau per kind: each held-out prompt is looked up in the structured held-out documents that
scripts/demo_corpus.py generated for the target (their count is in the target's log); a
prompt found in none is a standard-library one. Pooled per kind = accepted tokens / verify
steps over that kind's prompts (hist: steps per acceptance length).
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
sys.dont_write_bytecode = True
import demo_corpus  # noqa: E402

BAR = 2.5  # the held-out pooled tau the demo is meant to reach


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def target_info(log):
    """Figures from train_target.py's log: steps, ms/step, held-out bits/byte, seconds."""
    t = read(log) or ""
    info = {}
    m = re.findall(r"step +(\d+)/(\d+) loss", t)
    if m:
        info["steps"] = int(m[-1][1])
    m = re.search(r"(\d+) ms/step", t)
    if m:
        info["ms_per_step"] = int(m.group(1))
    m = re.search(r"held-out loss ([\d.]+) \(([\d.]+) bits/byte\)", t)
    if m:
        info["heldout_nats_per_byte"], info["heldout_bits_per_byte"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"done in (\d+)s", t)
    if m:
        info["seconds"] = int(m.group(1))
    m = re.search(r"demo_corpus: \S+ (\d+) structured training documents .*?, (\d+) held-out", t)
    if m:
        info["structured_train_docs"], info["structured_heldout_docs"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"corpus: (\d+) train files .*?, (\d+) held-out", t)
    if m:
        info["stdlib_train_files"], info["stdlib_heldout_files"] = int(m.group(1)), int(m.group(2))
    return info


def training_text(corpus, seed):
    """The target's training documents joined (what train_target.py --corpus trained on),
    or None where train_target.py cannot be imported (no torch)."""
    try:
        import train_target
    except ImportError:
        return None
    train, held = train_target.load_corpus(False)
    train, _ = demo_corpus.mix(corpus, train, held, seed)
    return b"\0".join(train)


def per_kind(ev, docs, train_text):
    """{kind: {"prompts": n, "tau_pooled": x, "seen": m}} over the eval's per-prompt results;
    seen: prompts that occur verbatim in the training documents (None: not checked)."""
    acc = {}
    lines = {}
    for p in ev.get("prompts", []):
        path, _, line = p["source"].rpartition(":")
        if path not in lines:
            with open(path, encoding="utf-8") as f:
                lines[path] = f.read().splitlines()
        msgs = json.loads(lines[path][int(line) - 1])["messages"]
        prompt = msgs[0]["content"].encode("latin-1")
        kind = demo_corpus.kind_of(prompt, docs) or "stdlib"
        h = p["hist"]
        a = acc.setdefault(kind, [0, 0, 0, 0])
        a[0] += 1
        a[1] += sum(k * c for k, c in enumerate(h))
        a[2] += sum(h)
        a[3] += train_text is not None and prompt in train_text
    return {k: {"prompts": a[0], "tau_pooled": a[1] / a[2] if a[2] else None,
                "seen": a[3] if train_text is not None else None} for k, a in sorted(acc.items())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--variants", required=True, help='lines "name corpus batch"')
    ap.add_argument("--samples", required=True, help='drafter sample counts, e.g. "1600 2400"')
    ap.add_argument("--shipped-samples", type=int, default=1600,
                    help='the sample count of the variant whose corpus is "shipped" (models/tiny-target)')
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0, help="the targets' --seed (the structured documents')")
    a = ap.parse_args()
    w = a.work
    variants = [l.split() for l in a.variants.strip().splitlines() if l.strip()]
    samples = [int(x) for x in a.samples.split()]
    targets, runs = {}, []
    for v, corpus, batch in variants:
        shipped = corpus == "shipped"  # models/tiny-target: trained on the stdlib alone
        ti = target_info(f"{w}/logs/target-{v}.log")
        ti.update(corpus=corpus, batch=int(batch))
        targets[v] = ti
        nh = ti.get("structured_heldout_docs", 0)
        docs = [demo_corpus.document("heldout", a.seed, i) for i in range(nh)]
        text = training_text("stdlib" if shipped else corpus, a.seed)
        for n in ([a.shipped_samples] if shipped else samples):
            name = f"{v}-{n}"
            r = f"{w}/runs/{name}"
            s = load(f"{r}/train_summary.json") or {}
            au = load(f"{r}/ledger_audit.json") or {}
            eu, et = load(f"{r}/eval_untrained.json"), load(f"{r}/eval_trained.json")
            row = dict(run=name, target=v, corpus=corpus, samples=n, steps=s.get("steps"),
                       train_s=s.get("seconds"), loss_start=s.get("loss_start"), loss_end=s.get("loss_end"),
                       train_acc=s.get("acc"), expected_tau=s.get("expected_tau"),
                       exactly_once=au.get("exactly_once"),
                       pipeline_wall_s=read(f"{w}/logs/wall-{name}"),
                       eval_untrained_s=read(f"{w}/logs/eval_untrained_s-{name}"),
                       eval_trained_s=read(f"{w}/logs/eval_trained_s-{name}"),
                       untrained=eu and eu["overall"], trained=et and et["overall"])
            try:
                row["trained_by_kind"] = per_kind(et, docs, text) if et else None
            except (OSError, ValueError, KeyError, IndexError) as e:
                row["trained_by_kind"] = None
                print(f"demo_report: {name}: no per-kind figures ({e})", file=sys.stderr)
            runs.append(row)

    def tau(row, which="trained"):
        o = row.get(which)
        return o and o.get("tau_token_weighted")
    ok = [r for r in runs if tau(r) is not None and targets[r["target"]]["corpus"] != "shipped"]
    reach = [r for r in ok if tau(r) >= BAR]
    best = (min(reach, key=lambda r: (r["samples"], -tau(r))) if reach else
            max(ok, key=tau) if ok else None)
    res = {"bar_tau_pooled": BAR, "targets": targets, "runs": runs, "best": best and best["run"],
           "best_reaches_bar": bool(reach)}
    os.makedirs(a.out, exist_ok=True)
    with open(f"{a.out}/demo_results.json", "w") as f:
        json.dump(res, f, indent=1)
    with open(f"{a.out}/demo_best.txt", "w") as f:
        f.write((best["run"] if best else "") + "\n")

    f2 = lambda x: "-" if x is None else f"{x:.2f}"
    out = ["targets (scripts/train_target.py --shape tiny, on the GPU):",
           f"  {'name':4} {'corpus':11} {'batch':>5} {'steps':>6} {'ms/step':>7} {'held-out bits/byte':>18} "
           f"{'seconds':>7} {'structured docs train/held':>26}"]
    for v, t in targets.items():
        sd = f"{t.get('structured_train_docs', '-')}/{t.get('structured_heldout_docs', '-')}"
        out.append(f"  {v:4} {t['corpus']:11} {t['batch']:5} {str(t.get('steps', '-')):>6} "
                   f"{str(t.get('ms_per_step', '-')):>7} {f2(t.get('heldout_bits_per_byte')):>18} "
                   f"{str(t.get('seconds', '-')):>7} {sd:>26}")
    out += ["", "drafter runs (the make-run pipeline, CPU; dflash_eval on held-out prompts, untrained -> trained):",
            f"  {'run':8} {'samples':>7} {'steps':>5} {'train_s':>7} {'wall_s':>6} {'eval_s u/t':>10} "
            f"{'tau pooled':>12} {'tau mean':>12} {'tau median':>12} {'acc k=1':>7} {'k=2':>5} {'k=4':>5} "
            f"{'k=8':>5} {'k=15':>5} {'lossless':>8} {'once':>5}"]
    for r in runs:
        u, t = r["untrained"] or {}, r["trained"] or {}
        pa = t.get("pos_acc") or [None] * 16
        ut = lambda k: f"{f2(u.get(k))}->{f2(t.get(k))}"
        ll = f"{t['n_prompts'] - t['mismatches']}/{t['n_prompts']}" if t else "-"
        es = f"{r['eval_untrained_s'] or '-'}/{r['eval_trained_s'] or '-'}"
        out.append(f"  {r['run']:8} {r['samples']:7} {str(r['steps'] or '-'):>5} "
                   f"{str(r['train_s'] and round(r['train_s']) or '-'):>7} {str(r['pipeline_wall_s'] or '-'):>6} "
                   f"{es:>10} {ut('tau_token_weighted'):>12} {ut('tau'):>12} {ut('tau_median'):>12} "
                   f"{f2(pa[1]):>7} {f2(pa[2]):>5} {f2(pa[4]):>5} {f2(pa[8]):>5} {f2(pa[15]):>5} {ll:>8} "
                   f"{str(r['exactly_once']):>5}")
    out += ["", "trained tau pooled per kind of held-out prompt (prompts, of which seen verbatim in training):"]
    for r in runs:
        k = r.get("trained_by_kind")
        if k:
            out.append(f"  {r['run']:8} " + ", ".join(
                f"{n} {f2(x['tau_pooled'])} ({x['prompts']}, {'?' if x['seen'] is None else x['seen']})"
                for n, x in k.items()))
    out += ["", f"best: {best['run'] if best else 'none'} "
            f"({'reaches' if reach else 'does not reach'} held-out tau pooled >= {BAR})"]
    text = "\n".join(out) + "\n"
    with open(f"{a.out}/demo_results.txt", "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
