#!/usr/bin/env python3
"""peer_torch.py: the eager-PyTorch peer of the drafter training step, for bench/drafter.

The C benchmark (bench/drafter/bench_drafter*) times its own training step and, in the same
call on the same GPU, runs this to time the PyTorch implementation of the same step
(tests/reference/dflash_torch.py step-bench: fwd + bwd + clip + fused AdamW, fp32 master weights,
bf16 autocast, SDPA with a dense bool mask, chunked frozen lm_head + CE). Shaped as a thin
wrapper so there is one PyTorch implementation, the one tests/test_dflash_torch.c checks.

Output: one JSON object per (seq, anchors) configuration on stdout (JSON lines), and with
--json-out the list in one file. Progress goes to stderr. Exit 0, or non-zero with a line
"dflash_torch: error: ..." when torch, CUDA or memory is missing.

    python3 bench/drafter/peer_torch.py                       # the four default configurations
    python3 bench/drafter/peer_torch.py --seq 768 --anchors 256 --json-out /tmp/peer.json
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE_DIR = os.path.join(HERE, "..", "..", "tests", "reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b-b16")
    ap.add_argument("--seq", type=int, nargs="+", default=[768, 2048])
    ap.add_argument("--anchors", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke test with --shape tiny")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "flex"],
                    help="sdpa (dense bool mask) or flex (flex_attention BlockMask + torch.compile, torch >= 2.5)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(REFERENCE_DIR))
    try:
        import dflash_torch
    except ImportError as e:
        print(f"peer_torch: error: cannot import tests/reference/dflash_torch.py ({e})", file=sys.stderr)
        return 1
    argv = ["step-bench", "--shape", a.shape, "--seq", *map(str, a.seq), "--anchors", *map(str, a.anchors),
            "--warmup", str(a.warmup), "--iters", str(a.iters), "--chunk", str(a.chunk), "--device", a.device, "--attn", a.attn]
    if a.json_out:
        argv += ["--json-out", a.json_out]
    try:
        return dflash_torch.main(argv)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - one clear line for the C bench's log
        import traceback
        traceback.print_exc()
        print(f"peer_torch: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
