#!/usr/bin/env bash
# test_ckpt_policy: what the drafter and the orchestrator do with checkpoints, on the real
# pipeline (tiny target, a small data slice, CPU backend):
#   - drafter.keep_checkpoints 2: old step dirs are deleted once a newer checkpoint is
#     committed and acknowledged; the committed (latest) one always stays;
#   - dflash_tool inspect reads optimizer.safetensors too: exit 100 on garbage or wrong names;
#   - orchestrator --resume of a finished run: exit 0 "already complete", nothing spawned;
#     with the summary missing the drafter finishes it (no step in that incarnation: the
#     start loss is null, it used to be "out of memory" from a NaN);
#   - a committed checkpoint that fails validation at resume: drafter exit 100 naming the
#     file, not restarted (max_restarts 3), orchestrator exit 1;
#   - a worker run by hand (no DF_* environment): exit 2 naming the variable.
# The full-disk policy (drafter.max_checkpoint_failures) is in test_bad_input.sh (it needs a tmpfs).
source "$(dirname "$0")/orch_lib.sh"
tiny_pipeline ck 40 '"checkpoint_every": 2, "keep_checkpoints": 2'
expect() { # RC PATTERN CMD...
  local want=$1 pat=$2; shift 2
  "$@" >"$T/out" 2>&1; local rc=$?
  [ "$rc" = "$want" ] || fail "$*: exit $rc, expected $want: $(head -c 1500 "$T/out")"
  grep -q -- "$pat" "$T/out" || fail "$*: output lacks '$pat': $(head -c 1500 "$T/out")"
}

# ---- keep_checkpoints
start_orch; wait_orch 240
[ "$ORCH_RC" = 0 ] || fail "run exited $ORCH_RC"
audit_exactly_once
steps=$(grep -c '"ev":"step"' "$RUN/metrics/drafter0.jsonl")
latest=$(cat "$RUN/checkpoints/latest")
[ "$latest" = "$(printf 'step-%08d' "$steps")" ] || fail "latest is $latest after $steps steps"
dirs=$(cd "$RUN/checkpoints" && ls -d step-* | tr '\n' ' ')
[ "$(echo $dirs | wc -w)" = 2 ] || fail "keep_checkpoints 2 left: $dirs"
[ -d "$RUN/checkpoints/$latest" ] || fail "the committed checkpoint $latest is gone"
made=$(( (steps + 1) / 2 ))
grep -q 'pruned' "$RUN/logs/drafter0.log" || fail "no prune logged"
ok "keep_checkpoints 2: $steps steps, about $made checkpoints written, left: $dirs(latest $latest)"

# ---- dflash_tool inspect reads the optimizer state
CK=$RUN/checkpoints/$latest
expect 0 "optimizer: $CK/optimizer.safetensors: m and v for" "$BIN/dflash_tool" inspect "$RUN/checkpoints"
# each broken copy is resealed (its manifest rewritten to match) so the parser itself is checked
cp -r "$CK" "$T/og"; head -c 4000 /dev/urandom >"$T/og/optimizer.safetensors"; tests/ckpt_reseal.py "$T/og"
expect 100 "$T/og/optimizer.safetensors" "$BIN/dflash_tool" inspect "$T/og"
cp -r "$CK" "$T/on"; cp "$CK/model.safetensors" "$T/on/optimizer.safetensors"; tests/ckpt_reseal.py "$T/on"
expect 100 "$T/on/optimizer.safetensors: tensor \"m\.[a-z_.0-9]*\" missing" "$BIN/dflash_tool" inspect "$T/on"
cp -r "$CK" "$T/os"; python3 - "$T/os/optimizer.safetensors" <<'PY' || fail "reshaping the optimizer file"
# rewrite the header so the first v.* tensor claims a different shape (same byte size)
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
k = next(k for k, v in h.items() if k.startswith('v.') and len(v['shape']) == 2 and v['shape'][0] % 2 == 0)
h[k]['shape'] = [h[k]['shape'][0] // 2, h[k]['shape'][1] * 2]
hb = json.dumps(h).encode(); hb += b' ' * ((8 - len(hb) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(hb)) + hb + b[8 + n:])
PY
tests/ckpt_reseal.py "$T/os"
expect 100 "$T/os/optimizer.safetensors: tensor \"v\..*\" has shape" "$BIN/dflash_tool" inspect "$T/os"
ok "dflash_tool inspect: optimizer.safetensors validated (garbage, model names, a wrong shape -> exit 100 naming the file)"

# ---- --resume of a finished run
spawns=$(events spawn | wc -l)
expect 0 "run ck is already complete: every batch of epoch 1 committed (step $steps)" "$ORCH" --resume "$RUN"
[ "$(events spawn | wc -l)" = "$spawns" ] || fail "--resume of a finished run spawned workers"
rm "$RUN/train_summary.json"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 || fail "--resume without the summary exited $?: $(tail -5 "$T/orch.out")"
[ "$(pyjson "$RUN/train_summary.json" "d['steps'], d['loss_start'], d['loss_end']")" = "$steps None None" ] || fail "summary: $(cat "$RUN/train_summary.json")"
grep -q "out of memory" "$RUN/logs/drafter0.log" && fail "the drafter still reports out of memory"
audit_exactly_once
ok "--resume of a finished run: exit 0 without spawning; without train_summary.json the drafter rewrites it (loss_start null)"

# ---- a committed checkpoint that fails validation at resume: permanent
rm "$RUN/train_summary.json"
truncate -s 5000 "$CK/model.safetensors"
spawns=$(events spawn | grep -c '"drafter0"')
expect 1 "drafter0 failed permanently (exit 100)" "$ORCH" --resume "$RUN"
grep -q "resume: $CK/model.safetensors: 5000 bytes, .*manifest.json says" "$RUN/logs/drafter0.log" || fail "the drafter's message does not name the file"
[ "$(events spawn | grep -c '"drafter0"')" = $((spawns + 1)) ] || fail "drafter0 was restarted after exit 100"
ok "corrupt committed checkpoint at resume -> drafter exit 100 naming $CK/model.safetensors, not restarted, orchestrator exit 1"

# ---- workers started by hand: bad usage
for b in target_worker postproc_worker drafter_worker; do
  expect 2 "environment variable DF_ORCH_PID is not set" env -u DF_ORCH_PID "$BIN/$b"
  expect 2 "DF_ORCH_PID=abc: expected an integer" env DF_ORCH_PID=abc "$BIN/$b"
done
ok "workers run by hand (no or a bad DF_ORCH_PID) -> exit 2 naming the variable"
echo "test_ckpt_policy: ok"
