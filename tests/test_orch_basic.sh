#!/usr/bin/env bash
# test_orch_basic.sh: a fake producer -> middle -> consumer pipeline runs an epoch to the end
# (exit 0, the audit says every batch exactly once, metrics files written); bad topologies
# exit 2 with the JSON path and start nothing; an existing run dir is refused; dfctl's
# usage errors (exit 2) and connection errors (exit 1, naming the socket).
. "$(dirname "$0")/orch_lib.sh"

topology basic '[{"name":"p0","role":"test","out":"tp"},{"name":"m0","role":"test","in":"tp","out":"pd"},
                 {"name":"c0","role":"test","in":"pd"}]' \
  '[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":3},{"name":"pd","slots":2,"slot_bytes":8192,"max_attempts":3}]'
"$ORCH" "$TOPO" >"$T/orch.out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "clean run exited $rc"
audit_exactly_once
[ "$(stat -c %a "$RUN")" = 700 ] || fail "run dir mode is $(stat -c %a "$RUN")"
for f in topology.json ledger.bin metrics/summary.jsonl metrics/pipeline.prom metrics/orchestrator.jsonl logs/p0.log logs/m0.log logs/c0.log; do
  [ -s "$RUN/$f" ] || fail "missing $RUN/$f"
done
grep -q '^df_ring_published_total{ring="pd"}' "$RUN/metrics/pipeline.prom" || fail "pipeline.prom lacks ring pd"
grep -q 'ledger .* committed' "$T/orch.out" || fail "no progress line on stdout"
ok "3-stage epoch: exit 0, audit exactly once, metrics and logs written"

"$ORCH" "$TOPO" >"$T/o2" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "exists" "$T/o2" || fail "existing run dir: rc $rc: $(cat "$T/o2")"
ok "existing run dir refused (exit 2)"

sed 's/"slots":4/"slots":0/' "$TOPO" | sed "s#run-basic#run-bad#" > "$T/bad.json"
"$ORCH" "$T/bad.json" >"$T/o3" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'rings\[0\].slots' "$T/o3" || fail "bad topology: rc $rc: $(cat "$T/o3")"
[ ! -e "$T/run-bad" ] || fail "bad topology created its run dir"
ok "bad topology: exit 2 naming rings[0].slots, nothing created"

"$DFCTL" --run-dir "$RUN" frobnicate >"$T/o4" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'unknown command' "$T/o4" || fail "unknown command: rc $rc"
"$DFCTL" --run-dir "$RUN" status >"$T/o5" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "$RUN/ctl.sock" "$T/o5" || fail "no orchestrator: rc $rc: $(cat "$T/o5")"
"$ORCH" --help | grep -q -- --resume || fail "orchestrator --help"
"$DFCTL" --help | grep -q checkpoint || fail "dfctl --help"
ok "dfctl: unknown command exit 2; cannot connect exit 1 naming the socket; --help"
echo "PASS test_orch_basic"
