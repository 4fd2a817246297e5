#!/usr/bin/env bash
# test_recipe_bench: bench/demo/recipe_cpu.sh (the make-run recipe trained per variant and
# judged by held-out tau) on the CPU at a tiny size: configs/tiny.json on its first 40
# answers (samples:40, a shard the script makes), 2 held-out prompts x 16 tokens, one seed.
# Checks:
#   - bad variants are refused before any work, exit 2, naming the part;
#   - two variants that change every kind of part (objective, attention kind and window,
#     depth, samples) train through the real pipeline and are evaluated: each run's
#     topology says what its variant asked for (the saved summary and eval JSON exist), the
#     table lists both with steps and tau, RES/recipe_cpu.json holds both rows, lossless.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for b in orchestrator target_worker postproc_worker drafter_worker dflash_eval; do
  [ -x "$BUILD/bin/$b" ] || { echo "missing $BUILD/bin/$b: build first (make)"; exit 1; }
done
tmp=$(mktemp -d /tmp/df_test_recipe_bench_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
B=bench/demo/recipe_cpu.sh

for bad in "decay" "sliding:" "layers:x" "window:4" "decay:7,,full"; do
  set +e
  RES=$tmp/bad bash $B "$bad" >"$tmp/out" 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "variant '$bad': exit $rc, expected 2: $(cat "$tmp/out")"
  grep -q "recipe_cpu: " "$tmp/out" || fail "variant '$bad': no message: $(cat "$tmp/out")"
done
set +e
RES=$tmp/bad bash $B "layers:0,full" >"$tmp/out" 2>&1; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "layers:0,full: 0: expected at least 1" "$tmp/out" || fail "layers:0: exit $rc: $(cat "$tmp/out")"
echo "ok: 6 bad variants refused with exit 2 before any work"

v1="decay:4,full,layers:1,samples:40"
v2="dpace:0.5,sliding:4,layers:2,samples:40"
RES=$tmp/res SEEDS=7 PROMPTS=2 MAX_NEW=16 bash $B "$v1" "$v2" >"$tmp/out" 2>&1 || fail "recipe_cpu failed: $(tail -20 "$tmp/out")"
cat "$tmp/out"
python3 - "$tmp/res" "$v1" "$v2" <<'PY' || fail "results"
import json, os, sys
res, v1, v2 = sys.argv[1:]
j = json.load(open(os.path.join(res, "recipe_cpu.json")))
rows = {r["variant"]: r for r in j["rows"]}
assert set(rows) == {v1, v2}, rows.keys()
for v, r in rows.items():
    assert r.get("steps", 0) > 0 and r["lossless"] and r["tau_pooled"] >= 1.0, r
    tag = v.replace(":", "_").replace(",", "+") + "_s7"
    s = json.load(open(os.path.join(res, tag + "_summary.json")))
    assert s["steps"] == r["steps"], (s, r)
    c = json.load(open(os.path.join(res, tag + "_drafter_config.json")))
    kinds = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    if v == v1:
        assert s["loss"] == "decay" and c["num_hidden_layers"] == 1 and kinds == ["full_attention"], (s, c)
    else:
        assert s["loss"] == "dpace" and c["num_hidden_layers"] == 2 and c["sliding_window"] == 4 and \
            kinds == ["sliding_attention"] * 2, (s, c)
print("ok: both variants trained and evaluated, lossless:",
      ", ".join(f"{v} {r['steps']} steps tau {r['tau_pooled']:.2f}" for v, r in rows.items()))
PY
grep -q "^$v1 " "$tmp/out" && grep -q "^$v2 " "$tmp/out" || fail "the table lacks a variant"
echo "PASS test_recipe_bench"
