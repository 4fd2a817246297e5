#!/usr/bin/env bash
# test_security: what another local user can reach of a running run (docs/security.md).
# A fake-worker run as root; then, as the unprivileged user nobody (setpriv), try to: list
# the run dir, connect to the control socket, open the orchestrator's shared segments
# through /proc/<pid>/fd (they are memfds: no /dev/shm name exists to open). Also: the
# modes the orchestrator creates (run dir 0700, ctl.sock 0600, files 0600), no df- segment
# under /dev/shm, and `--resume` refusing a run dir others may write or that is not ours.
source "$(dirname "$0")/orch_lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to run a check as another user (nobody)"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: setpriv (util-linux) not installed"; exit 77; }
AS_NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
$AS_NOBODY true 2>/dev/null || { echo "SKIP: cannot switch to uid 65534 here"; exit 77; }
chmod 755 "$T"   # the parent is searchable by everyone, so only the run dir's own mode protects it
export DF_SYNTHETIC_SAMPLES=2000
topology sec '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"10"}},{"name":"c0","role":"test","in":"tp"}]'
start_orch
wait_for 60 test -S "$RUN/ctl.sock" || fail "no control socket"
[ "$(stat -c %a "$RUN")" = 700 ] || fail "run dir mode $(stat -c %a "$RUN")"
[ "$(stat -c %a "$RUN/ctl.sock")" = 600 ] || fail "ctl.sock mode $(stat -c %a "$RUN/ctl.sock")"
for f in topology.json logs metrics; do
  m=$(stat -c %a "$RUN/$f"); [ $(( 0$m & 077 )) = 0 ] || fail "$f mode $m is open to group/others"
done
ok "modes: run dir 700, ctl.sock 600, topology.json/logs/metrics closed to others"
ls /dev/shm | grep -q '^df-' && fail "a df- segment exists under /dev/shm: $(ls /dev/shm)"
memfds=$(ls -l /proc/$ORCH_PID/fd | grep -c 'memfd:df-')
[ "$memfds" -ge 4 ] || fail "expected the orchestrator's memfd segments, found $memfds"
ok "shared segments: $memfds memfds held by the orchestrator, none under /dev/shm"

$AS_NOBODY ls "$RUN" >/dev/null 2>&1 && fail "nobody can list the run dir"
$AS_NOBODY python3 -c "
import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])" "$RUN/ctl.sock" 2>"$T/conn.err" && fail "nobody connected to ctl.sock"
grep -q 'Permission denied' "$T/conn.err" || fail "connect as nobody: $(cat "$T/conn.err")"
$AS_NOBODY "$DFCTL" --run-dir "$RUN" kill p0 >"$T/dfctl.out" 2>&1 && fail "nobody's dfctl kill succeeded"
ok "as nobody: the run dir cannot be listed, ctl.sock refuses the connection (EACCES), dfctl fails"
fd=$(ls -l /proc/$ORCH_PID/fd | awk '/memfd:df-ledger/ {print $9; exit}')
[ -n "$fd" ] || fail "no ledger memfd"
$AS_NOBODY python3 -c "open('/proc/$ORCH_PID/fd/$fd','rb')" 2>"$T/open.err" && fail "nobody opened the ledger memfd"
grep -q 'Permission denied' "$T/open.err" || fail "open as nobody: $(cat "$T/open.err")"
$AS_NOBODY python3 -c "open('/proc/$ORCH_PID/mem','rb')" 2>/dev/null && fail "nobody opened the orchestrator's memory"
ok "as nobody: /proc/<orchestrator>/fd/$fd (the ledger memfd) and /proc/<orchestrator>/mem refuse (EACCES)"
wait_orch 120
[ "$ORCH_RC" = 0 ] || fail "run exited $ORCH_RC"
audit_exactly_once

chmod 777 "$RUN"
"$ORCH" --resume "$RUN" >"$T/out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "is owned by uid 0 with mode 777: it must be ours" "$T/out" || fail "resume of a 777 run dir: exit $rc: $(cat "$T/out")"
chmod 700 "$RUN"; chown 65534 "$RUN"
"$ORCH" --resume "$RUN" >"$T/out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "is owned by uid 65534" "$T/out" || fail "resume of a run dir owned by nobody: exit $rc: $(cat "$T/out")"
chown 0 "$RUN"
ok "--resume refuses a run dir that others may write (777) or that another user owns (exit 2)"
# relative paths mean "relative to the cwd at start" and are stored absolute in the run dir,
# so --resume from elsewhere finds the same files
mkdir -p "$T/cwd"
sed -e "s#\"run_dir\": \"[^\"]*\"#\"run_dir\": \"rel/run\"#" "$TOPO" >"$T/cwd/rel.json"
(cd "$T/cwd" && "$ORCH" rel.json >"$T/out" 2>&1) || fail "relative run: $(tail -5 "$T/out")"
[ "$(pyjson "$T/cwd/rel/run/topology.json" "d['run_dir']")" = "$T/cwd/rel/run" ] || fail "run_dir not stored absolute"
[ "$(pyjson "$T/cwd/rel/run/topology.json" "d['data']['shards'][0]")" = "$T/cwd/none.dfs" ] || fail "shards not stored absolute"
ok "relative run_dir and shard paths are stored absolute in the run dir's topology.json"
echo "test_security: ok"
