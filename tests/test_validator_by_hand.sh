#!/usr/bin/env bash
# test_validator_by_hand: `validator --topology T CHECKPOINT...` on the CPU (the tiny target,
# 4 held-out samples, drafters made by dflash_tool init; a few seconds):
#   1. a drafter of the topology's capture layers [1,3]: exit 0, one JSON line whose fields
#      are, in this order, the validation line's names (io/metrics_keys.h VALIDATION_KEYS:
#      val_loss, val_acc [B-1], val_exp_tau, samples, eval_s, load_s) among the by-hand ones:
#      the order the scripts and tests that read them were written against;
#   2. a drafter trained on other layers ([0,3]: the same count) or on more of them ([1,2,3]):
#      exit 100 and no line; the message names the checkpoint's trainer_state.json with
#      dflash_config.target_layer_ids and the topology with target.capture_layers (the
#      held-out features are the topology's layers: scored, the figures would mean nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for b in validator dflash_tool; do
  [ -x "$BUILD/bin/$b" ] || { echo "FAIL: $BUILD/bin/$b missing (make)"; exit 1; }
done
tmp=$(mktemp -d /tmp/df_test_validator_by_hand_XXXXXX); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
t = json.load(open("configs/tiny.json"))
assert t["target"]["capture_layers"] == [1, 3], t["target"]
t["run_dir"] = f"{tmp}/run"
t["validation"] = {"shards": ["data/tiny/heldout-000.dfs"], "max_samples": 4, "every_steps": 0}
json.dump(t, open(f"{tmp}/topo.json", "w"))
for name, ids in (("ok", [1, 3]), ("other", [0, 3]), ("more", [1, 2, 3])):
    json.dump({"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
               "num_target_layers": 4, "dflash_config": {"target_layer_ids": ids, "mask_token_id": 261},
               "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 264, "rms_norm_eps": 1e-6,
               "rope_theta": 10000.0, "tie_word_embeddings": True, "layer_types": ["full_attention"]},
              open(f"{tmp}/cfg-{name}.json", "w"))
PY
for n in ok other more; do
  "$BUILD/bin/dflash_tool" init --out "$tmp/ck-$n" --config "$tmp/cfg-$n.json" --seed 7 >/dev/null
done

# 1. the fields and their order
"$BUILD/bin/validator" --topology "$tmp/topo.json" --device cpu "$tmp/ck-ok" >"$tmp/ok.jsonl" 2>"$tmp/ok.err" ||
  { cat "$tmp/ok.err"; fail "validator on a drafter of the topology's layers"; }
python3 - "$tmp/ok.jsonl" <<'PY' || fail "the by-hand line"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
keys = [k for k, _ in json.loads(lines[0], object_pairs_hook=list)]
want = ["checkpoint", "backend", "val_loss", "val_acc", "val_exp_tau", "samples", "tokens", "features_s", "eval_s",
        "load_s", "feature_bytes", "device_bytes", "wce", "sum_w", "count", "correct"]
assert keys == want, keys
x = json.loads(lines[0])
assert len(x["val_acc"]) == 15 and x["samples"] == 4 and x["val_loss"] > 0 and x["val_exp_tau"] >= 1, x
print("fields in order:", " ".join(keys))
PY

# 2. a drafter of other capture layers
for n in other more; do
  set +e
  "$BUILD/bin/validator" --topology "$tmp/topo.json" --device cpu "$tmp/ck-$n" >"$tmp/$n.jsonl" 2>"$tmp/$n.err"
  rc=$?
  set -e
  ids=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["dflash_config"]["target_layer_ids"])))' "$tmp/cfg-$n.json")
  [ $rc = 100 ] || { cat "$tmp/$n.err"; fail "drafter of layers [$ids]: exit $rc, expected 100"; }
  [ ! -s "$tmp/$n.jsonl" ] || fail "drafter of layers [$ids]: scored anyway: $(cat "$tmp/$n.jsonl")"
  grep -qF "ck-$n/step-00000000/trainer_state.json: dflash_config.target_layer_ids is [$ids], but $tmp/topo.json: target.capture_layers is [1,3]" "$tmp/$n.err" ||
    { cat "$tmp/$n.err"; fail "drafter of layers [$ids]: the message does not name both files and fields"; }
  echo "layers [$ids]: exit 100: $(tail -1 "$tmp/$n.err" | sed 's/.*validator: //')"
done
echo "PASS: validator by hand: the validation line's fields in their order; a drafter of other capture layers exits 100 naming both files"
