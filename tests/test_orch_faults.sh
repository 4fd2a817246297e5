#!/usr/bin/env bash
# test_orch_faults.sh: supervision under injected faults, each checked in the orchestrator's
# event log and the final ledger audit:
#   crash  -> reclaim, restart with exponential backoff (50 ms, then 100 ms), incarnation 3
#   hang   -> SIGKILL after heartbeat_timeout_ms, reclaim (requeue), restart
#   exit 100 of one of two producers -> not restarted, the other finishes, run exits 0
#   a batch whose consumer dies max_attempts times -> poisoned, counted, run still ends
#   restart intensity exceeded -> run exits 1, message names the worker and its log tail
#   a start-up (spawn to ready) longer than the heartbeat timeout -> not a hang; one longer
#   than startup_timeout_ms -> killed as hung in phase "startup", restarted
. "$(dirname "$0")/orch_lib.sh"

# crash + hang + permanent failure in one run
topology faults '[
  {"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_CRASH_AT":"3","DF_FAKE_FAULT_INCS":"2","DF_FAKE_SLOW_MS":"5"}},
  {"name":"p1","role":"test","out":"tp","env":{"DF_FAKE_EXIT":"100"}},
  {"name":"c0","role":"test","in":"tp","heartbeat_timeout_ms":1000,"env":{"DF_FAKE_HANG_AT":"5","DF_FAKE_FAULT_INCS":"1"}}]'
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "faults run exited $rc"
audit_exactly_once
delays=$(events restart | python3 -c "import json,sys; print(' '.join(str(json.loads(l)['delay_ms']) for l in sys.stdin if json.loads(l)['worker']=='p0'))")
[ "$delays" = "50 100" ] || fail "p0 restart delays: '$delays', expected '50 100'"
incs=$(events spawn | python3 -c "import json,sys; print(max(json.loads(l)['inc'] for l in sys.stdin if json.loads(l)['worker']=='p0'))")
[ "$incs" = 3 ] || fail "p0 last incarnation $incs, expected 3"
events exit | grep '"worker": "p0"' | grep -q '"signal": 6' || fail "p0 abort not recorded"
events reclaim | grep '"worker": "p0"' | grep -q '"freed": 1' || fail "p0's WRITING slot was not reclaimed"
ok "crash: reclaimed, restarted after 50 ms then 100 ms, incarnation 3"
events hang | grep -q '"worker": "c0"' || fail "no hang event for c0"
events reclaim | grep '"worker": "c0"' | grep -q '"requeued": 1' || fail "c0's READING slot was not requeued"
[ "$(events spawn | grep -c '"worker": "c0"')" = 2 ] || fail "c0 not restarted once"
ok "hang: killed after the heartbeat timeout, slot requeued, restarted"
[ "$(events spawn | grep -c '"worker": "p1"')" = 1 ] || fail "p1 (exit 100) was restarted"
events permanent_failure | grep -q '"worker": "p1"' || fail "no permanent_failure event"
ok "exit 100: not restarted, the run finished with exit 0"

# poison: the consumer dies on every batch it takes; max_attempts 2
topology poison '[
  {"name":"p0","role":"test","out":"tp"},
  {"name":"c0","role":"test","in":"tp","env":{"DF_FAKE_CRASH_AT":"1","DF_FAKE_FAULT_INCS":"2"}}]' \
  '[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":2}]'
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "poison run exited $rc"
audit_exactly_once
np=$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")
[ "$np" = 1 ] || fail "expected 1 poisoned batch, audit says $np"
events reclaim | grep -q '"poisoned": 1' || fail "no reclaim reported the poisoned batch"
grep -q 'df_poisoned_batches_total 1' "$RUN/metrics/pipeline.prom" || fail "pipeline.prom: poisoned total"
ok "poison: a batch that killed its consumer twice is poisoned, counted, and the epoch ends"

# intensity limit
topology intense '[
  {"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_CRASH_AT":"1"}},
  {"name":"c0","role":"test","in":"tp"}]' '' \
  '{"backoff_initial_ms":10,"backoff_max_ms":40,"max_restarts":3,"restart_window_s":30,"metrics_interval_ms":300}'
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 1 ] || fail "intensity: exited $rc, expected 1"
grep -q 'worker p0 restarted more than 3 times' "$T/orch.out" || fail "message does not name p0"
grep -q 'DF_FAKE_CRASH_AT=1: abort' "$T/orch.out" || fail "message lacks p0's log tail"
[ "$(events spawn | grep -c '"worker": "p0"')" = 4 ] || fail "p0 should have been started 4 times"
[ -f "$RUN/ledger_audit.json" ] || fail "no audit after the failed run"
ok "intensity limit: exit 1, message names p0 and shows its log tail"
# start-up: a 2.5 s model load under a 1 s heartbeat timeout is not a hang (startup_timeout_ms
# covers spawn to ready); c0's first incarnation takes 6 s against its own 1.5 s start-up limit
topology startup '[
  {"name":"p0","role":"test","out":"tp","heartbeat_timeout_ms":1000,"env":{"DF_FAKE_LOAD_MS":"2500"}},
  {"name":"c0","role":"test","in":"tp","startup_timeout_ms":1500,"env":{"DF_FAKE_LOAD_MS":"6000","DF_FAKE_FAULT_INCS":"1"}}]'
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "startup run exited $rc"
audit_exactly_once
events hang | grep -q '"worker": "p0"' && fail "p0's 2.5 s load was taken for a hang: $(events hang)"
[ "$(events spawn | grep -c '"worker": "p0"')" = 1 ] || fail "p0 was restarted"
events hang | grep '"worker": "c0"' | grep -q '"phase": "startup"' || fail "no start-up hang event for c0: $(events hang)"
grep -q 'c0 (pid [0-9]*): not ready and no heartbeat for [0-9]* ms (startup_timeout_ms 1500): SIGKILL' \
  "$T/orch.out" || fail "the start-up hang message does not name startup_timeout_ms"
[ "$(events spawn | grep -c '"worker": "c0"')" = 2 ] || fail "c0 not restarted exactly once"
ok "start-up: a 2.5 s load under a 1 s heartbeat timeout runs on; a 6 s one past startup_timeout_ms 1.5 s is killed (phase startup) and restarted"
echo "PASS test_orch_faults"
