#!/usr/bin/env bash
# test_ctl_garbage.sh: a live orchestrator's control socket (ctl.sock) under malformed and
# hostile requests, then proof that the run was not harmed.
#
# A three-stage fake run (p0 slowed to 15 ms a batch, m0, c0; a fixed sample count) is
# attacked from python over many connections, several requests per connection, sent in
# random fragments: random bytes (NUL, invalid UTF-8, stray newlines), truncated JSON, JSON
# that is not an object, "cmd" of the wrong type or very long (ASCII and multibyte), unknown
# commands, worker commands without a worker or with a wrong-typed / unknown / huge one,
# NUL bytes inside a line, nesting 100000 deep, 2 MB without a newline, a flood of empty
# lines, 200 connections opened at once and dropped in four ways, half lines, a client that
# sends requests and never reads the replies. Every reply to a complete line must be one
# JSON object on one line: the status object for a status request, else
# {"ok":false,"error":"<non-empty>","code":2}.
# Throughout: a prober asks for status on fresh connections (raw and `dfctl status`).
# After: same orchestrator pid, dfctl works, no worker restarted (incarnation 1, restarts
# 0), no command was carried out (no "dfctl" event), the orchestrator's fd count back to
# where it was; then the run ends by itself with exit 0 and every batch committed exactly
# once.
#
# The generator never sends a request the orchestrator would carry out: every line is
# parsed in python (the whole line, and the part before a NUL byte, which is what a reader
# stopping at NUL sees) and dropped when it is an object whose "cmd" is pause, resume,
# checkpoint or shutdown, or stop / start / restart / kill with a "worker" string naming a
# worker of this run (every "cmd" and "worker" key counted, duplicates too); a line python
# cannot parse for depth (jansson goes deeper) is dropped if it holds any of those words.
# Seed: CTL_GARBAGE_SEED.
. "$(dirname "$0")/orch_lib.sh"
SEED=${CTL_GARBAGE_SEED:-20261205}
echo "seed $SEED (CTL_GARBAGE_SEED=N to change)"
# 15 ms a batch: 887 batches, about 14 s of run; the attack takes about 2 s on 2 cores (3 s
# with both cores busy) and must overlap the run (checked: still running when it ends)
export DF_SYNTHETIC_SAMPLES=6000
topology garbage '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"15"}},
               {"name":"m0","role":"test","in":"tp","out":"pd"},
               {"name":"c0","role":"test","in":"pd"}]' \
  '[{"name":"tp","slots":4,"slot_bytes":8192,"max_attempts":3},{"name":"pd","slots":2,"slot_bytes":8192,"max_attempts":3}]'
start_orch
D() { "$DFCTL" --run-dir "$RUN" "$@"; }
is() { [ "$(wstat "$1" "$2")" = "$3" ]; }
for w in p0 m0 c0; do wait_for 20 is $w state up || fail "$w never came up"; done
pid0=$ORCH_PID
[ "$(cat "$RUN/orchestrator.lock")" = "$pid0" ] || fail "orchestrator.lock holds '$(cat "$RUN/orchestrator.lock")', not $pid0"
ok "run up: orchestrator pid $pid0, p0 m0 c0 up"

# RSS growth allowed during the attack (a few MB measured); none checked under a sanitizer,
# whose quarantine keeps freed memory resident
case $BUILD in *-address*|*-thread*|*-undefined*) rss_limit=0 ;; *) rss_limit=64 ;; esac
python3 - "$RUN/ctl.sock" "$pid0" "$SEED" "$DFCTL" "$RUN" p0,m0,c0 "$T/attack.json" "$rss_limit" <<'PY' || fail "the attack on ctl.sock (lines above)"
import json, math, os, random, socket, subprocess, sys, threading, time

sock_path, pid, seed, dfctl, run_dir, workers, out, rss_limit_mb = sys.argv[1:9]
pid, seed, WORKERS, rss_limit_mb = int(pid), int(seed), workers.split(","), int(rss_limit_mb)
rng = random.Random(seed)
sys.setrecursionlimit(6000)  # the classifiers parse the depth-2100 cases; 100000 deep stays a RecursionError
WORKER_CMDS = {"stop", "start", "restart", "kill"}
RUN_CMDS = {"pause", "resume", "checkpoint", "shutdown"}
WORDS = [w.encode() for w in sorted(WORKER_CMDS | RUN_CMDS)]
TO = 10  # seconds: any wait on the orchestrator (it answers in milliseconds); only reached when something is wrong
stats = {"requests": 0, "lines": 0, "replies": 0, "status_replies": 0, "error_replies": 0, "connections": 0,
         "dropped_destructive": 0, "bytes": 0}

def die(msg):
    print("FAIL: " + msg, flush=True)
    os._exit(1)  # also from the prober thread

def short(b):
    return repr(b[:120]) + ("... (%d bytes)" % len(b) if len(b) > 120 else "")

def alive(where):
    try:
        os.kill(pid, 0)
        exe = os.readlink("/proc/%d/exe" % pid)
    except OSError as e:
        die("%s: the orchestrator (pid %d) is gone: %s" % (where, pid, e))
    if not exe.endswith("/orchestrator"):
        die("%s: pid %d is now %s" % (where, pid, exe))

def nfds():
    return len(os.listdir("/proc/%d/fd" % pid))

def rss_kb():
    for l in open("/proc/%d/status" % pid):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])

def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TO)
    end = time.monotonic() + TO
    while True:
        try:
            s.connect(sock_path)
            break
        except BlockingIOError:  # the listen backlog (16) is full: the orchestrator has not accepted yet
            if time.monotonic() > end:
                die("connect: the orchestrator accepted no connection for %d s" % TO)
            time.sleep(0.01)
    stats["connections"] += 1
    return s

# ---- what a line is to the orchestrator --------------------------------------------------
class Obj(list):  # an object's (key, value) pairs in order, duplicate keys kept
    pass

def dangerous(seg):
    """True if the orchestrator could carry seg out: the generator drops such lines."""
    for cand in {seg, seg.split(b"\0")[0]}:
        try:
            v = json.loads(cand.decode("utf-8"), object_pairs_hook=Obj)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # syntax or encoding jansson refuses as well
        except Exception:  # too deep for python (jansson goes to 2048), a 4300-digit number, ...
            if any(w in cand for w in WORDS):
                return True
            continue
        if not isinstance(v, Obj):
            continue
        cmds = [x for k, x in v if k.split("\0")[0] == "cmd" and isinstance(x, str)]
        names = [x.split("\0")[0] for k, x in v if k.split("\0")[0] == "worker" and isinstance(x, str)]
        for c in (c.split("\0")[0] for c in cmds):
            if c in RUN_CMDS or (c in WORKER_CMDS and any(n in WORKERS for n in names)):
                return True
    return False

class Refused(Exception):
    pass

def _int(s):
    v = int(s)
    if not -2**63 <= v < 2**63:  # jansson: "too big integer"
        raise Refused()
    return v

def _float(s):
    if math.isinf(float(s)):  # jansson: "real number overflow"
        raise Refused()
    return float(s)

def _const(s):  # NaN, Infinity: python extensions, not JSON
    raise Refused()

def jansson_clean(v):
    """jansson refuses depth > 2048, \\u0000 and lone surrogates, which python accepts."""
    stack = [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > 2048:
                return False
            items = list(x.items()) if isinstance(x, dict) else [(None, y) for y in x]
            for k, y in items:
                if k is not None and not clean_str(k):
                    return False
                stack.append((y, d + 1))
        elif isinstance(x, str) and not clean_str(x):
            return False
    return True

def clean_str(s):
    return "\0" not in s and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)

def classify(seg):
    """'status' if the orchestrator must answer seg with the status object, else 'error'."""
    if b"\0" in seg:  # the whole line is the request: a NUL byte is not JSON
        return "error"
    try:
        v = json.loads(seg.decode("utf-8"), parse_int=_int, parse_float=_float, parse_constant=_const)
    except (ValueError, Refused, RecursionError):  # UnicodeDecodeError is a ValueError
        return "error"
    if isinstance(v, dict) and jansson_clean(v) and v.get("cmd") == "status":
        return "status"
    return "error"

def check_reply(line, want, req):
    try:
        r = json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        die("reply to %s is not one JSON object on a line (%s): %s" % (short(req), e, short(line)))
    if want == "status":
        good = isinstance(r, dict) and r.get("ok") is True and isinstance(r.get("run"), dict) and \
            isinstance(r.get("workers"), list) and r["run"].get("state") == "running"
        stats["status_replies"] += good
    else:
        good = isinstance(r, dict) and set(r) == {"ok", "error", "code"} and r["ok"] is False and \
            r["code"] == 2 and isinstance(r["error"], str) and r["error"] != ""
        stats["error_replies"] += good
    if not good:
        die("reply to %s: expected %s, got %s" % (short(req), "the status object" if want == "status"
                                                  else '{"ok":false,"error":...,"code":2}', short(line)))
    stats["replies"] += 1

class Reader:
    def __init__(self, s):
        self.s, self.buf = s, b""
    def line(self, what):
        while b"\n" not in self.buf:
            try:
                c = self.s.recv(1 << 16)
            except socket.timeout:
                die("no reply in %d s to %s" % (TO, what))
            except OSError as e:
                die("connection lost (%s) waiting for the reply to %s" % (e, what))
            if not c:
                die("the orchestrator closed the connection before replying to %s" % what)
            self.buf += c
        l, _, self.buf = self.buf.partition(b"\n")
        return l

# ---- generators: each returns one chunk of bytes (a newline is appended) --------------
UNI = ["é", "€", "𝄞", "ß", "中", "\u2028", "\ufeff", "\x7f"]
def rstr(n, uni=0.3):
    return "".join(rng.choice(UNI) if rng.random() < uni else chr(rng.randrange(32, 127)) for _ in range(n))
def enc(v):
    return json.dumps(v, ensure_ascii=rng.random() < 0.3, separators=rng.choice([(",", ":"), (", ", ": ")])).encode()
def rvalue(d=0):
    k = rng.randrange(9 if d < 3 else 6)
    if k == 0: return None
    if k == 1: return rng.random() < 0.5
    if k == 2: return rng.randrange(-10**12, 10**12)
    if k == 3: return rng.uniform(-1e9, 1e9)
    if k in (4, 5): return rstr(rng.randrange(0, 16))
    if k in (6, 7): return [rvalue(d + 1) for _ in range(rng.randrange(4))]
    return {rstr(rng.randrange(1, 8)): rvalue(d + 1) for _ in range(rng.randrange(4))}
def long_str():
    if rng.random() < 0.5:
        return "A" * rng.choice([1000, 10000, 200000])
    return rng.choice(["", "x", "xx"]) + rng.choice(["€", "é", "𝄞", "中"]) * rng.randrange(150, 3000)
def wrong_type():
    return rng.choice([None, True, False, 0, -1, 2**62, 3.5, [], ["status"], ["kill", "c0"], {}, {"cmd": "status"}])
def bad_worker():
    k = rng.randrange(4)
    if k == 0: return wrong_type()
    if k == 1: return long_str()
    if k == 2: return rstr(rng.randrange(0, 40))
    return rng.choice(["nosuch", "C0", "P0", "c0 ", " c0", "c0\t", "m0/", "../../etc/passwd", "", "tp", "pd",
                       "orchestrator", "p00", "c", "*", "c0\u00e9", "m0\n"])

def g_random():
    b = bytearray(rng.randbytes(rng.choice([1, 3, 16, 200, 3000])))
    for _ in range(rng.randrange(4)):
        b[rng.randrange(len(b))] = rng.choice([0, 0xFF, 0xC3, 0xE2, 0x0A, 0x7B])
    return bytes(b)
def g_truncated():
    full = rng.choice([g_cmd_type, g_unknown, g_worker, g_status])()
    return full[:rng.randrange(1, len(full))]
def g_nonobject():
    return rng.choice([lambda: enc([rvalue() for _ in range(rng.randrange(5))]), lambda: enc(rvalue(3)),
                       lambda: b"1" * rng.choice([1, 30, 5000]), lambda: b"1e999", lambda: b"-", lambda: b"NaN",
                       lambda: enc(rstr(20)), lambda: b"null", lambda: b"true", lambda: b'"status"',
                       lambda: b'["cmd","status"]', lambda: b"[" * 50 + b"]" * 50])()
def g_cmd_type():
    d = {"cmd": rng.choice([wrong_type, long_str])()}
    if rng.random() < 0.3: d["worker"] = rng.choice(WORKERS)
    return enc(d)
def g_unknown():
    c = rng.choice(["KILL", "Kill", "STOP", "Status", "status ", " status", "stat", "statuss", "status\n",
                    "kill ", "shutdown!", "pause\t", "help", "", "version", "exec", "../../x",
                    rstr(rng.randrange(1, 30)), rng.choice(sorted(RUN_CMDS))])  # the last: for the filter to drop
    d = {"cmd": c}
    if rng.random() < 0.5: d["worker"] = rng.choice(WORKERS)
    return enc(d)
def g_worker():
    d = {"cmd": rng.choice(sorted(WORKER_CMDS))}
    if rng.random() < 0.8: d["worker"] = bad_worker() if rng.random() < 0.9 else rng.choice(WORKERS)  # the filter drops a real one
    if rng.random() < 0.2: d[rstr(5)] = rvalue()
    return enc(d)
def g_status():
    d = {"cmd": "status"}
    for _ in range(rng.randrange(3)): d[rstr(rng.randrange(1, 6))] = rvalue()
    if rng.random() < 0.2: d["worker"] = rng.choice(WORKERS)
    return enc(d)
def g_trailing():
    return rng.choice([b'{"cmd":"status"} x', b'{"cmd":"status"}{"cmd":"status"}', b'{"cmd":"status"}\0junk',
                       b'{"cmd":"st\0atus"}', b' \t{"cmd":"status"}\r', b'{"cmd":"status",}', b"{'cmd':'status'}",
                       b'{"cmd":"\\u0073tatus"}', b'{"cmd":"status","cmd":"KILL"}', b'{"cmd":"kill","cmd":"status"}',
                       b'{"cmd":"\\ud800"}', b'{"cmd":"status","x":"\\udfff"}', b'{"cmd":"status\\u0000"}',
                       b'{"cmd":"status","x":1e999}', b'{"cmd":"status","x":99999999999999999999}', b"\xef\xbb\xbf{}",
                       b'{"cmd":"sta\xc3(tus"}', b'{"cmd":"\xed\xa0\x80"}', b" ", b"\r", b"\t\t"])
GENS = [(g_random, 4), (g_truncated, 3), (g_nonobject, 3), (g_cmd_type, 3), (g_unknown, 3), (g_worker, 4),
        (g_status, 2), (g_trailing, 2)]
GEN_LIST = [g for g, w in GENS for _ in range(w)]

def plan(chunk):
    """The chunk's complete lines as the orchestrator splits them, or None if one is dangerous."""
    segs = (chunk + b"\n").split(b"\n")[:-1]
    if any(dangerous(s) for s in segs):
        stats["dropped_destructive"] += 1
        return None
    return [(s, classify(s)) for s in segs if s]  # an empty line gets no reply

def send_fragmented(s, data):
    i = 0
    while i < len(data):
        n = rng.choice([1, 7, 100, 4096, 65536, len(data)])
        s.sendall(data[i:i + n])
        i += n
    stats["bytes"] += len(data)

def exchange(chunks, lockstep, tag):
    """Send chunks on one connection; every complete line's reply checked in order; a
    sentinel line at the end proves no reply is missing and none is extra."""
    s = conn()
    rd = Reader(s)
    expect = []
    for ch in chunks:
        p = plan(ch)
        if p is None:
            continue
        stats["requests"] += 1
        stats["lines"] += len(p)
        if lockstep:
            send_fragmented(s, ch + b"\n")
            for seg, want in p:
                check_reply(rd.line(short(seg)), want, seg)
        else:
            expect += p
            send_fragmented(s, ch + b"\n")
    sentinel = b"sentinel-%s" % tag.encode()
    s.sendall(b'{"cmd":"%s"}\n' % sentinel)
    got = []
    while True:
        l = rd.line("the sentinel of connection %s (%d replies so far, %d expected)" % (tag, len(got), len(expect)))
        if sentinel in l and l.startswith(b'{"ok":false'):
            break
        got.append(l)
    if len(got) != len(expect):
        for i, (seg, want) in enumerate(expect):
            if i >= len(got):
                die("connection %s: %d replies for %d request lines; first without one: %s"
                    % (tag, len(got), len(expect), short(seg)))
            check_reply(got[i], want, seg)  # dies at the first reply that belongs to another line
        die("connection %s: %d replies for %d request lines" % (tag, len(got), len(expect)))
    for l, (seg, want) in zip(got, expect):
        check_reply(l, want, seg)
    s.close()

# ---- the prober: status on fresh connections throughout the attack --------------------
probe = {"n": 0, "dfctl": 0, "max_s": 0.0}
stop_probe = threading.Event()
def prober():
    while not stop_probe.is_set():
        t = time.monotonic()
        if probe["n"] % 10 == 9:
            try:
                r = subprocess.run([dfctl, "--run-dir", run_dir, "status"], capture_output=True, timeout=TO)
            except subprocess.TimeoutExpired:
                die("prober: dfctl status took more than %d s" % TO)
            if r.returncode != 0 or b"p0 " not in r.stdout:
                die("prober: dfctl status exit %d: %s %s" % (r.returncode, r.stdout[-300:], r.stderr[-300:]))
            probe["dfctl"] += 1
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(TO)
            try:
                for _ in range(1000):  # while the listen backlog is full (the 200 connections)
                    try:
                        s.connect(sock_path)
                        break
                    except BlockingIOError:
                        time.sleep(0.01)
                s.sendall(b'{"cmd":"status"}\n')
                r = json.loads(Reader(s).line("the prober's status"))
            except OSError as e:
                die("prober: status on a fresh connection failed: %s" % e)
            s.close()
            if r.get("ok") is not True or r["run"]["state"] != "running":
                die("prober: status reply %s" % short(json.dumps(r).encode()))
        probe["max_s"] = max(probe["max_s"], time.monotonic() - t)
        probe["n"] += 1
        time.sleep(0.05)

fd0, rss0 = nfds(), rss_kb()
t_attack = time.monotonic()
pt = threading.Thread(target=prober, daemon=True)
pt.start()

# ---- 1. fixed cases, one connection, one line at a time -------------------------------
FIXED = [b"[" * 100000, b'{"a":' * 50000, b"[" * 100000 + b"]" * 100000, b"[" * 2000 + b"]" * 2000,
         b'{"cmd":"status","x":' + b"[" * 2040 + b"]" * 2040 + b"}",  # depth 2041: jansson parses it
         b'{"cmd":"status","x":' + b"[" * 2100 + b"]" * 2100 + b"}",  # depth 2101: refused
         b'{"cmd":"status"}\0{"cmd":"status"}', b'{"cmd":"status"}', b"\0\0\0", b"\xff\xfe\xfd", b"\xc3",
         b'"' + b"\xc3\xa9" * 10 + b"\xc3"]
for c in ("€", "x€", "xx€", "𝄞", "x𝄞", "xx𝄞", "xxx𝄞", "é", "xé"):  # a message cut at any byte of a character
    for n in (170, 400, 3000):
        FIXED.append(json.dumps({"cmd": c[:-1] + c[-1] * n}, ensure_ascii=False).encode())
        FIXED.append(json.dumps({"cmd": "kill", "worker": c[:-1] + c[-1] * n}, ensure_ascii=False).encode())
        FIXED.append(json.dumps({"cmd": "stop", "worker": c[:-1] + c[-1] * n}).encode())  # \u escapes
exchange(FIXED, True, "fixed")
alive("after the fixed cases")
print("ok: %d fixed cases (nesting 100000 deep, depth 2041 and 2101, NUL inside a line, multibyte names "
      "cut at every byte) answered one by one" % len(FIXED), flush=True)

# ---- 2. random garbage: many connections, several requests each ----------------------
n_conn = 150
before = dict(stats)
for i in range(n_conn):
    chunks = [rng.choice(GEN_LIST)() for _ in range(rng.randrange(1, 40))]
    exchange(chunks, rng.random() < 0.3, "r%d" % i)
alive("after the random garbage")
print("ok: random garbage on %d connections: %d requests, %d lines, %d replies checked (%d status, %d code 2), "
      "%d destructive candidates dropped, %.1f MB sent" % ((n_conn,) + tuple(stats[k] - before[k] for k in (
      "requests", "lines", "replies", "status_replies", "error_replies", "dropped_destructive")) +
      ((stats["bytes"] - before["bytes"]) / 1e6,)), flush=True)

# ---- 3. lines at and past the 1 MiB cap ------------------------------------------------
big_ok = b'{"cmd":"status","pad":"' + b"a" * 900000 + b'"}'
exchange([big_ok], True, "900k")
closed = 0
for filler in (b"x" * (2 << 20), b"[" * (2 << 20), b'{"cmd":"status","pad":"' + b"a" * (2 << 20)):
    s = conn()
    try:
        s.sendall(filler)  # no newline
    except OSError:
        pass  # dropped while sending: that is the point
    try:
        extra = s.recv(1 << 16)
    except socket.timeout:
        die("a 2 MB line without a newline: the connection was not closed in %d s" % TO)
    except OSError:
        extra = b""  # reset: closed
    if extra:
        die("a 2 MB line without a newline got a reply: %s" % short(extra))
    s.close()
    closed += 1
    alive("after a 2 MB line")
print("ok: a 900 KB status line answered; %d clients sending 2 MB without a newline were closed" % closed, flush=True)

# ---- 4. 200 connections at once, then dropped in four ways ---------------------------
many = [conn() for _ in range(200)]
end = time.monotonic() + TO
while nfds() < fd0 + 190:  # accepted: the orchestrator holds them
    if time.monotonic() > end:
        die("200 connections open, but the orchestrator holds %d fds (%d before)" % (nfds(), fd0))
    time.sleep(0.05)
fd_peak = nfds()
exchange([b'{"cmd":"status"}', b"[]"], True, "beside-200")
for i, s in enumerate(many):
    k = i % 4
    if k == 1:
        s.sendall(b'{"cmd":"sta')  # half a line
    elif k == 2:
        s.sendall(b'{"cmd":"status"}\n{"cmd":"status"}\n[1]\n')  # replies never read
    elif k == 3:
        s.shutdown(socket.SHUT_WR)
    s.close()
alive("after 200 connections dropped")
print("ok: 200 connections at once (orchestrator fds %d -> %d), dropped idle / half a line / replies unread / "
      "half-closed" % (fd0, fd_peak), flush=True)

# ---- 5. half lines: completed later on the same connection, or abandoned --------------
s = conn()
rd = Reader(s)
s.sendall(b'{"cmd":"sta')
time.sleep(0.2)
s.sendall(b'tus"}\n{"cmd":"sto')
time.sleep(0.2)
s.sendall(b'p"}\n')
check_reply(rd.line("a status sent in two halves"), "status", b'{"cmd":"status"}')
check_reply(rd.line("a stop without a worker sent in two halves"), "error", b'{"cmd":"stop"}')
s.close()
for i in range(20):
    s = conn()
    s.sendall(rng.choice([b'{"cmd":"status"', b'{"cmd":"kill","worker":"no', b"\xc3", b"[[[[", b"\0"]))
    s.close()
alive("after half lines")
print("ok: a request split over two sends answered; 20 clients that sent half a line and hung up", flush=True)

# ---- 6. clients that never read their replies -----------------------------------------
def never_reads(req, limit):
    s = conn()
    sent = 0
    batch = req * (16384 // len(req))
    try:
        while sent < limit:
            sent += s.send(batch)
    except socket.timeout:
        die("a client that never reads: after %d bytes the orchestrator neither read from it nor dropped it for "
            "%d s (a write blocking its loop?)" % (sent, TO))
    except OSError:
        s.close()
        alive("a client that never reads was dropped")
        exchange([b'{"cmd":"status"}'], True, "after-flood")  # dropped by a live, running orchestrator
        return sent
    die("a client that never reads its replies: %d bytes of %s sent and it is still connected: the orchestrator "
        "queues their replies without bound (RSS %d -> %d kB)" % (sent, short(req), rss0, rss_kb()))
sent_status = never_reads(b'{"cmd":"status"}\n', 1 << 20)  # the replies: ~100 MB
sent_err = never_reads(b"[]\n", 4 << 20)  # ~80 MB
rss1 = rss_kb()
if rss_limit_mb and rss1 - rss0 > rss_limit_mb * 1024:
    die("orchestrator RSS grew from %d to %d kB during the attack" % (rss0, rss1))
print("ok: clients that never read were dropped after %d bytes of status requests and %d bytes of garbage; "
      "orchestrator RSS %d -> %d kB (%s)" % (sent_status, sent_err, rss0, rss1, "limit +%d MB" % rss_limit_mb
      if rss_limit_mb else "not checked: sanitizer build"), flush=True)

# ---- 7. 8 MB of empty lines after a long line, then a request --------------------------
s = conn()
rd = Reader(s)
s.sendall(b"x" * 900000)
time.sleep(0.2)
t = time.monotonic()
try:
    s.sendall(b"\n" + b"\n" * (8 << 20) + b'{"cmd":"status"}\n')
except socket.timeout:  # takes 0.1 s; a move of the buffer per line made it minutes
    die("8 MB of empty lines after a 900 KB line: the orchestrator took more than %d s to read them" % TO)
check_reply(rd.line("a 900 KB line followed by 8 MB of empty lines"), "error", b"x" * 900000)
check_reply(rd.line("a status after 8 MB of empty lines"), "status", b'{"cmd":"status"}')
flood_s = time.monotonic() - t
s.close()
alive("after the empty-line flood")
print("ok: 8 MB of empty lines after a 900 KB line: no reply to them, the next request answered (%.2f s)" % flood_s,
      flush=True)

# ---- after: prober, fds ----------------------------------------------------------------
stop_probe.set()
pt.join(TO)
attack_s = time.monotonic() - t_attack
end = time.monotonic() + TO
while nfds() > fd0 + 3:  # every abandoned connection closed by the orchestrator
    if time.monotonic() > end:
        die("orchestrator fds: %d before the attack, %d after (leak); /proc/%d/fd: %s"
            % (fd0, nfds(), pid, sorted(os.readlink("/proc/%d/fd/%s" % (pid, f)) for f in os.listdir("/proc/%d/fd" % pid))[:40]))
    time.sleep(0.1)
fd1 = nfds()
alive("at the end")
print("ok: prober: %d status requests on fresh connections (%d by dfctl) all answered during the attack, slowest "
      "%.3f s" % (probe["n"], probe["dfctl"], probe["max_s"]), flush=True)
print("ok: orchestrator fds %d before the attack, %d after (peak %d); attack %.1f s"
      % (fd0, fd1, fd_peak, attack_s), flush=True)
print("ok: in all %d connections, %d replies checked (%d status objects, %d code-2 errors), %.1f MB in their requests"
      % (stats["connections"], stats["replies"], stats["status_replies"], stats["error_replies"], stats["bytes"] / 1e6),
      flush=True)
stats.update(fd_before=fd0, fd_after=fd1, fd_peak=fd_peak, probes=probe["n"], probe_max_s=probe["max_s"],
             attack_s=attack_s, rss_before_kb=rss0, rss_after_kb=rss1, flood_s=flood_s)
json.dump(stats, open(out, "w"))
PY

# the run was not harmed: same orchestrator, dfctl works, nobody restarted, nothing carried out
kill -0 "$pid0" 2>/dev/null || fail "the orchestrator is gone after the attack"
[ "$ORCH_PID" = "$pid0" ] && [ "$(cat "$RUN/orchestrator.lock")" = "$pid0" ] || fail "orchestrator pid changed"
D status >"$T/st.txt" || fail "dfctl status after the attack"
grep -q '^c0 .* up ' "$T/st.txt" || fail "status table after the attack: $(cat "$T/st.txt")"
D --json status >"$T/st.json" || fail "dfctl --json status after the attack"
harm=$(python3 - "$T/st.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
bad = ["%s: incarnation %s, restarts %s, state %s" % (w["name"], w["incarnation"], w["restarts"], w["state"])
       for w in d["workers"] if w["incarnation"] != 1 or w["restarts"] != 0 or w["state"] not in ("up", "done")]
r = d["run"]
if r["state"] != "running": bad.append("run state %s: the run ended before the attack did (raise DF_SYNTHETIC_SAMPLES)" % r["state"])
if r["paused"] or r["checkpoint_gen"] != 0 or r["restarts_total"] != 0 or r["stop_claiming"]:
    bad.append("run: paused %s, checkpoint_gen %s, restarts_total %s, stop_claiming %s"
               % (r["paused"], r["checkpoint_gen"], r["restarts_total"], r["stop_claiming"]))
print("; ".join(bad))
PY
)
[ -z "$harm" ] || fail "the attack did harm: $harm"
[ -z "$(events dfctl)" ] || fail "a command was carried out: $(events dfctl | head -3)"
committed=$(pyjson "$T/st.json" "d['ledger']['committed']")
ok "after the attack: orchestrator pid $pid0 alive, dfctl status works, p0 m0 c0 incarnation 1 restarts 0, not paused, no dfctl event; run still running ($committed of $(pyjson "$T/st.json" "d['ledger']['batches']") batches committed)"

wait_orch 60
[ "$ORCH_RC" = 0 ] || fail "the attacked run exited $ORCH_RC"
audit_exactly_once
n=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n" ] || fail "not every batch committed"
[ -z "$(events restart)$(events hang)" ] || fail "restarts or hangs during the run: $(events restart; events hang)"
bad_exit=$(events exit | python3 -c "
import json,sys
print(' '.join('%s(inc %s, %s)' % (e['worker'], e['inc'], e['how']) for e in map(json.loads, sys.stdin) if e['inc'] != 1 or e['how'] != 'exit 0'))")
[ -z "$bad_exit" ] || fail "worker exits other than one exit 0 each: $bad_exit"
ok "the run ended by itself: exit 0, $n/$n batches committed exactly once, each worker one incarnation ending exit 0"
echo "PASS test_ctl_garbage"
