#!/usr/bin/env bash
# test_trained_target_smoke: the GPU recipe bench/eval/trained_target.sh, end to end on the
# CPU at a tiny size (BACKEND=cpu SHAPE=tiny): train_target.py trains a few steps in
# micro-batches and writes prompts only, the product's target_generate answers them into
# training shards, the pipeline trains a drafter on those shards, dflash_eval measures it
# three ways. Checks:
#   - every phase runs, in order, and the script exits 0;
#   - gradient accumulation keeps the step's math: --micro-batch 1 and 4 of a batch of 4
#     give the same losses (to float rounding);
#   - --prompts-only writes the prompts the answering path would have answered;
#   - the shards are what prepare_data.py made from the old answers, minus its trailing eos:
#     per sample <|bos|> <|user|> prompt <|assistant|> at loss mask 0 (the prompts of
#     prompts-train.jsonl, in order), then RESP_LEN response bytes at loss mask 1; the run
#     config lists every shard (several here), backend cpu;
#   - the held-out prompts are answered too and the validator worker scores the checkpoints
#     every VAL_EVERY steps and the last (metrics/validator.jsonl copied beside the results);
#   - the evaluations are lossless on every prompt;
#   - a second call reuses the target and the shards, and a BUDGET too small for the
#     pipeline stops with a message before starting it;
#   - --prompt-lens: long prompts whole, from the files long enough for them; a length no file
#     holds (and a --seq past the shape's positions) refused before training.
# Needs a Python with torch (skipped without one: CI machines have none).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
py=
for c in python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then py=$(command -v "$c"); break; fi
done
if [ -z "$py" ]; then
  echo "skipped: no Python with torch here (train_target.py needs it)"
  exit 77
fi
tmp=$(mktemp -d /tmp/df_test_trained_target_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
export OMP_NUM_THREADS=1

# gradient accumulation: the same losses whatever the micro-batch
for mb in 4 1; do
  "$py" scripts/train_target.py --shape tiny --steps 3 --batch 4 --micro-batch "$mb" --seq 48 --n-train 6 \
    --n-heldout 4 --prompts-only --device cpu --out "$tmp/m$mb" --data "$tmp/d$mb" >"$tmp/mb$mb.log" 2>&1 ||
    { cat "$tmp/mb$mb.log"; fail "train_target.py --micro-batch $mb"; }
done
grep -q "batch 4 x 48 bytes in micro-batches of 1" "$tmp/mb1.log" || fail "no micro-batch line in the log"
"$py" - "$tmp/mb4.log" "$tmp/mb1.log" <<'PY'
import re, sys
vals = [[float(x) for x in re.findall(r"loss (\d+\.\d+)", open(p).read())] for p in sys.argv[1:]]
assert len(vals[0]) == 4 and len(vals[0]) == len(vals[1]), vals  # 3 steps + held-out
assert all(abs(a - b) < 2e-3 for a, b in zip(*vals)), f"micro-batch 4 vs 1: {vals}"
print(f"accumulation: micro-batch 4 and 1 give the losses {vals[0]} / {vals[1]}")
PY
cmp -s "$tmp/d4/prompts-train.jsonl" "$tmp/d1/prompts-train.jsonl" || fail "prompts depend on the micro-batch"
"$py" scripts/train_target.py --shape tiny --steps 3 --batch 4 --seq 48 --n-train 6 --n-heldout 4 --resp-len 4 \
  --device cpu --out "$tmp/ma" --data "$tmp/da" >"$tmp/answer.log" 2>&1 || { cat "$tmp/answer.log"; fail "answers"; }
"$py" - "$tmp/d4" "$tmp/da" <<'PY'
import json, sys
for f in ("train", "heldout"):
    a = [json.loads(l)["messages"] for l in open(f"{sys.argv[1]}/prompts-{f}.jsonl")]
    b = [json.loads(l)["messages"] for l in open(f"{sys.argv[2]}/chat-{f}.jsonl")]
    assert all(len(m) == 1 and m[0]["role"] == "user" for m in a), a[0]
    assert [m[0] for m in a] == [m[0] for m in b], f"{f}: prompts-only prompts differ from the answered ones"
print("--prompts-only: the prompts of the answering path, user turn only")
PY

# --prompt-lens: long prompts come from the documents long enough for them, whole; a length no
# document holds, or a --seq past the shape's positions, is refused before any training
"$py" scripts/train_target.py --shape tiny --steps 1 --batch 2 --seq 48 --n-train 12 --n-heldout 6 --prompts-only \
  --prompt-lens 1500,3000 --device cpu --out "$tmp/ml" --data "$tmp/dl" >"$tmp/long.log" 2>&1 ||
  { cat "$tmp/long.log"; fail "train_target.py --prompt-lens 1500,3000"; }
"$py" - "$tmp/dl" <<'PY'
import json, sys
for f, n in (("train", 12), ("heldout", 6)):
    p = [json.loads(l)["messages"] for l in open(f"{sys.argv[1]}/prompts-{f}.jsonl")]
    lens = [len(m[0]["content"].encode("latin-1")) for m in p]
    assert len(p) == n and set(lens) <= {1500, 3000} and lens == sorted(lens), (f, lens)
print("--prompt-lens 1500,3000: whole prompts of those lengths, grouped by length")
PY
for bad in "--prompt-lens 10000000" "--seq 5000"; do
  # shellcheck disable=SC2086 # $bad is two words, an option and its value
  if "$py" scripts/train_target.py --shape tiny --steps 1 --n-train 4 --n-heldout 4 --prompts-only --device cpu \
    --out "$tmp/mb" --data "$tmp/db" $bad >"$tmp/bad.log" 2>&1; then fail "train_target.py $bad: exit 0"; fi
  grep -q "need documents of more than\|longer than the shape's max_position_embeddings" "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "train_target.py $bad: no message"; }
  ! grep -q "step " "$tmp/bad.log" || fail "train_target.py $bad trained before refusing"
done
echo "--prompt-lens past every document and --seq past the positions: refused before training"

# the recipe, CPU-sized
run() {
  BACKEND=cpu SHAPE=tiny WORK=$tmp/w RES=$tmp/res PY=$py BUILD=$BUILD TB=0 NTRAIN=48 RESP_LEN=24 GEN_BATCH=8 \
    EPOCHS=1 PROMPTS=4 MAX_NEW=16 BATCH=2 VAL_EVERY=4 TRAIN_ARGS="--steps 3 --seq 64 --batch 4 --micro-batch 2" \
    GEN_ARGS="--shard-samples 20" bench/eval/trained_target.sh
}
run >"$tmp/call.log" 2>&1 || {
  rc=$?
  cat "$tmp/call.log"
  fail "trained_target.sh exited $rc"
}
phases=$(sed -n 's/^== \[[0-9]*s, -*[0-9]*s left\] \([a-z]*\):.*/\1/p' "$tmp/call.log" | tr '\n' ' ')
[ "$phases" = "train answer pipeline eval eval eval " ] || { cat "$tmp/call.log"; fail "phases: $phases"; }
grep -q "in micro-batches of 2" "$tmp/res/trained_tiny_target.log" || fail "the target did not train in micro-batches"
grep -q "held-out answers: " "$tmp/call.log" || { cat "$tmp/call.log"; fail "the held-out prompts were not answered"; }
grep -q "checkpoints scored on 64 held-out samples" "$tmp/call.log" || { cat "$tmp/call.log"; fail "no validator table"; }
d=$tmp/w/data/tiny-bytes
"$py" - "$d" "$tmp/w/tiny-bytes.json" "$tmp/res" <<'PY'
import glob, json, struct, sys
d, cfg, res = sys.argv[1:]
BOS, EOS, USER, ASSISTANT, RESP = 256, 257, 258, 259, 24
prompts = [json.loads(l)["messages"][0]["content"].encode("latin-1") for l in open(f"{d}/prompts-train.jsonl")]
shards = sorted(glob.glob(f"{d}/train-*.dfs"))
assert len(shards) == 3, shards  # 48 answers, 20 a shard
samples = []
for p in shards:
    b = open(p, "rb").read()
    n, nt = struct.unpack_from("<QQ", b, 16)
    off = struct.unpack_from("<%dQ" % (n + 1), b, 64)
    tp = 64 + 8 * (n + 1)
    tok = struct.unpack_from("<%dI" % nt, b, tp)
    mp = tp + (4 * nt + 7) // 8 * 8  # the mask section is 8-byte aligned
    samples += [(tok[off[i]:off[i + 1]], b[mp + off[i]:mp + off[i + 1]]) for i in range(n)]
assert len(samples) == len(prompts) == 48, (len(samples), len(prompts))
for i, (t, m) in enumerate(samples):
    head = [BOS, USER] + list(prompts[i]) + [ASSISTANT]
    assert list(t[:len(head)]) == head, f"sample {i}: not <bos> <user> prompt {i} <assistant>"
    r = t[len(head):]
    assert list(m) == [0] * len(head) + [1] * len(r), f"sample {i}: mask not 0 on the prompt, 1 on the response"
    assert len(r) == RESP or (0 < len(r) < RESP and r[-1] == EOS), f"sample {i}: response of {len(r)} tokens"
g = json.load(open(f"{res}/trained_tiny_generate.json"))
assert g["greedy"] and g["samples_written"] == 48 and g["backend"] == "cpu", g
c = json.load(open(cfg))
assert c["backend"] == "cpu" and c["data"]["shards"] == shards, c["data"]
held = sorted(glob.glob(f"{d}/heldout-*.dfs"))
assert held and c["validation"]["shards"] == held and c["validation"]["every_steps"] == 4, c.get("validation")
assert c["drafter"]["checkpoint_every"] == 4, c["drafter"]
assert [w for w in c["workers"] if w["role"] == "validator"] == [{"name": "validator", "role": "validator"}]
assert all(x["gpu"] == -1 for x in c["rings"] + c["workers"] if "gpu" in x)
s = json.load(open(f"{res}/trained_tiny_summary.json"))
v = [json.loads(l) for l in open(f"{res}/trained_tiny_validator.jsonl")]
want = sorted(set(list(range(4, s["steps"] + 1, 4)) + [s["steps"]]))
assert [x["step"] for x in v] == want, ([x["step"] for x in v], want)
assert all(x["samples"] == 64 and x["val_loss"] > 0 for x in v), v
for label in ("trained", "trained_batch2", "untrained"):
    e = json.load(open(f"{res}/trained_tiny_eval_{label}.json"))
    o = e["overall"]
    assert e["backend"] == "cpu" and o["n_prompts"] == 4 and o["mismatches"] == 0, (label, o)
print(f"shards: {len(samples)} samples in {len(shards)} shards, prompt at mask 0, {RESP}-byte responses "
      f"at mask 1; 3 evaluations lossless on 4 / 4 prompts")
PY

# a second call: the target and the shards are reused; a budget too small for the pipeline
# (which keeps 3 x 30 s for the evaluations) stops before it starts
touch "$tmp/stamp"
set +e
BUDGET=60 run >"$tmp/call2.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || { cat "$tmp/call2.log"; fail "BUDGET=60: exit 0"; }
for want in "train: reusing" "answer: reusing 3 shard" "out of BUDGET"; do
  grep -q "$want" "$tmp/call2.log" || { cat "$tmp/call2.log"; fail "second call: no '$want'"; }
done
! grep -q "pipeline:" "$tmp/call2.log" || fail "the pipeline started without the budget for it"
[ -z "$(find "$d" -newer "$tmp/stamp" -name 'train-*.dfs')" ] || fail "the shards were rewritten"
echo "second call: target and shards reused; BUDGET=60 stopped before the pipeline (exit $rc)"
echo "test_trained_target_smoke: ok"
