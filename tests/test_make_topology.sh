#!/usr/bin/env bash
# test_make_topology: scripts/make_topology.py, the topology writer for a real checkpoint.
#   1. --help; bad input exits 2 naming the file / field (no config.json, an unknown family,
#      Qwen3 code with a foreign vocabulary, Llama without --mask-token-id, unreadable and
#      malformed shards, an empty GPU list, --gpus with the cpu backend);
#   2. model dirs made here with only the config.json of the Qwen3-1.7B and Qwen3-8B shapes
#      (no weights) and a Llama-3-8B one: capture layers, mask token id, gamma and both slot
#      sizes against values computed here independently; GPU placement for 1, 2, 4, 8 GPUs and
#      a GPU list; the orchestrator accepts each generated file (it gets past the topology
#      checks, up to the GPU arena this CPU build cannot make);
#   3. the walkthrough's CPU commands for the embedded tiny model, end to end
#      (docs/walkthrough.md): prepare_data, make_topology, orchestrator (dfctl status while it
#      runs), the ledger audit, metrics, plot_run.py, dflash_tool export, dflash_eval; the
#      tp slot size matches what target_worker itself computes for the same shapes.
#   4. every shipped config in configs/ says what it is (description).
#   5. a mixture-of-experts target (the Qwen3-30B-A3B config): capture layers for 48 layers,
#      total vs active parameters, a memory estimate that counts every expert (computed here
#      independently), a GPU over --gpu-mem-gib refused, a shared-expert config refused.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
MT="python3 scripts/make_topology.py"
for b in target_worker postproc_worker drafter_worker dflash_tool dflash_eval; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

# expect_bad NEEDLE CMD...: exit 2 and stderr contains NEEDLE
expect_bad() {
  local needle=$1; shift
  "$@" >"$T/bad.out" 2>"$T/bad.err"; local rc=$?
  [ $rc = 2 ] || { cat "$T/bad.err"; fail "expected exit 2, got $rc: $*"; }
  grep -qF -- "$needle" "$T/bad.err" || { cat "$T/bad.err"; fail "stderr lacks \"$needle\": $*"; }
  [ ! -s "$T/bad.out" ] || fail "wrote a topology to stdout on bad input: $*"
}

# --- 1. help and bad input ------------------------------------------------------------------------
$MT --help >"$T/help" || fail "--help exited $?"
grep -q -- "--target DIR" "$T/help" && grep -q "capture layers" "$T/help" || fail "--help text"

mkdir -p "$T/empty" "$T/mistral" "$T/qwen-foreign" "$T/llama8b" "$T/q17" "$T/q8"
python3 - "$T" <<'PY' || fail "writing the model dirs"
import json, random, sys
sys.path.insert(0, "scripts")
from prepare_data import write_shard
T = sys.argv[1]
qwen = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu", attention_bias=False,
            max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000, torch_dtype="bfloat16",
            vocab_size=151936, head_dim=128, num_key_value_heads=8)
cfgs = {
    "q17": dict(qwen, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                tie_word_embeddings=True),
    "q8": dict(qwen, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               tie_word_embeddings=False),
    "qwen-foreign": dict(qwen, hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=4,
                         vocab_size=32000),
    "mistral": dict(qwen, architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=4096,
                    intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "llama8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", hidden_size=4096,
                    intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                    torch_dtype="bfloat16"),
}
for d, c in cfgs.items():
    json.dump(c, open(f"{T}/{d}/config.json", "w"), indent=1)
r = random.Random(7)
samples = []
for i in range(600):
    n = r.randint(100, 2500)
    samples.append(([r.randrange(151000) for _ in range(n)], [0] * (n // 3) + [1] * (n - n // 3)))
write_shard(f"{T}/big-000.dfs", 151936, samples)
write_shard(f"{T}/llama-000.dfs", 128256, [([x % 128000 for x in t], m) for t, m in samples[:200]])
PY
printf 'not a shard, just text padding it past sixty-four bytes...........................\n' >"$T/junk.dfs"

expect_bad "$T/empty/config.json: no config.json" $MT --target "$T/empty" --data "$T/big-000.dfs" --gpus 1
expect_bad "$T/mistral/config.json: architectures: unknown family MistralForCausalLM" \
  $MT --target "$T/mistral" --data "$T/big-000.dfs" --gpus 1
expect_bad "$T/qwen-foreign/config.json: vocab_size: 32000 is not the Qwen3 tokenizer's" \
  $MT --target "$T/qwen-foreign" --data "$T/big-000.dfs" --gpus 1
expect_bad "pass --mask-token-id" $MT --target "$T/llama8b" --data "$T/big-000.dfs" --gpus 1
expect_bad "$T/llama8b/config.json: architectures: Llama family" $MT --target "$T/llama8b" --data "$T/big-000.dfs" --gpus 1
expect_bad "$T/nope-000.dfs: cannot read the shard" $MT --target "$T/q8" --data "$T/nope-000.dfs" --gpus 1
expect_bad "$T/junk.dfs: offset 0: bad magic" $MT --target "$T/q8" --data "$T/junk.dfs" --gpus 1
expect_bad "--data: $T/none-*.dfs: no shard matches" $MT --target "$T/q8" --data "$T/none-*.dfs" --gpus 1
expect_bad "$T/big-000.dfs: offset 12: vocab_size 151936 is larger than the target's 264" \
  $MT --target models/tiny-target --data "$T/big-000.dfs" --backend cpu --drafter-layers 1
expect_bad "--gpus: empty GPU list" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus ""
expect_bad "--gpus: empty GPU list" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 0
expect_bad "--gpus: empty GPU list" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus ","
expect_bad "--gpus: required with --backend cuda" $MT --target "$T/q8" --data "$T/big-000.dfs"
expect_bad "--gpus: the cpu backend" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 1 --backend cpu
expect_bad "--mask-token-id: 128256 is outside the vocabulary" \
  $MT --target "$T/llama8b" --data "$T/big-000.dfs" --gpus 1 --mask-token-id 128256
expect_bad "capture layers [1, 1]" $MT --target models/tiny-target --data data/tiny/train-000.dfs --backend cpu \
  --drafter-layers 2
expect_bad "--layer-types needs --sliding-window" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 1 \
  --layer-types SSSSF
expect_bad "--sliding-window 0: expected a width >= 1" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 1 \
  --sliding-window 0
expect_bad "--layer-types 'SSF': expected 5 letters" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 1 \
  --sliding-window 2048 --layer-types SSF
expect_bad "--layer-types 'FFFFF': no sliding layer" $MT --target "$T/q8" --data "$T/big-000.dfs" --gpus 1 \
  --sliding-window 2048 --layer-types FFFFF
ok "--help; 21 bad inputs exit 2 naming the file and field"

# --- 2. real shapes, config.json only --------------------------------------------------------------
gen() { # gen NAME MODEL GPUS [ARGS...]: $T/NAME.json and $T/NAME.err
  local name=$1 model=$2 gpus=$3; shift 3
  local data=$T/big-000.dfs; [ "$model" = llama8b ] && data=$T/llama-000.dfs
  $MT --target "$T/$model" --data "$data" --gpus "$gpus" --run-dir "$T/run-$name" --out "$T/$name.json" \
    "$@" 2>"$T/$name.err" || { cat "$T/$name.err"; fail "make_topology $name exited $?"; }
}
for g in 1 2 4 8; do gen "q8-$g" q8 "$g"; gen "q17-$g" q17 "$g"; done
gen q8-list q8 "2,5"
gen q8-one q8 "3,"
gen llama llama8b 4 --mask-token-id 128002 --drafter-layers 3 --block-size 8 --anchors 256
gen q8-swa q8 1 --sliding-window 2048
gen q8-swa2 q8 1 --sliding-window 512 --layer-types SFSFS
python3 - "$T" <<'PY' || fail "sliding-window drafter fields"
import json, sys
T = sys.argv[1]
d = json.load(open(f"{T}/q8-swa.json"))["drafter"]
assert d["sliding_window"] == 2048 and d["layer_types"] == ["sliding_attention"] * 4 + ["full_attention"], d
d = json.load(open(f"{T}/q8-swa2.json"))["drafter"]
s, f = "sliding_attention", "full_attention"
assert d["sliding_window"] == 512 and d["layer_types"] == [s, f, s, f, s], d
assert "sliding_window" not in json.load(open(f"{T}/q8-1.json"))["drafter"]
PY
find "$T/q8" "$T/q17" -type f ! -name config.json | grep -q . && fail "a model dir holds more than config.json"
python3 - "$T" <<'PY' || fail "shape checks"
import json, sys
T = sys.argv[1]

def spread(n, L):  # DFlash's default, written out here (lround: halves away from zero)
    return [L // 2] if n == 1 else [int(1 + i * (L - 4) / (n - 1) + 0.5) for i in range(n)]

def need(T_, ncap, d, esz, docs=0, anchors=0):  # common/io/batch.c batch_layout, by hand
    up = lambda x, a: -(-x // a) * a
    hdr = 4 * 4 + 8 + 8 + 8 + 8 + 5 * 8 + 8 + 256 * 8 + 257 * 4 + 4 + 8  # sizeof(batch_header) = 3184
    assert hdr == 3184, hdr
    o = up(up(hdr, 64) + 4 * T_ + T_, 64)
    o = up(o + 5 * docs * anchors, 256)
    return o + T_ * ncap * d * esz

assert spread(5, 36) == [1, 9, 17, 25, 33] and spread(5, 28) == [1, 7, 13, 19, 25]
cases = {"q8": (36, 4096, [1, 9, 17, 25, 33], 151669, 512, 16, 7.0),
         "q17": (28, 2048, [1, 7, 13, 19, 25], 151669, 512, 16, 7.0)}
for name, (L, d, cap, mask, anchors, B, gamma) in cases.items():
    for g in (1, 2, 4, 8):
        t = json.load(open(f"{T}/{name}-{g}.json"))
        assert t["target"]["capture_layers"] == cap == spread(5, L), (name, t["target"])
        dr = t["drafter"]
        assert dr["mask_token_id"] == mask and dr["num_anchors"] == anchors and dr["block_size"] == B, dr
        assert dr["gamma"] == gamma and dr["num_layers"] == 5, dr
        tb = t["data"]["token_budget"]
        assert t["data"]["max_seq_len"] == 2500 and tb == 8192, t["data"]  # longest sample 2500 < 3072
        for r in t["rings"]:
            want = need(tb, 5, d, 2) if r["name"].startswith("tp") else need(tb, 5, d, 2, 256, anchors)
            assert want <= r["slot_bytes"] < want + (1 << 20) and r["slot_bytes"] % (1 << 20) == 0, (r, want)
        # placement: as tests/test_configs.c demands of the shipped files
        rings = {r["name"]: r for r in t["rings"]}
        ranks, dgpus, used = [], [], set()
        for w in t["workers"]:
            used.add(w["gpu"])
            if "out" in w:
                assert rings[w["out"]]["gpu"] == w["gpu"], w
            if w["role"] == "drafter":
                assert rings[w["in"]]["gpu"] == w["gpu"], w
                ranks.append(w["rank"]); dgpus.append(w["gpu"])
        assert sorted(ranks) == list(range(len(ranks))) and len(set(dgpus)) == len(dgpus), t["workers"]
        assert used == set(range(g)), (name, g, used)
        err = open(f"{T}/{name}-{g}.err").read()
        for s in ("capture layers", "mask token id 151669", "rates per GPU", "expected bottleneck", "checkpoint_every"):
            assert s in err, (name, g, s)
        assert "<- chosen" in err and t["drafter"]["checkpoint_every"] >= 1
    # the shipped 8-GPU benchmark configs split 2 targets : 6 drafters; the same rates give the same here
t = json.load(open(f"{T}/q8-8.json"))
assert sum(w["role"] == "target" for w in t["workers"]) == 2 and sum(w["role"] == "drafter" for w in t["workers"]) == 6
t = json.load(open(f"{T}/q8-list.json"))
assert sorted({w["gpu"] for w in t["workers"]}) == [2, 5], t["workers"]
t = json.load(open(f"{T}/q8-one.json"))
assert {w["gpu"] for w in t["workers"]} == {3} and [r["name"] for r in t["rings"]] == ["tp", "pd"]
t = json.load(open(f"{T}/llama.json"))
assert t["target"]["capture_layers"] == spread(3, 32) == [1, 15, 29], t["target"]
assert t["drafter"]["mask_token_id"] == 128002 and t["drafter"]["gamma"] == 4.0, t["drafter"]
for r in t["rings"]:
    want = need(8192, 3, 4096, 2) if r["name"].startswith("tp") else need(8192, 3, 4096, 2, 256, 256)
    assert want <= r["slot_bytes"] < want + (1 << 20), (r, want)
print("shape checks passed")
PY
# the orchestrator's own validation: the whole topology check passes (fields, ring graph,
# placement, ranks); this CPU build then stops at the first GPU arena
for f in q8-1 q8-2 q8-8 q17-4 q8-list llama q8-swa q8-swa2; do
  "$ORCH" "$T/$f.json" >"$T/orch-$f.out" 2>&1; rc=$?
  if grep -q "this build has no CUDA" "$T/orch-$f.out"; then
    grep -q "^$T/$f.json: " "$T/orch-$f.out" && fail "$f: topology error: $(cat "$T/orch-$f.out")"
  else
    echo "--- $f"; cat "$T/orch-$f.out"; fail "$f: orchestrator exit $rc, not the expected stop at the GPU arena"
  fi
done
ok "Qwen3-1.7B / 8B / Llama shapes from config.json only: capture layers, mask id, gamma, slot bytes, placement; the orchestrator accepts them"

# --- 3. the walkthrough on the embedded tiny model (CPU) -------------------------------------------
python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data/train" data/tiny/chat-train.jsonl \
  --max-samples 60 --max-len 400 >/dev/null || fail "prepare_data"
$MT --target models/tiny-target --data "$T/data/train-*.dfs" --backend cpu --drafter-layers 1 \
  --run-dir "$T/run-tiny" --out "$T/tiny.json" 2>"$T/tiny.err" || { cat "$T/tiny.err"; fail "make_topology tiny"; }
cat "$T/tiny.err"
python3 - "$T/tiny.json" <<'PY' || fail "tiny topology"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["target"]["capture_layers"] == [2] and t["drafter"]["mask_token_id"] == 261, t  # 4 layers: L/2
assert t["backend"] == "cpu" and all(w["gpu"] == -1 for w in t["workers"]) and len(t["workers"]) == 3
assert t["description"].startswith("training run for models/tiny-target")
PY
RUN=$T/run-tiny; TOPO=$T/tiny.json
start_orch
wait_for 120 test -S "$RUN/ctl.sock" || fail "no control socket"
"$DFCTL" --run-dir "$RUN" pause >/dev/null || fail "dfctl pause"
"$DFCTL" --run-dir "$RUN" status >"$T/status.txt" || fail "dfctl status"
grep -q "drafter0" "$T/status.txt" && grep -q "^ledger:" "$T/status.txt" || { cat "$T/status.txt"; fail "dfctl status output"; }
"$DFCTL" --run-dir "$RUN" resume >/dev/null || fail "dfctl resume"
wait_orch 500
[ "$ORCH_RC" = 0 ] || fail "tiny run exited $ORCH_RC"
audit_exactly_once
grep -q '"ev":"step"' "$RUN/metrics/drafter0.jsonl" || fail "no step metrics"
grep -q '"description": "training run for models/tiny-target' "$RUN/topology.json" || fail "normalised topology lost the description"
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' >/dev/null 2>&1; then
    "$py" scripts/plot_run.py "$RUN" --out "$T/curves" >/dev/null || fail "plot_run.py"
    [ -s "$T/curves/training.png" ] || fail "no training.png"
    break
  fi
done
"$BIN/dflash_tool" export "$RUN/checkpoints" "$T/release" >/dev/null || fail "dflash_tool export"
grep -q '"mask_token_id": 261' "$T/release/config.json" || fail "release config lacks the mask token"
"$BIN/dflash_eval" --target models/tiny-target --drafter "$T/release" --prompts data/tiny/chat-heldout.jsonl \
  --max-prompts 4 --max-new 48 --quiet --json "$T/eval.json" >"$T/eval.txt" || fail "dflash_eval"
python3 - "$T/eval.json" <<'PY' || fail "eval result"
import json, sys
o = json.load(open(sys.argv[1]))["overall"]
assert o["n_prompts"] == 4 and o["mismatches"] == 0 and o["tau"] >= 1.0, o
print(f"ok: dflash_eval on the exported drafter: tau {o['tau']:.2f}, lossless on {o['n_prompts']} prompts")
PY
ok "walkthrough on the tiny model: prepare_data -> make_topology -> orchestrator (dfctl status) -> export -> eval"

# the tp slot size: what target_worker computes for these shapes (its own batch_layout), read
# from its refusal when the slot is made too small
tp_need=$(sed -n 's/.*slots: tp \([0-9]*\) bytes needed.*/\1/p' "$T/tiny.err")
[ -n "$tp_need" ] || fail "no tp size on stderr"
python3 - "$T/tiny.json" "$T/small.json" "$T/run-small" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); t["run_dir"] = sys.argv[3]
t["rings"][0]["slot_bytes"] = 4096
json.dump(t, open(sys.argv[2], "w"))
PY
RUN=$T/run-small; TOPO=$T/small.json
start_orch; wait_orch 200
[ "$ORCH_RC" != 0 ] || fail "a 4096-byte tp slot was accepted"
grep -q "rings\[0\].slot_bytes 4096 is too small for a batch of [0-9]* tokens ($tp_need bytes needed)" "$RUN/logs/target0.log" ||
  { tail -5 "$RUN/logs/target0.log"; fail "target_worker's own size differs from make_topology's $tp_need"; }
ok "tp slot: make_topology's $tp_need bytes = target_worker's batch_layout"

# --- 5. a mixture-of-experts target, config.json only ----------------------------------------------
mkdir -p "$T/a3b" "$T/q2moe"
python3 - "$T" <<'PY' || fail "writing the MoE config dirs"
import json, sys
T = sys.argv[1]
a3b = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_act="silu", attention_bias=False,
           decoder_sparse_step=1, head_dim=128, hidden_size=2048, intermediate_size=6144,
           max_position_embeddings=40960, mlp_only_layers=[], moe_intermediate_size=768, norm_topk_prob=True,
           num_attention_heads=32, num_experts=128, num_experts_per_tok=8, num_hidden_layers=48,
           num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1000000.0, router_aux_loss_coef=0.001,
           tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=151936)
json.dump(a3b, open(f"{T}/a3b/config.json", "w"))
json.dump(dict(a3b, shared_expert_intermediate_size=5632), open(f"{T}/q2moe/config.json", "w"))
PY
gen a3b a3b 1
python3 - "$T/a3b.json" "$T/a3b.err" <<'PY' || { cat "$T/a3b.err"; fail "MoE topology"; }
import json, re, sys
t, err = json.load(open(sys.argv[1])), open(sys.argv[2]).read()
assert t["target"]["capture_layers"] == [1, 12, 23, 34, 45] and t["drafter"]["mask_token_id"] == 151669, t
# parameters by hand: attention 2048 x (32 + 4 + 4 + 32) x 128, router 128 x 2048, experts 128 x 3 x 2048 x 768
d, V, E, k, F = 2048, 151936, 128, 8, 768
attn = d * (32 + 4 + 4 + 32) * 128
total = 2 * V * d + 48 * (attn + E * d + E * 3 * d * F)
active = 2 * V * d + 48 * (attn + E * d + k * 3 * d * F)
assert f"{total / 1e9:.2f}B parameters, {active / 1e9:.2f}B active" in err, err
assert abs(total / 1e9 - 30.53) < 0.01 and abs(active / 1e9 - 3.35) < 0.01, (total, active)
run = V * d + 46 * (attn + E * d + E * 3 * d * F)  # layers 0..45 run, every expert resident, bf16
m = re.search(r"target weights \(([0-9.]+)B parameters of 46 layers, all 128 experts of 46 sparse layers\) ([0-9.]+)", err)
assert m and abs(float(m.group(2)) - 2 * run / 2**30) < 0.01, (m and m.groups(), 2 * run / 2**30)
print(f"ok: 30B-A3B: {total / 1e9:.2f}B parameters, {active / 1e9:.2f}B active, {2 * run / 2**30:.2f} GiB of target weights")
PY
expect_bad "the estimate passes --gpu-mem-gib 40 on GPU 0" $MT --target "$T/a3b" --data "$T/big-000.dfs" --gpus 1 \
  --gpu-mem-gib 40
expect_bad "$T/q2moe/config.json: shared_expert_intermediate_size: 5632 is not supported" \
  $MT --target "$T/q2moe" --data "$T/big-000.dfs" --gpus 1
ok "MoE target: capture layers, total / active parameters, every expert in the memory estimate, refusals"

# --- 4. the shipped configs say what they are --------------------------------------------------------
python3 - <<'PY' || fail "configs/ descriptions"
import glob, json
for f in sorted(glob.glob("configs/*.json")):
    t = json.load(open(f))
    d = t.get("description")
    assert isinstance(d, str) and d, f"{f}: no description"
    if "random" in d or f.split("/")[-1].startswith(("qwen3-1.7b", "qwen3-8b")):
        assert d.startswith("benchmark:"), f"{f}: a random-weight config must say it is a benchmark: {d}"
print("ok: every config in configs/ has a description; the random-weight ones say benchmark")
PY
echo "test_make_topology: all passed"
