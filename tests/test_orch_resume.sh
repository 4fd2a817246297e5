#!/usr/bin/env bash
# test_orch_resume.sh: SIGKILL of the orchestrator leaves no worker running (PR_SET_PDEATHSIG,
# checked with kill -0 on the pids dfctl reported), and `orchestrator --resume <run dir>`
# continues from the last committed checkpoint (ledger.bin) to a complete epoch whose audit
# shows every batch exactly once.
. "$(dirname "$0")/orch_lib.sh"
export DF_SYNTHETIC_SAMPLES=1200
topology resume '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},
                  {"name":"c0","role":"test","in":"tp"}]'
start_orch
committed() { "$DFCTL" --run-dir "$RUN" --json status | pyjson - "d['ledger']['committed']"; }
ge8() { [ "$(committed)" -ge 8 ]; }
wait_for 15 ge8 || fail "nothing committed"
pids=$("$DFCTL" --run-dir "$RUN" --json status | pyjson - "' '.join(str(w['pid']) for w in d['workers'])")
for p in $pids; do [ "$p" -gt 0 ] && kill -0 "$p" || fail "worker pid $p not running before the kill"; done
kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
gone() { for p in $pids; do ! kill -0 "$p" 2>/dev/null || return 1; done; }
wait_for 5 gone || fail "workers still running after the orchestrator was SIGKILLed: $pids"
ok "orchestrator SIGKILLed: workers $pids are gone"

[ -s "$RUN/ledger.bin" ] || fail "no ledger.bin"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "resumed run exited $rc"
grep -q 'resume: ledger.bin: step [1-9]' "$T/orch.out" || fail "resume did not load the snapshot"
audit_exactly_once
ok "--resume: continued from the committed step, epoch complete, exactly once"
echo "PASS test_orch_resume"
