#!/usr/bin/env bash
# test_drafter_learns: a drafter trained by the real CPU pipeline on the tiny target's own
# answers decodes held-out prompts better than the same drafter at its initial weights.
# Deterministic mode: the figures are the same on every run on one machine, so the margins
# below are not timing-dependent. The trained drafter must beat the untrained one by
#   tau pooled per verify step:    >= untrained + MARGIN_TAU (0.15)
#   accuracy at block position 1:  >= untrained + MARGIN_ACC (0.10)
# and both decodes must equal plain greedy decoding (lossless).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker dflash_eval; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 360 --max-len 512 >/dev/null || fail "prepare_data"
RUN=$T/run; TOPO=$T/learn.json
cat >"$TOPO" <<JSON
{ "version": 1, "name": "learns", "run_dir": "$RUN", "backend": "cpu", "seed": 1234, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 16, "num_anchors": 32, "lr": 3e-3, "checkpoint_every": 1000,
               "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 1024, "max_seq_len": 512 },
  "rings": [ { "name": "tp", "slots": 8, "slot_bytes": 4194304 }, { "name": "pd", "slots": 8, "slot_bytes": 4194304 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" } ],
  "supervision": { "heartbeat_timeout_ms": 60000, "metrics_interval_ms": 1000 } }
JSON
start_orch; wait_orch 500
[ "$ORCH_RC" = 0 ] || fail "training run exited $ORCH_RC"
[ -f "$RUN/drafter/config.json" ] || fail "no release drafter in $RUN/drafter"
ev() { # ev NAME EXTRA...
  local n=$1; shift
  "$BIN/dflash_eval" --target models/tiny-target --drafter "$RUN/drafter" --prompts data/tiny/chat-heldout.jsonl \
    --max-prompts 16 --max-new 96 --quiet --json "$T/$n.json" "$@" >"$T/$n.txt" 2>&1 || { cat "$T/$n.txt"; fail "dflash_eval $n"; }
}
ev trained
ev untrained --random-drafter 1234
python3 - "$T" <<'PY' || fail "the trained drafter does not beat the untrained one"
import json, sys
t = json.load(open(f"{sys.argv[1]}/trained.json"))["overall"]
u = json.load(open(f"{sys.argv[1]}/untrained.json"))["overall"]
MARGIN_TAU, MARGIN_ACC = 0.15, 0.10
for name, o in (("untrained", u), ("trained", t)):
    print(f"{name:9}: tau pooled {o['tau_token_weighted']:.3f}, mean {o['tau']:.3f}, median {o['tau_median']:.3f}, "
          f"acc k=1..4 {[round(x, 3) for x in o['pos_acc'][1:5]]}, mismatches {o['mismatches']}")
ok = True
if t["mismatches"] or u["mismatches"]:
    print("FAIL: speculative output differs from plain decoding"); ok = False
if not t["tau_token_weighted"] >= u["tau_token_weighted"] + MARGIN_TAU:
    print(f"FAIL: pooled tau {t['tau_token_weighted']:.3f} < untrained {u['tau_token_weighted']:.3f} + {MARGIN_TAU}"); ok = False
if not t["pos_acc"][1] >= u["pos_acc"][1] + MARGIN_ACC:
    print(f"FAIL: position-1 accuracy {t['pos_acc'][1]:.3f} < untrained {u['pos_acc'][1]:.3f} + {MARGIN_ACC}"); ok = False
sys.exit(0 if ok else 1)
PY
echo "ok: the trained drafter beats the untrained one on held-out prompts"
