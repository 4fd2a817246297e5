#!/usr/bin/env bash
# test_moe_pipeline: a mixture-of-experts target (Qwen3-MoE) through the whole CPU path, on the
# tiny transformers fixture tests/fixtures/tiny-qwen3-moe (scripts/make_moe_fixture.py; 2 of
# its 4 layers routed, 8 experts, top 2), or, while that fixture is absent, a random checkpoint
# of the same shape made by tests/make_tiny_moe.py.
#   1. target_generate on the MoE target (KV decode through routed experts) writes the
#      training data: each prompt's greedy continuation, batched == the same prompt alone;
#   2. make_topology reads the MoE config (its expert line, capture layer L/2 = 2);
#   3. the 3-worker pipeline (orchestrator + target + postproc + drafter) trains on it:
#      exit 0, the ledger audit shows every batch exactly once;
#   4. the exported drafter speculates against the MoE target in dflash_eval (multi-row
#      verify through the experts), one prompt at a time and batched: lossless (0 mismatches
#      with plain greedy decoding).
# MOE_TARGET overrides the model directory (any Qwen3-MoE checkpoint small enough for the CPU).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
MODEL=${MOE_TARGET:-$PWD/tests/fixtures/tiny-qwen3-moe}
if [ ! -f "$MODEL/config.json" ]; then
  # the transformers fixture is made on the GPU machine; until it is committed, a random
  # checkpoint of the same shape and scales made here (tests/make_tiny_moe.py) runs the path
  MODEL=$T/tiny-moe
  python3 tests/make_tiny_moe.py "$MODEL" || fail "tests/make_tiny_moe.py"
  echo "note: no transformers fixture (tests/fixtures/tiny-qwen3-moe): the random stand-in $MODEL"
fi
for b in target_worker postproc_worker drafter_worker dflash_tool dflash_eval target_generate; do
  [ -x "$BIN/$b" ] || fail "missing $BIN/$b"
done
V=$(pyjson "$MODEL/config.json" "d['vocab_size']")

# --- 1. data: random prompts, the MoE target's own greedy continuations --------------------------
python3 - "$T" "$V" <<'PY' || fail "writing the prompt shards"
import random, sys
sys.path.insert(0, "scripts")
from prepare_data import write_shard
T, V = sys.argv[1], int(sys.argv[2])
r = random.Random(11)
for name, n in (("prompts", 48), ("heldout", 4)):
    s = []
    for _ in range(n):
        p = [r.randrange(V) for _ in range(r.randrange(4, 12))]
        s.append((p + [0], [0] * len(p) + [1]))  # the prompt ends where the loss mask starts
    write_shard(f"{T}/{name}.dfs", V, s)
PY
"$BIN/target_generate" --target "$MODEL" --prompts "$T/prompts.dfs" --out "$T/gen" --max-new 40 --greedy \
  --batch 8 --quiet >"$T/gen.out" 2>&1 || { cat "$T/gen.out"; fail "target_generate (batch 8)"; }
grep -q "mixture of experts: 2 of 4 layers routed" "$T/gen.out" || { cat "$T/gen.out"; fail "no MoE load line"; }
"$BIN/target_generate" --target "$MODEL" --prompts "$T/prompts.dfs" --out "$T/gen1" --max-new 40 --greedy \
  --batch 1 --max-prompts 6 --quiet >"$T/gen1.out" 2>&1 || { cat "$T/gen1.out"; fail "target_generate (batch 1)"; }
python3 - "$T" <<'PY' || fail "generated data"
import sys
sys.path.insert(0, "tests")
from chat_shards import read_shard
T = sys.argv[1]
many, one = read_shard(f"{T}/gen-000.dfs"), read_shard(f"{T}/gen1-000.dfs")
assert len(many) == 48 and len(one) == 6, (len(many), len(one))
assert many[:6] == one, "batched decode of the MoE target differs from one prompt at a time"
lens = [len(t) for t, _ in many]
assert min(lens) > 40 and len({tuple(t[-40:]) for t, _ in many}) > 40, "continuations missing or all alike"
print(f"ok: 48 greedy continuations of 40 tokens, batch 8 == batch 1 on the first 6")
PY
ok "target_generate on the MoE target"

# --- 2. make_topology ----------------------------------------------------------------------------
RUN=$T/run-moe; TOPO=$T/moe.json
python3 scripts/make_topology.py --target "$MODEL" --data "$T/gen-000.dfs" --backend cpu --drafter-layers 1 \
  --mask-token-id $((V - 1)) --block-size 8 --anchors 16 --token-budget 512 --run-dir "$RUN" --out "$TOPO" \
  2>"$T/topo.err" || { cat "$T/topo.err"; fail "make_topology"; }
grep -q "mixture of experts: 2 of 4 layers sparse, 8 experts of width 32, top 2" "$T/topo.err" ||
  { cat "$T/topo.err"; fail "make_topology: no MoE line"; }
grep -q "all 8 experts of 1 sparse layers" "$T/topo.err" || { cat "$T/topo.err"; fail "make_topology: memory line"; }
[ "$(pyjson "$TOPO" "d['target']['capture_layers']")" = "[2]" ] || fail "capture layers"

# --- 3. the pipeline, exactly once -----------------------------------------------------------------
start_orch; wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "MoE pipeline run exited $ORCH_RC"
audit_exactly_once
grep -q '"ev":"step"' "$RUN/metrics/drafter0.jsonl" || fail "no drafter steps"
grep -q "mixture of experts" "$RUN/logs/target0.log" || fail "target0 did not load the MoE target"
ok "3-worker pipeline on the MoE target: every batch exactly once"

# --- 4. speculative decoding against the MoE target --------------------------------------------------
"$BIN/dflash_tool" export "$RUN/checkpoints" "$T/release" >/dev/null || fail "dflash_tool export"
for batch in 1 3; do
  "$BIN/dflash_eval" --target "$MODEL" --drafter "$T/release" --prompts "$T/heldout.dfs" --max-prompts 4 \
    --max-new 32 --eos -1 --batch $batch --quiet --json "$T/eval$batch.json" >"$T/eval$batch.txt" 2>&1 ||
    { cat "$T/eval$batch.txt"; fail "dflash_eval --batch $batch"; }
  python3 - "$T/eval$batch.json" $batch <<'PY' || fail "dflash_eval result (batch $batch)"
import json, sys
o = json.load(open(sys.argv[1]))["overall"]
assert o["n_prompts"] == 4 and o["mismatches"] == 0 and o["tau"] >= 1.0, o
print(f"ok: dflash_eval --batch {sys.argv[2]} on the MoE target: tau {o['tau']:.2f}, lossless on 4 prompts")
PY
done
ok "MoE target: generate -> make_topology -> pipeline -> export -> speculative eval"
