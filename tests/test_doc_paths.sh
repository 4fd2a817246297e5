#!/usr/bin/env bash
# test_doc_paths: every docs/<name>.md that any file of the tree cites (code, scripts,
# tests, docs, README, Makefile) exists. A citation of a page that is not in the
# repository fails with the file and line that makes it. Then the same scan is run with
# one planted dangling citation and must refuse it (the check can fail).
set -u
cd "$(dirname "$0")/.."

scan() { # scan FILE...: prints "file:line:<the path>" for each citation of a missing page
  grep -I -H -n -o -E 'docs/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md' "$@" 2>/dev/null |
  while IFS= read -r hit; do
    path=${hit##*:}
    [ -f "$path" ] || echo "$hit"
  done
}

mapfile -t files < <(git ls-files -co --exclude-standard | while IFS= read -r f; do [ -f "$f" ] && echo "$f"; done)
[ ${#files[@]} -gt 0 ] || { echo "FAIL: no files listed (not a git checkout?)"; exit 1; }
n=$(grep -I -o -h -E 'docs/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md' "${files[@]}" 2>/dev/null | wc -l)
bad=$(scan "${files[@]}")
if [ -n "$bad" ]; then
  echo "$bad"; echo "FAIL: the lines above cite docs that are not in the repository"; exit 1
fi

tmp=$(mktemp /tmp/df_doc_paths.XXXXXX)
trap 'rm -f "$tmp"' EXIT
page=no_such_page   # spelled apart so that this file itself cites nothing missing
printf 'see docs/ring.md and docs/%s.md\n' "$page" >"$tmp"
planted=$(scan "$tmp")
if [ "$planted" != "$tmp:1:docs/$page.md" ]; then
  echo "got: '$planted'"; echo "FAIL: a planted dangling citation was not reported"; exit 1
fi
echo "doc paths: $n citations of docs/*.md in ${#files[@]} files, every page exists; a planted dangling one is reported"
