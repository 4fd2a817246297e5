#!/usr/bin/env bash
# test_pipeline: the real pipeline on the CPU backend, end to end: orchestrator +
# target_worker + postproc_worker + drafter_worker over shared-memory rings, on the tiny
# target and a small slice of its chat data.
#   1. a clean run: exit 0, the ledger audit shows every batch exactly once, the loss falls,
#      checkpoints, the release export, and every stage's metrics are written; the drafter's
#      step lines count the documents they trained ("docs": all the plan's samples, once) and
#      bench/pipeline/report.py reports that count and a steady-state samples/s from them,
#      the drafter's start-up (from its log) and the checkpoints' cost (from its metrics), and
#      the one-GPU ceiling from bench_target's or bench_moe's JSON;
#   2. the same run while each stage is SIGKILLed once (target, postproc, drafter, the
#      drafter after a checkpoint so it resumes from it): it still completes with the same
#      audit (every batch committed exactly once, nothing poisoned).
# Both runs' TensorBoard event files are read record by record and checked against the
# drafter's metrics lines (tests/check_tfevents.py; after the kills with its self-test too).
source "$(dirname "$0")/orch_lib.sh"
unset DF_SYNTHETIC_SAMPLES
for b in target_worker postproc_worker drafter_worker; do [ -x "$BIN/$b" ] || fail "missing $BIN/$b"; done

python3 scripts/prepare_data.py --tokenizer models/tiny-target --out "$T/data" data/tiny/chat-train.jsonl \
  --max-samples 90 --max-len 400 >/dev/null || fail "prepare_data"
mk_topo() { # NAME [DRAFTER_ENV_JSON]
  RUN=$T/run-$1; TOPO=$T/$1.json
  cat >"$TOPO" <<JSON
{ "version": 1, "name": "$1", "run_dir": "$RUN", "backend": "cpu", "seed": 5, "deterministic": true,
  "target": { "model_dir": "$PWD/models/tiny-target", "capture_layers": [1, 3] },
  "drafter": { "num_layers": 1, "block_size": 8, "num_anchors": 16, "lr": 3e-3, "warmup_frac": 0.1,
               "checkpoint_every": 4, "mask_token_id": 261 },
  "data": { "shards": ["$T/data-000.dfs"], "token_budget": 800, "max_seq_len": 400 },
  "rings": [ { "name": "tp", "slots": 4, "slot_bytes": 2097152, "max_attempts": 4 },
             { "name": "pd", "slots": 4, "slot_bytes": 2097152, "max_attempts": 4 } ],
  "workers": [ { "name": "target0", "role": "target", "out": "tp" },
               { "name": "postproc0", "role": "postproc", "in": "tp", "out": "pd" },
               { "name": "drafter0", "role": "drafter", "in": "pd"${2:+, \"env\": $2} } ],
  "supervision": { "backoff_initial_ms": 50, "backoff_max_ms": 400, "max_restarts": 10, "restart_window_s": 60,
                   "heartbeat_timeout_ms": 20000, "shutdown_timeout_ms": 5000, "metrics_interval_ms": 300 } }
JSON
}
steps() { grep -c '"ev":"step"' "$RUN/metrics/drafter0.jsonl" 2>/dev/null || echo 0; }
inc() { wstat "$1" incarnation 2>/dev/null || echo 0; }

# 1. clean run
mk_topo clean
start_orch; wait_orch 240
[ "$ORCH_RC" = 0 ] || fail "clean run exited $ORCH_RC"
audit_exactly_once
n_batches=$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n_batches" ] || fail "not every batch committed"
python3 - "$RUN" <<'PY' || fail "loss/summary check"
import json, sys
run = sys.argv[1]
L = [json.loads(l) for l in open(f"{run}/metrics/drafter0.jsonl") if '"ev":"step"' in l]
first = sum(x["loss"] for x in L[:3]) / 3
last = sum(x["loss"] for x in L[-3:]) / 3
print(f"steps {len(L)}, loss first 3 {first:.3f} -> last 3 {last:.3f}")
assert last < 0.75 * first, "loss did not fall"  # from ~5.4 (ln 264 = 5.6) to ~3.2 nats
s = json.load(open(f"{run}/train_summary.json"))
assert s["steps"] == len(L) and len(s["acc"]) == 7 and 1.0 <= s["expected_tau"] <= 8.0, s
for w in ("target0", "postproc0", "drafter0"):
    st = [json.loads(l) for l in open(f"{run}/metrics/{w}.jsonl") if '"ev":"stage"' in l]
    assert st and "busy_frac" in st[-1] and "tok_s" in st[-1], w
    assert sum(x["items_s"] for x in st) > 0, w
# each step line counts the documents it trained: over a clean run, every sample once
audit = json.load(open(f"{run}/ledger_audit.json"))
docs = sum(x["docs"] for x in L)
assert docs == audit["n_samples"] and all(x["docs"] >= 1 for x in L), (docs, audit["n_samples"])
print(f"step lines count {docs} documents = the plan's {audit['n_samples']} samples")
PY
# bench/pipeline/report.py's samples/s come from those counts
python3 bench/pipeline/report.py "$RUN" --label clean --json "$T/report.json" >"$T/report.out" || { cat "$T/report.out"; fail "report.py"; }
python3 - "$T/report.json" "$RUN" <<'PY' || { cat "$T/report.out"; fail "report.py samples"; }
import json, sys
r = json.load(open(sys.argv[1]))
n = json.load(open(f"{sys.argv[2]}/ledger_audit.json"))["n_samples"]
assert r["docs_trained"] == n and r["steady_samples_s"] and r["steady_samples_s"] > 0, r
# where the drafter's start-up went (its log) and what the checkpoints cost (its metrics)
su = r["drafter_startup"]
assert su and all(x["ready_s"] >= 0 and x["how"] in ("random", "release", "checkpoint") for x in su), su
cks = [json.loads(l) for l in open(f"{sys.argv[2]}/metrics/drafter0.jsonl") if '"checkpoint"' in l]
assert cks and r["checkpoints"]["n"] == len(cks) and r["checkpoints"]["ok"] == len(cks), (r["checkpoints"], len(cks))
PY
# the one-GPU ceiling: stage-alone results in the benches' JSON shapes (two target layouts, the
# drafter packed and alone), one document = target time for its tokens + drafter time for it
cat >"$T/tgt.json" <<'J'
{"bench": "target_forward", "results": [{"model": "m", "T": 64, "tok_s": 8000.0}, {"model": "m", "T": 256, "tok_s": 4000.0}]}
J
cat >"$T/dr.json" <<'J'
[{"shape": "tiny", "seq": 64, "anchors": 8, "docs": 1, "samples_per_s": 40.0, "ms_per_step": 25.0, "mfu": 0.1},
 {"shape": "tiny", "seq": 64, "anchors": 8, "docs": 4, "samples_per_s": 50.0, "ms_per_step": 80.0, "mfu": 0.1}]
J
python3 bench/pipeline/report.py "$RUN" --label clean --json "$T/report2.json" --target-json "$T/tgt.json" \
  --drafter-json "$T/dr.json" >"$T/report2.out" || { cat "$T/report2.out"; fail "report.py with stage-alone JSON"; }
python3 - "$T/report2.json" <<'PY' || { cat "$T/report2.out"; fail "report.py one-GPU ceiling"; }
import json, sys
r = json.load(open(sys.argv[1]))
c = r["one_gpu_ceiling"]
# T = 64 matches the documents' length: 64 / 8000 s; the packed drafter row: 1 / 50 s
assert c["target_T"] == 64 and abs(c["target_ms_per_doc"] - 8.0) < 1e-9, c
assert c["drafter_alone_docs"] == 4 and abs(c["drafter_ms_per_doc"] - 20.0) < 1e-9, c
assert abs(c["samples_s"] - 1000.0 / 28.0) < 1e-9, c
assert abs(c["steady_frac"] - r["steady_samples_s"] / c["samples_s"]) < 1e-12, c
assert 0 < c["drafter_busy_frac_of_alone"], c
PY
# bench_moe's JSON in bench_target's place (a mixture-of-experts target alone, bench/pipeline/run.sh
# 30b-a3b): its rows' T and tok_s give the ceiling the same way, the line names bench_moe
cat >"$T/moe.json" <<'J'
{"bench": "target_forward_moe", "shape": "Qwen3-30B-A3B", "layers_run": 6, "tokens": 256, "results": [
 {"layout": "4 docs x 64", "kernel": "grouped", "T": 64, "B": 4, "graph_ms": 40.0, "tok_s": 6400.0}]}
J
python3 bench/pipeline/report.py "$RUN" --label clean --json "$T/report4.json" --target-json "$T/moe.json" \
  --drafter-json "$T/dr.json" >"$T/report4.out" || { cat "$T/report4.out"; fail "report.py with bench_moe's JSON"; }
grep -q "target alone (bench_moe Qwen3-30B-A3B, 6 layers, grouped experts, T=64): 6,400 tok/s" "$T/report4.out" ||
  { cat "$T/report4.out"; fail "report.py: bench_moe's ceiling line"; }
python3 - "$T/report4.json" <<'PY' || { cat "$T/report4.out"; fail "report.py one-GPU ceiling from bench_moe"; }
import json, sys
c = json.load(open(sys.argv[1]))["one_gpu_ceiling"]
assert c["target_T"] == 64 and abs(c["target_ms_per_doc"] - 10.0) < 1e-9, c
assert abs(c["samples_s"] - 1000.0 / 30.0) < 1e-9, c
PY
# two peers (peer_pipeline.py's JSON shape): one ratio table each, ours / peer in samples/s
for i in 1 2; do
  echo "{\"samples_per_s\": $((i * 3)).0, \"tok_per_s\": $((i * 192)).0, \"seq\": 64, \"anchors\": 8, \"attention_note\": \"p$i\"}" >"$T/peer$i.json"
done
python3 bench/pipeline/report.py "$RUN" --label clean --json "$T/report3.json" --peer-json "$T/peer1.json" \
  --peer-json "$T/peer2.json" >"$T/report3.out" || { cat "$T/report3.out"; fail "report.py with two peers"; }
python3 - "$T/report3.json" <<'PY' || { cat "$T/report3.out"; fail "report.py peer tables"; }
import json, sys
r = json.load(open(sys.argv[1]))
v = r["vs_peers"]
assert len(v) == 2 and r["vs_peer"] == v[0], r.keys()
for k, peer_sps in ((0, 3.0), (1, 6.0)):
    assert abs(v[k]["ratio_steady"] - r["steady_samples_s"] / peer_sps) < 1e-12, v[k]
    assert v[k]["peer_attention"] == f"p{k + 1}", v[k]
PY
[ -f "$RUN/drafter/config.json" ] && [ -f "$RUN/drafter/model.safetensors" ] || fail "no release export"
grep -q '"DFlashDraftModel"' "$RUN/drafter/config.json" || fail "release config.json"
[ -f "$RUN/checkpoints/latest" ] || fail "no checkpoint"
# curves from the metrics (scripts/plot_run.py) where a Python with matplotlib exists
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' >/dev/null 2>&1; then
    "$py" scripts/plot_run.py "$RUN" --out "$T/curves" >/dev/null || fail "plot_run.py"
    for f in training stages; do
      [ "$(head -c 4 "$T/curves/$f.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "curves/$f.png is not a PNG"
    done
    echo "ok: plot_run.py drew training.png and stages.png"
    break
  fi
done
python3 scripts/plot_run.py "$T/nowhere" 2>/dev/null; [ $? -eq 2 ] || fail "plot_run.py on a run dir without metrics: expected exit 2"
tb_check "$RUN" --workers drafter0
ok "clean run: $n_batches batches exactly once, checkpoint, export, metrics"

# 2. each stage killed once during the run (each step followed by 150 ms: the run must still
# be going when the kills and the status polls of a loaded machine land)
mk_topo chaos '{"DF_FAULT_STEP_DELAY_MS": "150"}'
start_orch
wait_for 120 test -S "$RUN/ctl.sock" || fail "no control socket"
wait_for 120 sh -c "[ \$(grep -c '\"ev\":\"step\"' '$RUN/metrics/drafter0.jsonl' 2>/dev/null || echo 0) -ge 1 ]" || fail "no step"
"$DFCTL" --run-dir "$RUN" kill target0 >/dev/null || fail "dfctl kill target0"
wait_for 60 sh -c "[ \$('$DFCTL' --run-dir '$RUN' --json status | python3 -c 'import json,sys;print([w for w in json.load(sys.stdin)[\"workers\"] if w[\"name\"]==\"target0\"][0][\"incarnation\"])') -ge 2 ]" || fail "target0 not restarted"
"$DFCTL" --run-dir "$RUN" kill postproc0 >/dev/null || fail "dfctl kill postproc0"
# postproc0 back before the drafter dies: two deaths close together can be one group
# restart (the drafter's group takes in a postproc still waiting for its backoff), and the
# count below wants one restart per kill
wait_for 60 sh -c "[ \$('$DFCTL' --run-dir '$RUN' --json status | python3 -c 'import json,sys;print([w for w in json.load(sys.stdin)[\"workers\"] if w[\"name\"]==\"postproc0\"][0][\"incarnation\"])') -ge 2 ]" || fail "postproc0 not restarted"
wait_for 60 committed_ge 1 || fail "no checkpoint before the drafter kill"
wait_for 60 sh -c "[ \$(grep -c '\"ev\":\"step\"' '$RUN/metrics/drafter0.jsonl') -ge 6 ]" || fail "drafter stalled"
"$DFCTL" --run-dir "$RUN" kill drafter0 >/dev/null || fail "dfctl kill drafter0"
wait_orch 300
[ "$ORCH_RC" = 0 ] || fail "chaos run exited $ORCH_RC"
audit_exactly_once
[ "$(pyjson "$RUN/ledger_audit.json" "d['n_batches']")" = "$n_batches" ] || fail "batch count differs"
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['committed']")" = "$n_batches" ] || fail "not every batch committed"
[ "$(pyjson "$RUN/ledger_audit.json" "d['counts']['poisoned']")" = 0 ] || fail "poisoned batches"
restarts=$(events restart | wc -l)
[ "$restarts" -ge 3 ] || fail "expected >= 3 restarts, saw $restarts"
grep -q 'resumed from' "$RUN/logs/drafter0.log" || fail "drafter did not resume from its checkpoint"
rewound=$(pyjson "$RUN/ledger_audit.json" "d['stats']['rewound']")
# the restarted drafter wrote a second event file, whose SessionLog START drops the redone steps
[ "$(ls "$RUN/tensorboard/drafter0" | wc -l)" -ge 2 ] || fail "one event file for two drafter incarnations"
tb_check "$RUN" --workers drafter0 --selftest
ok "chaos run: 3 kills, $restarts restarts, $rewound batches rewound and retrained, $n_batches batches exactly once"
echo "test_pipeline: ok"
