#!/usr/bin/env bash
# test_layering: no source file includes a header, and no library calls a function, from a
# folder its layer may not use; the Makefile's _USES lines are closed and in link order.
#
# The rooms and what each may use come from the Makefile (`make print-layers`: one line
# "DIR: DIR ALLOWED..." per room, ALLOWED in _USES order), the same lines that decide which
# libraries a program links, so the include rule and the link rule cannot drift apart.
#   1. the lines: every room a room uses is itself allowed only rooms the user is allowed
#      too (closed: io uses ipc, so whatever uses io lists ipc), and it comes before them
#      in the user's line (the line is the link order: highest first, no --start-group);
#   2. includes: every #include "X" of every .c/.h/.cu/.cuh in a room is resolved the way
#      the compiler does (the including file's folder, then -I., then -Icommon); the folder
#      it lands in must be the room itself or one of its allowed rooms. A quoted include
#      that resolves nowhere fails too (nothing may slip past unchecked). The layers under
#      common/ (base = common/ itself, ipc/, nn/, io/, proc/, target/, dflash/) are rooms
#      like the others: an upward include between them fails as a sideways one does;
#   3. calls: with the libraries built ($BUILD/lib<room>.a), every symbol an object of a
#      room's library needs and another room's library defines must be defined by an
#      allowed room. The link refuses most such calls already, but not one whose object
#      the program happened to pull in for another reason; this check sees every object.
# Then each check runs on a planted violation and must refuse it: a sideways include
# (postproc_worker/ including drafter_worker/), upward includes between the common/
# layers (ipc -> io, ipc -> proc, nn -> io, io -> proc, base -> ipc), a _USES line left
# open and one out of order, and an upward call (an object calling topology_load, of io,
# added to a copy of libipc.a).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}

layers=$(make -s --no-print-directory print-layers) || { echo "FAIL: make print-layers"; exit 1; }
[ -n "$layers" ] || { echo "FAIL: make print-layers printed nothing"; exit 1; }

check_lines() { # check_lines LAYERS: prints what is open or out of order, exits 1 if anything
  LAYERS="$1" python3 - <<'EOF'
import os, sys
rooms = {}
for line in os.environ["LAYERS"].splitlines():
    d, _, allowed = line.partition(":")
    rooms[d.strip()] = [a for a in allowed.split() if a != d.strip()]
bad = []
for me, uses in rooms.items():
    for i, u in enumerate(uses):
        if u not in rooms:
            bad.append(f"{me}/: uses {u}/, which is not a room")
            continue
        for w in rooms[u]:
            if w not in uses:
                bad.append(f"{me}/: uses {u}/, which uses {w}/, but {me}/'s _USES does not name {w}/ (not closed)")
            elif uses.index(w) < i:
                bad.append(f"{me}/: _USES lists {w}/ before {u}/, which uses it (not a link order)")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
}

check_includes() { # check_includes ROOT: prints the violations, exits 1 if there are any
  LAYERS="$layers" python3 - "$1" <<'EOF'
import os, re, sys
root = sys.argv[1]
rooms = {}
for line in os.environ["LAYERS"].splitlines():
    d, _, allowed = line.partition(":")
    rooms[d.strip()] = allowed.split()
# longest folder first: common/ipc is its own room inside common
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
                        bad.append(f"{rel}:{ln}: #include \"{x}\" ({hit}): {me}/ may use only "
                                   + ", ".join(r + "/" for r in rooms[me])
                                   + f", not {(owner or os.path.dirname(hit)) + '/'}")
for b in bad:
    print(b)
print(f"{nfiles} files, {nincl} quoted includes, {len(bad)} across a layer", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

check_calls() { # check_calls LIBDIR: prints the upward / sideways calls, exits 1 if any
  LAYERS="$layers" python3 - "$1" <<'EOF'
import os, re, subprocess, sys
libdir = sys.argv[1]
sym = re.compile(r'^[^:]*:([^:]*):\s*[0-9a-fA-F]*\s+(\w)\s+(\S+)$')
rooms, lib = {}, {}
for line in os.environ["LAYERS"].splitlines():
    d, _, allowed = line.partition(":")
    d = d.strip()
    rooms[d] = allowed.split()
    # the Makefile names a library after its room: common -> base, common/io -> io, eval -> eval
    lib[d] = "base" if d == "common" else os.path.basename(d)
defined, needs = {}, {}
for d, name in lib.items():
    a = os.path.join(libdir, f"lib{name}.a")
    if not os.path.isfile(a):
        continue
    out = subprocess.run(["nm", "-A", a], capture_output=True, text=True, check=True).stdout
    for l in out.splitlines():  # "ARCHIVE:OBJECT:[ADDRESS] TYPE SYMBOL"
        m = sym.match(l)
        if not m:
            continue
        obj, kind, name = m.groups()
        if kind in "TDBRCVW":
            defined.setdefault(name, d)
        elif kind == "U":
            needs.setdefault(d, []).append((obj, name))
bad = []
for d, syms in needs.items():
    for obj, s in syms:
        owner = defined.get(s)
        if owner is not None and owner not in rooms[d]:
            bad.append(f"lib{lib[d]}.a: {obj} calls {s}, defined in lib{lib[owner]}.a ({owner}/): "
                       f"{d}/ may use only " + ", ".join(r + "/" for r in rooms[d]))
for b in sorted(set(bad)):
    print(b)
print(f"{len(needs)} libraries, {sum(len(v) for v in needs.values())} undefined symbols, "
      f"{len(bad)} across a layer", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

out=$(check_lines "$layers")
if [ $? -ne 0 ]; then echo "$out"; echo "FAIL: the Makefile's _USES lines are not closed or not in link order"; exit 1; fi
if ! check_includes .; then echo "FAIL: an include crosses the layers (Makefile: the _USES lines)"; exit 1; fi
libs_built=
if ls "$BUILD"/libbase.a "$BUILD"/libipc.a "$BUILD"/libio.a >/dev/null 2>&1; then
  libs_built=1
  if ! check_calls "$BUILD"; then echo "FAIL: a library calls across the layers (nm of $BUILD/lib*.a)"; exit 1; fi
else
  echo "note: $BUILD/lib*.a not built: the call check is skipped (the include checks ran)"
fi

tmp=$(mktemp -d /tmp/df_layering.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# the lines: ipc/ taken out of proc/'s line (open), then io/ moved after nn/ in eval/'s
open_lines=$(sed '/^common\/proc:/s# common/ipc##' <<<"$layers")
out=$(check_lines "$open_lines")
if [ $? -eq 0 ] || ! grep -q "common/proc/: uses common/io/, which uses common/ipc/, but .* (not closed)" <<<"$out"; then
  echo "$out"; echo "FAIL: a _USES line without a layer its uses need was not refused"; exit 1
fi
swapped=$(sed '/^eval:/s#common/io common/nn#common/nn common/io#' <<<"$layers")
out=$(check_lines "$swapped")
if [ $? -eq 0 ] || ! grep -q "eval/: _USES lists common/nn/ before common/io/, which uses it" <<<"$out"; then
  echo "$out"; echo "FAIL: a _USES line out of link order was not refused"; exit 1
fi

# the includes: one copy of the rooms, one planted include per case
for d in $(echo "$layers" | cut -d: -f1); do
  mkdir -p "$tmp/src/$(dirname "$d")"; [ -e "$tmp/src/$d" ] || cp -r "$d" "$tmp/src/$d"
done
plant() { # plant FILE HEADER: FILE's first #include gets HEADER's before it, in the copy
  cp "$1" "$tmp/src/$1"
  sed -i "0,/#include/s|#include|#include \"$2\"\n#include|" "$tmp/src/$1"
  grep -q "#include \"$2\"" "$tmp/src/$1" || { echo "FAIL: could not plant $2 in $1"; exit 1; }
}
unplant() { cp "$1" "$tmp/src/$1"; }
refused=()
for c in postproc_worker/pp_copy.c:drafter_worker/trainer.h \
         common/ipc/ring.c:io/topology.h common/ipc/ledger.c:proc/worker.h \
         common/nn/rope.c:io/hfconfig.h common/io/topology.c:proc/ctl.h common/util.c:ipc/ring.h; do
  f=${c%%:*}; h=${c#*:}
  plant "$f" "$h"
  out=$(check_includes "$tmp/src" 2>/dev/null)
  rc=$?
  if [ $rc -eq 0 ] || ! grep -q "^$f:[0-9]*: #include \"$h\"" <<<"$out" || [ "$(wc -l <<<"$out")" -ne 1 ]; then
    echo "$out"; echo "FAIL: a planted include of $h in $f was not refused (alone)"; exit 1
  fi
  refused+=("$out")
  unplant "$f"
done

# the calls: an object that calls topology_load (io) added to a copy of libipc.a
if [ -n "$libs_built" ]; then
  mkdir -p "$tmp/lib"
  cp "$BUILD"/lib*.a "$tmp/lib/"
  printf 'int topology_load(void);\nint zz_planted_upward(void) { return topology_load(); }\n' >"$tmp/zz_planted.c"
  cc -c -o "$tmp/zz_planted.o" "$tmp/zz_planted.c" || { echo "FAIL: cc of the planted call"; exit 1; }
  ar rs "$tmp/lib/libipc.a" "$tmp/zz_planted.o" 2>/dev/null || { echo "FAIL: ar of the planted call"; exit 1; }
  out=$(check_calls "$tmp/lib" 2>/dev/null)
  if [ $? -eq 0 ] || ! grep -q "^libipc.a: zz_planted.o calls topology_load, defined in libio.a" <<<"$out"; then
    echo "$out"; echo "FAIL: a planted call from libipc.a to topology_load (libio.a) was not refused"; exit 1
  fi
  refused+=("$out")
fi

echo "layering: the _USES lines are closed and in link order; every include${libs_built:+ and every call}"
echo "stays in its layer; planted violations refused:"
printf '  %s\n' "${refused[@]}"
