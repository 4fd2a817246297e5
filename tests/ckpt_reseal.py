#!/usr/bin/env python3
"""ckpt_reseal: rewrite a checkpoint step dir's manifest.json from the files as they are now
(sizes and SHA-256), optionally with another step. Tests use it to get a deliberately broken
file past the checksum check so that the loader's own validation (safetensors header, tensor
names and shapes, trainer_state.json) is still exercised, and to forge a consistent-looking
manifest for the step checks.

usage: tests/ckpt_reseal.py STEP_DIR [--step N]"""
import hashlib
import json
import os
import sys

FILES = ["model.safetensors", "optimizer.safetensors", "trainer_state.json"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    m = json.load(open(os.path.join(d, "manifest.json")))
    if "--step" in sys.argv:
        m["step"] = int(sys.argv[sys.argv.index("--step") + 1])
    files = {}
    for f in FILES:
        p = os.path.join(d, f)
        if os.path.exists(p):
            b = open(p, "rb").read()
            files[f] = {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
    m["files"] = files
    open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m, indent=2))


if __name__ == "__main__":
    main()
