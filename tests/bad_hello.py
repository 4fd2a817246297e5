#!/usr/bin/env python3
# bad_hello.py BIN PAYLOAD_REPR: start a worker binary the way the orchestrator does (fd 3 a
# SOCK_SEQPACKET socket, DF_* environment) but send PAYLOAD as the hello; print its stderr
# and exit with its exit code. Used by tests/test_bad_input.sh for "garbage on the worker's control socket".
import ast, os, socket, subprocess, sys
binary, payload = sys.argv[1], ast.literal_eval(sys.argv[2])
hold = os.open('/dev/null', os.O_RDONLY)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
env = dict(os.environ, DF_ORCH_PID=str(os.getpid()), DF_CTL_FD='3', DF_WORKER='w0', DF_WORKER_ID='0',
           DF_INCARNATION='1', DF_RUN_DIR='/nonexistent')
fd = b.fileno()
p = subprocess.Popen([binary], env=env, pass_fds=(fd, hold), preexec_fn=lambda: os.dup2(fd, 3),
                     stderr=subprocess.PIPE)
b.close()
if payload:
    a.send(payload)
else:
    a.close()
err = p.stderr.read().decode(errors='replace')
print(err, end='')
sys.exit(p.wait())
