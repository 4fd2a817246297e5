#!/usr/bin/env bash
# test_progress_tty.sh: the orchestrator's progress line on a real terminal (a pseudo-terminal
# from python3's pty module, raw mode so the bytes arrive as written).
#   - 60 columns (TIOCSWINSZ): the line is drawn in place ("\r" + clear to the end of the
#     line), never longer than 59 characters, several times; the log lines in between (a
#     worker crash and its restart) arrive whole, each starting with its time stamp, and the
#     line is drawn again after them; the last figures stay on the screen (one newline)
#   - no size from the terminal (0 columns): $COLUMNS (45) is used instead
#   - stdout not a terminal: one full line per interval, every figure, as before
# report_fit_fields itself (which fields go first) is tests/test_progress_line.c.
. "$(dirname "$0")/orch_lib.sh"
export DF_SYNTHETIC_SAMPLES=2000

cat > "$T/on_terminal.py" <<'EOF'
import os, pty, re, sys, termios, fcntl, struct, tty
cols, out_path = int(sys.argv[1]), sys.argv[2]
argv = sys.argv[3:]
pid, fd = pty.fork()
if pid == 0:
    tty.setraw(1)  # no "\n" -> "\r\n": the test sees the orchestrator's bytes
    fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
    os.execv(argv[0], argv)
data = b""
while True:
    try:
        b = os.read(fd, 65536)
    except OSError:  # EIO: the child closed the terminal
        break
    if not b:
        break
    data += b
_, st = os.waitpid(pid, 0)
open(out_path, "wb").write(data)
sys.exit(os.waitstatus_to_exitcode(st))
EOF

cat > "$T/check.py" <<'EOF'
import re, sys
def fail(msg):  # on stdout, where the shell takes the message from
    print(msg)
    sys.exit(1)
data = open(sys.argv[1], "rb").read().decode()
width = int(sys.argv[2])
stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
CLR = "\r\x1b[K"
if CLR not in data:
    fail("no in-place drawing (\\r ESC[K) on the terminal: %r" % data[:300])
chunks = data.split(CLR)
draws, logs = [], []
for c in chunks[1:]:
    if "\n" not in c:
        if c: draws.append(c)          # a drawing, cleared or redrawn later
        continue
    lines = c.split("\n")
    first = lines[0]
    if not stamp.match(first):         # the last drawing, left on the screen with a newline
        draws.append(first)
        lines = lines[1:]
    logs += [l for l in lines if l]
logs += [l for l in chunks[0].split("\n") if l]
for d in draws:
    if len(d) > width - 1:
        fail("a drawn line of %d characters on a %d-column terminal: %r" % (len(d), width, d))
    if "\x1b" in d or "\r" in d:
        fail("a drawn line with control characters: %r" % d)
    if not re.match(r"^\[\d", d):
        fail("a drawn line that does not start with the elapsed time: %r" % d)
if len(draws) < 3:
    fail("only %d drawings: %r" % (len(draws), draws))
for l in logs:
    if not stamp.match(l):
        fail("a log line mixed with the progress line: %r" % l)
if not any("ended: signal 6" in l for l in logs):
    fail("the crash's log line is missing: %r" % logs)
if not re.search(r"\r\x1b\[K(?!\d{4}-)[^\r\n\x1b]+\n", data):
    fail("the last drawing was not left on the screen with a newline")
print("%d drawings, the longest %d characters (width %d), %d log lines whole" %
      (len(draws), max(len(d) for d in draws), width, len(logs)))
EOF

topology tty '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"6"}},
               {"name":"consumer0","role":"test","in":"tp","env":{"DF_FAKE_CRASH_AT":"40","DF_FAKE_FAULT_INCS":"1"}}]' \
  '' '{"backoff_initial_ms":50,"backoff_max_ms":400,"stable_ms":5000,"max_restarts":5,"restart_window_s":30,"heartbeat_timeout_ms":5000,"shutdown_timeout_ms":3000,"metrics_interval_ms":200}'
python3 "$T/on_terminal.py" 60 "$T/tty60.out" "$ORCH" "$TOPO"; rc=$?
[ $rc -eq 0 ] || fail "run on a 60-column terminal exited $rc: $(tr '\r\033' '~^' < "$T/tty60.out" | tail -c 1500)"
msg=$(python3 "$T/check.py" "$T/tty60.out" 60) || fail "60 columns: $msg"
ok "60 columns: $msg"
audit_exactly_once

rm -rf "$RUN"
COLUMNS=45 python3 "$T/on_terminal.py" 0 "$T/tty0.out" "$ORCH" "$TOPO"; rc=$?
[ $rc -eq 0 ] || fail "run on a terminal without a size exited $rc"
msg=$(python3 "$T/check.py" "$T/tty0.out" 45) || fail "COLUMNS=45: $msg"
ok "no size from the terminal, COLUMNS=45: $msg"

rm -rf "$RUN"
"$ORCH" "$TOPO" >"$T/orch.out" 2>"$T/orch.err"; rc=$?
[ $rc -eq 0 ] || fail "run to a file exited $rc"
grep -q $'\033' "$T/orch.out" && fail "escape sequences in the progress lines written to a file"
n=$(grep -c '^[0-9T:.-]*Z \[ *[0-9.]*s\] ledger [0-9]*/[0-9]* committed (step [0-9]*, [0-9]* in flight) | p0 .* | consumer0 .* | tp [0-9]*/4 | restarts [0-9]* poisoned [0-9]* | step ' "$T/orch.out")
[ "$n" -ge 2 ] || fail "not a terminal: expected full progress lines, one per interval: $(head -3 "$T/orch.out")"
ok "not a terminal: $n full lines with every figure"
echo "PASS test_progress_tty"
