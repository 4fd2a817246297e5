#!/usr/bin/env bash
# test_orch_dfctl.sh: the operator's commands against a live run (3 fake stages, slowed down),
# each observed in `dfctl status --json`: kill (restart policy brings it back, incarnation 2),
# restart, stop (stays down), start, pause/resume, checkpoint, top --count, unknown worker
# (exit 2); then `dfctl shutdown` drains in pipeline order (p0, then m0, then c0 exit 0),
# the orchestrator exits 0 and the audit shows nothing left in flight.
. "$(dirname "$0")/orch_lib.sh"
export DF_SYNTHETIC_SAMPLES=30000  # long enough that the run never ends before the last command, however slow the machine
topology ctl '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"15"}},
               {"name":"m0","role":"test","in":"tp","out":"pd"},
               {"name":"c0","role":"test","in":"pd"}]' \
  '[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":3},{"name":"pd","slots":2,"slot_bytes":8192,"max_attempts":3}]'
start_orch
D() { "$DFCTL" --run-dir "$RUN" "$@"; }
is() { [ "$(wstat "$1" "$2")" = "$3" ]; }
wait_for 10 is c0 state up || fail "c0 never came up"
wait_for 10 is p0 state up || fail "p0 never came up"
D status > "$T/st.txt" || fail "dfctl status failed"
grep -q '^p0 .* up ' "$T/st.txt" && grep -q '^RING' "$T/st.txt" && grep -q '^ledger:' "$T/st.txt" || fail "status table: $(cat "$T/st.txt")"
ok "dfctl status table"

D kill c0 >/dev/null || fail "dfctl kill c0"
wait_for 10 is c0 incarnation 2 || fail "c0 not restarted after kill"
wait_for 10 is c0 state up || fail "c0 not up again"
[ "$(wstat c0 restarts)" = 1 ] || fail "c0 restarts != 1"
ok "kill c0 -> restarted (incarnation 2, restarts 1)"

D restart m0 >/dev/null || fail "dfctl restart m0"
wait_for 10 is m0 incarnation 2 || fail "m0 not restarted"
wait_for 10 is m0 state up || fail "m0 not up after restart"
ok "restart m0 -> incarnation 2, up"

out=$(D stop p0) || fail "dfctl stop p0"
echo "$out" | grep -q "^stop p0: ok (stopped after [0-9.]* s)$" || fail "dfctl stop p0 printed: $out"
is p0 state stopped || fail "dfctl stop returned before p0 was down: $(wstat p0 state)"
sleep 0.3; is p0 state stopped || fail "p0 came back by itself"
D start p0 >/dev/null || fail "dfctl start p0"
wait_for 10 is p0 state up || fail "p0 not up after start"
[ "$(wstat p0 incarnation)" = 2 ] || fail "p0 incarnation after start"
ok "stop p0 returns once it is down and it stays down; start p0 at once -> up, incarnation 2"

# --no-wait: the reply comes once SIGTERM is sent; the worker goes down after it
D --no-wait stop p0 | grep -q "^stop p0: ok$" || fail "dfctl --no-wait stop p0"
wait_for 10 is p0 state stopped || fail "p0 not stopped after --no-wait stop: $(wstat p0 state)"
D start p0 >/dev/null || fail "dfctl start p0 (2)"
wait_for 10 is p0 state up || fail "p0 not up after the second start"
ok "--no-wait stop p0: replies at once, p0 down after; start p0 -> up"

D pause >/dev/null && [ "$(D --json status | pyjson - "d['run']['paused']")" = True ] || fail "pause"
D resume >/dev/null && [ "$(D --json status | pyjson - "d['run']['paused']")" = False ] || fail "resume"
D checkpoint >/dev/null && [ "$(D --json status | pyjson - "d['run']['checkpoint_gen']")" = 1 ] || fail "checkpoint"
[ "$(D --json top --count 2 | wc -l)" = 2 ] || fail "top --count 2"
D kill nosuch 2>"$T/e"; [ $? -eq 2 ] && grep -q 'unknown worker "nosuch"' "$T/e" || fail "unknown worker: $(cat "$T/e")"
ok "pause/resume/checkpoint/top; unknown worker exit 2"

D shutdown >/dev/null || fail "dfctl shutdown"
wait_orch 40
[ "$ORCH_RC" = 0 ] || fail "orchestrator exited $ORCH_RC after shutdown"
order=$(events exit | python3 -c "
import json,sys
ex=[json.loads(l) for l in sys.stdin]
sd=[json.loads(l)['t'] for l in open('$RUN/metrics/orchestrator.jsonl') if json.loads(l)['ev']=='shutdown'][0]
print(' '.join(e['worker'] for e in ex if e['t']>=sd))")
[ "$order" = "p0 m0 c0" ] || fail "drain order '$order', expected 'p0 m0 c0'"
for k in claimed in_ring trained; do
  [ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['$k']")" = 0 ] || fail "audit: $k != 0 after the drain"
done
ok "shutdown: drained p0, m0, c0 in order, exit 0, nothing left in flight"
echo "PASS test_orch_dfctl"
