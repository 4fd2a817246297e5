#!/usr/bin/env bash
# test_chaos: the failure-model table's first four rows under a random killer
# (docs/reliability.md). scripts/chaos.py attacks, this script judges.
#   1. the real pipeline (target0, postproc0, drafter0 on the tiny model, CPU): >= 20
#      SIGKILLs of random workers of every role at random moments (paced by progress), one
#      SIGSTOP that the heartbeat watchdog must find, and one SIGKILL of the orchestrator
#      followed by `orchestrator --resume <run dir>`. The run must end with exit 0, the
#      ledger audit must show every batch committed exactly once and none poisoned, the
#      drafter must have resumed from a checkpoint, the workers must have died with the
#      orchestrator, and the final checkpoint must load (dflash_tool inspect). Then a clean
#      run of the same deterministic topology: its final checkpoint and release export must
#      be byte-identical to the attacked run's (cmp).
#   2. drafter ranks: the fake worker as two drafter ranks (a group) plus a producer, random
#      SIGKILLs of all three; every drafter kill must restart the group, exactly once.
# Options (for the long version, e.g. on the GPU machine):
#   --kills N          kills in part 1 (default 20)      --group-kills N  part 2 (default 10)
#   --seed S           the killer's seed (default 1)     --samples M      data size (default 240)
#   --keep DIR         keep the part 1 run dir (and summary.json) at DIR
#   --cuda             part 1 on the CUDA backend (GPU 0: device rings, tmc target, dfc drafter)
# The last line names the attacked run's final checkpoint (final_checkpoint=PATH).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
KILLS=20 GROUP_KILLS=10 SEED=1 SAMPLES=240 KEEP= BACKEND=cpu GPU=-1
while [ $# -gt 0 ]; do
  case $1 in
    --kills) KILLS=$2; shift 2 ;;
    --group-kills) GROUP_KILLS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --cuda) BACKEND=cuda GPU=0; shift ;;
    *) echo "usage: $0 [--kills N] [--group-kills N] [--seed S] [--samples M] [--keep DIR] [--cuda]"; exit 2 ;;
  esac
done
for b in target_worker postproc_worker drafter_worker dflash_tool; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

# ---- 1. the real pipeline ------------------------------------------------------------------
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples "$SAMPLES" --max-len 300 >/dev/null || fail "prepare_data"
RUN=${KEEP:-$T/run-chaos}
[ -n "$KEEP" ] && { [ -e "$KEEP" ] && fail "--keep $KEEP exists"; mkdir -p "$(dirname "$KEEP")"; }
TOPO=$T/chaos.json
# small batches (token budget 400) so the epoch has many steps; checkpoint every 3 steps so a
# drafter kill rewinds little; a 3 s heartbeat timeout for the watchdog check; a restart
# limit far above what the killer does (a worker may be killed ~10 times within a minute)
cat >"$TOPO" <<JSON
{ "version": 1, "name": "chaos", "run_dir": "$RUN", "backend": "$BACKEND", "seed": 5, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 3, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 400, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 1048576, "max_attempts": 16, "gpu": $GPU },
             { "name": "pd", "slots": 4, "slot_bytes": 1048576, "max_attempts": 16, "gpu": $GPU } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp", "gpu": $GPU },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd", "gpu": $GPU },
               { "name": "drafter0", "role": "drafter", "in": "pd", "gpu": $GPU } ],
  "supervision": { "backoff_initial_ms": 20, "backoff_max_ms": 200, "stable_ms": 2000, "max_restarts": 200,
                   "restart_window_s": 60, "heartbeat_timeout_ms": 3000, "shutdown_timeout_ms": 5000,
                   "metrics_interval_ms": 500 } }
JSON
python3 scripts/chaos.py --orchestrator "$ORCH" --topology "$TOPO" --run-dir "$RUN" --kills "$KILLS" \
  --seed "$SEED" --orch-log "$T/orch.out" --summary "$T/summary.json" >"$T/chaos.out" 2>&1 \
  || { cat "$T/chaos.out"; fail "chaos.py failed"; }
grep '^chaos: ' "$T/chaos.out" | sed 's/^/  /'
S=$T/summary.json
sj() { pyjson "$S" "$1"; }
[ "$(sj "d['orchestrator_rc']")" = 0 ] || fail "the run ended with $(sj "d['orchestrator_rc']"), expected 0"
[ "$(sj "d['kills']")" -ge "$KILLS" ] || fail "only $(sj "d['kills']") of $KILLS kills: the run ended first"
for w in target0 postproc0 drafter0; do
  [ "$(sj "d['kills_by_worker'].get('$w', 0)")" -ge 1 ] || fail "$w was never killed: $(sj "d['kills_by_worker']")"
done
[ "$(sj "d['hang']['detected']")" = True ] || fail "SIGSTOP of $(sj "d['hang']['worker']"): no hang event"
hw=$(sj "d['hang']['worker']"); hpid=$(sj "d['hang']['pid']")
events exit | grep "\"pid\": $hpid," | grep -q '"signal": 9' || fail "the stopped $hw (pid $hpid) was not SIGKILLed"
[ "$(sj "d['orchestrator_kill']['workers_left']")" = "[]" ] || fail "workers outlived the orchestrator: $(sj "d['orchestrator_kill']")"
grep -q 'resume: ledger.bin: step [0-9]\|resume: nothing was committed yet' "$T/orch.out" || fail "--resume did not start from the ledger"
audit_exactly_once
n=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n" ] || fail "not every batch committed"
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "poisoned batches"
grep -q 'resumed from' "$RUN/logs/drafter0.log" || fail "the drafter never resumed from a checkpoint"
ckpt=$(sj "d['final_checkpoint']")
"$BIN/dflash_tool" inspect "$ckpt" >"$T/inspect.out" 2>&1 || { cat "$T/inspect.out"; fail "final checkpoint $ckpt does not load"; }
steps=$(python3 -c "import json;print(json.load(open('$ckpt/trainer_state.json'))['step'])")
[ "$steps" = "$n" ] || fail "final checkpoint at step $steps, expected $n (one step per batch)"
restarts=$(events restart | wc -l)
ok "pipeline: $(sj "d['kills']") kills $(sj "d['kills_by_worker']"), watchdog found the stopped $hw, orchestrator killed and resumed, $restarts restarts, $n batches exactly once, final step $steps"
[ -n "$KEEP" ] && cp "$S" "$KEEP/chaos_summary.json"

# the same topology, deterministic, without a single fault: the final checkpoint and the
# release export must be byte-identical to the attacked run's
CHAOS_RUN=$RUN; RUN=$T/run-clean
sed "s|\"run_dir\": \"$CHAOS_RUN\"|\"run_dir\": \"$RUN\"|" "$T/chaos.json" >"$T/clean.json"
grep -q "\"run_dir\": \"$RUN\"" "$T/clean.json" || fail "could not write the clean topology"
TOPO=$T/clean.json; start_orch; wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC: $(tail -5 "$T/orch.out")"
audit_exactly_once
[ "$(final_ckpt "$CHAOS_RUN")" = "$ckpt" ] || fail "chaos.py names $ckpt, the run's latest is $(final_ckpt "$CHAOS_RUN")"
same_result "$RUN" "$CHAOS_RUN" "chaos run"
ok "deterministic: the attacked run's final checkpoint $(basename "$ckpt") and release export are byte-identical to a clean run's"

# ---- 2. drafter ranks as a group (fake workers) ----------------------------------------------
export DF_SYNTHETIC_SAMPLES=1500
mkdir -p "$T/bin"; ln -s "$BIN/fake_worker" "$T/bin/fake_worker"; ln -s "$BIN/fake_worker" "$T/bin/drafter_worker"
topology group '[
  {"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"15"}},
  {"name":"d0","role":"drafter","in":"tp","rank":0,"env":{"DF_FAKE_SLOW_MS":"30","DF_FAKE_CKPT_EVERY":"3"}},
  {"name":"d1","role":"drafter","in":"tp","rank":1,"env":{"DF_FAKE_SLOW_MS":"30","DF_FAKE_CKPT_EVERY":"3"}}]' \
  '' '{"backoff_initial_ms":20,"backoff_max_ms":200,"stable_ms":2000,"max_restarts":200,"restart_window_s":60,"heartbeat_timeout_ms":5000,"shutdown_timeout_ms":3000,"metrics_interval_ms":300}' \
  "\"binaries\": {\"dir\": \"$T/bin\"},"
python3 scripts/chaos.py --orchestrator "$ORCH" --topology "$TOPO" --run-dir "$RUN" --kills "$GROUP_KILLS" \
  --seed "$SEED" --jitter-s 0.1 --no-stop --no-orchestrator-kill --orch-log "$T/orch2.out" --summary "$T/summary2.json" \
  >"$T/chaos2.out" 2>&1 || { cat "$T/chaos2.out"; fail "chaos.py (group) failed"; }
S=$T/summary2.json
[ "$(sj "d['orchestrator_rc']")" = 0 ] || { tail -20 "$T/orch2.out"; fail "group run ended with $(sj "d['orchestrator_rc']")"; }
[ "$(sj "d['kills']")" -ge "$GROUP_KILLS" ] || fail "group: only $(sj "d['kills']") kills"
dk=$(sj "sum(v for k, v in d['kills_by_worker'].items() if k != 'p0')")
[ "$dk" -ge 1 ] || fail "no drafter rank was killed: $(sj "d['kills_by_worker']")"
gr=$(events group_restart | wc -l)
[ "$gr" -ge "$dk" ] || fail "$dk drafter kills but $gr group restarts"
audit_exactly_once
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "group: poisoned batches"
ok "drafter ranks: $(sj "d['kills']") kills $(sj "d['kills_by_worker']"), $gr group restarts, $(pyjson "$RUN/ledger_audit.json" "d['n_batches']") batches exactly once"
echo "final_checkpoint=$ckpt"
echo "test_chaos: ok"
