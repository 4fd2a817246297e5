#!/usr/bin/env bash
# test_supervisor_table: docs/supervisor.md and the supervisor's state table in
# orchestrator/supervisor.c say the same thing.
#
# The code's table is the ROW(state, event, next, action) lines of sv_table; the page's is
# the markdown table under "## The table". Checks: the two have the same rows in the same
# order; no (state, event) pair appears twice; every state of the supervisor_state enum,
# every event name (ev_names) and every action the rows use is described in the page's
# States / Events / Actions tables, and the page describes nothing the code lacks. Then the
# same check runs on copies of the page with one row's next state changed and with a row
# taken away, and must refuse both (the check can fail).
set -u
cd "$(dirname "$0")/.."

check() { # check PAGE: prints the disagreements, exits 1 if there are any
  python3 - "$1" <<'PY'
import re, sys
page = open(sys.argv[1]).read()
src = open("orchestrator/supervisor.c").read()
hdr = open("orchestrator/orch.h").read()
bad = []
code = [tuple(x.lower() for x in r) for r in
        re.findall(r'^\s*ROW\((\w+), (\w+), (\w+), (\w+)\),', src, re.M)]
if len(code) < 50:
    bad.append(f"only {len(code)} ROW lines found in supervisor.c")
seen = set()
for r in code:
    if r[:2] in seen:
        bad.append(f"code: ({r[0]}, {r[1]}) appears twice")
    seen.add(r[:2])

def section(title):
    m = re.search(r'^## ' + re.escape(title) + r'\s*$(.*?)(?=^## |\Z)', page, re.S | re.M)
    if not m:
        bad.append(f"page: no '## {title}' section"); return []
    rows = []
    for line in m.group(1).split("\n"):
        if not line.startswith("|") or re.match(r'^\|[-| ]+\|$', line):
            continue
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header

doc = [tuple(r) for r in section("The table")]
if doc != code:
    for i in range(max(len(doc), len(code))):
        d = doc[i] if i < len(doc) else None
        c = code[i] if i < len(code) else None
        if d != c:
            bad.append(f"row {i + 1}: page {d} but code {c}")
            break
    bad.append(f"the page's table ({len(doc)} rows) differs from sv_table ({len(code)} rows)")

enum = re.search(r'typedef enum \{(.*?)\} supervisor_state;', hdr, re.S)
states = [s.lower() for s in re.findall(r'\bSV_(\w+)', enum.group(1)) if s != "N_STATES"] if enum else []
evs = re.search(r'ev_names\[EV_N_EVENTS\] = \{(.*?)\};', src, re.S)
events = re.findall(r'"(\w+)"', evs.group(1)) if evs else []
actions = sorted({r[3] for r in code})
for title, want in (("States", states), ("Events", events), ("Actions", actions)):
    have = []
    for r in section(title):
        have += [x.strip().strip("`") for x in r[0].split(",")]
    for x in want:
        if x not in have:
            bad.append(f"page: {title}: {x} is not described")
    for x in have:
        if x not in want:
            bad.append(f"page: {title}: {x} is described but the code has none")
used = {r[0] for r in code} | {r[2] for r in code if r[2] not in ("same", "policy")}
for s in states:
    if s not in used:
        bad.append(f"code: state {s} appears in no row")
for e in events:
    if e not in {r[1] for r in code}:
        bad.append(f"code: event {e} appears in no row")
for b in bad:
    print(b)
print(f"{len(code)} rows, {len(states)} states, {len(events)} events, {len(actions)} actions")
sys.exit(1 if bad else 0)
PY
}

out=$(check docs/supervisor.md); rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: docs/supervisor.md and supervisor.c's state table differ"; exit 1; }

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# a planted wrong next state and a missing row must both be refused
sed 's/^| up | hang | killed | kill_hang |$/| up | hang | stopping | kill_hang |/' docs/supervisor.md >"$tmp/changed.md"
grep -v '^| stopping | escalation_timer |' docs/supervisor.md >"$tmp/missing.md"
cmp -s docs/supervisor.md "$tmp/changed.md" && { echo "FAIL: the planted change did not apply"; exit 1; }
cmp -s docs/supervisor.md "$tmp/missing.md" && { echo "FAIL: the planted removal did not apply"; exit 1; }
for f in changed missing; do
  if out=$(check "$tmp/$f.md"); then
    echo "FAIL: a page with a $f row passed the check"; exit 1
  fi
  echo "planted $f row refused: $(echo "$out" | head -1)"
done
echo "supervisor table: docs/supervisor.md matches sv_table"
