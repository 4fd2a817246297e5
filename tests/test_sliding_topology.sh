#!/usr/bin/env bash
# test_sliding_topology: a topology chooses the sliding-window attention layers of the
# drafter it trains (drafter.layer_types, drafter.sliding_window; docs/topology.md), on the
# real pipeline (tiny target, CPU, deterministic order, about a second a run):
#   1. a 2-layer drafter [sliding (window 8), full] trains from scratch: the run dir's
#      topology.json, the final checkpoint's trainer_state.json and the release config.json
#      say layer_types ["sliding_attention", "full_attention"], sliding_window 8 (and
#      use_sliding_window true). The kinds reach the math: the same run with both layers
#      full ends with other weights, and "layer_types": ["full_attention", "full_attention"]
#      gives byte for byte the weights of a topology that says nothing about sliding.
#   2. that release as drafter.init_dir: a topology whose layer_types or sliding_window
#      differ from the release's is refused at start (exit 2, no run dir) naming both
#      values; one that gives the same trains; one that says nothing takes the release's
#      kinds, and keeps them when the drafter restarts from its checkpoint (--resume with
#      train_summary.json removed: the release is exported again from the checkpoint).
source "$(dirname "$0")/orch_lib.sh"
tiny_pipeline base 24 '"checkpoint_every": 4, "keep_checkpoints": 0' 2
BASE=$TOPO
S='"sliding_attention"' F='"full_attention"'

# variant NAME PYTHON: $T/NAME.json = the base topology with run_dir $T/run-NAME, deterministic,
# edited by PYTHON (d: its drafter section); sets TOPO and RUN
variant() {
  RUN=$T/run-$1; TOPO=$T/$1.json
  python3 - "$BASE" "$TOPO" "$RUN" "$2" <<'PY' || fail "variant $1"
import json, sys
t = json.load(open(sys.argv[1])); t["run_dir"] = sys.argv[3]; t["deterministic"] = True
d = t["drafter"]
exec(sys.argv[4])
json.dump(t, open(sys.argv[2], "w"), indent=1)
PY
}
# train NAME PYTHON: the variant's run, to the end (exit 0, every batch once)
train() {
  variant "$1" "$2"
  "$ORCH" "$TOPO" >"$T/orch.out" 2>&1 || fail "$1: the run exited $?"
  audit_exactly_once
}
# kinds FILE EXPR: layer_types and sliding_window of the config at EXPR (d: FILE's JSON), as JSON
kinds() { pyjson "$1" "json.dumps([$2['layer_types'], $2['sliding_window']])"; }
# refused NAME PYTHON MESSAGE: the variant is refused at start, exit 2, no run dir, MESSAGE said
refused() {
  variant "$1" "$2"
  local rc=0; "$ORCH" "$TOPO" >"$T/orch.out" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "$1: the orchestrator exited $rc, expected 2: $(tail -3 "$T/orch.out")"
  [ ! -e "$RUN" ] || fail "$1: the refused start left $RUN"
  grep -qF -- "$3" "$T/orch.out" || fail "$1: the message lacks '$3': $(tail -3 "$T/orch.out")"
}

# ---- 1. from scratch
train sl "d['layer_types'] = [$S, $F]; d['sliding_window'] = 8"
SL=$RUN; CK=$(final_ckpt "$SL")
want='[["sliding_attention", "full_attention"], 8]'
[ "$(kinds "$SL/topology.json" "d['drafter']")" = "$want" ] || fail "topology.json: $(kinds "$SL/topology.json" "d['drafter']")"
[ "$(kinds "$CK/trainer_state.json" "d['config']")" = "$want" ] || fail "$CK/trainer_state.json: $(kinds "$CK/trainer_state.json" "d['config']")"
[ "$(kinds "$SL/drafter/config.json" "d")" = "$want" ] || fail "release config.json: $(kinds "$SL/drafter/config.json" "d")"
[ "$(pyjson "$SL/drafter/config.json" "d['use_sliding_window']")" = True ] || fail "release config.json: use_sliding_window is not true"
ok "2 layers [sliding (8), full] trained from scratch ($(basename "$CK")): topology.json, trainer_state.json and the release config.json say $want"

train none ""
train full "d['layer_types'] = [$F, $F]"
for r in none full; do
  [ "$(kinds "$(final_ckpt "$T/run-$r")/trainer_state.json" "d['config']")" = '[["full_attention", "full_attention"], null]' ] \
    || fail "$r: the checkpoint's layers are not all full"
done
[ "$(kinds "$T/run-none/topology.json" "d['drafter']")" = '[null, null]' ] || fail "none: topology.json: $(kinds "$T/run-none/topology.json" "d['drafter']")"
cmp -s "$(final_ckpt "$T/run-none")/model.safetensors" "$(final_ckpt "$T/run-full")/model.safetensors" \
  || fail "an explicit all-full layer_types trained other weights than no layer_types"
cmp -s "$CK/model.safetensors" "$(final_ckpt "$T/run-full")/model.safetensors" \
  && fail "the sliding layer trained the same weights as a full one: the window did not reach the math"
ok "the kinds reach the math: [sliding, full] ends with other weights than [full, full]; explicit [full, full] = no layer_types, byte for byte"

# ---- 2. the release as drafter.init_dir
REL=$SL/drafter
refused init-full "d['init_dir'] = '$REL'; d['layer_types'] = [$F, $F]" \
  "drafter.init_dir: $REL/config.json: layer_types[0] is \"sliding_attention\", but drafter.layer_types[0] is \"full_attention\""
refused init-window "d['init_dir'] = '$REL'; d['layer_types'] = [$S, $F]; d['sliding_window'] = 16" \
  "drafter.init_dir: $REL/config.json: sliding_window is 8, but drafter.sliding_window is 16"
ok "init_dir whose kinds differ from the topology's: refused at start (exit 2, no run dir), both values named"

train init-same "d['init_dir'] = '$REL'; d['layer_types'] = [$S, $F]; d['sliding_window'] = 8"
[ "$(kinds "$RUN/drafter/config.json" "d")" = "$want" ] || fail "init-same: release config.json: $(kinds "$RUN/drafter/config.json" "d")"
train init-none "d['init_dir'] = '$REL'"
for f in "$(final_ckpt "$RUN")/trainer_state.json:d['config']" "$RUN/drafter/config.json:d"; do
  [ "$(kinds "${f%%:*}" "${f#*:}")" = "$want" ] || fail "init-none: ${f%%:*}: $(kinds "${f%%:*}" "${f#*:}")"
done
rm -rf "$RUN/train_summary.json" "$RUN/drafter"
"$ORCH" --resume "$RUN" >"$T/orch.out" 2>&1 || fail "init-none: --resume exited $?: $(tail -3 "$T/orch.out")"
grep -q "resumed from $(final_ckpt "$RUN") " "$RUN/logs/drafter0.log" || fail "init-none: the drafter did not resume from its checkpoint"
[ "$(kinds "$RUN/drafter/config.json" "d")" = "$want" ] || fail "init-none: after the restart from the checkpoint the release says $(kinds "$RUN/drafter/config.json" "d")"
ok "init_dir with the same kinds trains; with none in the topology the release's are taken, and kept by a restart from the checkpoint"
echo "PASS test_sliding_topology"
