#!/usr/bin/env bash
# test_sliding_window_bench: bench/eval/sliding_window.sh (the GPU bench of sliding-window
# drafter layers on long documents) dry-run on the CPU at a tiny size, no torch needed: the
# shipped byte target models/tiny-target is placed where trained_target.sh keeps its target
# for these settings and the prompts are drawn from the standard library with
# scripts/stdlib_corpus.py's draw_prompts (what train_target.py --prompt-lens writes), so
# phase 1 is skipped; then both variants (full, sliding:64) run through the product:
# target_generate answers, the pipeline trains, dflash_eval measures. Checks:
#   - trained_target.sh's knobs name their paths (PATHS_ONLY=1): unset, the old names;
#     SEQ / PROMPT_LENS key the target and answers, MAX_SEQ_LEN / LAYER_TYPES /
#     SLIDING_WINDOW the run; bad settings are refused before any work (exit 2);
#   - the first variant answers, the second reuses the answers; both finish;
#   - the prompts (1100..1200 bytes) reach target_generate and dflash_eval whole (their
#     --max-prompt-len follows PROMPT_LENS: 1203, above the default 1024): shard samples are
#     <bos> <user> prompt <assistant> + response, dflash_eval's prompt_tokens = prompt + 3;
#   - the run's config: data.max_seq_len 2048 and token_budget raised to it (ring slots
#     twice configs/tiny.json's); drafter.layer_types / sliding_window as the variant says,
#     and the run dir's topology.json and release config.json carry them;
#   - the table prints both variants with steps, ms/step, tau and lossless prompts, and
#     RES/sliding_window.json holds them; every evaluation is lossless.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for b in orchestrator target_worker postproc_worker drafter_worker dflash_eval target_generate; do
  [ -x "$BUILD/bin/$b" ] || { echo "missing $BUILD/bin/$b: build first (make)"; exit 1; }
done
tmp=$(mktemp -d /tmp/df_test_sliding_bench_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
export OMP_NUM_THREADS=1
export BACKEND=cpu SHAPE=tiny WORK=$tmp/w RES=$tmp/res PY=python3 BUILD TB=0 NTRAIN=24 RESP_LEN=24 \
  GEN_BATCH=8 PROMPTS=3 MAX_NEW=16 GEN_ARGS="--shard-samples 10"

# paths: unset knobs keep the old names; each knob names its part; bad settings exit 2
paths() { env "$@" PATHS_ONLY=1 bench/eval/trained_target.sh; }
[ "$(paths)" = "trained_tiny $WORK/models/tiny-bytes $WORK/data/tiny-bytes $WORK/runs/tiny-bytes" ] ||
  fail "no knob: $(paths)"
[ "$(paths LOSS=decay)" = "trained_tiny_decay_acfg_gcfg $WORK/models/tiny-bytes $WORK/data/tiny-bytes $WORK/runs/tiny-bytes-decay-acfg-gcfg" ] ||
  fail "LOSS: $(paths LOSS=decay)"
got=$(paths SEQ=512 PROMPT_LENS=300,400 MAX_SEQ_LEN=1024 LAYER_TYPES=sliding SLIDING_WINDOW=8)
want="trained_tiny_s512-p300-400_len1024-lt-sliding-w8 $WORK/models/tiny-bytes-s512-p300-400"
want="$want $WORK/data/tiny-bytes-s512-p300-400 $WORK/runs/tiny-bytes-s512-p300-400-len1024-lt-sliding-w8"
[ "$got" = "$want" ] || fail "knobs: $got"
[ "$(paths MAX_PROMPT_LEN=2000 LAYER_TYPES=full | cut -d' ' -f1)" = trained_tiny_m2000_lt-full ] ||
  fail "MAX_PROMPT_LEN: $(paths MAX_PROMPT_LEN=2000 LAYER_TYPES=full)"
refused() { # refused MESSAGE SETTING...: exit 2 naming MESSAGE
  local rc=0 out
  out=$(paths "${@:2}" 2>&1) || rc=$?
  if [ "$rc" != 2 ] || ! grep -qF -- "$1" <<<"$out"; then fail "${*:2}: exit $rc, '$out' (expected 2, '$1')"; fi
}
[ "$(paths LAYER_TYPES=sliding-but-last SLIDING_WINDOW=8 | cut -d' ' -f1)" = trained_tiny_lt-sliding-but-last-w8 ] ||
  fail "sliding-but-last on the 2-layer tiny drafter: $(paths LAYER_TYPES=sliding-but-last SLIDING_WINDOW=8 2>&1)"
refused "without a sliding layer" LAYER_TYPES=full SLIDING_WINDOW=8
refused "SLIDING_WINDOW (tokens) is needed" LAYER_TYPES=sliding
refused "a comma list of 2 full / sliding" LAYER_TYPES=sliding,full,full SLIDING_WINDOW=8
refused "expected lengths in bytes" PROMPT_LENS=300,x
refused "expected a whole number" SEQ=0
echo "paths: unset knobs keep the old names; SEQ/PROMPT_LENS key the target, the drafter knobs the run; 5 bad settings refused"

# the dry run's settings: prompts past the 1024-token default prompt cut (and past the tiny
# target's 1024 positions: its text there means little, the plumbing is what is checked) and far past
# the window; SLIDING_LAYERS=sliding: the sliding variant's layers (configs/tiny.json's two) all slide
export SEQ=256 PROMPT_LENS=1100,1200 MAX_SEQ_LEN=2048 SLIDING_LAYERS=sliding
read -r _ model data _ <<<"$(paths LAYER_TYPES=full)"
mkdir -p "$(dirname "$model")" "$data"
cp -r models/tiny-target "$model"
python3 - "$data" "$NTRAIN" <<'PY'
import json, random, sys
sys.path.insert(0, "scripts")
from stdlib_corpus import draw_prompts, load_corpus
data, n = sys.argv[1], int(sys.argv[2])
train, held = load_corpus(False)
rng = random.Random(0)
for name, corpus, k in (("train", train, n), ("heldout", held, 8)):
    with open(f"{data}/prompts-{name}.jsonl", "w") as f:
        for g in draw_prompts(corpus, k, rng, [1100, 1200], name):
            for p in g:
                f.write(json.dumps({"messages": [{"role": "user", "content": p.decode("latin-1")}]}) + "\n")
PY
bench/eval/sliding_window.sh full sliding:64 >"$tmp/bench.log" 2>&1 || { cat "$tmp/bench.log"; fail "sliding_window.sh exited $?"; }
cat "$tmp/bench.log"
grep -q "^full .* 3/3" "$tmp/bench.log" || fail "no table row for full with 3/3 lossless"
grep -q "^sliding:64 .* 3/3" "$tmp/bench.log" || fail "no table row for sliding:64 with 3/3 lossless"
grep -q "answer: $BUILD/bin/target_generate" "$RES/sliding_window_full.log" || fail "the first variant did not answer"
grep -q "answer: reusing" "$RES/sliding_window_sliding_64.log" || fail "the second variant did not reuse the answers"
python3 - "$RES" "$WORK" "$data" <<'PY'
import glob, json, struct, sys
res, work, data = sys.argv[1:]
BOS, USER, ASSISTANT = 256, 258, 259
prompts = [json.loads(l)["messages"][0]["content"].encode("latin-1") for l in open(f"{data}/prompts-train.jsonl")]
assert sorted(set(map(len, prompts))) == [1100, 1200], sorted(set(map(len, prompts)))
samples = []
for p in sorted(glob.glob(f"{data}/train-*.dfs")):
    b = open(p, "rb").read()
    n, nt = struct.unpack_from("<QQ", b, 16)
    off = struct.unpack_from("<%dQ" % (n + 1), b, 64)
    tok = struct.unpack_from("<%dI" % nt, b, 64 + 8 * (n + 1))
    samples += [tok[off[i]:off[i + 1]] for i in range(n)]
assert len(samples) == len(prompts), (len(samples), len(prompts))
for t, p in zip(samples, prompts):  # whole prompts: not cut to target_generate's default 1024
    head = [BOS, USER] + list(p) + [ASSISTANT]
    assert list(t[:len(head)]) == head and len(t) > len(head), "a training sample lost the start of its prompt"
rows = {r["variant"]: r for r in json.load(open(f"{res}/sliding_window.json"))}
assert sorted(rows) == ["full", "sliding:64"], rows.keys()
want = {"full": (["full_attention"] * 2, None), "sliding:64": (["sliding_attention"] * 2, 64)}
for v, r in rows.items():
    tag, run = r["tag"], None
    cfg = json.load(open(f"{work}/{tag}.json"))
    run = cfg["run_dir"]
    assert cfg["data"]["max_seq_len"] == 2048 and cfg["data"]["token_budget"] == 2048, cfg["data"]
    assert all(x["slot_bytes"] == 2 * 4194304 for x in cfg["rings"]), cfg["rings"]
    lt, w = want[v]
    d = json.load(open(f"{run}/topology.json"))["drafter"]
    assert (d.get("layer_types"), d.get("sliding_window")) == (lt, w), (v, d)
    rel = json.load(open(f"{run}/drafter/config.json"))
    assert (rel["layer_types"], rel["sliding_window"]) == (lt, w), (v, rel)
    assert rel["use_sliding_window"] == (w is not None), (v, rel["use_sliding_window"])
    assert r["drafter"]["steps"] > 0 and r["drafter"]["ms_per_step"] > 0, r["drafter"]
    for kind in ("trained", "untrained"):
        e = json.load(open(f"{res}/{tag}_eval_{kind}.json"))
        o = e["overall"]
        assert o["n_prompts"] == 3 and o["mismatches"] == 0, (v, kind, o)
        # whole prompts: prompt + <bos> <user> <assistant>, not cut to dflash_eval's default 1024
        assert all(p["prompt_tokens"] in (1103, 1203) for p in e["prompts"]), [p["prompt_tokens"] for p in e["prompts"]]
    print(f"{v}: {tag}: layer_types {lt}, window {w} in topology.json and the release config.json; "
          f"{r['drafter']['steps']} steps; max_seq_len / token_budget 2048; 3/3 lossless, whole prompts")
PY
echo "test_sliding_window_bench: ok"
