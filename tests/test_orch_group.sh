#!/usr/bin/env bash
# test_orch_group.sh: drafter ranks restart as a group. The fake worker plays the drafters
# (binaries.dir points at a directory of symlinks: drafter_worker -> fake_worker). Rank 1
# crashes at its 3rd batch: the orchestrator SIGKILLs rank 0, reclaims both, rewinds the
# ledger to the last committed step, and restarts both (incarnation 2). The epoch still ends
# with every batch exactly once.
. "$(dirname "$0")/orch_lib.sh"
mkdir -p "$T/bin"
ln -s "$BIN/fake_worker" "$T/bin/fake_worker"
ln -s "$BIN/fake_worker" "$T/bin/drafter_worker"
topology group '[
  {"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"3"}},
  {"name":"d0","role":"drafter","in":"tp","rank":0,"env":{"DF_FAKE_SLOW_MS":"5"}},
  {"name":"d1","role":"drafter","in":"tp","rank":1,"env":{"DF_FAKE_CRASH_AT":"3","DF_FAKE_FAULT_INCS":"1","DF_FAKE_SLOW_MS":"5"}}]' \
  '' '' "\"binaries\": {\"dir\": \"$T/bin\"},"
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "group run exited $rc"
audit_exactly_once
events group_restart | grep -q '"delay_ms"' || fail "no group_restart event"
events signal | grep '"worker": "d0"' | grep -q '"reason": "group restart"' || fail "d0 was not killed for the group"
for d in d0 d1; do
  n=$(events spawn | grep -c "\"worker\": \"$d\"")
  [ "$n" = 2 ] || fail "$d spawned $n times, expected 2"
done
[ "$(events spawn | grep -c '"worker": "p0"')" = 1 ] || fail "p0 must not restart with the drafter group"
ok "drafter group: rank 1 crashed, rank 0 killed, ledger rewound, both restarted, exactly once"
echo "PASS test_orch_group"
