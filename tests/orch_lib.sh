#!/usr/bin/env bash
# orch_lib.sh: shared helpers for the tests/test_orch_*.sh scripts (sourced, not run).
# Each test gets a private temp dir ($T) with the run dir under it, fake workers
# (build/bin/fake_worker, role "test") and synthetic sample lengths (DF_SYNTHETIC_SAMPLES),
# so no model or shard is needed. Everything the test started is killed on exit.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$PWD/$BUILD/bin
ORCH=$BIN/orchestrator
DFCTL=$BIN/dfctl
for b in "$ORCH" "$DFCTL" "$BIN/fake_worker"; do
  [ -x "$b" ] || { echo "missing $b: build first (make BUILD_ROOT=...)"; exit 1; }
done
T=$(mktemp -d /tmp/df_orch_test.XXXXXX)
ORCH_PID=
cleanup() {
  if [ -n "$ORCH_PID" ] && kill -0 "$ORCH_PID" 2>/dev/null; then kill -KILL "$ORCH_PID" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
export DF_SYNTHETIC_SAMPLES=${DF_SYNTHETIC_SAMPLES:-120}

fail() { echo "FAIL: $*"; if [ -n "${RUN:-}" ]; then
  echo "--- orchestrator.jsonl"; tail -n 30 "$RUN/metrics/orchestrator.jsonl" 2>/dev/null
  for f in "$RUN"/logs/*.log; do echo "--- $f"; tail -n 8 "$f"; done; fi
  [ -f "$T/orch.out" ] && { echo "--- orchestrator output"; tail -n 30 "$T/orch.out"; }
  exit 1; }
ok() { echo "ok: $*"; }

# topology NAME WORKERS_JSON [RINGS_JSON] [SUPERVISION_JSON] [EXTRA_TOP_LEVEL]: writes $T/NAME.json, sets RUN
topology() {
  local name=$1 workers=$2
  local rings=${3:-'[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":3}]'}
  local sup=${4:-'{"backoff_initial_ms":50,"backoff_max_ms":400,"stable_ms":5000,"max_restarts":5,"restart_window_s":30,"heartbeat_timeout_ms":5000,"shutdown_timeout_ms":3000,"metrics_interval_ms":300}'}
  local extra=${5:-}
  RUN=$T/run-$name
  cat > "$T/$name.json" <<JSON
{ "version": 1, "name": "$name", "run_dir": "$RUN", "backend": "cpu", "seed": 11, $extra
  "target": { "model_dir": "none", "capture_layers": [1] },
  "data": { "shards": ["none.dfs"], "token_budget": 1024, "max_seq_len": 256 },
  "rings": $rings, "workers": $workers, "supervision": $sup }
JSON
  TOPO=$T/$name.json
}

# start the orchestrator in the background on $TOPO
start_orch() { "$ORCH" "$@" "$TOPO" >"$T/orch.out" 2>&1 & ORCH_PID=$!; }

# wait_for SECONDS CMD...: poll until CMD succeeds
wait_for() {
  local s=$1; shift
  local end=$(( $(date +%s) + s ))
  while ! "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && return 1
    sleep 0.1
  done
}

# wait for the orchestrator to exit; sets ORCH_RC
wait_orch() {
  local s=${1:-50} end=$(( $(date +%s) + ${1:-50} ))
  while kill -0 "$ORCH_PID" 2>/dev/null; do
    [ "$(date +%s)" -ge "$end" ] && fail "orchestrator still running after ${s}s"
    sleep 0.1
  done
  wait "$ORCH_PID"; ORCH_RC=$?; ORCH_PID=
}

# jq-like access with python: pyjson FILE_OR_- EXPR (d = the parsed JSON)
pyjson() { python3 -c "import json,sys; d=json.load(open(sys.argv[1]) if sys.argv[1]!='-' else sys.stdin); print($2)" "$1"; }
# events EV: orchestrator.jsonl lines with that ev, as JSON lines
events() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    e=json.loads(l)
    if e.get('ev')==sys.argv[2]: print(json.dumps(e))" "$RUN/metrics/orchestrator.jsonl" "$1"; }
# committed_ge N: the orchestrator committed a checkpoint at step >= N. A step dir or `latest`
# on disk is not enough: the drafter writes a checkpoint beside training and announces it
# (the ledger commits it) once the write is complete, so a kill right after the files
# appear may still restart from the checkpoint before.
committed_ge() { events checkpoint | python3 -c "
import json,sys; sys.exit(0 if any(json.loads(l)['step'] >= int(sys.argv[1]) for l in sys.stdin) else 1)" "$1"; }
# wstat WORKER FIELD: a field of dfctl status --json for one worker
wstat() { "$DFCTL" --run-dir "$RUN" --json status | python3 -c "
import json,sys
d=json.load(sys.stdin)
print([w for w in d['workers'] if w['name']==sys.argv[1]][0][sys.argv[2]])" "$1" "$2"; }
audit_exactly_once() {
  [ -f "$RUN/ledger_audit.json" ] || fail "no ledger_audit.json"
  [ "$(pyjson "$RUN/ledger_audit.json" "d['exactly_once']")" = True ] || fail "audit: exactly_once is not true: $(head -c 800 "$RUN/ledger_audit.json")"
}
# tb_check RUN_DIR [ARGS]: the run's TensorBoard event files, every record, against its JSONL
# metrics (tests/check_tfevents.py), with a Python that has the protobuf module when there is one
tb_check() {
  local py=python3 p
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import google.protobuf' >/dev/null 2>&1; then py=$p; break; fi
  done
  "$py" tests/check_tfevents.py "$@" || fail "TensorBoard event files of $1"
}
# final_ckpt RUN_DIR: the run's latest checkpoint directory
final_ckpt() { echo "$1/checkpoints/$(cat "$1/checkpoints/latest")"; }
# same_result CLEAN_RUN_DIR RUN_DIR WHAT: the two runs' final checkpoints (same step; model,
# optimizer and trainer state) and release exports are byte-identical, else fail naming the file
same_result() {
  local a b f
  a=$(final_ckpt "$1"); b=$(final_ckpt "$2")
  [ "$(basename "$a")" = "$(basename "$b")" ] || fail "$3: final checkpoints differ in step: $a vs $b"
  for f in model.safetensors optimizer.safetensors trainer_state.json; do
    cmp "$a/$f" "$b/$f" || fail "$3: final checkpoint file $f differs from the clean run's"
  done
  [ "$(ls "$1/drafter")" = "$(ls "$2/drafter")" ] || fail "$3: release exports have different files"
  for f in $(ls "$1/drafter"); do cmp "$1/drafter/$f" "$2/drafter/$f" || fail "$3: release file $f differs"; done
}

# tiny_pipeline NAME SAMPLES DRAFTER_FIELDS [LAYERS]: for a test of the real pipeline (tiny
# target, CPU backend, real samples: DF_SYNTHETIC_SAMPLES unset) instead of fake workers:
# checks the worker binaries, prepares SAMPLES samples of data/tiny/chat-train.jsonl (at most
# 300 tokens) into $T/data-000.dfs and writes the target -> postproc -> drafter topology
# $T/NAME.json (seed 5); sets RUN=$T/run and TOPO. DRAFTER_FIELDS ('"checkpoint_every": 2,
# "keep_checkpoints": 2') are the drafter section's fields beyond its shape; LAYERS its
# num_layers (default 1).
tiny_pipeline() {
  local name=$1 samples=$2 drafter=$3 layers=${4:-1} b
  unset DF_SYNTHETIC_SAMPLES
  for b in target_worker postproc_worker drafter_worker dflash_tool; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
  python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
    --max-samples "$samples" --max-len 300 >/dev/null || fail "prepare_data"
  RUN=$T/run; TOPO=$T/$name.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$name", "run_dir": "$RUN", "backend": "cpu", "seed": 5,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": $layers, "block_size": 8, "num_anchors": 8, $drafter,
               "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 400, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 1048576 }, { "name": "pd", "slots": 4, "slot_bytes": 1048576 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" } ],
  "supervision": { "max_restarts": 3, "backoff_initial_ms": 20, "metrics_interval_ms": 5000, "shutdown_timeout_ms": 5000 } }
JSON
}
