#!/usr/bin/env bash
# test_release_engine: what an exported drafter needs to load in the public loaders, checked
# without transformers (docs/export.md; the transformers half runs on the GPU machine,
# tests/reference/engine_load_check.py):
#   - dflash_tool export writes dflash.py, byte for byte common/dflash/dflash.py (compiled
#     into the binary), private (0600), valid Python; config.json's auto_map names its class;
#   - config.json carries every field z-lab's DFlashDraftModel, transformers' Qwen3Config
#     and the SGLang / vLLM DFlash loaders read (listed below), with the drafter's values;
#   - dflash_logits (our dflash_infer) reproduces the float64 PyTorch draft stored beside a
#     release made by transformers (tests/fixtures/dflash-release-tiny/reference.safetensors);
#     its bad inputs exit 2 / 100 with the file and tensor named;
#   - where torch exists: engine_load_check.py passes on two exports (a 1-layer drafter of
#     the make-run shape, a 2-layer one with a sliding-attention layer): dflash_logits equals
#     tests/reference/dflash_torch.py's forward on random features at several anchors; and it
#     fails on an export without dflash.py or without a required config field.
set -euo pipefail
BUILD=${BUILD:-build}
TOOL=$BUILD/bin/dflash_tool
LOGITS=$BUILD/bin/dflash_logits
FIX=tests/fixtures/dflash-release-tiny
tmp=$(mktemp -d /tmp/df_test_release_engine_XXXXXX); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -f models/tiny-target/model.safetensors ] || { echo "SKIPPED: models/tiny-target is missing (run from the repository root)"; exit 77; }

# two drafters for the tiny target: the make-run shape, and 2 layers with a sliding one
python3 - "$tmp" <<'PY'
import json, sys
base = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "num_target_layers": 4, "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 261},
        "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 264, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "layer_types": ["full_attention"]}
json.dump(base, open(sys.argv[1] + "/a.json", "w"))
base.update(num_hidden_layers=2, block_size=8, layer_types=["full_attention", "sliding_attention"],
            sliding_window=6, use_sliding_window=True)
json.dump(base, open(sys.argv[1] + "/b.json", "w"))
PY
for v in a b; do
  "$TOOL" init --out "$tmp/ck-$v" --config "$tmp/$v.json" --seed 7 >/dev/null
  (umask 000; "$TOOL" export "$tmp/ck-$v" "$tmp/rel-$v" >/dev/null)
done

# 1. the modeling file
for v in a b; do
  cmp -s common/dflash/dflash.py "$tmp/rel-$v/dflash.py" || fail "rel-$v/dflash.py is not common/dflash/dflash.py"
  [ "$(stat -c %a "$tmp/rel-$v/dflash.py")" = 600 ] || fail "rel-$v/dflash.py mode $(stat -c %a "$tmp/rel-$v/dflash.py"), expected 600"
done
python3 -c 'import ast, sys; t = ast.parse(open(sys.argv[1]).read());
assert any(isinstance(n, ast.ClassDef) and n.name == "DFlashDraftModel" for n in t.body), "no class DFlashDraftModel"' \
  "$tmp/rel-a/dflash.py" || fail "dflash.py does not parse or has no DFlashDraftModel"
echo "ok: export writes dflash.py (= common/dflash/dflash.py, 0600, parses, defines DFlashDraftModel)"

# 2. config.json: every field the public loaders read, with the drafter's values
python3 - "$tmp" <<'PY' || fail "config.json fields"
import json, sys
t = sys.argv[1]
for v, B, L, types, sw in (("a", 16, 1, ["full_attention"], None),
                           ("b", 8, 2, ["full_attention", "sliding_attention"], 6)):
    c = json.load(open(f"{t}/rel-{v}/config.json"))
    # z-lab's DFlashDraftModel: Qwen3Config fields its layers, rotary embedding and MLP read,
    # plus block_size, dflash_config (num_target_layers when target_layer_ids is absent);
    # transformers: model_type, auto_map, dtype, rope; SGLang / vLLM: architectures,
    # dflash_config.{target_layer_ids, mask_token_id, block_size}, block_size
    want = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "dtype": "bfloat16", "torch_dtype": "bfloat16",
            "block_size": B, "num_target_layers": 4, "hidden_size": 128, "intermediate_size": 384,
            "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "vocab_size": 264, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "hidden_act": "silu",
            "attention_bias": False, "layer_types": types, "sliding_window": sw, "use_sliding_window": sw is not None,
            "tie_word_embeddings": True, "max_position_embeddings": c.get("max_position_embeddings"),
            "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 261, "block_size": B}}
    bad = {k: (c.get(k, "<missing>"), w) for k, w in want.items() if c.get(k, "<missing>") != w}
    assert not bad, f"rel-{v}/config.json: field: (have, want): {bad}"
    assert isinstance(c["max_position_embeddings"], int) and c["max_position_embeddings"] > 0
print("ok: config.json has every field the public loaders read, with the drafter's values (both exports)")
PY

# 3. dflash_logits against the float64 PyTorch draft of a transformers-made release
"$LOGITS" --target models/tiny-target --drafter "$FIX" --in "$FIX/reference.safetensors" --out "$tmp/fix.st" \
  2>/dev/null || fail "dflash_logits on the release fixture"
python3 - "$FIX/reference.safetensors" "$tmp/fix.st" <<'PY' || fail "dflash_logits vs the fixture's PyTorch logits"
import array, json, math, struct, sys
def read(path, name):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])[name]
    assert h["dtype"] == "F32", h
    a, b = h["data_offsets"]
    return array.array("f", raw[8 + n + a:8 + n + b]), h["shape"]
ref, rs = read(sys.argv[1], "logits")
got, gs = read(sys.argv[2], "logits")
assert gs == [1] + rs, (gs, rs)
err = math.sqrt(sum((x - y) ** 2 for x, y in zip(got, ref)) / sum(y * y for y in ref))
V = rs[1]
same = sum(max(range(V), key=lambda i: got[k * V + i]) == max(range(V), key=lambda i: ref[k * V + i])
           for k in range(rs[0]))
print(f"ok: dflash_logits on the release fixture vs PyTorch float64: relative L2 {err:.2e}, {same} of {rs[0]} argmax equal")
assert err < 1e-4 and same == rs[0]
PY

# bad inputs: usage 2, bad files 100 naming the file and the tensor
set +e
"$LOGITS" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no arguments: expected exit 2"
"$LOGITS" --target models/tiny-target --drafter "$FIX" --in "$tmp/fix.st" --out "$tmp/x.st" 2>"$tmp/e1"; rc=$?
[ $rc -eq 100 ] && grep -q 'fix.st: tensor "H" missing' "$tmp/e1" || { cat "$tmp/e1"; fail "input without H: expected exit 100 naming H (rc $rc)"; }
"$LOGITS" --target tests/fixtures/tiny-qwen3 --drafter "$FIX" --in "$FIX/reference.safetensors" --out "$tmp/x.st" 2>"$tmp/e2"; rc=$?
[ $rc -eq 100 ] && grep -q "$FIX/config.json: hidden_size 128 / vocab_size 264 do not match the target tests/fixtures/tiny-qwen3/config.json" "$tmp/e2" ||
  { cat "$tmp/e2"; fail "drafter of another target: expected exit 100 naming both config files (rc $rc)"; }
set -e
python3 - "$tmp/bad.st" <<'PY'
import json, struct, sys
# H [4, 256] zeros, tokens [4], anchors [0]: anchor 0 has no context
t = {"H": ("F32", [4, 256], b"\0" * 4096), "tokens": ("I32", [4], b"\0" * 16), "anchors": ("I32", [1], b"\0" * 4)}
h, blobs, off = {}, b"", 0
for k, (dt, sh, b) in t.items():
    h[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(b)]}; blobs += b; off += len(b)
hj = json.dumps(h).encode(); hj += b" " * (-len(hj) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hj)) + hj + blobs)
PY
set +e
"$LOGITS" --target models/tiny-target --drafter "$FIX" --in "$tmp/bad.st" --out "$tmp/x.st" 2>"$tmp/e3"; rc=$?
set -e
[ $rc -eq 100 ] && grep -q "anchors\[0\] = 0: anchors must be ascending integers in 1..3" "$tmp/e3" || { cat "$tmp/e3"; fail "anchor 0: expected exit 100 (rc $rc)"; }
echo "ok: dflash_logits: no arguments -> 2; no H, another target's drafter, anchor without context -> 100 naming it"

# 4. engine_load_check.py (its transformers parts skip here) where a Python has torch
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ]; then
  echo "SKIPPED part: no Python with torch here, engine_load_check.py not run"
else
  for v in a b; do
    BUILD=$BUILD "$py" tests/reference/engine_load_check.py --export "$tmp/rel-$v" --target models/tiny-target \
      --context 40 --device cpu >"$tmp/chk-$v" 2>&1 || { cat "$tmp/chk-$v"; fail "engine_load_check on rel-$v"; }
    grep -Eq "^reference: dflash_torch.py +float64 .* ok$" "$tmp/chk-$v" || { cat "$tmp/chk-$v"; fail "rel-$v: no reference row"; }
    grep "^reference" "$tmp/chk-$v" | sed "s/^/  rel-$v: /"
  done
  # the check fails on an export that lacks the modeling file or a field the loaders read
  cp -r "$tmp/rel-a" "$tmp/rel-nopy" && rm "$tmp/rel-nopy/dflash.py"
  cp -r "$tmp/rel-a" "$tmp/rel-nodt"
  "$py" -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); del c["dtype"]; json.dump(c, open(p, "w"))' \
    "$tmp/rel-nodt/config.json"
  for v in nopy:"dflash.py (the class auto_map names) is missing" nodt:"missing field(s) \['dtype'\]"; do
    set +e
    BUILD=$BUILD "$py" tests/reference/engine_load_check.py --export "$tmp/rel-${v%%:*}" --target models/tiny-target \
      --context 16 --device cpu >"$tmp/chk-bad" 2>&1; rc=$?
    set -e
    [ $rc -eq 1 ] && grep -q "FAIL: .*${v#*:}" "$tmp/chk-bad" || { cat "$tmp/chk-bad"; fail "engine_load_check on rel-${v%%:*}: expected exit 1 naming it (rc $rc)"; }
  done
  echo "ok: engine_load_check.py ($py): C == float64 reference on both exports; fails without dflash.py / without dtype"
fi
echo "ok"
