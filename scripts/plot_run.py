#!/usr/bin/env python3
"""plot_run.py: curves of a run, as PNG, from its metrics files.

    python3 scripts/plot_run.py RUN_DIR [--out DIR]

Reads RUN_DIR/metrics/<drafter>.jsonl (one "step" line per optimizer step: loss, acc1,
tau, lr, grad_norm), every worker's "stage" lines (busy and waiting fractions), the
validator's "validation" lines (one per scored checkpoint: val_loss, val_acc, val_exp_tau)
and, when they exist, RUN_DIR/eval_trained.json / eval_untrained.json (the held-out
per-position accuracy that `make run` measures). Writes into --out (default
RUN_DIR/curves):
    training.png   loss (and its moving average), acc at position 1, expected tau, lr
    validation.png held-out loss and expected tau per checkpoint beside the training ones,
                   held-out accuracy per block position at a few checkpoints
    stages.png     each worker's busy and waiting share over time
    accuracy.png   held-out accuracy per block position, trained vs untrained
Needs matplotlib. When the Python running it has none (a pyenv or venv python3 does not
see Debian's python3-matplotlib), it runs itself again under the first of these that
has it: the python3 on PATH, /usr/bin/python3, /usr/local/bin/python3 (PLOT_RUN_PYTHONS,
colon-separated, replaces that list). With none, it exits 3 with one command that works as
printed, e.g. "apt-get install python3-matplotlib && /usr/bin/python3 scripts/plot_run.py
run/tiny", so a caller can treat curves as optional. The same figures are in the run's
TensorBoard event files: tensorboard --logdir RUN_DIR/tensorboard. Exit 2 on a bad command
line or a run dir without metrics.
"""
import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys

REEXEC_ENV = "PLOT_RUN_REEXEC"  # set for the interpreter it re-runs under: never twice


def read_jsonl(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                print(f"plot_run: {path}:{n}: not JSON, skipped", file=sys.stderr)
    return out


def smooth(xs, k):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def candidates():
    """The interpreters to try, in order, each once."""
    env = os.environ.get("PLOT_RUN_PYTHONS")
    names = env.split(":") if env else ["python3", "/usr/bin/python3", "/usr/local/bin/python3"]
    out = []
    for n in names:
        p = shutil.which(n) if n and os.sep not in n else n
        if p and os.access(p, os.X_OK) and p not in out:
            out.append(p)
    return out


def has_matplotlib(py):
    try:
        r = subprocess.run([py, "-c", "import matplotlib"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def no_matplotlib(run_dir):
    """Run again under an interpreter that has matplotlib, or say how to get one; exit 3."""
    tried = candidates()
    if not os.environ.get(REEXEC_ENV):
        for py in tried:
            if has_matplotlib(py):
                print(f"plot_run: {sys.executable} has no matplotlib; running under {py}", file=sys.stderr)
                sys.stdout.flush()
                os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], dict(os.environ, **{REEXEC_ENV: "1"}))
    script = shlex.quote(sys.argv[0])
    run = shlex.quote(run_dir)
    if os.access("/usr/bin/python3", os.X_OK) and shutil.which("apt-get"):
        # Debian's package is for Debian's interpreter: name it, whatever python3 is on PATH
        root = "" if os.geteuid() == 0 else "sudo "
        cmd = f"{root}apt-get install python3-matplotlib && /usr/bin/python3 {script} {run}"
    else:
        py = shlex.quote(sys.executable)
        cmd = f"{py} -m pip install matplotlib && {py} {script} {run}"
    print(f"plot_run: no curves: no Python here has matplotlib (tried {', '.join(tried) or 'none'}); "
          f"to draw them:\n  {cmd}\n(or read the same figures in TensorBoard: tensorboard --logdir "
          f"{shlex.quote(os.path.join(run_dir, 'tensorboard'))})", file=sys.stderr)
    return 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mdir = os.path.join(a.run_dir, "metrics")
    files = sorted(glob.glob(os.path.join(mdir, "*.jsonl")))
    if not files:
        print(f"plot_run: {mdir}: no metrics files", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return no_matplotlib(a.run_dir)
    out = a.out or os.path.join(a.run_dir, "curves")
    os.makedirs(out, exist_ok=True)
    rows = {os.path.basename(f)[:-6]: read_jsonl(f) for f in files}
    steps = {w: [r for r in rs if r.get("ev") == "step" and r.get("loss") is not None] for w, rs in rows.items()}
    steps = {w: s for w, s in steps.items() if s}
    written = []

    if steps:
        fig, ax = plt.subplots(2, 2, figsize=(11, 7))
        for w, s in steps.items():
            x = [r["step"] for r in s]
            loss = [r["loss"] for r in s]
            k = max(1, len(s) // 50)
            ax[0][0].plot(x, loss, alpha=0.25, label=f"{w} loss")
            ax[0][0].plot(x, smooth(loss, k), label=f"{w} loss, mean of {k}")
            ax[0][1].plot(x, smooth([r.get("acc1") or 0 for r in s], k), label=f"{w} acc at position 1")
            ax[1][0].plot(x, smooth([r.get("tau") or 0 for r in s], k), label=f"{w} expected tau")
            ax[1][1].plot(x, [r.get("lr") or 0 for r in s], label=f"{w} lr")
        try:  # D-PACE's loss is a sum over each block's positions, the decay loss a weighted mean in nats
            dpace = json.load(open(os.path.join(a.run_dir, "topology.json")))["drafter"].get("loss") == "dpace"
        except (OSError, ValueError, KeyError, TypeError):
            dpace = False
        loss_title = "training loss (D-PACE: a sum per block)" if dpace else "training loss (nats)"
        for axis, title in ((ax[0][0], loss_title), (ax[0][1], "accuracy at block position 1 (training batches)"),
                            (ax[1][0], "expected acceptance length (training batches)"), (ax[1][1], "learning rate")):
            axis.set_title(title, fontsize=10)
            axis.set_xlabel("optimizer step")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
        fig.suptitle(f"{a.run_dir}: training", fontsize=11)
        fig.tight_layout()
        p = os.path.join(out, "training.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    vals = sorted((r for rs in rows.values() for r in rs if r.get("ev") == "validation" and r.get("val_loss") is not None),
                  key=lambda r: r["step"])
    if vals:
        fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
        vx = [r["step"] for r in vals]
        for w, s in steps.items():  # the training figures, smoothed, for comparison
            k = max(1, len(s) // 50)
            ax[0].plot([r["step"] for r in s], smooth([r["loss"] for r in s], k), alpha=0.5,
                       label=f"{w} training loss, mean of {k}")
            ax[1].plot([r["step"] for r in s], smooth([r.get("tau") or 0 for r in s], k), alpha=0.5,
                       label=f"{w} training batches, mean of {k}")
        # the loss axis: the range the held-out points and the training curve share after the
        # first scored checkpoint (the first steps' loss, ~9 nats, would flatten everything)
        ys = [r["val_loss"] for r in vals]
        for w, s in steps.items():
            k = max(1, len(s) // 50)
            ys += [y for r, y in zip(s, smooth([r["loss"] for r in s], k)) if r["step"] >= vx[0]]
        lo, hi = min(ys), max(ys)
        ax[0].set_ylim(lo - 0.1 * (hi - lo + 1e-9), hi + 0.1 * (hi - lo + 1e-9))
        n = vals[-1].get("samples", "?")
        ax[0].plot(vx, [r["val_loss"] for r in vals], marker="o", color="black", label=f"held-out ({n} samples)")
        ax[1].plot(vx, [r.get("val_exp_tau") or 0 for r in vals], marker="o", color="black",
                   label=f"held-out ({n} samples)")
        pick = sorted(set([0, len(vals) // 3, (2 * len(vals)) // 3, len(vals) - 1]))
        for i in pick:
            acc = vals[i].get("val_acc") or []
            ax[2].plot(range(1, len(acc) + 1), [x if x is not None else float("nan") for x in acc], marker=".",
                       label=f"step {vals[i]['step']}")
        for axis, title, xl in ((ax[0], "loss (nats): held-out per checkpoint vs training", "optimizer step"),
                                (ax[1], "expected acceptance length", "optimizer step"),
                                (ax[2], "held-out accuracy per block position (teacher-forced)", "block position k")):
            axis.set_title(title, fontsize=10)
            axis.set_xlabel(xl)
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
        ax[2].set_ylim(-0.02, 1.02)
        fig.suptitle(f"{a.run_dir}: validation (validator, one point per scored checkpoint)", fontsize=11)
        fig.tight_layout()
        p = os.path.join(out, "validation.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    stages = {w: [r for r in rs if r.get("ev") == "stage"] for w, rs in rows.items()}
    stages = {w: s for w, s in stages.items() if s}
    if stages:
        t0 = min(s[0]["t"] for s in stages.values())
        fig, ax = plt.subplots(figsize=(11, 4))
        for w, s in sorted(stages.items()):
            x = [r["t"] - t0 for r in s]
            ax.plot(x, [r.get("busy_frac") or 0 for r in s], label=f"{w} busy")
            ax.plot(x, [r.get("wait_frac") or 0 for r in s], linestyle="--", label=f"{w} waiting")
        ax.set_title("share of each interval a worker was busy or waiting on a ring", fontsize=10)
        ax.set_xlabel("seconds since the first report")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=3)
        fig.tight_layout()
        p = os.path.join(out, "stages.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    evals = {}
    for name in ("untrained", "trained"):
        f = os.path.join(a.run_dir, f"eval_{name}.json")
        if os.path.exists(f):
            evals[name] = json.load(open(f))["overall"]
    if evals:
        fig, ax = plt.subplots(figsize=(8, 4))
        for name, o in evals.items():
            acc = o.get("pos_acc") or []
            ks = [k for k in range(1, len(acc)) if acc[k] is not None]
            ax.plot(ks, [acc[k] for k in ks], marker="o",
                    label=f"{name}: tau pooled {o.get('tau_token_weighted', 0):.2f}, median {o.get('tau_median', 0):.2f}")
        ax.set_title("held-out accuracy per block position (every output token as an anchor)", fontsize=10)
        ax.set_xlabel("block position k")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(out, "accuracy.png")
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)
    for p in written:
        print(f"plot_run: wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
