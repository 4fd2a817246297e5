#!/usr/bin/env bash
# test_resume_integrity.sh: --resume trusts nothing on disk, one orchestrator per run dir,
# and a final write that fails is a failure (docs/ledger.md "ledger.bin", docs/reliability.md).
#   1. a small run over a real shard (fake workers) completes; then each tampering of its
#      run dir makes --resume exit 2 naming what differs, and the untampered run dir resumes:
#      one flipped bit in ledger.bin (checksum); a batch COMMITTED past the committed step,
#      one COMMITTED with no step, one COMMITTED but never trained (checksums made right, so
#      only the state checks can see them); an old-format ledger.bin; the shard rewritten as
#      a valid shard with the same samples and lengths (same plan) but one token changed.
#   2. a run with a fake drafter that crashes once (its group restarts, the ledger rewinds:
#      one batch is trained twice): a second `orchestrator --resume` on the live run dir
#      exits 2 naming the live one's pid, and the live one is unharmed (its control socket
#      is still there and answers, it keeps committing). Then the orchestrator is SIGKILLed
#      and resumed with ledger_audit.json blocked (a directory in its place: the rename of
#      the audit fails): the run ends non-zero saying which file. With the block removed,
#      --resume of the complete run writes the missing audit instead of "already complete",
#      and that audit tells the replays (per batch "replays", stats.replayed) from the
#      second training ("trainings": 2, stats.rewound), which the resumes did not erase.
. "$(dirname "$0")/orch_lib.sh"
M=models/tiny-target

# ledger_edit FILE PYCODE: run PYCODE on ledger.bin FILE with `b` (bytearray), `hdr`,
# `slot(i)` (byte offset of batch i's slot: word u64, claims u32, trainings u32), `committed`;
# then the checksum field is recomputed (FNV-1a 64 with the field read as 0), so only the
# content checks can refuse it
ledger_edit() { python3 - "$1" "$2" <<'PY'
import struct, sys
path, code = sys.argv[1], sys.argv[2]
b = bytearray(open(path, 'rb').read())
ver = struct.unpack_from('<I', b, 8)[0]
n_batches = struct.unpack_from('<I', b, 48)[0]
off_slots = struct.unpack_from('<Q', b, 88)[0]
stride = 24 if ver >= 2 else 16
committed = struct.unpack_from('<Q', b, 192)[0]
slot = lambda i: off_slots + stride * i
exec(code)
def fnv(data):
    h = 0xcbf29ce484222325
    for x in data:
        h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return h
b[112:120] = b'\0' * 8
b[112:120] = struct.pack('<Q', fnv(b))
open(path, 'wb').write(bytes(b))
PY
}
# resume_refused WHAT PATTERN: --resume must exit 2 with PATTERN in its message
resume_refused() {
  "$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
  [ $rc = 2 ] || fail "$1: --resume exited $rc, expected 2"
  grep -q -- "$2" "$T/orch.out" || fail "$1: the refusal does not say \"$2\": $(cat "$T/orch.out")"
  ok "$1 -> exit 2: $(grep -o -- "$2.\{0,60\}" "$T/orch.out" | head -n 1)"
}

# ---- 1. tampering with a finished run dir ------------------------------------------------
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 60 --max-len 300 >/dev/null || fail "prepare_data"
DATA=$T/data-000.dfs
(
  unset DF_SYNTHETIC_SAMPLES
  topology shard '[{"name":"p0","role":"test","out":"tp"},{"name":"c0","role":"test","in":"tp"}]'
  sed -i "s#\"none.dfs\"#\"$DATA\"#" "$TOPO"
  "$ORCH" "$TOPO" >"$T/orch.out" 2>&1 || fail "the run over $DATA exited $?"
  audit_exactly_once
) || exit 1
RUN=$T/run-shard
unset DF_SYNTHETIC_SAMPLES
[ -s "$RUN/ledger.bin" ] && [ -s "$RUN/data_files.json" ] || fail "no ledger.bin / data_files.json"
cp "$RUN/ledger.bin" "$T/ledger.good"; cp "$DATA" "$T/data.good"

python3 - "$RUN/ledger.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
off_slots = struct.unpack_from('<Q', b, 88)[0]
stride = 24 if struct.unpack_from('<I', b, 8)[0] >= 2 else 16
b[off_slots + stride + 8] ^= 0x10          # one bit of batch 1's claim counter
open(sys.argv[1], 'wb').write(bytes(b))
PY
resume_refused "one flipped bit in ledger.bin" "checksum mismatch"
cp "$T/ledger.good" "$RUN/ledger.bin"

ledger_edit "$RUN/ledger.bin" 'struct.pack_into("<Q", b, slot(0), 4 | (committed + 5) << 8)'
resume_refused "batch committed past the committed step" "batch 0 is committed at step [0-9]*, past the committed step"
cp "$T/ledger.good" "$RUN/ledger.bin"
ledger_edit "$RUN/ledger.bin" 'struct.pack_into("<Q", b, slot(1), 4)'
resume_refused "batch committed with no step" "batch 1 is committed with no step"
cp "$T/ledger.good" "$RUN/ledger.bin"
ledger_edit "$RUN/ledger.bin" 'struct.pack_into("<I", b, slot(2) + 12, 0)'
resume_refused "batch committed but never trained" "batch 2 is committed with 0 trainings"
cp "$T/ledger.good" "$RUN/ledger.bin"
ledger_edit "$RUN/ledger.bin" 'struct.pack_into("<I", b, 8, 1)'
resume_refused "old-format ledger.bin" "ledger format version 1; this orchestrator reads version 2"
cp "$T/ledger.good" "$RUN/ledger.bin"

# a valid shard (both checksums right) with the same samples and lengths, one token changed
python3 - "$DATA" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
vocab, n = struct.unpack_from('<IQ', b, 12)
tok = 64 + 8 * (n + 1)
t0 = struct.unpack_from('<I', b, tok)[0]
struct.pack_into('<I', b, tok, (t0 + 1) % vocab)
def fnv(data):
    h = 0xcbf29ce484222325
    for x in data:
        h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return h
struct.pack_into('<Q', b, 32, fnv(b[64:]))
struct.pack_into('<Q', b, 40, fnv(b[:40]))
open(p, 'wb').write(bytes(b))
PY
cmp -s "$DATA" "$T/data.good" && fail "the shard was not changed"
resume_refused "shard rewritten with the same lengths" "data.shards\[0\] $DATA changed since the run was planned"
cp "$T/data.good" "$DATA"

"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 || fail "the untampered run dir does not resume (exit $?)"
audit_exactly_once
ok "the untampered run dir resumes (exit 0, exactly once)"

# ---- 2. a live run dir, a failed final write, replays vs a second training ---------------
# long enough that the live run cannot finish while the test runs its checks on a loaded
# machine (the resumed runs below drop the slowdown, so the rest goes fast)
export DF_SYNTHETIC_SAMPLES=4000
mkdir -p "$T/bin"
ln -s "$BIN/fake_worker" "$T/bin/fake_worker"
ln -s "$BIN/fake_worker" "$T/bin/drafter_worker"
topology live '[{"name":"p0","role":"test","out":"tp","env":{"DF_FAKE_SLOW_MS":"20"}},
  {"name":"d0","role":"drafter","in":"tp","env":{"DF_FAKE_CRASH_AT":"6","DF_FAKE_FAULT_INCS":"1"}}]' \
  '' '' "\"binaries\": {\"dir\": \"$T/bin\"},"
start_orch
committed() { "$DFCTL" --run-dir "$RUN" --json status | pyjson - "d['ledger']['committed']"; }
ge() { [ "$(committed)" -ge "$1" ]; }
wait_for 30 ge 12 || fail "nothing committed"
events group_restart | grep -q . || fail "the drafter crash did not restart its group"
first=$ORCH_PID
timeout 60 "$ORCH" --resume "$RUN" >"$T/second.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "a second --resume on the live run dir exited $rc, expected 2: $(tail -n 5 "$T/second.out")"
grep -q "in use by orchestrator pid $first" "$T/second.out" || fail "the refusal does not name pid $first: $(cat "$T/second.out")"
timeout 60 "$ORCH" "$TOPO" >"$T/second.out" 2>&1; rc=$?
[ $rc = 2 ] || fail "a second orchestrator on the live run's topology exited $rc, expected 2"
kill -0 "$first" || fail "the first orchestrator died"
[ -S "$RUN/ctl.sock" ] || fail "the live orchestrator's ctl.sock is gone"
c1=$(committed) || fail "dfctl cannot reach the live orchestrator"
wait_for 30 ge $((c1 + 4)) || fail "the live run stopped committing after the refused second orchestrator"
ok "second orchestrator on a live run dir -> exit 2 naming pid $first; the live one keeps its ctl.sock and commits on"

kill -KILL "$ORCH_PID"; wait "$ORCH_PID" 2>/dev/null; ORCH_PID=
# the resumed runs must not crash the drafter again (its incarnations count from 1 anew): a
# batch trained twice in the final audit is then the one of the first run, before the kill
python3 - "$RUN/topology.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
for w in t['workers']:
    w.get('env', {}).pop('DF_FAKE_CRASH_AT', None)
    w.get('env', {}).pop('DF_FAKE_SLOW_MS', None)
open(sys.argv[1], 'w').write(json.dumps(t, indent=2, sort_keys=True) + '\n')
PY
mkdir -p "$RUN/ledger_audit.json/blocked"   # the final rename onto it fails (EISDIR)
# the edit of the run dir's topology.json is a change from what the run was started with:
# workers' env may change on resume, but only when accepted (docs/operations.md, "Resume")
"$ORCH" --resume "$RUN" --accept-changes >"$T/orch.out" 2>&1; rc=$?
[ $rc = 1 ] || fail "the final audit could not be written but the run exited $rc, expected 1"
grep -q "orchestrator: $RUN/ledger_audit.json could not be written" "$T/orch.out" \
  || fail "no message naming the audit: $(tail -n 5 "$T/orch.out")"
K=$(sed -n 's/.*resume: ledger.bin: step [0-9]*, \([0-9]*\) batches committed.*/\1/p' "$T/orch.out" | head -n 1)
[ -n "$K" ] && [ "$K" -ge 12 ] || fail "the resume did not restore the committed batches (K=$K)"
ok "final audit unwritable -> exit 1 naming $RUN/ledger_audit.json"
rm -rf "$RUN/ledger_audit.json"
echo '{}' >"$RUN/train_summary.json"  # a real drafter's last act; the fake drafter writes none
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; rc=$?
[ $rc = 0 ] || fail "--resume of the complete run exited $rc"
grep -q "wrote the missing $RUN/ledger_audit.json" "$T/orch.out" || fail "--resume did not write the audit: $(cat "$T/orch.out")"
audit_exactly_once
python3 - "$RUN/ledger_audit.json" "$K" <<'PY' || fail "the audit does not tell replays from a second training"
import json, sys
d = json.load(open(sys.argv[1])); K = int(sys.argv[2]); n = d['n_batches']; st = d['stats']; bs = d['batches']
# first resume restored K batches, the complete-run resume all n: replays are counted apart
assert st['replayed'] == K + n == sum(b['replays'] for b in bs), (st, K, n)
# ... and raise no training count: what the audit calls trainings is what the drafters did
assert st['trained'] == sum(b['trainings'] for b in bs), st
assert all(b['trainings'] >= 1 for b in bs)
# the batch the first run's drafter crash rewound was trained a second time (before the
# orchestrator kill): the resumes kept that count
assert st['rewound'] >= 1 and max(b['trainings'] for b in bs) == 2, st
assert sum(1 for b in bs if b['replays'] == 2) == K
PY
ok "--resume of the complete run writes the missing audit; it counts $K+n replays apart from trainings and keeps the second training"
echo "PASS test_resume_integrity"
