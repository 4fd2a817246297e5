#!/usr/bin/env bash
# test_ckpt_verify: a committed checkpoint is verified before the drafter trusts it, and
# what the drafter writes is private. Real pipeline (tiny target, CPU), real resumes:
#   - a run under umask 000: every checkpoint file and every release-export file is 0600,
#     their directories 0700; manifest.json's SHA-256 equal sha256sum's, and each piece's
#     digest equals the digest of that byte range (computed here by Python); dflash_tool
#     init/export under umask 000 and 077 give the same modes;
#   - a symlink planted at a temp-file name (the export's model.safetensors.tmp.<pid>,
#     config.json.tmp): the write fails and the symlink's target is untouched (O_NOFOLLOW);
#   - orchestrator --resume (train_summary.json removed, so the drafter starts and loads
#     the committed checkpoint) with: one bit flipped in optimizer.safetensors; one in
#     model.safetensors; trainer_state.json's step edited (manifest resealed); the manifest's
#     step edited too (directory name step-N disagrees); manifest.json removed: each time the
#     drafter exits 100 naming the file, is not restarted, the orchestrator exits 1;
#     `dflash_tool verify` says the same by hand (exit 0 / 100 with the byte range);
#   - the checkpoint restored, its manifest rewritten as version 1 (whole-file digests only,
#     as older builds wrote): --resume verifies it and completes, exactly once.
source "$(dirname "$0")/orch_lib.sh"
tiny_pipeline cv 24 '"checkpoint_every": 4, "keep_checkpoints": 0'
# modes DIR: "path mode" for DIR and everything under it
modes() { find "$1" -printf '%P %m\n' | sort; }
# private DIR WHAT: every dir under DIR 700, every file 600
private() {
  local bad
  bad=$(find "$1" \( -type d ! -perm 700 \) -o \( -type f ! -perm 600 \) -printf '%P %m\n')
  [ -z "$bad" ] || fail "$2: not private (want dirs 700, files 600): $bad"
}

# ---- a whole run under umask 000
(umask 000; exec "$ORCH" "$TOPO") >"$T/orch.out" 2>&1 || fail "run exited $?"
audit_exactly_once
private "$RUN/checkpoints" "checkpoints under umask 000"
private "$RUN/drafter" "release export under umask 000"
[ "$(stat -c %a "$RUN/train_summary.json")" = 600 ] || fail "train_summary.json mode $(stat -c %a "$RUN/train_summary.json")"
CK=$(final_ckpt "$RUN"); STEP=$(pyjson "$CK/trainer_state.json" "d['step']")
for d in "$RUN"/checkpoints/step-*; do
  [ -f "$d/manifest.json" ] || fail "$d has no manifest.json"
  for f in model.safetensors optimizer.safetensors trainer_state.json; do
    [ "$(pyjson "$d/manifest.json" "d['files']['$f']['sha256']")" = "$(sha256sum <"$d/$f" | cut -d' ' -f1)" ] \
      || fail "$d/manifest.json: sha256 of $f differs from sha256sum's"
  done
  [ "$(pyjson "$d/manifest.json" "d['step']")" = "$((10#${d##*step-}))" ] || fail "$d/manifest.json: wrong step"
  python3 - "$d" <<'PY' || fail "$d/manifest.json: a piece digest differs from the bytes' own"
import hashlib, json, os, sys
d = sys.argv[1]; m = json.load(open(os.path.join(d, "manifest.json")))
assert m["version"] == 2
for f, e in m["files"].items():
    b = open(os.path.join(d, f), "rb").read(); p = e["piece_bytes"]
    want = [hashlib.sha256(b[i:i + p]).hexdigest() for i in range(0, len(b), p)]
    assert e["sha256_pieces"] == want, f
PY
done
for u in 000 077; do
  (umask $u; "$BIN/dflash_tool" init --out "$T/tool$u/ck" >/dev/null && "$BIN/dflash_tool" export "$T/tool$u/ck" "$T/tool$u/rel" >/dev/null) \
    || fail "dflash_tool init/export under umask $u"
  private "$T/tool$u/ck" "dflash_tool init under umask $u"
  private "$T/tool$u/rel" "dflash_tool export under umask $u"
done
ok "umask 000: checkpoints and export 0600 files / 0700 dirs, manifests match sha256sum; dflash_tool under umask 000 and 077 likewise"

# ---- O_NOFOLLOW: a symlink at the temp name is not written through
echo precious >"$T/victim"
for tmpname in 'model.safetensors.tmp.$$' 'config.json.tmp'; do
  rm -rf "$T/rel"; mkdir -p "$T/rel"
  # exec keeps the shell's pid, so $$ is the tool's pid: the writer's temp name
  sh -c "ln -s '$T/victim' \"$T/rel/$tmpname\"; exec '$BIN/dflash_tool' export '$T/tool000/ck' '$T/rel'" >"$T/out" 2>&1 \
    && fail "export through a symlink at $tmpname succeeded"
  [ "$(cat "$T/victim")" = precious ] || fail "the symlink's target was written through ($tmpname)"
  grep -q "Too many levels of symbolic links" "$T/out" || fail "export failure not ELOOP: $(cat "$T/out")"
done
ok "a symlink planted at model.safetensors.tmp.<pid> or config.json.tmp: export fails (ELOOP), its target untouched"

# ---- corrupt committed checkpoints at resume: exit 100 naming the file, not restarted
cp -a "$CK" "$T/good"
# resume_fails WHAT PATTERN: --resume must fail with the drafter exiting 100 once, log matching PATTERN
resume_fails() {
  rm -f "$RUN/train_summary.json"
  local spawns; spawns=$(events spawn | grep -c '"drafter0"')
  "$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1; local rc=$?
  [ "$rc" = 1 ] || fail "$1: --resume exited $rc, expected 1: $(tail -5 "$T/orch.out")"
  grep -q "drafter0 failed permanently (exit 100)" "$T/orch.out" || fail "$1: no permanent drafter failure"
  tail -3 "$RUN/logs/drafter0.log" | grep -q -- "$2" || fail "$1: the drafter's message lacks '$2': $(tail -3 "$RUN/logs/drafter0.log")"
  [ "$(events spawn | grep -c '"drafter0"')" = $((spawns + 1)) ] || fail "$1: drafter0 was restarted after exit 100"
  rm -rf "$CK"; cp -a "$T/good" "$CK"   # restore for the next case
}
# flip FILE: one bit in the middle of FILE
flip() { python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x10; open(p,'wb').write(b)" "$1"; }
"$BIN/dflash_tool" verify "$CK" >"$T/v.out" 2>&1 || fail "dflash_tool verify of the intact checkpoint: $(cat "$T/v.out")"
grep -q "verified $CK: step $STEP, manifest version 2, 3 files" "$T/v.out" || fail "dflash_tool verify said: $(cat "$T/v.out")"
flip "$CK/optimizer.safetensors"
rc=0; "$BIN/dflash_tool" verify "$CK" >"$T/v.out" 2>&1 || rc=$?
[ "$rc" = 100 ] || fail "dflash_tool verify of a flipped bit exited $rc"
grep -q "$CK/optimizer.safetensors: content does not match its checksum (bytes " "$T/v.out" \
  || fail "dflash_tool verify does not name the file and byte range: $(cat "$T/v.out")"
ok "dflash_tool verify: the intact checkpoint verifies (version 2, 3 files); a flipped bit exits 100 naming the file and its byte range"
resume_fails "bit flip in optimizer.safetensors" "resume: $CK/optimizer.safetensors: content does not match its checksum"
flip "$CK/model.safetensors"
resume_fails "bit flip in model.safetensors" "resume: $CK/model.safetensors: content does not match its checksum"
sed -i "s/\"step\": $STEP,/\"step\": $((STEP - 2)),/" "$CK/trainer_state.json"
cmp -s "$CK/trainer_state.json" "$T/good/trainer_state.json" && fail "the step edit did not change trainer_state.json"
resume_fails "edited step, manifest not resealed" "resume: $CK/trainer_state.json: content does not match its checksum"
sed -i "s/\"step\": $STEP,/\"step\": $((STEP - 2)),/" "$CK/trainer_state.json"; tests/ckpt_reseal.py "$CK"
resume_fails "edited step, manifest resealed" "resume: $CK/trainer_state.json: field \"step\" is $((STEP - 2)), manifest.json says $STEP"
sed -i "s/\"step\": $STEP,/\"step\": $((STEP - 2)),/" "$CK/trainer_state.json"; tests/ckpt_reseal.py "$CK" --step $((STEP - 2))
resume_fails "edited step in state and manifest" "resume: $CK/manifest.json: field \"step\" is $((STEP - 2)) but the directory is $(basename "$CK")"
rm "$CK/manifest.json"
resume_fails "no manifest" "resume: $CK/manifest.json: missing: the checkpoint has no checksums"
ok "at resume, exit 100 naming the file, not restarted: bit flips in optimizer/model, an edited step (resealed or not, and with the manifest's step), a missing manifest"

# ---- the intact checkpoint resumes, under a version 1 manifest
tests/ckpt_reseal.py "$CK" --v1
[ "$(pyjson "$CK/manifest.json" "d['version']")" = 1 ] || fail "the reseal did not write a version 1 manifest"
rm -f "$RUN/train_summary.json"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 || fail "--resume of the restored checkpoint exited $?: $(tail -5 "$T/orch.out")"
grep -q "resumed from $CK (step $STEP)" "$RUN/logs/drafter0.log" || fail "no resume from $CK logged"
[ -f "$RUN/train_summary.json" ] || fail "no train_summary.json after the resume"
audit_exactly_once
ok "the restored checkpoint, its manifest rewritten as version 1, verifies and resumes (step $STEP), run exactly once"
echo "test_ckpt_verify: ok"
