#!/usr/bin/env bash
# test_layering: no source file includes a header from a folder its layer may not use.
#
# The rooms and what each may use come from the Makefile (`make print-layers`: one line
# "DIR: DIR ALLOWED..." per room), the same lines that decide which libraries a program
# links, so the include rule and the link rule cannot drift apart. Every #include "X" of
# every .c/.h/.cu/.cuh in a room is resolved the way the compiler does (the including
# file's folder, then -I., then -Icommon); the folder it lands in must be the room itself
# or one of its allowed rooms. A quoted include that resolves nowhere fails too (nothing
# may slip past unchecked). Then the same check is run on a copy of the tree with one
# sideways include planted (postproc_worker including drafter_worker/) and must refuse it.
set -u
cd "$(dirname "$0")/.."

layers=$(make -s --no-print-directory print-layers) || { echo "FAIL: make print-layers"; exit 1; }
[ -n "$layers" ] || { echo "FAIL: make print-layers printed nothing"; exit 1; }

check() { # check ROOT: prints the violations, exits 1 if there are any
  LAYERS="$layers" python3 - "$1" <<'EOF'
import os, re, sys
root = sys.argv[1]
rooms = {}
for line in os.environ["LAYERS"].splitlines():
    d, _, allowed = line.partition(":")
    rooms[d.strip()] = allowed.split()
# longest folder first: common/target is its own room inside common
order = sorted(rooms, key=len, reverse=True)
def room_of(path):
    for d in order:
        if path == d or path.startswith(d + "/"):
            return d
    return None
inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
bad, nfiles, nincl = [], 0, 0
for d in rooms:
    for dirpath, dirs, files in os.walk(os.path.join(root, d)):
        for f in sorted(files):
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            me = room_of(rel)
            if me != d:
                continue  # a file of a nested room is checked as that room's
            nfiles += 1
            with open(os.path.join(root, rel), encoding="utf-8") as fh:
                for ln, text in enumerate(fh, 1):
                    m = inc.match(text)
                    if not m:
                        continue
                    nincl += 1
                    x = m.group(1)
                    cands = [os.path.normpath(os.path.join(os.path.dirname(rel), x)), x, "common/" + x]
                    hit = next((c for c in cands if os.path.isfile(os.path.join(root, c))), None)
                    if hit is None:
                        bad.append(f"{rel}:{ln}: #include \"{x}\" resolves to no file of the tree")
                        continue
                    owner = room_of(hit)
                    if owner not in rooms[me]:
                        bad.append(f"{rel}:{ln}: #include \"{x}\" ({hit}): {me} may use only "
                                   + ", ".join(rooms[me]) + f", not {owner or os.path.dirname(hit)}")
for b in bad:
    print(b)
print(f"{nfiles} files, {nincl} quoted includes, {len(bad)} across a layer", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

if ! check .; then echo "FAIL: an include crosses the layers (Makefile: the _USES lines)"; exit 1; fi

# The check must refuse a planted sideways include.
tmp=$(mktemp -d /tmp/df_layering.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for d in $(echo "$layers" | cut -d: -f1); do
  mkdir -p "$tmp/$(dirname "$d")"; [ -e "$tmp/$d" ] || cp -r "$d" "$tmp/$d"
done
sed -i '0,/#include/s//#include "drafter_worker\/trainer.h"\n#include/' "$tmp/postproc_worker/pp_copy.c"
out=$(check "$tmp" 2>/dev/null)
if [ $? -eq 0 ] || ! grep -q 'postproc_worker/pp_copy.c:.*drafter_worker/trainer.h' <<<"$out"; then
  echo "$out"; echo "FAIL: a planted include of drafter_worker/ from postproc_worker/ was not refused"; exit 1
fi
echo "layering: every include stays in its layer; a planted sideways include is refused:"
echo "  $out"
