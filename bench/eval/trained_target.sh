#!/usr/bin/env bash
# bench/eval/trained_target.sh: a drafter that works, at a real shape, on the GPU machine, in
# one device call (10 min limit). No weights can be downloaded there, so the target is
# trained in the same call:
#   1. train:    scripts/train_target.py --shape 0.6b --prompts-only: a byte-level Qwen3 with
#                Qwen3-0.6B's body (28 layers, d 1024, 16/8 heads, MLP 3072, tied embeddings)
#                trained from scratch on the Python standard library shipped on the machine
#                for TB seconds (batches of 32 x 1024 bytes in micro-batches of 8: fits an
#                80 GB H100), then NTRAIN training prompts and 64 held-out prompts are written
#                (chat JSONL, the user turn only);
#   2. answer:   the product's target_generate --backend cuda --batch GEN_BATCH --greedy answers
#                the training prompts (RESP_LEN bytes each) straight into the drafter's training
#                shards (prompt at loss mask 0, response at loss mask 1);
#                The 64 held-out prompts are answered the same way (heldout-NNN.dfs): the
#                validator's held-out set;
#   3. pipeline: the whole pipeline, CUDA backend (configs/qwen3-0.6b-bytes.json): a 5-layer
#                drafter, EPOCHS passes over the shards, a checkpoint every VAL_EVERY steps,
#                each scored by the validator worker on the GPU while training goes on
#                (held-out loss, per-position accuracy, expected tau: metrics/validator.jsonl,
#                printed as a table with the validator's seconds beside the run's);
#   4. eval:     dflash_eval --backend cuda on PROMPTS held-out prompts: the trained drafter,
#                again with BATCH prompts decoded together, then the same drafter at its
#                initial weights (--random-drafter <run seed>): tau pooled per verify step, per
#                response and median, the per-position accuracy curve, the lossless check,
#                plain vs speculative time per token.
# Prints a stamp per phase ("== [elapsed s, left s] ..."), then the tables; writes
# RES/trained_<shape>_*.json and logs (RES: bench/results/eval).
# Env: TB (150) seconds of target training, NTRAIN (5000), RESP_LEN (224), GEN_BATCH (64),
#      EPOCHS (2), VAL_EVERY (250; 0: no validator), PROMPTS (32), MAX_NEW (128), BATCH (4; 1 skips the batched evaluation),
#      WAIT_BUILD (unset: the programs must exist at the start; N: the target trains while
#      a build still runs, and phase 2 waits up to N s for the programs),
#      BUDGET (540): seconds the whole script may take; each phase's timeout leaves the
#      later phases their share of what is left, so a slow phase ends with a message and the
#      results so far instead of the device call being cut off.
#      The drafter's objective (docs/drafter_quality.md, "Which objective"): LOSS (decay |
#      dpace; default: the config's), DPACE_ALPHA, GAMMA; with any of them set the results
#      are tagged trained_<shape>_<loss>_a<alpha>_g<gamma> and the run dir is its own, so
#      the same warm machine compares objectives on one target and one set of answers.
#      Long contexts and the drafter's attention kinds (bench/eval/sliding_window.sh sets them):
#      PROMPT_LENS (train_target.py --prompt-lens, bytes, e.g. 3000,3300,3600; default its
#      64,96,128), SEQ (train_target.py --seq, the target's training window; the batch keeps
#      32 Ki bytes a step, in micro-batches of 8 Ki bytes at the 0.6b shape: 8 x 4096 in
#      passes of 2, ~2.7 GiB of activations per 1 Ki bytes (docs/drafter_quality.md, "Memory
#      arithmetic"): ~22 GiB a pass, as 8 x 1024; TRAIN_ARGS may override them, at 0.6b
#      --batch with --micro-batch), MAX_PROMPT_LEN (target_generate and
#      dflash_eval --max-prompt-len, tokens; default with PROMPT_LENS: the longest + 3, the chat
#      template's tokens, at least their default 1024), MAX_SEQ_LEN (the pipeline's
#      data.max_seq_len; data.token_budget raised to it where lower, the ring slots with it),
#      LAYER_TYPES (the drafter's drafter.layer_types: a comma list of full / sliding, one per
#      drafter layer, or full, sliding, sliding-but-last: every layer so, or all sliding but
#      the last), SLIDING_WINDOW (drafter.sliding_window, tokens). With PROMPT_LENS, SEQ or
#      MAX_PROMPT_LEN set the target and its answers are their own (models/<name>-s..-p..-m..,
#      data/ likewise); with any of these set the tag and run dir name them, as LOSS does.
#      PATHS_ONLY=1 prints "tag model data run" for these settings and exits.
#      Switches for a dry run without a GPU (tests/test_trained_target_smoke.sh):
#      BACKEND (cuda | cpu: target_generate, pipeline and dflash_eval on the CPU, the target
#      trained with --device cpu), SHAPE (0.6b | tiny: configs/tiny.json's drafter),
#      WORK (gpu: models/, data/, runs/ go under it), PY (python3: a Python with torch),
#      TRAIN_ARGS (extra train_target.py options, e.g. "--steps 3 --seq 64 --batch 4"),
#      GEN_ARGS (extra target_generate options, e.g. "--shard-samples 20"),
#      BUILD (build-cuda; build with BACKEND=cpu).
# Steps 1 and 2 are skipped when WORK already holds their outputs (a second call on a warm
# machine goes straight to the pipeline).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
BACKEND=${BACKEND:-cuda} SHAPE=${SHAPE:-0.6b} WORK=${WORK:-gpu} PY=${PY:-python3}
case "$BACKEND" in
  cuda) BUILD=${BUILD:-build-cuda} dev=cuda ;;
  cpu) BUILD=${BUILD:-build} dev=cpu ;;
  *) echo "trained_target: BACKEND=$BACKEND: expected cuda or cpu"; exit 2 ;;
esac
case "$SHAPE" in
  0.6b) name=qwen3-0.6b-bytes base=configs/qwen3-0.6b-bytes.json ;;
  tiny) name=tiny-bytes base=configs/tiny.json ;;
  *) echo "trained_target: SHAPE=$SHAPE: expected 0.6b or tiny"; exit 2 ;;
esac
TB=${TB:-150} NTRAIN=${NTRAIN:-5000} RESP_LEN=${RESP_LEN:-224} GEN_BATCH=${GEN_BATCH:-64}
EPOCHS=${EPOCHS:-2} PROMPTS=${PROMPTS:-32} MAX_NEW=${MAX_NEW:-128} BATCH=${BATCH:-4}
BUDGET=${BUDGET:-540} VAL_EVERY=${VAL_EVERY:-250} TRAIN_ARGS=${TRAIN_ARGS:-} GEN_ARGS=${GEN_ARGS:-}
res=${RES:-bench/results/eval}
tag=trained_$SHAPE
model=$WORK/models/$name data=$WORK/data/$name run=$WORK/runs/$name
LOSS=${LOSS:-} DPACE_ALPHA=${DPACE_ALPHA:-} GAMMA=${GAMMA:-}
if [ -n "$LOSS$DPACE_ALPHA$GAMMA" ]; then
  tag=${tag}_${LOSS:-cfg}_a${DPACE_ALPHA:-cfg}_g${GAMMA:-cfg}
  run=$run-${LOSS:-cfg}-a${DPACE_ALPHA:-cfg}-g${GAMMA:-cfg}
fi
PROMPT_LENS=${PROMPT_LENS:-} SEQ=${SEQ:-} MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-} MAX_SEQ_LEN=${MAX_SEQ_LEN:-}
LAYER_TYPES=${LAYER_TYPES:-} SLIDING_WINDOW=${SLIDING_WINDOW:-}
long=$PROMPT_LENS$SEQ$MAX_PROMPT_LEN$MAX_SEQ_LEN$LAYER_TYPES$SLIDING_WINDOW # any of them set
kinds= # LAYER_TYPES as the drafter.layer_types JSON array (checked here, before any work)
if [ -n "$long" ]; then
  out=$("$PY" - "$base" "$PROMPT_LENS" "$SEQ" "$MAX_PROMPT_LEN" "$MAX_SEQ_LEN" "$LAYER_TYPES" "$SLIDING_WINDOW" <<'PY'
import json, re, sys
base, lens, seq, mpl, msl, types, window = sys.argv[1:]
def bad(msg):
    sys.exit(f"trained_target: {msg}")
for k, v in (("SEQ", seq), ("MAX_PROMPT_LEN", mpl), ("MAX_SEQ_LEN", msl), ("SLIDING_WINDOW", window)):
    if v and not re.fullmatch(r"[1-9][0-9]*", v):
        bad(f"{k}={v}: expected a whole number >= 1")
if lens and not re.fullmatch(r"[1-9][0-9]*(,[1-9][0-9]*)*", lens):
    bad(f"PROMPT_LENS={lens}: expected lengths in bytes separated by commas")
if not mpl and lens:  # the chat template adds <|bos|> <|user|> ... <|assistant|>
    mpl = str(max(1024, max(map(int, lens.split(","))) + 3))
n = json.load(open(base))["drafter"]["num_layers"]
F, S = "full_attention", "sliding_attention"
kinds, short = "", ""
if types:
    if types in ("full", "sliding"):
        k = [F if types == "full" else S] * n
    elif types == "sliding-but-last":
        if n < 2:
            bad(f"LAYER_TYPES=sliding-but-last: the drafter of {base} has {n} layer: no layer would slide "
                "(LAYER_TYPES=sliding, or a config with more layers)")
        k = [S] * (n - 1) + [F]
    else:
        name = {"full": F, "sliding": S, F: F, S: S}
        k = [name.get(x) for x in types.split(",")]
        if None in k or len(k) != n:
            bad(f"LAYER_TYPES={types}: expected full, sliding, sliding-but-last or a comma list of "
                f"{n} full / sliding (the drafter of {base} has {n} layers)")
    kinds, short = json.dumps(k), types if "," not in types else "".join(x[0] for x in k)
if window and S not in (k if types else []):
    bad(f"SLIDING_WINDOW={window} without a sliding layer (LAYER_TYPES={types or 'unset'})")
if types and S in k and not window:
    bad(f"LAYER_TYPES={types} has sliding layers: SLIDING_WINDOW (tokens) is needed")
# the target and its answers (t), the drafter's run (d): name parts of what is set
t = [p for p in ((seq and f"s{seq}"), (lens and "p" + lens.replace(",", "-")), (sys.argv[4] and f"m{mpl}")) if p]
d = [p for p in ((msl and f"len{msl}"), (short and f"lt-{short}"), (window and f"w{window}")) if p]
print(mpl or "-", "-".join(t) or "-", "-".join(d) or "-", kinds.replace(" ", "") or "-")
PY
  ) || exit 2
  read -r MAX_PROMPT_LEN tpart dpart kinds <<<"$out"
  [ "$MAX_PROMPT_LEN" = - ] && MAX_PROMPT_LEN=
  [ "$kinds" = - ] && kinds=
  if [ "$tpart" != - ]; then
    model=$model-$tpart data=$data-$tpart run=$run-$tpart tag=${tag}_$tpart
  fi
  if [ "$dpart" != - ]; then
    run=$run-$dpart tag=${tag}_$dpart
  fi
fi
if [ "${PATHS_ONLY:-0}" = 1 ]; then
  echo "$tag $model $data $run"
  exit 0
fi
bins="orchestrator target_worker postproc_worker drafter_worker dflash_eval target_generate"
[ "$BACKEND" = cuda ] && bins="$bins cuda_helper"
# need_bins: the programs must exist from phase 2 on. Checked there, not here, so a build may
# still be running while the target trains (phase 1 needs only Python); WAIT_BUILD (seconds,
# default 0) waits that long for them first. A trained target stays in WORK for the next call.
need_bins() {
  local b w=${WAIT_BUILD:-0}
  for b in $bins; do
    while [ ! -x "$BUILD/bin/$b" ] && [ "$w" -gt 0 ]; do sleep 2; w=$((w - 2)); done
    [ -x "$BUILD/bin/$b" ] || {
      echo "trained_target: missing $BUILD/bin/$b: build first (make CUDA=1, or make for BACKEND=cpu)"
      exit 2
    }
  done
}
[ -n "${WAIT_BUILD:-}" ] || need_bins # without WAIT_BUILD: at once, before any work
# the knobs' options for train_target.py (long), target_generate and dflash_eval (plen)
long_args=() plen=()
[ -z "$PROMPT_LENS" ] || long_args+=(--prompt-lens "$PROMPT_LENS")
if [ -n "$SEQ" ]; then # 32 Ki bytes a step; at 0.6b in passes of 8 Ki bytes (the largest divisor of the batch)
  tb=$((32768 / SEQ)) mb=$((8192 / SEQ))
  [ "$tb" -ge 1 ] || tb=1
  [ "$mb" -ge 1 ] || mb=1
  while [ $((tb % mb)) -ne 0 ]; do mb=$((mb - 1)); done
  long_args+=(--seq "$SEQ" --batch "$tb")
  [ "$SHAPE" != 0.6b ] || long_args+=(--micro-batch "$mb") # tiny: one pass a step, as without SEQ
fi
[ -z "$MAX_PROMPT_LEN" ] || plen=(--max-prompt-len "$MAX_PROMPT_LEN")
mkdir -p "$res" "$model" "$data" "$(dirname "$run")"

left() { echo $((BUDGET - ($(date +%s) - t0))); }
stamp() { echo "== [$(($(date +%s) - t0))s, $(left)s left] $*"; }
# cap MAX RESERVE: a phase's timeout in seconds: MAX, or what is left of BUDGET after RESERVE
# seconds kept for the later phases, whichever is smaller; fails when under 10 s are left.
cap() {
  local c=$(($(left) - $2))
  [ "$c" -gt "$1" ] && c=$1
  if [ "$c" -lt 10 ]; then
    echo "trained_target: out of BUDGET ($(left)s left, $2s kept for later phases)" >&2
    return 1
  fi
  echo "$c"
}
# phase_failed RC WHAT LOG: a phase's failure, with a timeout said as such
phase_failed() {
  if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
    echo "trained_target: $2 ran out of its time (BUDGET $BUDGET s); tail of $3:"
  else
    echo "trained_target: $2 failed (exit $1); tail of $3:"
  fi
  tail -30 "$3"
  exit 1
}

# 1. train the target; write the prompts (reserve: answers, pipeline and evaluations)
if [ ! -f "$model/model.safetensors" ] || [ ! -f "$data/prompts-heldout.jsonl" ]; then
  t=$(cap $((TB + 180)) 240)
  stamp "train: scripts/train_target.py --shape $SHAPE --device $dev, ${TB}s; $NTRAIN + 64 prompts"
  # shellcheck disable=SC2086 # TRAIN_ARGS is a list of options
  timeout --kill-after=10 "$t" "$PY" scripts/train_target.py --shape "$SHAPE" --device "$dev" \
    --time-budget "$TB" --with-tests --n-train "$NTRAIN" --n-heldout 64 --prompts-only \
    --out "$model" --data "$data" ${long_args[@]+"${long_args[@]}"} $TRAIN_ARGS 2>&1 | tee "$res/${tag}_target.log" ||
    phase_failed $? "train_target.py" "$res/${tag}_target.log" # pipefail: timeout's status, or python's
  rm -f "$data"/train-*.dfs # answers of an earlier target are not this one's
else
  stamp "train: reusing $model and its prompts in $data"
fi

# 2. the target answers the training prompts: the drafter's training shards
need_bins
if ! ls "$data"/train-*.dfs >/dev/null 2>&1; then
  t=$(cap 300 150)
  stamp "answer: $BUILD/bin/target_generate --backend $BACKEND --batch $GEN_BATCH --greedy --max-new $RESP_LEN"
  # shellcheck disable=SC2086 # GEN_ARGS is a list of options
  timeout --kill-after=10 "$t" "$BUILD/bin/target_generate" --backend "$BACKEND" --batch "$GEN_BATCH" --greedy \
    --max-new "$RESP_LEN" --target "$model" --prompts "$data/prompts-train.jsonl" --out "$data/train.tmp" \
    ${plen[@]+"${plen[@]}"} $GEN_ARGS >"$res/${tag}_generate.log" 2>&1 || {
    rc=$?
    rm -f "$data"/train.tmp-*.dfs
    phase_failed $rc "target_generate" "$res/${tag}_generate.log"
  }
  # renamed only once complete, so a call cut off here answers again next time
  for f in "$data"/train.tmp-*.dfs; do mv "$f" "$data/train-${f##*/train.tmp-}"; done
  mv "$data/train.tmp.json" "$data/train.json"
  tail -1 "$res/${tag}_generate.log"
  cp "$data/train.json" "$res/${tag}_generate.json"
  # PyTorch's loop never chose a special token; target_generate's greedy argmax may (an eos
  # ends the response): count them, the target never saw one in training
  "$PY" - "$data" <<'PY'
import glob, struct, sys
n = eos = other = 0
for p in sorted(glob.glob(f"{sys.argv[1]}/train-[0-9][0-9][0-9].dfs")):
    b = open(p, "rb").read()
    ns, nt = struct.unpack_from("<QQ", b, 16)
    off = struct.unpack_from(f"<{ns + 1}Q", b, 64)
    tp = 64 + 8 * (ns + 1)
    tok = struct.unpack_from(f"<{nt}I", b, tp)
    mask = b[tp + (4 * nt + 7) // 8 * 8:]
    for i in range(ns):
        r = [t for t, m in zip(tok[off[i]:off[i + 1]], mask[off[i]:off[i + 1]]) if m]
        n += 1
        eos += bool(r) and r[-1] == 257
        other += any(t >= 256 for t in r[:-1]) or (bool(r) and r[-1] >= 256 and r[-1] != 257)
print(f"answers in {sys.argv[1]}/train-NNN.dfs: {n} responses, {eos} ended on <|eos|>, {other} hold another special token")
PY
else
  stamp "answer: reusing $(find "$data" -maxdepth 1 -name 'train-*.dfs' | wc -l) shard(s) $data/train-NNN.dfs"
fi

# 2b. the held-out prompts answered the same way: the validator's held-out set
if [ "$VAL_EVERY" -gt 0 ] && ! ls "$data"/heldout-*.dfs >/dev/null 2>&1; then
  t=$(cap 120 150)
  stamp "held-out answers: $BUILD/bin/target_generate on $data/prompts-heldout.jsonl (the validator's set)"
  # shellcheck disable=SC2086 # GEN_ARGS is a list of options
  timeout --kill-after=10 "$t" "$BUILD/bin/target_generate" --backend "$BACKEND" --batch "$GEN_BATCH" --greedy \
    --max-new "$RESP_LEN" --target "$model" --prompts "$data/prompts-heldout.jsonl" --out "$data/heldout.tmp" \
    ${plen[@]+"${plen[@]}"} $GEN_ARGS >"$res/${tag}_generate_heldout.log" 2>&1 || {
    rc=$?
    rm -f "$data"/heldout.tmp-*.dfs
    phase_failed $rc "target_generate (held-out)" "$res/${tag}_generate_heldout.log"
  }
  for f in "$data"/heldout.tmp-*.dfs; do mv "$f" "$data/heldout-${f##*/heldout.tmp-}"; done
  mv "$data/heldout.tmp.json" "$data/heldout.json"
  tail -1 "$res/${tag}_generate_heldout.log"
fi

# 3. the pipeline: a config for this run's paths, backend and epochs
cfg=$WORK/$name.json
[ -n "$LOSS$DPACE_ALPHA$GAMMA$long" ] && cfg=$WORK/$tag.json # each variant its own config
"$PY" - "$base" "$cfg" "$BACKEND" "$EPOCHS" "$model" "$run" "$data" "$LOSS" "$DPACE_ALPHA" "$GAMMA" "$VAL_EVERY" \
  "$MAX_SEQ_LEN" "$kinds" "$SLIDING_WINDOW" <<'PY'
import glob, json, sys
base, out, backend, epochs, model, run, data, loss, alpha, gamma, val_every, max_seq_len, kinds, window = sys.argv[1:]
c = json.load(open(base))
if max_seq_len:  # whole long samples: the token budget holds at least one, the ring slots a batch of it
    n = int(max_seq_len)
    budget = c["data"].get("token_budget", 2048)
    c["data"]["max_seq_len"] = n
    if budget < n:
        c["data"]["token_budget"] = n
        for r in c["rings"]:
            r["slot_bytes"] = -(-r.get("slot_bytes", 4194304) * n // budget)
if kinds:
    c["drafter"]["layer_types"] = json.loads(kinds)
    if "sliding_attention" not in c["drafter"]["layer_types"]:
        c["drafter"]["sliding_window"] = None  # the base's window would be unused: the topology refuses it
if window:
    c["drafter"]["sliding_window"] = int(window)
if loss:
    c["drafter"]["loss"] = loss
if alpha:
    c["drafter"]["dpace_alpha"] = float(alpha)
if gamma:
    c["drafter"]["gamma"] = float(gamma)
c["run_dir"], c["target"]["model_dir"], c["backend"] = run, model, backend
c["drafter"]["epochs"] = int(epochs)
c["data"]["shards"] = sorted(glob.glob(f"{data}/train-[0-9][0-9][0-9].dfs"))
c.pop("validation", None)
c["workers"] = [w for w in c["workers"] if w["role"] != "validator"]
gpu = 0 if backend == "cuda" else -1
for x in c["rings"] + c["workers"]:
    if "gpu" in x:
        x["gpu"] = gpu
if int(val_every) > 0:  # the validator scores a checkpoint every VAL_EVERY steps, on the GPU with cuda
    c["drafter"]["checkpoint_every"] = int(val_every)
    c["validation"] = {"shards": sorted(glob.glob(f"{data}/heldout-[0-9][0-9][0-9].dfs")), "max_samples": 64,
                       "every_steps": int(val_every)}
    c["workers"].append({"name": "validator", "role": "validator", "gpu": gpu} if gpu >= 0
                        else {"name": "validator", "role": "validator"})
json.dump(c, open(out, "w"), indent=1)
PY
nev=2
[ "$BATCH" -gt 1 ] && nev=3
t=$(cap 330 $((nev * 30)))
stamp "pipeline: $BUILD/bin/orchestrator $cfg ($base, backend $BACKEND, epochs $EPOCHS)"
rm -rf "$run"
timeout --kill-after=10 "$t" "$BUILD/bin/orchestrator" "$cfg" >"$res/${tag}_train.log" 2>&1 || {
  rc=$?
  tail -20 "$run"/logs/drafter0.log 2>/dev/null || true
  phase_failed $rc "the pipeline" "$res/${tag}_train.log"
}
cp "$run/train_summary.json" "$res/${tag}_summary.json"
cp "$run/ledger_audit.json" "$res/${tag}_audit.json"
"$PY" - "$run" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/train_summary.json"))
a = json.load(open(f"{sys.argv[1]}/ledger_audit.json"))
print(f"drafter: {s['steps']} steps in {s['seconds']:.0f}s, loss {s['loss_start']:.3f} -> {s['loss_end']:.3f}, "
      f"expected tau {s['expected_tau']:.2f}, exactly once {a.get('exactly_once')}")
print("  per-position accuracy (training mask, last steps): " + " ".join(f"{x:.2f}" for x in s["acc"]))
PY
if [ "$VAL_EVERY" -gt 0 ]; then
  cp "$run/metrics/validator.jsonl" "$res/${tag}_validator.jsonl"
  "$PY" - "$run" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(f"{run}/train_summary.json"))
v = [json.loads(l) for l in open(f"{run}/metrics/validator.jsonl")]
print(f"validator: {len(v)} checkpoints scored on {v[0]['samples'] if v else 0} held-out samples")
print(f"  {'step':>6} {'val_loss':>9} {'exp tau':>8} {'acc1':>6} {'acc8':>6} {'eval s':>7}")
for x in v:
    a = x["val_acc"]
    print(f"  {x['step']:6d} {x['val_loss']:9.4f} {x['val_exp_tau']:8.3f} {a[0]:6.3f} {a[min(7, len(a) - 1)]:6.3f} {x['eval_s']:7.2f}")
busy = sum(x["eval_s"] for x in v)
print(f"  validator busy {busy:.1f} s in a {s['seconds']:.0f} s run ({100 * busy / max(s['seconds'], 1e-9):.1f}%; it shares the drafter's GPU)")
PY
fi

# 4. held-out tau: trained, trained with BATCH prompts together, untrained
seed=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['seed'])" "$cfg")
ev() { # ev LABEL RESERVE EXTRA...: one dflash_eval over the held-out prompts
  local label=$1 reserve=$2 t
  shift 2
  t=$(cap 200 "$reserve")
  stamp "eval: dflash_eval --backend $BACKEND: $label"
  timeout --kill-after=10 "$t" "$BUILD/bin/dflash_eval" --backend "$BACKEND" --target "$model" \
    --drafter "$run/drafter" --prompts "$data/prompts-heldout.jsonl" --max-prompts "$PROMPTS" \
    --max-new "$MAX_NEW" --eos -1 --quiet --label "$name, $label" --json "$res/${tag}_eval_$label.json" \
    ${plen[@]+"${plen[@]}"} "$@" \
    >"$res/${tag}_eval_$label.log" 2>&1 || phase_failed $? "dflash_eval ($label)" "$res/${tag}_eval_$label.log"
  cat "$res/${tag}_eval_$label.log"
}
ev trained $(((nev - 1) * 30))
[ "$BATCH" -gt 1 ] && ev "trained_batch$BATCH" 30 --batch "$BATCH"
ev untrained 0 --random-drafter "$seed"
stamp "done; JSON and logs in $res/${tag}_*"
