#!/usr/bin/env python3
"""chaos.py: run the orchestrator on a topology while a killer attacks it, then report.

The killer SIGKILLs random workers of every role (drafter ranks included) at random
moments, SIGSTOPs one worker once so the heartbeat watchdog has to find it, and SIGKILLs
the orchestrator once, after which it starts `orchestrator --resume <run dir>` itself.
It ends when the run ends and prints (and with --summary writes) a JSON summary: every
kill, the watchdog's verdict, the resume, the orchestrator's final exit code, the final
checkpoint. The test that judges the run is tests/test_chaos.sh; this script only attacks
and records, so an operator can also point it at a run by hand:

  scripts/chaos.py --orchestrator build/bin/orchestrator --topology my.json --kills 40

Why the kills are paced by progress, not by the clock: the i-th event waits until the
drafter has trained (high-water mark of trained + committed batches) a fixed share of the
epoch, then a random 0..--jitter-s more. A fast machine cannot finish the epoch before the
kills are done and a slow one cannot be killed faster than it recovers; every kill
happens after new progress, so the run always moves on. A drafter is only killed once a
checkpoint was committed since its previous kill (a drafter kill rewinds to it).

Only processes this script started are signalled: a victim's parent must be the
orchestrator this script launched (checked in /proc right before the kill).
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time


def now():
    return time.monotonic()


class Chaos:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.log = open(a.orch_log, "ab")
        self.orch = None
        self.run_dir = None
        self.kills = []
        self.hang = None
        self.orch_kill = None
        self.hw = 0  # high-water mark of trained + committed batches
        self.drafter_kill_step = -1  # committed_step when a drafter was last killed
        self.killed_roles = set()

    def say(self, msg):
        print(f"chaos: {msg}", flush=True)

    # ---- the orchestrator ----------------------------------------------------------
    def start(self, args):
        self.say("start: " + " ".join(args))
        self.orch = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def status(self):
        """The orchestrator's status object, or None (not up yet, gone, or mid-restart)."""
        if not self.run_dir:
            return None
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(os.path.join(self.run_dir, "ctl.sock"))
            s.sendall(b'{"cmd":"status"}\n')
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            s.close()
            return json.loads(buf)
        except (OSError, ValueError):
            return None

    def wait_up(self, timeout):
        end = now() + timeout
        while now() < end:
            if self.orch.poll() is not None:
                return None
            st = self.status()
            if st:
                return st
            time.sleep(0.1)
        raise SystemExit(f"chaos: no control socket under {self.run_dir} after {timeout}s")

    def running(self):
        return self.orch is not None and self.orch.poll() is None

    # ---- victims ---------------------------------------------------------------------
    def ours(self, pid):
        """True if pid is a live, not-yet-reaped child of our orchestrator."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return fields[0] not in ("Z", "X") and int(fields[1]) == self.orch.pid
        except (OSError, IndexError, ValueError):
            return False

    def progress(self, st):
        led = st["ledger"]
        return led["trained"] + led["committed"]

    def candidates(self, st):
        out = []
        for w in st["workers"]:
            if w["state"] != "up" or w["pid"] <= 0:
                continue
            if w["role"] == "drafter" and st["ledger"]["committed_step"] <= self.drafter_kill_step:
                continue  # no checkpoint since the last drafter kill: it would only rewind
            out.append(w)
        fresh = [w for w in out if w["role"] not in self.killed_roles]
        return fresh or out

    def wait_progress(self, target):
        """Poll until the high-water mark reaches target. False if the run ended."""
        while self.running():
            st = self.status()
            if st:
                self.hw = max(self.hw, self.progress(st))
                if self.hw >= target:
                    return True
            time.sleep(0.05)
        return False

    def pick(self, timeout=120):
        """A random eligible victim (status entry), or None if the run ended."""
        end = now() + timeout
        while self.running() and now() < end:
            st = self.status()
            if st:
                c = self.candidates(st)
                if c:
                    return st, self.rng.choice(c)
            time.sleep(0.05)
        return None, None

    # ---- the three kinds of attack ----------------------------------------------------
    def kill_one(self):
        st, w = self.pick()
        if not w:
            return False
        if not self.ours(w["pid"]):
            return True  # it died or restarted between status and now: try again later
        os.kill(w["pid"], signal.SIGKILL)
        if w["role"] == "drafter":
            self.drafter_kill_step = st["ledger"]["committed_step"]
        self.killed_roles.add(w["role"])
        self.kills.append({"n": len(self.kills) + 1, "worker": w["name"], "role": w["role"], "pid": w["pid"],
                           "incarnation": w["incarnation"], "progress": self.hw,
                           "committed_step": st["ledger"]["committed_step"]})
        self.say(f"kill {len(self.kills)}: SIGKILL {w['name']} (pid {w['pid']}, incarnation {w['incarnation']}) "
                 f"at {self.hw}/{st['ledger']['batches']} trained, committed step {st['ledger']['committed_step']}")
        return True

    def stop_one(self):
        """SIGSTOP a worker and wait for the watchdog's hang event naming its pid."""
        st, w = self.pick()
        if not w or not self.ours(w["pid"]):
            return False
        os.kill(w["pid"], signal.SIGSTOP)
        self.say(f"SIGSTOP {w['name']} (pid {w['pid']}): waiting for the heartbeat watchdog")
        ev_path = os.path.join(self.run_dir, "metrics", "orchestrator.jsonl")
        end = now() + self.a.hang_wait_s
        found = None
        while found is None and now() < end and self.running():
            try:
                for line in open(ev_path):
                    e = json.loads(line)
                    if e.get("ev") == "hang" and e.get("pid") == w["pid"]:
                        found = e
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        if found is None and self.ours(w["pid"]):
            os.kill(w["pid"], signal.SIGCONT)  # leave no stopped process behind
        self.hang = {"worker": w["name"], "pid": w["pid"], "detected": found is not None,
                     "heartbeat_age_ms": found.get("heartbeat_age_ms") if found else None}
        self.say(f"watchdog: {'hang of ' + w['name'] + ' detected' if found else 'NO hang event'}")
        return True

    def kill_orchestrator(self):
        st = self.status()
        pids = [w["pid"] for w in st["workers"] if w["pid"] > 0] if st else []
        self.say(f"SIGKILL the orchestrator (pid {self.orch.pid}); workers {pids}")
        os.kill(self.orch.pid, signal.SIGKILL)
        self.orch.wait()
        end = now() + 60
        alive = pids
        while alive and now() < end:
            alive = [p for p in pids if self.alive(p)]
            time.sleep(0.1)
        self.orch_kill = {"at_kill": len(self.kills), "workers": pids, "workers_left": alive,
                          "committed_step": st["ledger"]["committed_step"] if st else None}
        self.say("workers gone with it" if not alive else f"workers still alive: {alive}")
        self.start([self.a.orchestrator, "--resume", self.run_dir])
        self.wait_up(self.a.start_wait_s)
        return True

    @staticmethod
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    # ---- the run -----------------------------------------------------------------------
    def run(self):
        a = self.a
        self.start([a.orchestrator, a.topology])
        self.run_dir = a.run_dir
        st = self.wait_up(a.start_wait_s)
        if not st:
            raise SystemExit("chaos: the orchestrator ended before it was up")
        n = st["ledger"]["batches"]
        # the event plan: kills, with the SIGSTOP after half of them and the orchestrator
        # kill after two thirds
        events = ["kill"] * a.kills
        if a.stop:
            events.insert(a.kills // 2, "stop")
        if a.kill_orchestrator:
            events.insert((2 * len(events)) // 3, "orch")
        self.say(f"{n} batches, {len(events)} events: {a.kills} kills"
                 f"{', 1 SIGSTOP' if a.stop else ''}{', 1 orchestrator kill' if a.kill_orchestrator else ''}")
        t0 = now()
        for i, ev in enumerate(events):
            # event i after (i+1)/(E+2) of the epoch, so the last leaves a tail to finish
            if not self.wait_progress((i + 1) * n // (len(events) + 2)):
                break
            time.sleep(self.rng.uniform(0, a.jitter_s))
            if not self.running():
                break
            if ev == "kill":
                while self.running() and len(self.kills) < sum(1 for e in events[:i + 1] if e == "kill"):
                    if not self.kill_one():
                        break
            elif ev == "stop":
                self.stop_one()
            else:
                self.kill_orchestrator()
        chaos_s = now() - t0
        self.say(f"{len(self.kills)} kills done in {chaos_s:.1f}s; waiting for the run to finish")
        try:
            rc = self.orch.wait(timeout=a.finish_wait_s)
        except subprocess.TimeoutExpired:
            self.orch.kill()
            self.orch.wait()
            rc = "timeout"
        latest = os.path.join(self.run_dir, "checkpoints", "latest")
        final_ckpt = None
        if os.path.exists(latest):
            final_ckpt = os.path.join(self.run_dir, "checkpoints", open(latest).read().strip())
        by_worker = {}
        for k in self.kills:
            by_worker[k["worker"]] = by_worker.get(k["worker"], 0) + 1
        return {"seed": a.seed, "run_dir": self.run_dir, "batches": n, "kills_wanted": a.kills,
                "kills": len(self.kills), "kills_by_worker": by_worker, "kill_log": self.kills,
                "hang": self.hang, "orchestrator_kill": self.orch_kill, "orchestrator_rc": rc,
                "chaos_s": round(chaos_s, 1), "total_s": round(now() - t0, 1), "final_checkpoint": final_ckpt}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--orchestrator", required=True, help="the orchestrator binary")
    p.add_argument("--topology", required=True, help="the topology to start")
    p.add_argument("--run-dir", required=True, help="the topology's run_dir (must not exist yet)")
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs of workers (default 20)")
    p.add_argument("--seed", type=int, default=1, help="seed of the victim and moment choices")
    p.add_argument("--no-stop", dest="stop", action="store_false", help="no SIGSTOP/watchdog check")
    p.add_argument("--no-orchestrator-kill", dest="kill_orchestrator", action="store_false",
                   help="do not kill and resume the orchestrator")
    p.add_argument("--jitter-s", type=float, default=0.3,
                   help="random extra delay 0..J s after each progress mark (default 0.3)")
    p.add_argument("--orch-log", default="/dev/null", help="append the orchestrator's output here")
    p.add_argument("--summary", help="also write the JSON summary here")
    p.add_argument("--start-wait-s", type=float, default=180)
    p.add_argument("--hang-wait-s", type=float, default=180)
    p.add_argument("--finish-wait-s", type=float, default=900)
    a = p.parse_args()
    c = Chaos(a)
    try:
        res = c.run()
    finally:
        if c.running():  # an error above: take our orchestrator (and by pdeathsig its workers) down
            c.orch.kill()
            c.orch.wait()
    text = json.dumps(res, indent=1)
    if a.summary:
        with open(a.summary, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
