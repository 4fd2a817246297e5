#!/usr/bin/env bash
# test_demo_corpus: scripts/demo_corpus.py, the structured text of the demo target
# (train_target.py --corpus demo:F). Checks that
#   - a document is the same bytes in two interpreters with different hash seeds (str
#     seeds must not depend on PYTHONHASHSEED), ASCII, and long enough for train_target.py
#     (its prompts and batches need >= 2048 bytes), and every kind occurs;
#   - held-out documents are honest: none equals a training one, and per kind at most 10%
#     of prompts cut from held-out documents (as train_target.py cuts them: line start,
#     64/96/128 bytes) occur verbatim in the training documents (the standard library's
#     own held-out files measure about 9%; a generator with a small parameter space, e.g.
#     multiplication tables of 2..19, measured 83% and fails here);
#   - mix() gives F of the documents structured, "stdlib" leaves the corpus alone, and a
#     bad spec is refused naming it; kind_of() finds a prompt's kind;
#   - with a Python that has torch: train_target.py --corpus demo:0.5 trains 2 steps on the
#     CPU and answers prompts from both parts of the corpus, and --corpus demo:2 exits 2
#     naming --corpus (without torch that part is skipped, said below).
set -euo pipefail
tmp=$(mktemp -d /tmp/df_test_demo_corpus_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
h1=$(PYTHONHASHSEED=1 python3 -c 'import sys, hashlib; sys.path.insert(0, "scripts"); import demo_corpus as d
print(hashlib.sha256(b"".join(d.documents("train", 3, 40))).hexdigest())')
h2=$(PYTHONHASHSEED=2 python3 -c 'import sys, hashlib; sys.path.insert(0, "scripts"); import demo_corpus as d
print(hashlib.sha256(b"".join(d.documents("train", 3, 40))).hexdigest())')
[ "$h1" = "$h2" ] || { echo "documents differ between interpreters: $h1 vs $h2"; exit 1; }
echo "40 documents, two interpreters: the same bytes ($h1)"
python3 - <<'PY'
import random, sys
sys.path.insert(0, "scripts")
import demo_corpus as d

train = [d.document("train", 0, i) for i in range(600)]
held = [d.document("heldout", 0, i) for i in range(120)]
kinds = sorted({k for k, _ in train})
assert kinds == sorted(d.KINDS), f"kinds seen {kinds}"
for split, docs in (("train", train), ("heldout", held)):
    for i, (k, doc) in enumerate(docs):
        assert len(doc) >= 2048, f"{split} document {i} ({k}): {len(doc)} bytes"
        doc.decode("ascii")  # raises on a non-ASCII byte
tset = {doc for _, doc in train}
assert not any(doc in tset for _, doc in held), "a held-out document is a training one"
big = b"\0".join(doc for _, doc in train)
rng = random.Random(7)
seen = {}
for k, doc in held:
    for _ in range(8):
        s = rng.randrange(0, len(doc) - 400)
        nl = doc.find(b"\n", s)
        p = doc[nl + 1:nl + 1 + rng.choice([64, 96, 128])]
        n = seen.setdefault(k, [0, 0])
        n[0] += 1
        n[1] += p in big
        assert d.kind_of(p, held) == k, f"kind_of: {d.kind_of(p, held)} for a {k} prompt"
bad = {k: f"{v[1]}/{v[0]}" for k, v in seen.items() if v[1] > 0.10 * v[0]}
print("held-out prompts seen verbatim in training, per kind: " +
      ", ".join(f"{k} {v[1]}/{v[0]}" for k, v in sorted(seen.items())))
assert not bad, f"kinds with more than 10% of their held-out prompts in the training text: {bad}"
assert d.kind_of(b"def __init__(self, name):\n        self.name = name\n", held) is None

stdlib_train, stdlib_held = [b"x" * 3000] * 30, [b"y" * 3000] * 4
tr, he = d.mix("demo:0.75", stdlib_train, stdlib_held, 0)
assert (len(tr), len(he)) == (120, 16), (len(tr), len(he))
assert tr[:30] == stdlib_train and he[:4] == stdlib_held
tr, he = d.mix("demo:1", stdlib_train, stdlib_held, 0)
assert b"x" * 3000 not in tr and len(tr) == 1200 and len(he) == 60
assert d.mix("stdlib", stdlib_train, stdlib_held, 0) == (stdlib_train, stdlib_held)
for spec in ("demo:0", "demo:1.5", "demo:x", "demo", "code"):
    try:
        d.mix(spec, stdlib_train, stdlib_held, 0)
    except ValueError as e:
        assert repr(spec) in str(e), str(e)
    else:
        raise AssertionError(f"{spec} accepted")
print("mix: demo:0.75 -> 90 + 30 train, 12 + 4 held-out; demo:1 -> 1200 / 60; bad specs refused")
PY

# train_target.py --corpus needs torch: any Python that has it (a pyenv python3 may not)
py=
for c in python3 /usr/bin/python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import torch' 2>/dev/null; then py=$c; break; fi
done
if [ -z "$py" ]; then
  echo "train_target.py --corpus: not run (no Python with torch here)"
  echo "test_demo_corpus: ok"
  exit 0
fi
set +e
"$py" scripts/train_target.py --corpus demo:2 --out "$tmp/m" --data "$tmp/d" 2>"$tmp/err"
rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--corpus 'demo:2'" "$tmp/err" || { echo "--corpus demo:2: exit $rc"; cat "$tmp/err"; exit 1; }
OMP_NUM_THREADS=1 "$py" scripts/train_target.py --shape tiny --corpus demo:0.5 --steps 2 --batch 2 --seq 32 \
  --n-train 12 --n-heldout 16 --resp-len 8 --device cpu --out "$tmp/m" --data "$tmp/d" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; exit 1; }
grep -q "demo_corpus: demo:0.5: " "$tmp/log" || { cat "$tmp/log"; exit 1; }
"$py" - "$tmp/d" <<'PY'
import json, sys
sys.path.insert(0, "scripts")
import demo_corpus as d
held = [d.document("heldout", 0, i) for i in range(200)]
kinds = []
for line in open(f"{sys.argv[1]}/chat-heldout.jsonl"):
    p = json.loads(line)["messages"][0]["content"].encode("latin-1")
    kinds.append(d.kind_of(p, held) or "stdlib")
print("held-out prompts of a demo:0.5 target: " + " ".join(kinds))
assert len(kinds) == 16 and "stdlib" in kinds and set(kinds) != {"stdlib"}, kinds
PY
echo "train_target.py --corpus demo:0.5: trained, answered prompts from both parts; demo:2 refused"
echo "test_demo_corpus: ok"
