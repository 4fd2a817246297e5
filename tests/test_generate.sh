#!/usr/bin/env bash
# test_generate: target_generate end to end on the tiny target: the target answers held-out
# prompts and writes training shards (prompt mask 0, response mask 1, eos kept); defaults
# come from generation_config.json (eos ids, do_sample and its settings); a rerun writes
# byte-identical shards, a prompt's sampled response does not depend on the other prompts
# of the run nor on how many are decoded together (--batch), another seed changes them;
# the shards train (dflash_eval reads them as
# prompts again, the orchestrator's dataset check accepts them); bad input gets the
# documented exit code and a message naming the file / field / option, before any
# generation when it can.
set -euo pipefail
BUILD=${BUILD:-build}
GEN=$BUILD/bin/target_generate
tmp=$(mktemp -d /tmp/df_test_generate_XXXXXX); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect() { # expect CODE PATTERN CMD...: exit code CODE, stderr matching PATTERN
  local code=$1 pat=$2; shift 2
  set +e; "$@" >"$tmp/x.out" 2>"$tmp/x.err"; local rc=$?; set -e
  [ $rc -eq "$code" ] || { cat "$tmp/x.err"; fail "$*: exit $rc, expected $code"; }
  grep -q -- "$pat" "$tmp/x.err" || { cat "$tmp/x.err"; fail "$*: message lacks '$pat'"; }
}
# the shard's samples as (prompt, response) token lists
shard() { python3 - "$@" <<'PY'
import struct, sys
for p in sys.argv[1:]:
    b = open(p, "rb").read()
    n, nt = struct.unpack_from("<QQ", b, 16)
    off = struct.unpack_from("<%dQ" % (n + 1), b, 64)
    tp = 64 + 8 * (n + 1)
    tok = struct.unpack_from("<%dI" % nt, b, tp)
    mp = tp + (4 * nt + 7) // 8 * 8  # the mask section is 8-byte aligned
    mk = b[mp: mp + nt]
    for i in range(n):
        t, m = tok[off[i]:off[i + 1]], mk[off[i]:off[i + 1]]
        k = m.index(1) if 1 in m else len(m)
        assert list(m) == [0] * k + [1] * (len(m) - k), "mask not 0...0 1...1"
        print(" ".join(map(str, t[:k])), "|", " ".join(map(str, t[k:])))
PY
}

"$GEN" --help | grep -q -- "--top-p P" || fail "--help does not describe --top-p"
expect 2 "required" "$GEN"
expect 2 "--top-p" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --top-p 0
expect 2 "cannot go with" "$GEN" --target models/tiny-target --prompts p --out "$tmp/o" --greedy --temperature 1
expect 2 "--backend gpu" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --backend gpu
expect 2 "--batch" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --batch 0
expect 2 "--batch" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --batch 65
expect 2 "--batch" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --batch 2.5
expect 100 "nope.dfs" "$GEN" --target models/tiny-target --prompts "$tmp/nope.dfs" --out "$tmp/o"
expect 100 "config.json" "$GEN" --target "$tmp" --prompts data/tiny/heldout-000.dfs --out "$tmp/o"
# a bad generation_config.json is named with its field, before anything runs
cp -r models/tiny-target "$tmp/m"
echo '{"eos_token_id": 257, "do_sample": true, "top_p": 2}' >"$tmp/m/generation_config.json"
expect 100 "generation_config.json: top_p: 2 must be in (0, 1]" "$GEN" --target "$tmp/m" \
  --prompts data/tiny/heldout-000.dfs --out "$tmp/o"
echo '{"eos_token_id": "x"}' >"$tmp/m/generation_config.json"
expect 100 "generation_config.json: eos_token_id: expected an integer or a list" "$GEN" --target "$tmp/m" \
  --prompts data/tiny/heldout-000.dfs --out "$tmp/o"
# an eos id outside the vocabulary: from the model's files a bad model (100) named with its file
# and field, given as --eos a bad option (2)
echo '{"eos_token_id": [257, 999]}' >"$tmp/m/generation_config.json"
expect 100 "m/generation_config.json: eos_token_id: 999 is not a token id: the vocabulary has 264 tokens" "$GEN" \
  --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --out "$tmp/o"
expect 2 "^.*: --eos 999: the vocabulary has 264 tokens" "$GEN" --target models/tiny-target \
  --prompts data/tiny/heldout-000.dfs --out "$tmp/o" --eos 999
# an output that cannot be written fails before the first prompt is answered
touch "$tmp/file"
expect 1 "cannot create" "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --out "$tmp/file/sub/o"
[ -z "$(grep 'prompts,' "$tmp/x.err" || true)" ] || fail "generation started before the output was checked"

# greedy (the tiny target's generation_config.json says do_sample false): 6 prompts, 2 shards
"$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --max-prompts 6 --max-new 48 \
  --shard-samples 4 --out "$tmp/g/a" --quiet >"$tmp/g.out"
grep -q "6 prompts -> 6 samples in 2 shard(s)" "$tmp/g.out" || { cat "$tmp/g.out"; fail "summary line"; }
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['greedy'] and j['eos']==[257] and j['samples_written']==6, j" "$tmp/g/a.json"
shard "$tmp/g/a-000.dfs" "$tmp/g/a-001.dfs" >"$tmp/g.txt"
[ "$(wc -l <"$tmp/g.txt")" -eq 6 ] || fail "expected 6 samples"
# the prompts are the held-out shard's prompts, as dflash_eval reads them
shard data/tiny/heldout-000.dfs >"$tmp/h.txt"; head -6 "$tmp/h.txt" | cut -d"|" -f1 >"$tmp/p_in.txt"
cut -d'|' -f1 "$tmp/g.txt" >"$tmp/p_out.txt"
cmp -s "$tmp/p_in.txt" "$tmp/p_out.txt" || fail "the written prompts differ from the input's"
# rerun: byte-identical shards
"$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --max-prompts 6 --max-new 48 \
  --shard-samples 4 --out "$tmp/g/b" --quiet >/dev/null
cmp "$tmp/g/a-000.dfs" "$tmp/g/b-000.dfs" && cmp "$tmp/g/a-001.dfs" "$tmp/g/b-001.dfs" || fail "greedy rerun differs"
# one prompt at a time (--batch 1) and 4 together (a full batch, then 2): the same shards
for b in 1 4; do
  "$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --max-prompts 6 --max-new 48 \
    --shard-samples 4 --batch $b --out "$tmp/g/b$b" --quiet >/dev/null
  cmp "$tmp/g/a-000.dfs" "$tmp/g/b$b-000.dfs" && cmp "$tmp/g/a-001.dfs" "$tmp/g/b$b-001.dfs" ||
    fail "greedy --batch $b differs from the default batch"
done

# eos from generation_config.json: token 32 (a space) ends every response early and is kept
echo '{"eos_token_id": [32], "do_sample": false}' >"$tmp/m/generation_config.json"
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 6 --max-new 200 --out "$tmp/e/e" --quiet >/dev/null
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['eos']==[32] and j['stopped_on_eos']==6, j" "$tmp/e/e.json"
shard "$tmp/e/e-000.dfs" | awk -F'|' '{n=split($2,a," "); if (a[n]!=32) exit 1; for(i=1;i<n;i++) if(a[i]==32) exit 1}' \
  || fail "responses must end at their first eos (32), kept"
# --drop-unfinished with an eos that never comes writes nothing but the summary
"$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs --max-prompts 3 --max-new 8 --eos 258 \
  --drop-unfinished --out "$tmp/d/d" --quiet >"$tmp/d.out"
grep -q "3 prompts -> 0 samples in 0 shard(s)" "$tmp/d.out" || { cat "$tmp/d.out"; fail "--drop-unfinished"; }

# sampling defaults from generation_config.json; a prompt's response is the same alone
echo '{"eos_token_id": 257, "do_sample": true, "temperature": 0.9, "top_p": 0.9, "top_k": 20}' >"$tmp/m/generation_config.json"
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 5 --max-new 40 --seed 3 --out "$tmp/s/all" --quiet >/dev/null
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert not j['greedy'] and j['top_k']==20 and abs(j['top_p']-0.9)<1e-9, j" "$tmp/s/all.json"
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 1 --max-new 40 --seed 3 --out "$tmp/s/one" --quiet >/dev/null
shard "$tmp/s/all-000.dfs" >"$tmp/all.txt"; [ "$(shard "$tmp/s/one-000.dfs")" = "$(head -1 "$tmp/all.txt")" ] || fail "prompt 0's sampled response depends on the other prompts"
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 5 --max-new 40 --seed 3 --batch 1 --out "$tmp/s/b1" --quiet >/dev/null
cmp "$tmp/s/all-000.dfs" "$tmp/s/b1-000.dfs" || fail "sampled --batch 1 differs from the default batch"
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 5 --max-new 40 --seed 4 --out "$tmp/s/other" --quiet >/dev/null
! cmp -s "$tmp/s/all-000.dfs" "$tmp/s/other-000.dfs" || fail "another seed gave the same responses"
! cmp -s "$tmp/s/all-000.dfs" "$tmp/g/a-000.dfs" || fail "sampling gave the greedy responses"
# --greedy overrides do_sample
"$GEN" --target "$tmp/m" --prompts data/tiny/heldout-000.dfs --max-prompts 4 --max-new 48 --greedy --out "$tmp/s/gr" --quiet >/dev/null
[ "$(shard "$tmp/s/gr-000.dfs")" = "$(shard "$tmp/g/a-000.dfs")" ] || fail "--greedy did not give the greedy responses"

# the written shards carry valid checksums (the readers refuse anything else)
python3 - "$tmp/g/a-000.dfs" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"DFSHARD1"
def fnv(d, h=0xcbf29ce484222325):
    for x in d:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
assert struct.unpack_from("<Q", b, 32)[0] == fnv(b[64:]), "payload checksum"
assert struct.unpack_from("<Q", b, 40)[0] == fnv(b[:40]), "header checksum"
PY
# docs/walkthrough.md's tiny command, as written there (output under the test's folder)
"$GEN" --target models/tiny-target --prompts data/tiny/heldout-000.dfs \
    --max-prompts 8 --max-new 64 --out "$tmp/data/mine/regen" >"$tmp/w.out" 2>"$tmp/w.err"
grep -q "8 prompts -> 8 samples in 1 shard(s)" "$tmp/w.out" || { cat "$tmp/w.out" "$tmp/w.err"; fail "walkthrough command"; }
grep -q "8/8 prompts" "$tmp/w.err" || fail "no progress line"
echo "PASS: target_generate: greedy = the target's own answers (byte-identical rerun), eos from generation_config"\
     "stops and is kept, sampling reproducible per prompt, bad input named with documented exit codes"
