#!/usr/bin/env bash
# test_bad_input: the real binaries (orchestrator, the three workers, dflash_tool) on bad
# input, end to end: each case must give its documented message and exit code, start
# nothing where the docs say nothing starts, and leave the previous checkpoint intact.
# The parsers have their own unit tests (test_topology: 86 topology cases, test_safetensors +
# tests/bad_safetensors/, test_shard); this checks what the operator sees. docs/reliability.md
# lists every case; inputs that are not what they claim (FIFOs, devices, overflowing sizes,
# reserved bytes, ring graphs) are in tests/test_bad_files.sh. Cases that need root to mount
# a tmpfs print SKIP-CASE and the reason.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker dflash_tool; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
M=$PWD/models/tiny-target
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 40 --max-len 300 >/dev/null || fail "prepare_data"
DATA=$T/data-000.dfs
MOUNTS=()
# a worker that outlives a failed case may still hold files there: detach lazily if busy
cleanup_mounts() {
  if [ -n "$ORCH_PID" ]; then kill -KILL "$ORCH_PID" 2>/dev/null; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=; fi
  for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done; cleanup; }
trap cleanup_mounts EXIT

# real3 NAME RUN_DIR MODEL_DIR SHARD [RING0_SLOTS RING0_SLOT_BYTES [EXTRA]]: the three real
# workers; writes $T/NAME.json into TOPO and sets RUN
real3() {
  RUN=$2; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$2", "backend": "cpu", "seed": 5,
  "target": { "model_dir": "$3", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "checkpoint_every": 2, "mask_token_id": 261 },
  "data": { "shards": ["$4"], "token_budget": 400, "max_seq_len": 300 },
  "rings": [ { "name": "tp", "slots": ${5:-4}, "slot_bytes": ${6:-1048576} },
             { "name": "pd", "slots": 4, "slot_bytes": 1048576 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" } ],
  "supervision": { "max_restarts": 0, "backoff_initial_ms": 20, "metrics_interval_ms": 5000,
                   "shutdown_timeout_ms": 5000 } ${7:-} }
JSON
}
# expect RC PATTERN CMD...: run CMD, its exit code must be RC and its output match PATTERN
expect() {
  local want=$1 pat=$2; shift 2
  "$@" >"$T/out" 2>&1; local rc=$?
  [ "$rc" = "$want" ] || fail "$*: exit $rc, expected $want: $(head -c 1500 "$T/out")"
  grep -q -- "$pat" "$T/out" || fail "$*: output lacks '$pat': $(head -c 1500 "$T/out")"
}
no_run_dir() { [ ! -e "$RUN" ] || fail "$1: the run dir $RUN was created"; }

# ---- topology, data, binaries: exit 2, message names the file and field/offset, no run dir
RUN=$T/run-none
expect 2 "tests/topologies/bad/syntax_missing_comma.json:4:11: JSON syntax error" \
  "$ORCH" tests/topologies/bad/syntax_missing_comma.json
expect 2 "$T/missing.json" "$ORCH" "$T/missing.json"
real3 slots0 "$T/run-slots0" "$M" "$DATA" 0
expect 2 "rings\[0\].slots: expected an integer 1..4096, got 0" "$ORCH" "$TOPO"; no_run_dir "slots 0"
ok "topology: syntax error (file:line:col), missing file, rings[0].slots 0 -> exit 2, nothing created"

head -c 10000 "$DATA" >"$T/trunc.dfs"; head -c 5 "$DATA" >"$T/short.dfs"; head -c 4000 /dev/urandom >"$T/garbage.dfs"
real3 trunc "$T/run-trunc" "$M" "$T/trunc.dfs"
expect 2 "$T/trunc.dfs: offset 10000: file is 10000 bytes, header says" "$ORCH" "$TOPO"; no_run_dir "truncated shard"
real3 short "$T/run-short" "$M" "$T/short.dfs"
expect 2 "$T/short.dfs: offset 0: file is 5 bytes, shorter than the 64-byte header" "$ORCH" "$TOPO"; no_run_dir "short shard"
real3 garbage "$T/run-garbage" "$M" "$T/garbage.dfs"
expect 2 "$T/garbage.dfs: offset 0: bad magic" "$ORCH" "$TOPO"; no_run_dir "garbage shard"
ok "data: truncated, short and garbage shards -> exit 2 naming the file and offset, nothing created"

mkdir -p "$T/emptybin"
real3 nobin "$T/run-nobin" "$M" "$DATA" 4 1048576 ", \"binaries\": {\"dir\": \"$T/emptybin\"}"
expect 2 "workers\[0\] \"target0\" (role target): binary $T/emptybin/target_worker: No such file or directory" "$ORCH" "$TOPO"
no_run_dir "missing binary"
ok "missing worker binary -> exit 2 naming workers[0] and the path, nothing created"

# ---- unwritable run dir. Root bypasses permission bits, so: a run dir below a regular file
# (mkdir fails ENOTDIR for everyone), and a run dir on a read-only tmpfs (EROFS)
touch "$T/afile"
real3 notdir "$T/afile/run" "$M" "$DATA"
expect 2 "run dir $T/afile/run: Not a directory" "$ORCH" "$TOPO"
mkdir -p "$T/ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$T/ro" 2>"$T/mount.err"; then
  MOUNTS+=("$T/ro")
  real3 ro "$T/ro/run" "$M" "$DATA"
  expect 2 "run dir $T/ro/run: Read-only file system" "$ORCH" "$TOPO"
  ok "unwritable run dir: below a regular file (ENOTDIR) and on a read-only tmpfs (EROFS) -> exit 2"
else
  ok "unwritable run dir: below a regular file (ENOTDIR) -> exit 2"
  echo "SKIP-CASE read-only run dir: cannot mount a tmpfs here ($(head -c 200 "$T/mount.err"))"
fi

# ---- exhausted memory for the shared segments: arenas are memfds, sized slots x slot_bytes
# and mapped at start; under an address-space limit the mapping fails and the message names
# the two topology fields
# (AddressSanitizer and ThreadSanitizer reserve terabytes of shadow memory at start: no
# address-space limit leaves them room, so SANITIZE=address and =thread builds skip this case)
real3 shm "$T/run-shm" "$M" "$DATA" 4 1073741824
if [[ $BUILD == *address* || $BUILD == *thread* ]]; then
  echo "SKIP-CASE exhausted memory: a sanitizer build ($BUILD) cannot start under ulimit -v"
else
  expect 2 "rings\[0\] \"tp\": arena of 4294967296 bytes (rings\[0\].slots 4 x rings\[0\].slot_bytes 1073741824): Cannot allocate memory" \
    bash -c "ulimit -v 1000000 && exec '$ORCH' '$TOPO'"
  no_run_dir "exhausted memory"
  ok "exhausted memory (RLIMIT_AS, a 4 GiB ring) -> exit 2 naming rings[0].slots and slot_bytes, nothing created"
fi

# ---- bad model files: the target worker exits 100 (permanent), the orchestrator does not
# restart it, shuts the run down and exits 1 with the worker's log tail naming the file
# (a bad config.json is found before that, by the orchestrator)
mkdir -p "$T/mtrunc" "$T/mcfg"; cp "$M"/* "$T/mtrunc/"; cp "$M"/* "$T/mcfg/"
truncate -s 1000000 "$T/mtrunc/model.safetensors"
echo '{"hidden_size": "x"}' >"$T/mcfg/config.json"
real3 mtrunc "$T/run-mtrunc" "$T/mtrunc" "$DATA"
expect 1 "target0 failed permanently (exit 100).*" "$ORCH" "$TOPO"
grep -q "$T/mtrunc/model.safetensors: tensor \".*\": data_offsets .* exceed the data section" "$T/out" || fail "truncated model: $(cat "$T/out")"
events exit | grep '"worker": "target0"' | grep -q '"status": 100' || fail "target0 did not exit 100"
[ "$(events spawn | grep -c '"worker": "target0"')" = 1 ] || fail "target0 was restarted after exit 100"
ok "bad model (truncated safetensors) -> target exit 100, not restarted, orchestrator exit 1 naming the file"
# config.json is read by the orchestrator too (capture layers, vocabulary): refused at start
real3 mcfg "$T/run-mcfg" "$T/mcfg" "$DATA"
expect 2 "target.model_dir: $T/mcfg/config.json: architectures: expected a list of one string" "$ORCH" "$TOPO"
no_run_dir "bad config.json"
ok "bad model config.json -> exit 2 naming target.model_dir and the file, nothing created"

# ---- corrupt checkpoints read by dflash_tool: exit 100 naming the file
"$BIN/dflash_tool" init --out "$T/ck" >/dev/null || fail "dflash_tool init"
# resealed (manifest rewritten to match) so the parser, not the checksum, has to catch it
cp -r "$T/ck/step-00000000" "$T/ckt"; truncate -s 5000 "$T/ckt/model.safetensors"; tests/ckpt_reseal.py "$T/ckt"
expect 100 "$T/ckt/model.safetensors: tensor \"fc.weight\": data_offsets \[0, 8192\] exceed the data section" \
  "$BIN/dflash_tool" inspect "$T/ckt"
cp -r "$T/ck/step-00000000" "$T/ckj"; echo '{"step": ' >"$T/ckj/trainer_state.json"; tests/ckpt_reseal.py "$T/ckj"
expect 100 "$T/ckj/trainer_state.json: line" "$BIN/dflash_tool" inspect "$T/ckj"
ok "corrupt checkpoint (truncated model.safetensors, broken trainer_state.json) -> dflash_tool exit 100 naming the file"

# ---- garbage on a worker's control socket (fd 3): exit 1 with a ctl: message; a worker
# started by hand names the missing variable
expect 1 "ctl: hello is not a JSON object" python3 tests/bad_hello.py "$BIN/postproc_worker" "b'hello \\x00\\xff garbage'"
expect 1 "ctl: hello segment 0 names fd 5, but 0 fds came" python3 tests/bad_hello.py "$BIN/target_worker" \
  "b'{\"worker_id\":0,\"incarnation\":1,\"segments\":[{\"fd\":5,\"kind\":\"ring\"}]}'"
expect 1 "ctl: hello lacks the status or ledger segment" python3 tests/bad_hello.py "$BIN/drafter_worker" \
  "b'{\"worker_id\":0,\"incarnation\":1,\"segments\":[]}'"
expect 1 "ctl: no hello on fd 3: orchestrator closed the socket" python3 tests/bad_hello.py "$BIN/target_worker" "b''"
expect 2 "environment variable DF_ORCH_PID is not set" env -u DF_ORCH_PID "$BIN/target_worker"
expect 2 "ctl: DF_WORKER_ID=x: expected an integer" env DF_ORCH_PID=$$ DF_CTL_FD=3 DF_WORKER_ID=x "$BIN/drafter_worker"
ok "garbage hello on a worker's control socket -> exit 1 with a ctl: message; worker run by hand -> exit 2 naming the variable"

# ---- garbage on the orchestrator's control socket: every request gets a code-2 error, a
# client that sends a megabyte without a newline is dropped, the run goes on and ends exact once
export DF_SYNTHETIC_SAMPLES=600
topology ctl '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"10"}},{"name":"c0","role":"test","in":"tp"}]'
start_orch
wait_for 60 test -S "$RUN/ctl.sock" || fail "no control socket"
# paused while the garbage goes in: a fast machine (or a slow python) must not see the run end first
"$DFCTL" --run-dir "$RUN" pause >/dev/null || fail "dfctl pause"
python3 - "$RUN/ctl.sock" <<'PY' || fail "control socket garbage"
import json, socket, sys
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(20); s.connect(sys.argv[1]); return s
def ask(s, raw):
    s.sendall(raw); buf = b""
    while not buf.endswith(b"\n"):
        c = s.recv(65536)
        if not c: raise SystemExit(f"connection closed after {raw[:40]!r}")
        buf += c
    return json.loads(buf)
s = conn()
cases = [(b"hello\n", "request is not a JSON object"), (b"[1,2]\n", "request is not a JSON object"),
         (b'{"cmd":42}\n', 'request has no "cmd"'), (b'{"cmd":"format-disk"}\n', 'unknown command "format-disk"'),
         (b'{"cmd":"kill","worker":"../../etc"}\n', 'unknown worker "../../etc"'), (b'{"cmd":"kill"}\n', "needs a worker name"),
         (b"\x00\xff\xfe{{{\n", "request is not a JSON object"), (b'{"cmd":"status"' + b" " * 100000 + b"\n", "not a JSON object")]
for raw, want in cases:
    r = ask(s, raw)
    assert r.get("ok") is False and r.get("code") == 2 and want in r.get("error", ""), (raw[:40], r)
# a megabyte without a newline: the orchestrator drops this client
big = conn(); big.sendall(b"x" * (1 << 20) + b"x" * 8192)
try:
    while big.recv(65536): pass
except OSError: pass
# a half request and a hang-up, then the same connection as before still works
half = conn(); half.sendall(b'{"cmd":"sta'); half.close()
r = ask(s, b'{"cmd":"status"}\n'); assert r["ok"] is True and r["run"]["state"] == "running", r
print("control socket: 8 garbage requests answered with code 2, a 1 MiB line dropped, status still served")
PY
"$DFCTL" --run-dir "$RUN" resume >/dev/null || fail "dfctl resume"
wait_orch 120
[ "$ORCH_RC" = 0 ] || fail "the run with garbage on its socket exited $ORCH_RC"
audit_exactly_once
expect 2 "unknown command" "$DFCTL" --run-dir "$RUN" frobnicate
ok "garbage on the control socket: code-2 replies, oversized client dropped, run ends exit 0 exactly once"
unset DF_SYNTHETIC_SAMPLES

# ---- a checkpoint written to a full disk: the run dir on a 96 MiB tmpfs, filled after the
# first checkpoint. Every later checkpoint fails with ENOSPC naming the file; the drafter
# trains on and the orchestrator counts the failures (dfctl status); after
# drafter.max_checkpoint_failures (3) in a row the drafter exits 100 naming the checkpoint
# directory and the error, is not restarted, and the orchestrator exits 1 well before the
# end of the epoch. The previous checkpoint stays the latest, byte for byte; with space
# freed, --resume completes.
mkdir -p "$T/full"
if mount -t tmpfs -o size=96m tmpfs "$T/full" 2>"$T/mount.err"; then
  MOUNTS+=("$T/full")
  real3 full "$T/full/run" "$M" "$DATA"
  # restarts allowed (exit 100 must not be retried anyway); status lines for the summary check
  python3 - "$TOPO" <<'PY' || fail "full-disk topology"
import json, sys
t = json.load(open(sys.argv[1])); t["supervision"].update(max_restarts=3, metrics_interval_ms=300)
# keep every checkpoint: a prune (after a commit that lands once the drafter is paused, of a
# checkpoint written beside training before the pause) would free space behind the filler
t["drafter"]["keep_checkpoints"] = 0
# each step followed by 100 ms: the run must still be going when the pause lands on a loaded
# machine (it once trained all 40 steps first, and the test found no checkpoint to fail)
for w in t["workers"]:
    if w["role"] == "drafter":
        w.setdefault("env", {})["DF_FAULT_STEP_DELAY_MS"] = "100"
json.dump(t, open(sys.argv[1], "w"))
PY
  start_orch
  wait_for 120 committed_ge 1 || fail "no first checkpoint"
  "$DFCTL" --run-dir "$RUN" pause >/dev/null || fail "dfctl pause"
  # the paused drafter may still finish a checkpoint and the workers keep writing metrics, so
  # the free space can shrink between stat and fallocate: retry with a wider margin (always
  # well under one checkpoint, ~2.8 MB here)
  filled=
  for margin in 65536 262144 1048576; do
    avail=$(( $(stat -f -c '%a * %S' "$T/full") ))
    fallocate -l $(( avail - margin )) "$T/full/filler" 2>"$T/falloc.err" && { filled=1; break; }
    rm -f "$T/full/filler"
  done
  [ -n "$filled" ] || fail "fallocate filler: $(cat "$T/falloc.err")"
  "$DFCTL" --run-dir "$RUN" resume >/dev/null || fail "dfctl resume"
  # the first failure proves every earlier checkpoint is complete: record the latest now
  wait_for 120 grep -q 'checkpoint at step [0-9]* failed (1 in a row, limit 3): .*No space left on device' "$RUN/logs/drafter0.log" \
    || fail "no checkpoint failure logged"
  latest=$(cat "$RUN/checkpoints/latest")
  sums=$(cd "$RUN/checkpoints/$latest" && sha256sum *)
  wait_orch 180
  [ "$ORCH_RC" = 1 ] || fail "full disk: orchestrator exited $ORCH_RC, expected 1"
  grep -q "drafter0 failed permanently (exit 100)" "$T/orch.out" || fail "full disk: no permanent-failure message"
  grep -q "drafter0: $RUN/checkpoints: 3 checkpoints in a row failed (drafter.max_checkpoint_failures 3), last: No space left on device" "$T/orch.out" \
    || fail "full disk: the message does not name the directory and the error"
  [ "$(events spawn | grep -c '"drafter0"')" = 1 ] || fail "full disk: drafter0 was restarted after exit 100"
  [ "$(events checkpoint_failed | wc -l)" = 3 ] || fail "full disk: $(events checkpoint_failed | wc -l) checkpoint_failed events, expected 3"
  python3 - "$RUN/metrics/summary.jsonl" <<'PY' || fail "full disk: checkpoint_failures not in the status"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
d = [w for w in last["workers"] if w["name"] == "drafter0"][0]
assert d["checkpoint_failures"] == 3 and "No space left on device" in d["checkpoint_last_error"], d
PY
  # the batch count from the plan line (the run dir is on the full disk: the final audit may
  # not have fit, which the orchestrator reports)
  steps=$(grep -c '"ev":"step"' "$RUN/metrics/drafter0.jsonl")
  n_b=$(sed -n 's/.*plan: epoch 1 of 1: [0-9]* samples -> \([0-9]*\) batches.*/\1/p' "$T/orch.out" | head -1)
  [ -n "$n_b" ] || fail "full disk: no plan line in the orchestrator's output"
  [ "$steps" -lt "$n_b" ] || fail "full disk: the drafter trained the whole epoch ($steps of $n_b) before giving up"
  [ "$(cat "$RUN/checkpoints/latest")" = "$latest" ] || fail "latest moved from $latest to $(cat "$RUN/checkpoints/latest")"
  [ "$(cd "$RUN/checkpoints/$latest" && sha256sum *)" = "$sums" ] || fail "checkpoint $latest changed"
  ls -a "$RUN/checkpoints" | grep -q '^\.tmp-' && fail "temp checkpoint dirs left behind: $(ls -a "$RUN/checkpoints")"
  "$BIN/dflash_tool" inspect "$RUN/checkpoints" >/dev/null 2>&1 || fail "the previous checkpoint does not load"
  rm -f "$T/full/filler"
  "$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
  [ "$rc" = 0 ] || fail "resume after freeing space exited $rc: $(tail -5 "$T/orch.out")"
  audit_exactly_once
  ok "full disk: 3 checkpoints after $latest fail with ENOSPC, counted in the status, drafter exit 100 at step $steps of $n_b naming the directory, not restarted; $latest intact (sha256), --resume after freeing space completes exactly once"
else
  echo "SKIP-CASE full disk: cannot mount a tmpfs here ($(head -c 200 "$T/mount.err"))"
fi
echo "test_bad_input: ok"
