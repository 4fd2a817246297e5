#!/usr/bin/env bash
# gpu_test_cuda_helper: the orchestrator's CUDA-side helper answers both requests over a
# SOCK_SEQPACKET pair, as orchestrator/helper.c reads them: --arena sends "ok <bytes>" with
# an fd (a VMM allocation rounded up to the granularity), --nccl-id sends "ok" + 256 hex
# digits, two calls give two different ids; bad usage exits 2.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIPPED: gpu_test_cuda_helper: no CUDA device"; exit 77
fi
H=$BUILD/bin/cuda_helper
[ -x "$H" ] || { echo "FAIL: $H missing (make CUDA=1)"; exit 1; }
"$H" --sock 3 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "FAIL: bad usage must exit 2"; exit 1; }
python3 - "$H" <<'PY'
import array, os, re, socket, subprocess, sys
helper = sys.argv[1]

def call(*args):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p = subprocess.Popen([helper, "--sock", str(b.fileno()), *args], pass_fds=[b.fileno()])
    b.close()
    msg, anc, _, _ = a.recvmsg(1024, socket.CMSG_SPACE(4))
    fds = array.array("i")
    for lvl, typ, data in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % 4])
    rc = p.wait()
    return rc, msg.rstrip(b"\0").decode(), list(fds)

rc, msg, fds = call("--arena", "--device", "0", "--bytes", "1000000", "--name", "df-test")
assert rc == 0 and len(fds) == 1, (rc, msg, fds)
size = int(msg.split()[1])
assert size >= 1000000 and size % (2 << 20) == 0, msg
print(f"ok: --arena: 1000000 bytes requested, {size} mapped, fd received")
os.close(fds[0])
ids = []
for _ in range(2):
    rc, msg, fds = call("--nccl-id")
    assert rc == 0 and not fds and re.fullmatch(r"ok [0-9a-f]{256}", msg), (rc, msg[:80], fds)
    ids.append(msg[3:])
assert ids[0] != ids[1], "two NCCL ids are equal"
print("ok: --nccl-id: 128-byte ids, fresh each call")
PY
[ $? -eq 0 ] || { echo "FAIL: cuda_helper"; exit 1; }
echo "gpu_test_cuda_helper: ok"
