#!/usr/bin/env bash
# ctest docs.snippets: every code block of README.md and docs/*.md marked
#     <!-- snippet: <file> <name> [<name>...] -->
# (the marker on the line before the opening ``` fence) must be, line for line, the block(s)
# between "--- snippet: <name> ---" and "--- end snippet ---" in <file> (a path relative to the
# repository; a comment of any style), dedented; several names are joined with one blank line.
# Those files are compiled and run by the tests, examples or package consumers, so a snippet in
# the documentation cannot drift from code that works.
#
# Usage: tests/docs/check_snippets.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/singleflight-snippets.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# dedent: strips the indentation common to all non-empty lines; trailing spaces too.
dedent() {
  awk '{ lines[NR] = $0; sub(/[ \t]+$/, "", lines[NR])
         if (lines[NR] != "") { match(lines[NR], /^ */); if (min == "" || RLENGTH < min) min = RLENGTH } }
       END { for (i = 1; i <= NR; i++) print substr(lines[i], (lines[i] == "" ? 1 : min + 1)) }'
}

# Blocks: one file per marker, <page>-<n>, with the marker's arguments in <page>-<n>.args and the
# page's path in <page>-<n>.page.
pages=("$root/README.md")
for page in "$root"/docs/*.md; do [ -e "$page" ] && pages+=("$page"); done
p=0
for page in "${pages[@]}"; do
  p=$((p + 1))
  rel="${page#"$root"/}"
  awk -v dir="$tmp" -v pfx="page$p" -v rel="$rel" '
    /^<!-- snippet: .* -->$/ {
      n++; args = $0; sub(/^<!-- snippet: /, "", args); sub(/ -->$/, "", args)
      f = dir "/" pfx "-" n
      print args > (f ".args"); close(f ".args")
      print rel > (f ".page"); close(f ".page")
      want = 1; next
    }
    want == 1 && /^```/ { want = 2; printf "" > f; next }
    want == 1 && !/^[[:space:]]*$/ { print rel ": marker " n " is not followed by a code block" > "/dev/stderr"; exit 1 }
    want == 2 && /^```/ { want = 0; close(f); next }
    want == 2 { print > f }
  ' "$page"
done

count=0
failed=0
for args_file in "$tmp"/page*-*.args; do
  [ -e "$args_file" ] || continue
  block="${args_file%.args}"
  read -r file names <"$args_file"
  page="$(cat "${block}.page")"
  [ -f "$root/$file" ] || { echo "snippets: $file (named in $page) does not exist" >&2; failed=1; continue; }
  : >"$block.source"
  first=1
  for name in $names; do
    [ "$first" -eq 1 ] || echo >>"$block.source"
    first=0
    if ! grep -q -- "--- snippet: $name ---" "$root/$file"; then
      echo "snippets: no snippet '$name' in $file" >&2
      failed=1
      continue
    fi
    awk -v name="$name" '
      index($0, "--- snippet: " name " ---") { on = 1; next }
      on && index($0, "--- end snippet ---") { exit }
      on { print }
    ' "$root/$file" | dedent >>"$block.source"
  done
  dedent <"$block" >"$block.readme"
  count=$((count + 1))
  if ! diff -u --label "$page (snippet: $file $names)" --label "$file" \
    "$block.readme" "$block.source" >&2; then
    failed=1
  fi
done

[ "$count" -gt 0 ] || { echo "snippets: no <!-- snippet: ... --> marker in README.md or docs/" >&2; exit 1; }
if [ "$failed" -ne 0 ]; then
  echo "snippets: the documentation differs from the code it shows (diff above: - docs, + code)" >&2
  exit 1
fi
echo "snippets: $count blocks of README.md and docs/ match the code they come from"
