#!/usr/bin/env bash
# test_orch_interrupted.sh: a run stopped before its end says so, everywhere a newcomer looks.
#   1. SIGTERM to the orchestrator mid-run: it drains and exits 0, and its last line says it
#      stopped before the end, why, how far it got (epochs counted from 1, as dfctl does) and
#      how to continue (`orchestrator --resume RUN_DIR`), not "finished"; ledger_audit.json
#      says "status": "incomplete" with "exactly_once": null (it said false: "not exactly
#      once"); the finish event says state "incomplete", complete false
#   2. dfctl against the stopped run (socket gone): exit 1, naming the socket, and what the
#      run dir tells: stopped before the end, the exit status, the audit, how to continue
#   3. --resume finishes it: the audit says complete and exactly once; dfctl now says the run
#      finished complete, names the audit, and offers no resume
#   4. a run dir whose orchestrator was SIGKILLed (no end recorded): dfctl says so
# Epochs are counted from 1 in every line people read: the orchestrator's plan line and last
# line, dfctl status, dfctl on a stopped run (the JSON keeps its 0-based "epoch").
. "$(dirname "$0")/orch_lib.sh"
export DF_SYNTHETIC_SAMPLES=3000
D() { "$DFCTL" --run-dir "$RUN" "$@"; }

topology intr '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},
                {"name":"c0","role":"test","in":"tp"}]'
start_orch
wait_for 20 committed_ge 5 || fail "no checkpoint committed"
D status >"$T/st" || fail "dfctl status on the live run"
grep -q '^ledger: epoch 1 of 1, ' "$T/st" || fail "dfctl status: $(grep ledger "$T/st")"
kill -TERM "$ORCH_PID"
wait_orch 60
[ "$ORCH_RC" = 0 ] || fail "SIGTERM: exit $ORCH_RC, expected 0 (a requested stop that drained)"
last=$(tail -1 "$T/orch.out")
echo "$last" | grep -q "orchestrator: stopped (exit 0) before the end: interrupted by SIGTERM: [0-9]* of [0-9]* batches of epoch 1 of 1 committed (step [0-9]*); ledger audit: $RUN/ledger_audit.json; continue with: orchestrator --resume $RUN\$" \
  || fail "the last line: $last"
grep -q 'finished' "$T/orch.out" && fail "an interrupted run said finished: $(grep finished "$T/orch.out")"
grep -q 'orchestrator: plan: epoch 1 of 1: 3000 samples' "$T/orch.out" || fail "the plan line: $(grep plan: "$T/orch.out")"
[ "$(pyjson "$RUN/ledger_audit.json" "d['status'], d['exactly_once'], d['epoch_done']")" = "incomplete None False" ] \
  || fail "audit of the interrupted run: $(pyjson "$RUN/ledger_audit.json" "d['status'], d['exactly_once'], d['epoch_done']")"
[ "$(events finish | pyjson - "d['state'], d['complete'], d['exactly_once'], d['exit_code']")" = "incomplete False None 0" ] \
  || fail "finish event: $(events finish)"
ok "SIGTERM: exit 0, 'stopped ... before the end ... continue with: orchestrator --resume', audit incomplete (exactly_once null)"

D status >"$T/d.out" 2>&1; rc=$?
[ $rc = 1 ] || fail "dfctl on a stopped run: exit $rc"
grep -q "cannot connect to $RUN/ctl.sock" "$T/d.out" || fail "dfctl does not name the socket: $(cat "$T/d.out")"
grep -q "the run stopped at [0-9T:-]*Z with exit 0, before the end: interrupted by SIGTERM: [0-9]* of [0-9]* batches of epoch 1 of 1 committed" "$T/d.out" \
  && grep -q "ledger audit: *$RUN/ledger_audit.json" "$T/d.out" \
  && grep -q "continue it with: orchestrator --resume $RUN\$" "$T/d.out" || fail "dfctl on a stopped run: $(cat "$T/d.out")"
ok "dfctl on the stopped run: exit 1, how it ended, the audit, how to continue"

"$ORCH" --resume "$RUN" >"$T/orch2.out" 2>&1; rc=$?
[ $rc = 0 ] || fail "--resume exited $rc: $(tail -5 "$T/orch2.out")"
audit_exactly_once
[ "$(pyjson "$RUN/ledger_audit.json" "d['status']")" = complete ] || fail "audit status after the resume"
grep -q "finished (exit 0): the run is complete: every batch of epoch 1 of 1 committed (step [0-9]*); ledger audit: $RUN/ledger_audit.json\$" "$T/orch2.out" \
  || fail "the resumed run's last line: $(tail -1 "$T/orch2.out")"
D status >"$T/d.out" 2>&1; rc=$?
[ $rc = 1 ] || fail "dfctl on a finished run: exit $rc"
grep -q "the run finished at [0-9T:-]*Z with exit 0: complete, every batch of epoch 1 of 1 committed" "$T/d.out" \
  && grep -q "ledger audit: *$RUN/ledger_audit.json" "$T/d.out" || fail "dfctl on a finished run: $(cat "$T/d.out")"
grep -q -- "--resume" "$T/d.out" && fail "dfctl offers a resume of a complete run: $(cat "$T/d.out")"
ok "--resume completes it: audit complete, exactly once; dfctl says it finished complete and where the audit is"

topology crashed '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},
                   {"name":"c0","role":"test","in":"tp"}]'
start_orch
wait_for 20 committed_ge 2 || fail "no checkpoint committed"
kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
D status >"$T/d.out" 2>&1; rc=$?
[ $rc = 1 ] || fail "dfctl on a crashed run: exit $rc"
grep -q "recorded no end: it was killed or crashed" "$T/d.out" && grep -q "continue it with: orchestrator --resume $RUN\$" "$T/d.out" \
  || fail "dfctl on a crashed run: $(cat "$T/d.out")"
ok "dfctl on a run whose orchestrator was killed: says it recorded no end, how to continue"
echo "PASS test_orch_interrupted"
