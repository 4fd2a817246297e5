#!/usr/bin/env python3
"""make_multigpu_topology.py: the topologies for 2, 4 and 8 GPUs of one host.

    python3 scripts/make_multigpu_topology.py            # writes configs/qwen3-{1.7b,8b}-{2,4,8}gpu.json

The split between target and drafter GPUs comes from the stage-alone rates measured on the
H200 in the same call as the one-GPU pipeline run (bench/results/pipeline/, docs/pipeline.md):

    Qwen3-1.7B: target 173K tok/s, drafter 29.8K tok/s per GPU
    Qwen3-8B:   target 40.5K tok/s, drafter 12.0K tok/s per GPU

For N GPUs it picks t target GPUs and d = N - t drafter GPUs maximising min(t * target,
d * drafter) (fewest targets on a tie). Each target writes its own "tp<i>" ring on its GPU;
each drafter rank r has its own postproc worker on the drafter's GPU (it pulls the features
from the target's GPU with a peer copy, so the target never waits on it) and its own "pd<r>"
ring there; postprocs are spread over the target rings round-robin. Drafter ranks form one
NCCL group.
"""
import json
import os

RATES = {"1.7b": (173_000, 29_800), "8b": (40_500, 12_000)}
SLOT = {"1.7b": 201326592, "8b": 369098752}
CAPTURE = {"1.7b": [1, 7, 13, 19, 25], "8b": [1, 9, 17, 25, 33]}
ANCHORS = {"1.7b": 64, "8b": 512}


def split(n, shape):
    tgt, dra = RATES[shape]
    best = max(range(1, n), key=lambda t: (min(t * tgt, (n - t) * dra), -t))
    return best, n - best, min(best * tgt, (n - best) * dra)


def topology(shape, n):
    t, d, rate = split(n, shape)
    base = json.load(open(f"configs/qwen3-{shape}.json"))
    base["name"] = f"qwen3-{shape}-{n}gpu"
    base["description"] = (f"benchmark: configs/qwen3-{shape}.json spread over {n} GPUs by "
                           f"scripts/make_multigpu_topology.py ({t} target : {d} drafter GPUs); random weights, "
                           f"not a training recipe (for a real checkpoint: scripts/make_topology.py)")
    base["run_dir"] = f"gpu/runs/qwen3-{shape}-{n}gpu"
    base["drafter"]["num_anchors"] = ANCHORS[shape]
    rings, workers = [], []
    for i in range(t):
        rings.append({"name": f"tp{i}", "slots": 4, "slot_bytes": SLOT[shape], "max_attempts": 3, "gpu": i})
        workers.append({"name": f"target{i}", "role": "target", "gpu": i, "out": f"tp{i}"})
    for r in range(d):
        g = t + r
        rings.append({"name": f"pd{r}", "slots": 3, "slot_bytes": SLOT[shape], "max_attempts": 3, "gpu": g})
        workers.append({"name": f"postproc{r}", "role": "postproc", "gpu": g, "in": f"tp{r % t}", "out": f"pd{r}"})
        workers.append({"name": f"drafter{r}", "role": "drafter", "gpu": g, "in": f"pd{r}", "rank": r})
    base["rings"], base["workers"] = rings, workers
    split_note = (f"{t} target GPU(s) : {d} drafter GPU(s); predicted bound "
                      f"min({t} x {RATES[shape][0]}, {d} x {RATES[shape][1]}) = {rate} tok/s")
    return base, t, d, rate, split_note


def main():
    for shape in ("1.7b", "8b"):
        for n in (2, 4, 8):
            topo, t, d, rate, note = topology(shape, n)
            path = f"configs/qwen3-{shape}-{n}gpu.json"
            with open(path + ".tmp", "w") as f:
                json.dump(topo, f, indent=1)
                f.write("\n")
            os.rename(path + ".tmp", path)
            print(f"{path}: {note}")


if __name__ == "__main__":
    main()
