#!/usr/bin/env bash
# test_init_dir_shape: a drafter.init_dir release of another shape than the topology's
# drafter is refused by the drafter worker itself, not only by the orchestrator's start
# check (orchestrator/setup.c, check_init_dir; tests/test_resume_changes.sh part 4).
# The release can change after that check: the drafter reads init_dir again on every
# start until a checkpoint is committed. Before, the worker took the release's block size
# (and depth, mask token) in place of the topology's without a word.
#   1. the orchestrator starts on a release that fits (the tiny fixture, block 16, on the
#      tiny target) and is paused once the drafter is up (no checkpoint: checkpoint_every
#      is past the run);
#   2. the release's config.json is given block_size 8 and the drafter is SIGKILLed: its
#      restart reads init_dir again and exits 100 (permanent, not restarted) naming the
#      file, the field and both values, and the run ends with exit 1;
#   3. the same with other capture layers ([1, 2] for the topology's [1, 3]);
#   4. the same with other attention layers: the topology says "layer_types":
#      ["full_attention"], the release's one layer is made sliding (window 4).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
M=$PWD/models/tiny-target
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 40 --max-len 300 >/dev/null || fail "prepare_data"

run_case() { # NAME PYTHON-EDIT-OF-THE-RELEASE-CONFIG EXPECTED-MESSAGE [DRAFTER-FIELDS]
  local name=$1 edit=$2 want=$3 extra=${4:+$4, }
  REL=$T/release-$name
  cp -r tests/fixtures/dflash-release-tiny "$REL"
  RUN=$T/run-$name; TOPO=$T/$name.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$name", "run_dir": "$RUN", "backend": "cpu", "seed": 5,
  "target": { "model_dir": "$M", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 16, "num_anchors": 8, "checkpoint_every": 100000,
               ${extra}"mask_token_id": 261, "init_dir": "$REL" },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 400, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 1048576 }, { "name": "pd", "slots": 4, "slot_bytes": 1048576 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" } ],
  "supervision": { "max_restarts": 3, "backoff_initial_ms": 20, "metrics_interval_ms": 5000,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000 } }
JSON
  start_orch
  wait_for 60 test -S "$RUN/ctl.sock" || fail "$name: no control socket"
  "$DFCTL" --run-dir "$RUN" pause >/dev/null || fail "$name: dfctl pause"
  wait_for 60 grep -q 'drafter0: ready' "$RUN/logs/drafter0.log" || fail "$name: the drafter did not start on the fitting release"
  python3 -c "
import json, sys
p = sys.argv[1]; c = json.load(open(p))
$edit
json.dump(c, open(p, 'w'), indent=1)" "$REL/config.json" || fail "$name: editing the release"
  # SIGKILL: no checkpoint on the way out (a stop would write one, and the restart would
  # resume from it instead of init_dir); the supervisor restarts the drafter at once
  "$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "$name: dfctl kill drafter0"
  "$DFCTL" --run-dir "$RUN" resume >/dev/null || fail "$name: dfctl resume"
  wait_orch 120
  [ "$ORCH_RC" = 1 ] || fail "$name: the run ended with exit $ORCH_RC, expected 1 (the drafter refused its release)"
  grep -q 'drafter0 failed permanently (exit 100)' "$T/orch.out" || fail "$name: no permanent drafter failure: $(tail -5 "$T/orch.out")"
  [ -z "$(events checkpoint)" ] || fail "$name: a checkpoint was committed: the restart did not read init_dir"
  grep -qF -- "$want" "$RUN/logs/drafter0.log" || fail "$name: the drafter's log lacks '$want': $(tail -3 "$RUN/logs/drafter0.log")"
  ok "$name: the release changed after the start check: the restarted drafter exits 100 (\"${want#*config.json: }\"), the run exit 1"
}

run_case block "c['block_size'] = 8" \
  "drafter.init_dir: $T/release-block/config.json: block_size is 8, but drafter.block_size is 16"
run_case layers "c['dflash_config']['target_layer_ids'] = [1, 2]" \
  "drafter.init_dir: $T/release-layers/config.json: dflash_config.target_layer_ids is [1,2], but target.capture_layers is [1,3]"
run_case kinds "c['layer_types'] = ['sliding_attention']; c['sliding_window'] = 4; c['use_sliding_window'] = True" \
  "drafter.init_dir: $T/release-kinds/config.json: layer_types[0] is \"sliding_attention\", but drafter.layer_types[0] is \"full_attention\"" \
  '"layer_types": ["full_attention"]'
echo "PASS test_init_dir_shape"
