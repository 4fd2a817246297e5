#!/usr/bin/env bash
# test_resume_changes: --resume never ignores the operator or the disk, and what can be
# known before a run starts is checked before its run dir exists (docs/operations.md,
# "Resume"; docs/topology.md, "Checked at start"). Real orchestrator, real workers on the
# tiny target, real shards:
#   1. a fixed topology reaches the resume: a run that failed before committing anything
#      (truncated model.safetensors) is resumed with the corrected topology file: refused
#      with the difference (target.model_dir: old -> new) until --accept-changes, then it
#      runs with the new one, exactly once; the run's record follows, the change is in
#      metrics/orchestrator.jsonl and the next resume finds no difference.
#   2. drafter.lr edited in the run dir's topology.json after a checkpoint was committed:
#      refused naming the field, with or without --accept-changes (the checkpoint's
#      optimizer state would win); checkpoint cadence and restart limits are accepted with
#      --accept-changes and recorded. A topology naming another run_dir is refused.
#   3. ledger.bin deleted under a finished run: --resume refuses naming ledger.bin and the
#      checkpoints, and every checkpoint file keeps its bytes and its inode; the committed
#      checkpoint removed: refused naming it (before: the drafter failed mid-start).
#   4. refused before the run dir exists, naming the file and field: a capture layer past the
#      target's depth, a mask token outside its vocabulary, a shard token id outside it
#      (shard, sample, id), an empty sample (shard, sample), a validation shard's token id,
#      drafter.init_dir of another block size or other capture layers; over-long samples
#      are reported (truncated by the plan, as documented).
#   5. a shard changed under a running pipeline (so the start's check cannot see it): the
#      target worker's refusal names the id, the shard and the sample.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker validator; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
M=$PWD/models/tiny-target
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 40 --max-len 300 >/dev/null || fail "prepare_data"
DATA=$T/data-000.dfs

# topo NAME RUN_DIR MODEL_DIR SHARD [EXTRA_PYTHON]: the three real workers; $T/NAME.json -> TOPO
topo() {
  RUN=$2; TOPO=$T/$1.json
  python3 - "$TOPO" "$1" "$2" "$3" "$4" "${5:-}" <<'PY' || fail "topology $1"
import json, sys
path, name, run, model, shard, extra = sys.argv[1:7]
t = {"version": 1, "name": name, "run_dir": run, "backend": "cpu", "seed": 5,
     "target": {"model_dir": model, "capture_layers": [1, 3]},
     "drafter": {"num_layers": 1, "block_size": 8, "num_anchors": 8, "checkpoint_every": 2, "mask_token_id": 261},
     "data": {"shards": [shard], "token_budget": 400, "max_seq_len": 300},
     "rings": [{"name": "tp", "slots": 4, "slot_bytes": 1048576}, {"name": "pd", "slots": 4, "slot_bytes": 1048576}],
     "workers": [{"name": "target0", "role": "target", "out": "tp"},
                 {"name": "postproc0", "role": "postproc", "in": "tp", "out": "pd"},
                 {"name": "drafter0", "role": "drafter", "in": "pd"}],
     "supervision": {"max_restarts": 0, "backoff_initial_ms": 20, "metrics_interval_ms": 5000,
                     "shutdown_timeout_ms": 5000}}
exec(extra)
json.dump(t, open(path, "w"), indent=1)
PY
}
# expect RC PATTERN CMD...: CMD's exit code must be RC and its output contain PATTERN
expect() {
  local want=$1 pat=$2; shift 2
  "$@" >"$T/out" 2>&1; local rc=$?
  [ "$rc" = "$want" ] || fail "$*: exit $rc, expected $want: $(head -c 2500 "$T/out")"
  grep -q -- "$pat" "$T/out" || fail "$*: output lacks '$pat': $(head -c 2500 "$T/out")"
}
no_run_dir() { [ ! -e "$RUN" ] || fail "$1: the run dir $RUN was created"; }
# edit_json FILE PYCODE: run PYCODE on the JSON in FILE as `d`, write it back
edit_json() { python3 - "$1" "$2" <<'PY' || fail "edit $1"
import json, sys
d = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(d, open(sys.argv[1], "w"), indent=2, sort_keys=True)
PY
}
# shard SRC DST PYCODE [VOCAB]: rewrite shard SRC into DST after PYCODE edits `s` (a list of
# [tokens, mask] per sample), with vocab_size VOCAB (default: SRC's); checksums recomputed
shard() { python3 - "$1" "$2" "$3" "${4:-}" <<'PY' || fail "shard $2"
import struct, sys
src, dst, code, vocab = sys.argv[1:5]
b = open(src, "rb").read()
v, n, nt = struct.unpack_from("<IQQ", b, 12)
offs = struct.unpack_from("<%dQ" % (n + 1), b, 64)
tok0 = 64 + 8 * (n + 1); mask0 = tok0 + (4 * nt + 7) // 8 * 8
toks = struct.unpack_from("<%dI" % nt, b, tok0)
s = [[list(toks[offs[i]:offs[i + 1]]), list(b[mask0 + offs[i]:mask0 + offs[i + 1]])] for i in range(n)]
exec(code)
v = int(vocab) if vocab else v
flat = [t for x in s for t in x[0]]; mask = bytes(m for x in s for m in x[1]); offs = [0]
for x in s: offs.append(offs[-1] + len(x[0]))
pad = lambda d: d + b"\0" * (-len(d) % 8)
payload = struct.pack("<%dQ" % len(offs), *offs) + pad(struct.pack("<%dI" % len(flat), *flat)) + pad(mask)
def fnv(d):
    h = 0xcbf29ce484222325
    for x in d: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return h
hdr = bytearray(b"DFSHARD1" + struct.pack("<IIQQQ", 1, v, len(s), len(flat), fnv(payload)))
hdr += struct.pack("<Q", fnv(hdr[:40])) + b"\0" * 16
open(dst + ".tmp", "wb").write(bytes(hdr) + payload)
import os; os.rename(dst + ".tmp", dst)
PY
}

# ---- 1. a failed start, the topology fixed, resumed with it -----------------------------
mkdir -p "$T/mtrunc"; cp "$M"/* "$T/mtrunc/"; truncate -s 1000000 "$T/mtrunc/model.safetensors"
topo fix "$T/run-fix" "$T/mtrunc" "$DATA"
expect 1 "target0 failed permanently (exit 100)" "$ORCH" "$TOPO"
[ -d "$RUN" ] || fail "the failed run left no run dir"
edit_json "$TOPO" "d['target']['model_dir'] = '$M'"   # the operator fixes the mistake
snap() { (cd "$RUN" && find . -printf '%p %s %T@\n' | sort) >"$1"; }
snap "$T/before"
expect 2 "target.model_dir: \"$T/mtrunc\" -> \"$M\"" "$ORCH" --resume "$TOPO"
grep -q -- "--accept-changes" "$T/out" || fail "the refusal does not say how to proceed: $(cat "$T/out")"
snap "$T/after"; cmp -s "$T/before" "$T/after" || fail "the refused resume changed the run dir: $(diff "$T/before" "$T/after")"
ok "resume with a fixed topology file: refused (exit 2), the difference named, nothing changed"
expect 0 "resume: 1 change accepted (--accept-changes)" "$ORCH" --resume "$TOPO" --accept-changes
audit_exactly_once
[ "$(pyjson "$RUN/topology.recorded.json" "d['target']['model_dir']")" = "$M" ] || fail "the record was not updated"
[ "$(pyjson "$RUN/topology.json" "d['target']['model_dir']")" = "$M" ] || fail "the run dir's topology.json was not updated"
events topology_changed | grep -q "\"field\": \"target.model_dir\", \"new\": \"$M\", \"old\": \"$T/mtrunc\"" \
  || fail "no topology_changed event: $(events topology_changed)"
expect 0 "is already complete" "$ORCH" --resume "$RUN"
grep -q "differs" "$T/out" && fail "the resume after the accepted change still finds a difference: $(cat "$T/out")"
ok "--accept-changes (nothing committed yet: any field): the run completes with the fixed model, exactly once; record updated, change logged, the next resume finds no difference"

# ---- 2. after a commit: lr refused, cadences and limits accepted -------------------------
cp "$RUN/topology.recorded.json" "$T/record.good"
edit_json "$RUN/topology.json" "d['drafter']['lr'] = 0.001"
expect 2 "drafter.lr: 0.0006 -> 0.001  \[cannot change once a checkpoint is committed" "$ORCH" --resume "$RUN"
expect 2 "refusing: drafter.lr cannot change once a checkpoint is committed" "$ORCH" --resume "$RUN" --accept-changes
cmp -s "$RUN/topology.recorded.json" "$T/record.good" || fail "a refused change reached the record"
ok "drafter.lr edited in the run dir's topology.json after a commit: refused with and without --accept-changes"
edit_json "$RUN/topology.json" "d['drafter']['lr'] = 0.0006; d['drafter']['checkpoint_every'] = 4; d['supervision']['max_restarts'] = 2"
expect 2 "drafter.checkpoint_every: 2 -> 4  \[may change on resume" "$ORCH" --resume "$RUN"
grep -q "supervision.max_restarts: 0 -> 2  \[may change on resume" "$T/out" || fail "max_restarts not listed: $(cat "$T/out")"
expect 0 "resume: 2 changes accepted" "$ORCH" --resume "$RUN" --accept-changes
[ "$(pyjson "$RUN/topology.recorded.json" "d['drafter']['checkpoint_every'], d['supervision']['max_restarts']")" = "4 2" ] \
  || fail "the record does not hold the accepted changes"
[ "$(events topology_changed | wc -l)" = 2 ] || fail "the accepted change was not logged: $(events topology_changed)"
expect 0 "is already complete" "$ORCH" --resume "$RUN"
ok "checkpoint_every and max_restarts: listed as changeable, accepted with --accept-changes, recorded and logged"
topo other "$T/run-other" "$M" "$DATA"
expect 2 "names run_dir $T/run-other, not the run dir being resumed ($T/run-fix)" "$ORCH" --resume "$T/run-fix" --topology "$TOPO"
RUN=$T/run-fix
expect 2 "goes with --resume" "$ORCH" --accept-changes "$T/fix.json"
ok "--topology naming another run dir, --accept-changes without --resume: exit 2"

# ---- 3. the disk contradicting itself ----------------------------------------------------
ck_state() { (cd "$RUN/checkpoints" && find . -type f -printf '%p %i %s\n' | sort && find . -type f -exec sha256sum {} + | sort); }
ck_state >"$T/ck.before"
ls "$RUN"/checkpoints/step-* >/dev/null || fail "no checkpoints to protect"
cp "$RUN/ledger.bin" "$T/ledger.good"; rm "$RUN/ledger.bin"
expect 2 "$RUN/ledger.bin is missing, but the run dir holds what committed work leaves behind: checkpoints/ step-" \
  "$ORCH" --resume "$RUN"
ck_state >"$T/ck.after"
cmp -s "$T/ck.before" "$T/ck.after" || fail "checkpoint files changed: $(diff "$T/ck.before" "$T/ck.after")"
[ ! -e "$RUN/ledger.bin" ] || fail "the refused resume wrote a ledger.bin"
ok "ledger.bin deleted under committed checkpoints: --resume exit 2 naming it; every checkpoint file byte- and inode-identical"
cp "$T/ledger.good" "$RUN/ledger.bin"
last=$(cat "$RUN/checkpoints/latest"); mv "$RUN/checkpoints/$last" "$T/aside"; rm "$RUN/train_summary.json"
expect 2 "commits the batches up to step $((10#${last#step-})), but $RUN/checkpoints/$last is missing" "$ORCH" --resume "$RUN"
mv "$T/aside" "$RUN/checkpoints/$last"
ok "the committed checkpoint $last removed: --resume exit 2 naming it, before any worker starts"

# ---- 4. checked before the run dir exists ------------------------------------------------
topo cap "$T/run-cap" "$M" "$DATA" "t['target']['capture_layers'] = [1, 7]"
expect 2 "target.capture_layers\[1\]: layer 7 does not exist: the target has 4 layers, 0..3 ($M/config.json: num_hidden_layers 4)" "$ORCH" "$TOPO"
no_run_dir "capture layer 7"
topo mask "$T/run-mask" "$M" "$DATA" "t['drafter']['mask_token_id'] = 300"
expect 2 "drafter.mask_token_id: 300 is outside the target's vocabulary 0..263" "$ORCH" "$TOPO"
no_run_dir "mask token 300"
shard "$DATA" "$T/tok.dfs" "s[17][0][5] = 300" 400
topo tok "$T/run-tok" "$M" "$T/tok.dfs"
expect 2 "data.shards\[0\] $T/tok.dfs: sample 17: token id 300 (position 5) is outside the target's vocabulary 0..263" "$ORCH" "$TOPO"
no_run_dir "token id 300"
shard "$DATA" "$T/empty.dfs" "s[9] = [[], []]"
topo empty "$T/run-empty" "$M" "$T/empty.dfs"
expect 2 "data.shards\[0\] $T/empty.dfs: sample 9 is empty (0 tokens)" "$ORCH" "$TOPO"
no_run_dir "empty sample"
topo val "$T/run-val" "$M" "$DATA" "t['validation'] = {'shards': ['$T/tok.dfs'], 'max_samples': 32}; t['workers'].append({'name': 'validator', 'role': 'validator'})"
expect 2 "validation.shards\[0\] $T/tok.dfs: sample 17: token id 300" "$ORCH" "$TOPO"
no_run_dir "validation token id 300"
"$BIN/dflash_tool" export "$T/run-fix/checkpoints" "$T/release" >/dev/null || fail "dflash_tool export"
topo init "$T/run-init" "$M" "$DATA" "t['drafter']['init_dir'] = '$T/release'; t['drafter']['block_size'] = 16"
expect 2 "drafter.init_dir: $T/release/config.json: block_size is 8, but drafter.block_size is 16" "$ORCH" "$TOPO"
no_run_dir "init_dir block size"
topo init2 "$T/run-init2" "$M" "$DATA" "t['drafter']['init_dir'] = '$T/release'; t['target']['capture_layers'] = [1, 2]"
expect 2 "dflash_config.target_layer_ids is \[1,3\], but target.capture_layers is \[1,2\]" "$ORCH" "$TOPO"
no_run_dir "init_dir capture layers"
ok "refused before the run dir exists: capture layer 7 of 4, mask token 300, a token id 300 (shard, sample 17, position 5), an empty sample 9, a validation shard's id, init_dir of another block size / capture layers"
topo long "$T/run-long" "$M" "$DATA" "t['data']['max_seq_len'] = 200"
n_long=$(python3 -c "
import struct; b = open('$DATA', 'rb').read(); n = struct.unpack_from('<Q', b, 16)[0]
o = struct.unpack_from('<%dQ' % (n + 1), b, 64); print(sum(o[i + 1] - o[i] > 200 for i in range(n)))")
[ "$n_long" -gt 0 ] || fail "no sample longer than 200 tokens to check with"
expect 0 "plan: $n_long of 40 samples are longer than data.max_seq_len 200 and are truncated to it (the longest: data.shards\[0\] $DATA: sample" "$ORCH" "$TOPO"
ok "$n_long samples over max_seq_len 200: reported at start with the longest one's shard and sample, then truncated by the plan"

# ---- 5. a shard changed under the running pipeline ---------------------------------------
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/more" data/tiny/chat-train.jsonl \
  --max-samples 120 --max-len 300 >/dev/null || fail "prepare_data"
cp "$T/more-000.dfs" "$T/live.dfs"
shard "$T/more-000.dfs" "$T/live-bad.dfs" "
for i, x in enumerate(s): x[0][1] = 300 + i % 50" 400
topo live "$T/run-live" "$M" "$T/live.dfs"
start_orch
wait_for 60 test -S "$RUN/ctl.sock" || fail "no control socket"
"$DFCTL" --run-dir "$RUN" pause >/dev/null || fail "dfctl pause"
"$DFCTL" --run-dir "$RUN" stop target0 >/dev/null || fail "dfctl stop target0"
cp "$T/live-bad.dfs" "$T/live.tmp" && mv "$T/live.tmp" "$T/live.dfs"   # a new file: the others' mappings stay
"$DFCTL" --run-dir "$RUN" start target0 >/dev/null || fail "dfctl start target0"
"$DFCTL" --run-dir "$RUN" resume >/dev/null || fail "dfctl resume"
wait_orch 120
[ "$ORCH_RC" = 1 ] || fail "the run over a changed shard exited $ORCH_RC, expected 1"
grep -q "target0: batch [0-9]*: token id 3[0-9][0-9] (position 1) of data.shards\[0\] $T/live.dfs: sample [0-9]* is outside the target's vocabulary 0..263" \
  "$RUN/logs/target0.log" || fail "the target's message does not name the id, shard and sample: $(tail -n 3 "$RUN/logs/target0.log")"
ok "a shard changed under the running pipeline: target0 exit 100 naming the id, the shard and the sample"
echo "PASS test_resume_changes"
