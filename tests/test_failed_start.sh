#!/usr/bin/env bash
# test_failed_start: a start that fails removes the run dir it created, and only that one.
#   1. a new run whose setup fails after the run dir was made (its control socket path is
#      longer than a unix socket allows): exit != 0, the message says the run dir was
#      removed, and it is gone;
#   2. a new run with a missing target.model_dir or a bad validation shard: refused (exit
#      2) naming the field, no run dir;
#   3. a failed --resume (the run dir's lock held by another process; the data changed)
#      leaves the old run dir byte for byte as it was (every file compared with cmp);
#   4. a new run on an existing run dir is refused and that dir is left as it was.
# How it can fail: without setup_remove_new_run_dir part 1 finds the run dir left behind;
# a removal that ignored the resume / created flags would delete the old run dir of 3 or 4.
. "$(dirname "$0")/orch_lib.sh"

# 1. setup fails after the run dir exists
long=$T/$(printf 'd%.0s' $(seq 1 90))
topology longsock '[{"name":"p0","role":"test","out":"tp"},{"name":"c0","role":"test","in":"tp"}]'
RUN=$long/run
sed -i "s|\"run_dir\": \"[^\"]*\"|\"run_dir\": \"$RUN\"|" "$TOPO"
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -ne 0 ] || fail "a run whose control socket path is too long started"
grep -q "path too long for a unix socket" "$T/orch.out" || fail "no reason given: $(cat "$T/orch.out")"
grep -q "removed the run dir $RUN this start had created" "$T/orch.out" || fail "no word of the removal: $(cat "$T/orch.out")"
[ ! -e "$RUN" ] || fail "the failed start left its run dir: $(ls -la "$RUN")"
ok "failed start (socket path too long): exit $rc, run dir removed and the message says so"

# 2. inputs refused before anything is created
unset DF_SYNTHETIC_SAMPLES
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 20 --max-len 200 >/dev/null || fail "prepare_data"
real() { # NAME MODEL_DIR VALIDATION_SHARD
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu",
  "target": { "model_dir": "$2", "capture_layers": [1, 3] },
  "drafter": { "checkpoint_every": 2, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "max_seq_len": 200, "token_budget": 400 },
  "validation": { "shards": ["$3"], "max_samples": 2 },
  "rings": [ { "name": "tp" }, { "name": "pd" } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" },
               { "name": "validator", "role": "validator" } ] }
JSON
}
real nomodel "$T/no-such-model" "$PWD/data/tiny/heldout-000.dfs"
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "missing model dir: exit $rc, expected 2: $(cat "$T/orch.out")"
grep -q "target.model_dir: $T/no-such-model: No such file or directory" "$T/orch.out" || fail "missing model dir: $(cat "$T/orch.out")"
[ ! -e "$RUN" ] || fail "missing model dir: a run dir was created"
head -c 100 "$T/data-000.dfs" >"$T/short.dfs"
real badval "$PWD/models/tiny-target" "$T/short.dfs"
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "bad validation shard: exit $rc, expected 2: $(cat "$T/orch.out")"
grep -q "validation.shards: $T/short.dfs: offset" "$T/orch.out" || fail "bad validation shard: $(cat "$T/orch.out")"
[ ! -e "$RUN" ] || fail "bad validation shard: a run dir was created"
ok "missing target.model_dir, bad validation shard: exit 2 naming the field, no run dir"

# 3. failed --resume: the old run dir is untouched
# a run left half done: the orchestrator SIGKILLed (its workers die with it)
export DF_SYNTHETIC_SAMPLES=6000
topology old '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},{"name":"c0","role":"test","in":"tp"}]'
start_orch
committed() { "$DFCTL" --run-dir "$RUN" --json status | pyjson - "d['ledger']['committed']"; }
ge4() { [ "$(committed)" -ge 4 ]; }
wait_for 60 ge4 || fail "nothing committed"
pids=$("$DFCTL" --run-dir "$RUN" --json status | pyjson - "' '.join(str(w['pid']) for w in d['workers'])")
kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
gone() { for p in $pids; do ! kill -0 "$p" 2>/dev/null || return 1; done; }
wait_for 30 gone || fail "workers $pids of the killed run still alive"
snap() { (cd "$RUN" && find . -printf '%p %y %m %s\n' | sort) >"$1"; }
snap "$T/before"; cp -a "$RUN" "$T/copy"
same() { # WHAT: the run dir is as it was
  snap "$T/after"
  cmp -s "$T/before" "$T/after" || fail "$1: the run dir listing changed: $(diff "$T/before" "$T/after")"
  (cd "$T/copy" && find . -type f) | while read -r f; do cmp -s "$T/copy/$f" "$RUN/$f" || { echo "$f"; }; done >"$T/changed"
  [ ! -s "$T/changed" ] || fail "$1: files changed: $(cat "$T/changed")"
}
python3 -c '
import fcntl, sys, time
f = open(sys.argv[1] + "/orchestrator.lock", "r+")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(60)' "$RUN" "$T/locked" & LOCKER=$!
wait_for 10 test -f "$T/locked" || fail "the lock holder did not start"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
kill $LOCKER 2>/dev/null; wait $LOCKER 2>/dev/null
[ $rc = 2 ] || fail "--resume with the lock held: exit $rc, expected 2: $(cat "$T/orch.out")"
grep -q "is in use by" "$T/orch.out" || fail "--resume with the lock held: $(cat "$T/orch.out")"
grep -q "removed the run dir" "$T/orch.out" && fail "--resume claims to have removed the run dir"
same "--resume with the lock held"
DF_SYNTHETIC_SAMPLES=6001 "$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "--resume over changed data: exit $rc, expected 2: $(cat "$T/orch.out")"
same "--resume over changed data"
ok "failed --resume (lock held; data changed): exit 2, the old run dir byte for byte as it was"

# 4. a new start on an existing run dir
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "new run on an existing run dir: exit $rc"
grep -q "exists: continue it with" "$T/orch.out" || fail "new run on an existing run dir: $(cat "$T/orch.out")"
same "new run on an existing run dir"
ok "new run on an existing run dir: refused, the dir untouched"
echo "PASS test_failed_start"
