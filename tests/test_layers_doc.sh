#!/usr/bin/env bash
# test_layers_doc: docs/layers.md's picture of the layers is the one the code gives now
# (scripts/layers.py: the Makefile's _USES lines and the includes between the rooms).
# Then a copy of the page with one include count changed, and one with a room's line in the
# table taken out, must both be refused (the check can fail).
set -u
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "SKIPPED: no python3"; exit 77; }
out=$(scripts/layers.py --check docs/layers.md 2>&1)
if [ $? -ne 0 ]; then
  echo "$out"; echo "FAIL: docs/layers.md is not what scripts/layers.py makes of the code (run it with --write)"; exit 1
fi
tmp=$(mktemp /tmp/df_layers_doc.XXXXXX)
trap 'rm -f "$tmp"' EXIT
sed -E '0,/-->\|[0-9]+\| base_/s/-->\|([0-9]+)\| base_/-->|9999| base_/' docs/layers.md >"$tmp"
grep -q -- '-->|9999| base_' "$tmp" || { echo "FAIL: could not plant a count (the page changed form?)"; exit 1; }
if scripts/layers.py --check "$tmp" 2>/dev/null; then echo "FAIL: a wrong include count was not refused"; exit 1; fi
grep -v '^| `common/io/` |' docs/layers.md >"$tmp"
if scripts/layers.py --check "$tmp" 2>/dev/null; then echo "FAIL: a page without io's row was not refused"; exit 1; fi
echo "PASS: docs/layers.md is the code's picture of the layers (a wrong count and a missing row are refused)"
