#!/usr/bin/env bash
# test_format: every C / CUDA source of the tree is as .clang-format lays it out
# (clang-format --dry-run --Werror, no file changed). The tree is formatted with Debian's
# clang-format 14 (scripts/install_deps.sh installs it); another major version lays some
# constructs out differently, so with one the test says so and skips. Then a planted
# misformatted copy of a file must be refused (the check can fail).
set -u
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "SKIPPED: no clang-format (make deps installs it)"; exit 77; }
ver=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
[ "$ver" = 14 ] || { echo "SKIPPED: clang-format $ver; the tree is laid out with version 14"; exit 77; }
files=$(git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null || find common eval orchestrator target_worker \
  postproc_worker drafter_worker tests bench fuzz -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')
out=$(clang-format --dry-run --Werror $files 2>&1)
if [ -n "$out" ]; then
  echo "$out" | grep -E '^[^ ].*(warning|error):' | cut -d: -f1 | sort -u | head -20
  echo "FAIL: the files above are not as .clang-format lays them out (clang-format -i FILE)"; exit 1
fi
tmp=$(mktemp -d /tmp/df_test_format_XXXXXX); trap 'rm -rf "$tmp"' EXIT
cp .clang-format "$tmp/"
sed 's/^    return /  return  /' common/util.c >"$tmp/bad.c"
if clang-format --dry-run --Werror "$tmp/bad.c" >/dev/null 2>&1; then
  echo "FAIL: a misindented copy of common/util.c was not refused"; exit 1
fi
echo "PASS: $(echo $files | wc -w) files as .clang-format lays them out (a planted misindent is refused)"
