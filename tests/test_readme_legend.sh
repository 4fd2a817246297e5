#!/usr/bin/env bash
# test_readme_legend: README.md's "Layout" section and the headers agree on the prefixes.
#
# The Layout section's code block names folders ("common/", "  ipc/" under it, ...) and,
# in the text that follows each folder up to the next one, the function prefixes of that
# folder (any word ending in "_": `ring_`, `shard_/dataset_`, `backend_`). Two checks:
#   1. every prefix the legend gives a folder starts at least one function declared in a
#      .h of that folder (a header belongs to the deepest folder the legend names above it,
#      so a prefix given to common/ must be in common/*.h, not in common/ipc/);
#   2. every function declared in a .h under common/, eval/ and the worker folders starts
#      with a prefix the legend gives its folder.
# A function is a declaration or definition that starts in column 0 (struct members and
# bodies are indented); typedefs and preprocessor lines are skipped. Internal CUDA includes
# (.cuh) are not headers of the library's interface and are not read.
# Then the same check runs on copies of README with a planted wrong prefix and with a
# prefix taken away, and must refuse both (the check can fail).
set -u
cd "$(dirname "$0")/.."

check() { # check README: prints the disagreements, exits 1 if there are any
  python3 - "$1" <<'EOF'
import os, re, sys
readme = open(sys.argv[1]).read()
m = re.search(r'^## Layout\s*$(.*?)^## ', readme, re.S | re.M)
if not m:
    print("README has no '## Layout' section"); sys.exit(1)
block = re.search(r'^```[^\n]*\n(.*?)^```', m.group(1), re.S | re.M)
if not block:
    print("the Layout section has no code block"); sys.exit(1)
legend, top, cur = {}, None, None
prefix_re = re.compile(r'(?<![\w.])([a-z][a-z0-9]*(?:_[a-z0-9]+)*_)(?!\w)')
for line in block.group(1).split("\n"):
    f = re.match(r'^( {0,3})([a-z][\w-]*/)(?=\s|$)', line)
    rest = line
    if f:
        if f.group(1) == "":
            top = cur = f.group(2)
        else:
            cur = (top or "") + f.group(2)
        legend.setdefault(cur, set())
        rest = line[f.end():]
    if cur is None:
        continue
    legend[cur].update(prefix_re.findall(rest))
if not legend:
    print("the Layout block names no folder"); sys.exit(1)

def folder_of(path):  # the deepest folder of the legend that holds path
    best = None
    for d in legend:
        if path.startswith(d) and (best is None or len(d) > len(best)):
            best = d
    return best

decl = re.compile(r'^(?!typedef\b)[A-Za-z_][\w\s\*]*?[\s\*]([A-Za-z_]\w*)\s*\(')
def functions(path):
    txt = open(path, errors="replace").read()
    txt = re.sub(r'/\*.*?\*/', lambda c: "\n" * c.group(0).count("\n"), txt, flags=re.S)
    txt = re.sub(r'//[^\n]*', "", txt)
    out = []
    for line in txt.split("\n"):
        if not line or line[0] in " \t#}{":
            continue
        d = decl.match(line)
        if d and d.group(1) not in ("if", "while", "for", "return", "sizeof"):
            out.append(d.group(1))
    return out

roots = ["common", "eval", "target_worker", "postproc_worker", "drafter_worker"]
funcs = {}  # legend folder -> [(header, function)]
bad = []
nh = 0
for r in roots:
    for dirpath, dirs, files in os.walk(r):
        dirs.sort()
        for fn in sorted(files):
            if not fn.endswith(".h"):
                continue
            h = os.path.join(dirpath, fn)
            d = folder_of(h)
            if d is None:
                bad.append("%s: its folder is not in the Layout section" % h)
                continue
            nh += 1
            missing = []
            for f in functions(h):
                funcs.setdefault(d, []).append((h, f))
                if not any(f.startswith(p) for p in legend[d]):
                    missing.append(f + "()")
            if missing:
                bad.append("%s: %s: no prefix the Layout section gives %s starts them (it gives: %s)"
                           % (h, " ".join(missing[:4]) + (" ..." if len(missing) > 4 else ""), d,
                              " ".join(sorted(legend[d])) or "none"))
for d in sorted(legend):
    for p in sorted(legend[d]):
        if not any(f.startswith(p) for h, f in funcs.get(d, [])):
            bad.append("README Layout: %s is given %s, but no header of that folder declares a %s... function"
                       % (d, p, p))
for b in bad:
    print(b)
if nh == 0:
    print("no header found"); sys.exit(1)
sys.exit(1 if bad else 0)
EOF
}

out=$(check README.md)
if [ $? -ne 0 ]; then
  echo "$out"; echo "FAIL: README.md's Layout section and the headers disagree (lines above)"; exit 1
fi

tmp=$(mktemp /tmp/df_readme_legend.XXXXXX)
trap 'rm -f "$tmp"' EXIT
# a prefix no header has, given to common/ipc/ next to ring_
sed '/^## Layout/,/^## /s/ring_ (slot/ring_, zzq_ (slot/' README.md >"$tmp"
grep -q 'zzq_ (slot' "$tmp" || { echo "FAIL: could not plant a prefix (README Layout changed?)"; exit 1; }
out=$(check "$tmp")
if [ $? -eq 0 ] || ! grep -q 'common/ipc/ is given zzq_' <<<"$out"; then
  echo "$out"; echo "FAIL: a planted prefix zzq_ for common/ipc/ was not refused"; exit 1
fi
# backend_ taken away from target_worker/: its header's functions lose their prefix
sed '/^## Layout/,/^## /s/the backend_ forward/the forward/' README.md >"$tmp"
grep -q 'the forward writing' "$tmp" || { echo "FAIL: could not remove backend_ (README Layout changed?)"; exit 1; }
out=$(check "$tmp")
if [ $? -eq 0 ] || ! grep -q 'target_worker/target_backend.h: backend_open()' <<<"$out"; then
  echo "$out"; echo "FAIL: target_worker/ without backend_ in the legend was not refused"; exit 1
fi
echo "PASS: README.md Layout prefixes match the headers (planted wrong and missing prefixes refused)"
