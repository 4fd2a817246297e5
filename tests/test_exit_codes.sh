#!/usr/bin/env bash
# test_exit_codes.sh: one list of exit codes everywhere a user reads them. `orchestrator --help`
# and `dfctl --help` print the same block (orchestrator/exit_codes.h), README.md and
# docs/operations.md hold it verbatim, and its codes are exactly the DF_EXIT_* values of
# common/util.h (0, 1, 2, 100). Before, --help listed 0/1/2 while the README added 100, each
# in its own words.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for b in orchestrator dfctl; do
  [ -x "$BUILD/bin/$b" ] || { echo "FAIL: missing $BUILD/bin/$b: build first"; exit 1; }
done
python3 - "$BUILD" <<'PY'
import re, subprocess, sys
build = sys.argv[1]
def block(text, where):
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if l.strip().lower().startswith("exit codes (the same for every program)"):
            out = [l]
            for m in lines[i + 1:]:
                if not m.startswith("  "):
                    break
                out.append(m)
            return "\n".join(out)
    sys.exit("FAIL: %s has no 'exit codes (the same for every program):' block" % where)
helps = {}
for prog in ("orchestrator", "dfctl"):
    r = subprocess.run([f"{build}/bin/{prog}", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {prog} --help exited {r.returncode}")
    helps[prog] = block(r.stdout, f"{prog} --help")
if helps["orchestrator"] != helps["dfctl"]:
    sys.exit("FAIL: orchestrator --help and dfctl --help list different exit codes:\n%s\n---\n%s"
             % (helps["orchestrator"], helps["dfctl"]))
ref = helps["orchestrator"]
for doc in ("README.md", "docs/operations.md"):
    text = open(doc).read()
    if block(text, doc) != ref:
        sys.exit("FAIL: %s lists the exit codes differently from --help:\n%s\n--- --help:\n%s" % (doc, block(text, doc), ref))
codes = sorted(int(m) for m in re.findall(r"^  (\d+) ", ref, re.M))
util = open("common/util.h").read()
defined = sorted(int(v) for v in re.findall(r"DF_EXIT_[A-Z]+ = (\d+)", util))
if not defined or codes != defined:
    sys.exit(f"FAIL: the list has codes {codes}, common/util.h defines {defined}")
print(f"ok: the same {len(ref.splitlines())}-line list of exit codes {codes} in orchestrator --help, dfctl --help, "
      "README.md and docs/operations.md, equal to DF_EXIT_* in common/util.h")
PY
rc=$?
[ $rc -eq 0 ] && echo "PASS test_exit_codes"
exit $rc
