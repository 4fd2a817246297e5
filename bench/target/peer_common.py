"""peer_common.py: what the two transformers peers of the CUDA target forward share
(peer_transformers.py for bench_target, moe_peer.py for bench_moe): the bf16 8192^3 matmul
their MFU is over, the timing of a forward (its first call apart, then CUDA events) and the
JSON they print and write. Imported from the peers' own folder (python3 puts a script's
folder on sys.path)."""
import json
import time

import torch


def timed(fn, iters):
    """The mean ms of iters calls of fn between two CUDA events."""
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    for _ in range(iters):
        fn()
    ev1.record()
    torch.cuda.synchronize()
    return ev0.elapsed_time(ev1) / iters  # ms


def matmul_ceiling_tflops(dev):
    """TFLOP/s of torch's bf16 8192^3 matmul on dev: 3 calls to warm up, then 20 timed. Draws
    its operands from torch's generator: seed it first, the peers' inputs come after."""
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    ms = timed(lambda: x @ y, 20)
    del x, y
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


def time_forward(fwd, row, warm, iters):
    """fwd's first call apart (plans, compiles: its seconds go to row["first_call_s"] before
    anything else can fail), warm more calls, then the mean ms of iters timed calls."""
    torch.cuda.synchronize()
    t0 = time.time()
    fwd()
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.time() - t0, 2)
    for _ in range(warm):
        fwd()
    torch.cuda.synchronize()
    return timed(fwd, iters)


def write_json(out, path):
    """out as indented JSON text, also written to path (with a newline) when path is set."""
    text = json.dumps(out, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return text
