#!/usr/bin/env bash
# test_orch_kills.sh: what the operator does on purpose is not a failure; what fails still is.
#   1. max_restarts 2: the middle stage m0 is killed five times with `dfctl kill`, restarted
#      once with `dfctl restart` and stopped and started again: each comes back, no restart
#      limit is hit ("restart" events with "counted": false), restarts_total stays 0, and the
#      run ends complete (exit 0, the audit exactly once)
#   2. max_restarts 2, m0 crashing on every start: the third crash ends the run (exit 1), the
#      message names m0, its log tail is printed once (it was printed twice: in the shutdown
#      line and again at the end), and the last line says how to continue
# The run is paused (dfctl pause) while the commands run, so it cannot end before them
# however slow the machine; the kills still land on live processes.
. "$(dirname "$0")/orch_lib.sh"
export DF_SYNTHETIC_SAMPLES=2000
SUP='{"backoff_initial_ms":50,"backoff_max_ms":400,"stable_ms":60000,"max_restarts":2,"restart_window_s":120,"heartbeat_timeout_ms":5000,"shutdown_timeout_ms":3000,"metrics_interval_ms":300}'
RINGS='[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":3},{"name":"pd","slots":2,"slot_bytes":8192,"max_attempts":3}]'

# ---- 1. deliberate kills, restarts, stop/start: more than max_restarts, and the run ends well
topology kills '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},
                 {"name":"m0","role":"test","in":"tp","out":"pd"},
                 {"name":"c0","role":"test","in":"pd"}]' "$RINGS" "$SUP"
start_orch
D() { "$DFCTL" --run-dir "$RUN" "$@"; }
is() { [ "$(wstat "$1" "$2")" = "$3" ]; }
# up_as W INC: W is up in incarnation INC (one status request, one python)
up_as() { [ "$(wstat "$1" incarnation)" = "$2 up" ]; }
wstat() { "$DFCTL" --run-dir "$RUN" --json status | python3 -c "
import json,sys
w=[w for w in json.load(sys.stdin)['workers'] if w['name']==sys.argv[1]][0]
print(w[sys.argv[2]], w['state']) if sys.argv[2]=='incarnation' else print(w[sys.argv[2]])" "$1" "$2"; }
# paused as soon as its socket is there (before the workers start): the run cannot end early
wait_for 20 test -S "$RUN/ctl.sock" || fail "no control socket"
D pause >/dev/null || fail "dfctl pause"
wait_for 20 is m0 state up || fail "m0 never came up"
inc=1
for k in 1 2 3 4 5; do
  D kill m0 >/dev/null || fail "dfctl kill m0 (kill $k)"
  inc=$((inc + 1))
  wait_for 20 up_as m0 $inc || fail "m0 not up again after kill $k (incarnation, state: $(wstat m0 incarnation))"
done
ok "5 x dfctl kill m0 under max_restarts 2: back every time (incarnation $inc)"
D restart m0 >/dev/null || fail "dfctl restart m0"
inc=$((inc + 1))
wait_for 20 up_as m0 $inc || fail "m0 not up again after restart: $(wstat m0 incarnation)"
D stop m0 >/dev/null || fail "dfctl stop m0"
wait_for 20 is m0 state stopped || fail "m0 not stopped"
D start m0 >/dev/null || fail "dfctl start m0"
inc=$((inc + 1))
wait_for 20 up_as m0 $inc || fail "m0 not up after start: $(wstat m0 incarnation)"
[ "$(D --json status | pyjson - "d['run']['restarts_total']")" = 0 ] || fail "deliberate restarts counted in restarts_total"
ok "then restart, stop and start: incarnation $inc, restarts_total 0"
D resume >/dev/null || fail "dfctl resume"
wait_orch 120
[ "$ORCH_RC" = 0 ] || fail "the run exited $ORCH_RC after deliberate kills (restart limit counted them?)"
audit_exactly_once
events intensity_limit | grep -q . && fail "an intensity_limit event: $(events intensity_limit)"
n=$(events restart | python3 -c "
import json,sys
r=[json.loads(l) for l in sys.stdin if json.loads(l)['worker']=='m0' and 'dfctl kill' in json.loads(l)['why']]
assert all(e['counted'] is False for e in r), r
print(len(r))")
[ "$n" = 5 ] || fail "expected 5 uncounted restarts of m0 after dfctl kill, got $n"
grep -q 'finished (exit 0): the run is complete: every batch of epoch 1 of 1 committed' "$T/orch.out" \
  || fail "no 'run is complete' line: $(tail -3 "$T/orch.out")"
ok "the run ended complete (exit 0, exactly once); 5 restarts after dfctl kill, none counted"

# ---- 2. a crash loop still hits the limit; its log tail is printed once
topology crashloop '[{"name":"p0","role":"test","out":"tp"},
                     {"name":"m0","role":"test","in":"tp","out":"pd","env":{"DF_FAKE_CRASH_AT":"1"}},
                     {"name":"c0","role":"test","in":"pd"}]' "$RINGS" "$SUP"
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 1 ] || fail "crash loop: exit $rc, expected 1"
grep -q 'worker m0 restarted more than 2 times within 120 s' "$T/orch.out" || fail "the message does not name m0"
[ "$(events spawn | grep -c '"worker": "m0"')" = 3 ] || fail "m0 should have been started 3 times"
events restart | grep '"worker": "m0"' | grep -q '"counted": false' && fail "a crash restart was not counted"
tails=$(grep -c "last lines of $RUN/logs/m0.log" "$T/orch.out")
[ "$tails" = 1 ] || fail "m0's log tail printed $tails times: $(cat "$T/orch.out")"
[ "$(grep -c 'DF_FAKE_CRASH_AT=1: abort' "$T/orch.out")" = 3 ] \
  || fail "the tail's lines are not there exactly once each: $(grep -c 'DF_FAKE_CRASH_AT=1: abort' "$T/orch.out")"
grep -q "failed (exit 1) before the end: worker m0 restarted more than 2 times.*continue with: orchestrator --resume $RUN\$" \
  "$T/orch.out" || fail "the last line: $(tail -1 "$T/orch.out")"
ok "crash loop: exit 1 at the third crash, the log tail once, the last line says how to continue"
echo "PASS test_orch_kills"
