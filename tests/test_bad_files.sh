#!/usr/bin/env bash
# test_bad_files: inputs on disk that are not what they claim, through the real binaries
# (orchestrator, target worker, dflash_eval). Each case must give its documented message and
# exit code and must not hang:
#   - ring graphs that cannot run: a cycle, stages out of order, a dangling ring, a token
#     budget too large for a batch header -> orchestrator exit 2, nothing created
#   - paths that are not regular files (a FIFO, a /dev node, a directory) as the topology
#     file, a data shard, config.json, model.safetensors and the dflash_eval prompts file ->
#     refused at once naming the path and what it is (a FIFO must not block the open)
#   - numbers whose products overflow: config.json dimensions, a safetensors shape, shard
#     counts with valid checksums -> refused naming the field (exit 2 for data and the
#     model's config.json at start, 100 from the target worker for the weights)
#   - non-zero reserved bytes in a shard header -> refused with the byte offset
# Every command runs under `timeout`: a case that blocks (as a FIFO did before) fails instead
# of hanging the suite. docs/reliability.md lists every case.
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker dflash_tool dflash_eval; do
  [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done
M=$PWD/models/tiny-target
python3 scripts/prepare_data.py --tokenizer "$M" --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 40 --max-len 300 >/dev/null || fail "prepare_data"
DATA=$T/data-000.dfs
HANG=120 # seconds: far above any case's run time, only there to turn a hang into a failure

# real3 NAME MODEL_DIR SHARD [WORKERS_JSON [RINGS_JSON [DATA_EXTRA]]]: the three real workers
# (or the given workers); writes $T/NAME.json into TOPO and sets RUN
real3() {
  RUN=$T/run-$1; TOPO=$T/$1.json
  local workers=${4:-'[ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd" } ]'}
  local rings=${5:-'[ { "name": "tp", "slots": 4, "slot_bytes": 1048576 }, { "name": "pd", "slots": 4, "slot_bytes": 1048576 } ]'}
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 5,
  "target": { "model_dir": "$2", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 8, "checkpoint_every": 2, "mask_token_id": 261 },
  "data": { "shards": ["$3"], "max_seq_len": 300, "token_budget": ${6:-400} },
  "rings": $rings, "workers": $workers,
  "supervision": { "max_restarts": 0, "backoff_initial_ms": 20, "metrics_interval_ms": 5000,
                   "shutdown_timeout_ms": 5000 } }
JSON
}
# expect RC PATTERN CMD...: run CMD (bounded by HANG), its exit code must be RC and its output match PATTERN
expect() {
  local want=$1 pat=$2; shift 2
  timeout -k 10 "$HANG" "$@" >"$T/out" 2>&1 </dev/null; local rc=$?
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "$*: still running after ${HANG}s (blocked?): $(head -c 1500 "$T/out")"
  [ "$rc" = "$want" ] || fail "$*: exit $rc, expected $want: $(head -c 1500 "$T/out")"
  grep -q -- "$pat" "$T/out" || fail "$*: output lacks '$pat': $(head -c 1500 "$T/out")"
}
no_run_dir() { [ ! -e "$RUN" ] || fail "$1: the run dir $RUN was created"; }
# a model directory: a copy of the tiny target, then $2 applied in it
model_copy() { rm -rf "$T/$1"; mkdir -p "$T/$1"; cp "$M"/* "$T/$1/"; }
# the target worker refused its model: exit 100, not restarted, orchestrator exit 1
target_refused() {
  events exit | grep '"worker": "target0"' | grep -q '"status": 100' || fail "$1: target0 did not exit 100"
  [ "$(events spawn | grep -c '"worker": "target0"')" = 1 ] || fail "$1: target0 was restarted after exit 100"
}

# ---- the ring graph: exit 2 with the JSON path, nothing created
real3 cycle "$M" "$DATA" '[ {"name":"a","role":"test","in":"tp","out":"pd"}, {"name":"b","role":"test","in":"pd","out":"tp"} ]'
expect 2 "$TOPO: rings\[0\]: ring \"tp\" is part of a cycle: tp -> workers\[0\] \"a\" -> pd -> workers\[1\] \"b\" -> tp" "$ORCH" "$TOPO"
no_run_dir "cycle"
real3 skip "$M" "$DATA" '[ {"name":"t0","role":"target","out":"tp"}, {"name":"p0","role":"postproc","in":"tp","out":"pd"},
                           {"name":"d0","role":"drafter","in":"tp"}, {"name":"d1","role":"drafter","in":"pd"} ]'
expect 2 "$TOPO: workers\[2\].in: ring \"tp\" is written by workers\[0\] \"t0\" (role target), but a drafter reads only what a postproc writes" \
  "$ORCH" "$TOPO"
no_run_dir "drafter reading the target's ring"
real3 pp "$M" "$DATA" '[ {"name":"t0","role":"target","out":"tp"}, {"name":"p0","role":"postproc","in":"tp","out":"pp"},
                         {"name":"p1","role":"postproc","in":"pp","out":"pd"}, {"name":"d0","role":"drafter","in":"pd"} ]' \
  '[ {"name":"tp"}, {"name":"pp"}, {"name":"pd"} ]'
expect 2 "$TOPO: workers\[2\].in: ring \"pp\" is written by workers\[1\] \"p0\" (role postproc), but a postproc reads only what a target writes" \
  "$ORCH" "$TOPO"
no_run_dir "postproc after postproc"
real3 dangling "$M" "$DATA" '[ {"name":"t0","role":"target","out":"tp"}, {"name":"p0","role":"postproc","in":"tp","out":"pd"} ]'
expect 2 "$TOPO: rings\[1\]: ring \"pd\" has no consumer" "$ORCH" "$TOPO"
no_run_dir "dangling ring"
real3 budget "$M" "$DATA" "" "" 4294967296
expect 2 "$TOPO: data.token_budget: expected an integer 1..2147483647, got 4294967296" "$ORCH" "$TOPO"
no_run_dir "token_budget 2^32"
mkfifo "$T/topo.fifo"
expect 2 "$T/topo.fifo: is a FIFO (named pipe), not a regular file (the topology file)" "$ORCH" "$T/topo.fifo"
ok "ring graph: cycle, drafter after target, postproc after postproc, dangling ring, token_budget 2^32, topology FIFO -> exit 2 naming the JSON path / file, nothing created"

# ---- data shards that are not regular files: exit 2 at start naming the file and its kind
mkfifo "$T/fifo.dfs"; mkdir "$T/dir.dfs"; ln -s /dev/zero "$T/zero.dfs"
real3 sfifo "$M" "$T/fifo.dfs"
expect 2 "$T/fifo.dfs: is a FIFO (named pipe), not a regular file" "$ORCH" "$TOPO"; no_run_dir "FIFO shard"
real3 sdev "$M" "$T/zero.dfs"
expect 2 "$T/zero.dfs: is a character device, not a regular file" "$ORCH" "$TOPO"; no_run_dir "/dev/zero shard"
real3 sdir "$M" "$T/dir.dfs"
expect 2 "$T/dir.dfs: is a directory, not a regular file" "$ORCH" "$TOPO"; no_run_dir "directory shard"
ok "shard that is a FIFO, /dev/zero (a symlink to it) or a directory -> exit 2 naming the file and what it is"

# ---- shard headers with valid checksums but bad content: huge counts, reserved bytes
# patch_shard SRC DST OFFSET FORMAT VALUE: write VALUE (struct format) at OFFSET, refresh header_fnv
patch_shard() {
  python3 - "$@" <<'PY' || fail "patch_shard $*"
import struct, sys
src, dst, off, fmt, val = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
b = bytearray(open(src, "rb").read())
struct.pack_into("<" + fmt, b, off, val)
h = 0xcbf29ce484222325
for x in b[:40]:
    h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
struct.pack_into("<Q", b, 40, h)
open(dst, "wb").write(b)
PY
}
patch_shard "$DATA" "$T/huge_n.dfs" 16 Q 9223372036854775808
real3 hugen "$M" "$T/huge_n.dfs"
expect 2 "$T/huge_n.dfs: offset 16: n_samples 9223372036854775808 exceeds the limit of 1099511627776" "$ORCH" "$TOPO"
no_run_dir "huge n_samples"
patch_shard "$DATA" "$T/huge_t.dfs" 24 Q 4611686018427387905 # 4 * n_tokens wraps to 4 in 64 bits
real3 huget "$M" "$T/huge_t.dfs"
expect 2 "$T/huge_t.dfs: offset 24: n_tokens 4611686018427387905 exceeds the limit of 1099511627776" "$ORCH" "$TOPO"
no_run_dir "huge n_tokens"
patch_shard "$DATA" "$T/reserved.dfs" 57 B 255
real3 reserved "$M" "$T/reserved.dfs"
expect 2 "$T/reserved.dfs: offset 57: reserved header byte is 0xff, expected 0" "$ORCH" "$TOPO"
no_run_dir "reserved bytes"
ok "shard header: n_samples 2^63, n_tokens that wrap 4 x n_tokens, a non-zero reserved byte (checksums valid) -> exit 2 naming the offset and field"

# ---- model files: config.json is read by the orchestrator at start (exit 2, nothing created);
# the weights by the target worker, which exits 100 naming the file and field, not restarted
model_copy mdims
python3 - "$T/mdims/config.json" <<'PY' || fail "mdims"
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_attention_heads=1073741824, num_key_value_heads=1073741824, head_dim=1073741824)
json.dump(c, open(sys.argv[1], "w"))
PY
real3 mdims "$T/mdims" "$DATA"
expect 2 "target.model_dir: $T/mdims/config.json: num_attention_heads x head_dim: 1073741824 x 1073741824 = 1152921504606846976, above the limit of 1048576" "$ORCH" "$TOPO"
no_run_dir "overflowing config dims"
model_copy mvocab
python3 - "$T/mvocab/config.json" <<'PY' || fail "mvocab"
import json, sys
c = json.load(open(sys.argv[1])); c.update(vocab_size=1073741824, hidden_size=1048576)
json.dump(c, open(sys.argv[1], "w"))
PY
real3 mvocab "$T/mvocab" "$DATA"
expect 2 "target.model_dir: $T/mvocab/config.json: vocab_size x hidden_size: 1125899906842624 elements in one weight, above the limit of 68719476736" "$ORCH" "$TOPO"
no_run_dir "vocab x hidden"
model_copy mshape
cp tests/bad_safetensors/shape_overflow.safetensors "$T/mshape/model.safetensors"
real3 mshape "$T/mshape" "$DATA"
expect 1 "$T/mshape/model.safetensors: tensor \".*\": shape \[.*\] of .* overflows 64 bits" "$ORCH" "$TOPO"
target_refused "overflowing safetensors shape"
ok "model: config.json heads x head_dim and vocab x hidden beyond the limits -> exit 2 naming the file and field, nothing created (the orchestrator reads config.json first); a safetensors shape overflowing 64 bits -> target exit 100 naming the file and field, not restarted"

model_copy mcfifo; rm "$T/mcfifo/config.json"; mkfifo "$T/mcfifo/config.json"
real3 mcfifo "$T/mcfifo" "$DATA"
expect 2 "$T/mcfifo/config.json: is a FIFO (named pipe), not a regular file" "$ORCH" "$TOPO"; no_run_dir "config FIFO"
model_copy mcdir; rm "$T/mcdir/config.json"; mkdir "$T/mcdir/config.json"
real3 mcdir "$T/mcdir" "$DATA"
expect 2 "$T/mcdir/config.json: is a directory, not a regular file" "$ORCH" "$TOPO"; no_run_dir "config directory"
model_copy msfifo; rm "$T/msfifo/model.safetensors"; mkfifo "$T/msfifo/model.safetensors"
real3 msfifo "$T/msfifo" "$DATA"
expect 1 "$T/msfifo/model.safetensors: is a FIFO (named pipe), not a regular file" "$ORCH" "$TOPO"; target_refused "safetensors FIFO"
model_copy msdev; rm "$T/msdev/model.safetensors"; ln -s /dev/zero "$T/msdev/model.safetensors"
real3 msdev "$T/msdev" "$DATA"
expect 1 "$T/msdev/model.safetensors: is a character device, not a regular file" "$ORCH" "$TOPO"; target_refused "safetensors /dev/zero"
model_copy msdir; rm "$T/msdir/model.safetensors"; mkdir "$T/msdir/model.safetensors"
real3 msdir "$T/msdir" "$DATA"
expect 1 "$T/msdir/model.safetensors: is a directory, not a regular file" "$ORCH" "$TOPO"; target_refused "safetensors directory"
ok "model: config.json as a FIFO or a directory -> exit 2 naming it, nothing created; model.safetensors as a FIFO, /dev/zero or a directory -> target exit 100 naming the file and its kind"

# ---- dflash_eval's prompts file: exit 100 naming it
# a drafter that fits the tiny target (as in test_eval), so that the prompts file is reached
python3 - "$T/dcfg.json" <<'PY' || fail "drafter config"
import json, sys
json.dump({"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
           "num_target_layers": 4, "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 261},
           "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 264, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": True, "layer_types": ["full_attention"]},
          open(sys.argv[1], "w"))
PY
"$BIN/dflash_tool" init --out "$T/ck" --config "$T/dcfg.json" --seed 11 >/dev/null || fail "dflash_tool init"
mkfifo "$T/prompts.jsonl"; mkdir "$T/pdir.jsonl"
expect 100 "$T/prompts.jsonl: is a FIFO (named pipe), not a regular file" \
  "$BIN/dflash_eval" --target "$M" --drafter "$T/ck" --prompts "$T/prompts.jsonl" --max-new 4
expect 100 "$T/pdir.jsonl: is a directory, not a regular file" \
  "$BIN/dflash_eval" --target "$M" --drafter "$T/ck" --prompts "$T/pdir.jsonl" --max-new 4
ok "dflash_eval: prompts file that is a FIFO or a directory -> exit 100 naming it"
echo "test_bad_files: ok"
