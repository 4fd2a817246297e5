#!/usr/bin/env python3
"""ckpt_reseal: rewrite a checkpoint step dir's manifest.json from the files as they are now
(sizes and SHA-256 digests, whole and in pieces), optionally with another step. Tests use it
to get a deliberately broken file past the checksum check so that the loader's own
validation (safetensors header, tensor names and shapes, trainer_state.json) is still
exercised, and to forge a consistent-looking manifest for the step checks. The manifest
format is docs/drafter.md's: version 2 (each file's digest and its pieces' digests, pieces
of "piece_bytes"), or with --v1 version 1 (whole-file digests only, what older builds
wrote).

usage: tests/ckpt_reseal.py STEP_DIR [--step N] [--v1]"""
import hashlib
import json
import os
import sys

FILES = ["model.safetensors", "optimizer.safetensors", "trainer_state.json"]
PIECE = 64 << 20  # DFLASH_MANIFEST_PIECE_BYTES


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    d = sys.argv[1]
    m = json.load(open(os.path.join(d, "manifest.json")))
    if "--step" in sys.argv:
        m["step"] = int(sys.argv[sys.argv.index("--step") + 1])
    v1 = "--v1" in sys.argv
    m["version"] = 1 if v1 else 2
    old = m.get("files", {})
    files = {}
    for f in FILES:
        p = os.path.join(d, f)
        if not os.path.exists(p):
            continue
        b = open(p, "rb").read()
        e = {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        if not v1:
            piece = int(old.get(f, {}).get("piece_bytes", PIECE))
            e["piece_bytes"] = piece
            e["sha256_pieces"] = [hashlib.sha256(b[i:i + piece]).hexdigest() for i in range(0, len(b), piece)]
        files[f] = e
    m["files"] = files
    open(os.path.join(d, "manifest.json"), "w").write(json.dumps(m, indent=2))


if __name__ == "__main__":
    main()
