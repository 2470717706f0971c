#!/usr/bin/env bash
# ctest docs.readme_snippets: every README code block marked
#     <!-- snippet: <file> <name> [<name>...] -->
# (the marker on the line before the opening ``` fence) must be, line for line, the block(s)
# between "--- snippet: <name> ---" and "--- end snippet ---" in <file> (a path relative to the
# repository; a comment of any style), dedented; several names are joined with one blank line.
# Those files are compiled and run by the tests, examples or package consumers, so a README
# snippet cannot drift from code that works.
#
# Usage: tests/docs/check_snippets.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)}"
readme="$root/README.md"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/singleflight-snippets.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# dedent: strips the indentation common to all non-empty lines; trailing spaces too.
dedent() {
  awk '{ lines[NR] = $0; sub(/[ \t]+$/, "", lines[NR])
         if (lines[NR] != "") { match(lines[NR], /^ */); if (min == "" || RLENGTH < min) min = RLENGTH } }
       END { for (i = 1; i <= NR; i++) print substr(lines[i], (lines[i] == "" ? 1 : min + 1)) }'
}

# README blocks: one file per marker, README-<n>, with the marker's arguments in README-<n>.args.
awk -v dir="$tmp" '
  /^<!-- snippet: .* -->$/ {
    n++; args = $0; sub(/^<!-- snippet: /, "", args); sub(/ -->$/, "", args)
    print args > (dir "/README-" n ".args"); close(dir "/README-" n ".args")
    want = 1; next
  }
  want == 1 && /^```/ { want = 2; printf "" > (dir "/README-" n); next }
  want == 1 && !/^[[:space:]]*$/ { print "marker " n " is not followed by a code block" > "/dev/stderr"; exit 1 }
  want == 2 && /^```/ { want = 0; close(dir "/README-" n); next }
  want == 2 { print > (dir "/README-" n) }
' "$readme"

count=0
failed=0
for args_file in "$tmp"/README-*.args; do
  [ -e "$args_file" ] || continue
  block="${args_file%.args}"
  read -r file names <"$args_file"
  [ -f "$root/$file" ] || { echo "snippets: $file (named in README.md) does not exist" >&2; failed=1; continue; }
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
  if ! diff -u --label "README.md (snippet: $file $names)" --label "$file" \
    "$block.readme" "$block.source" >&2; then
    failed=1
  fi
done

[ "$count" -gt 0 ] || { echo "snippets: no <!-- snippet: ... --> marker in README.md" >&2; exit 1; }
if [ "$failed" -ne 0 ]; then
  echo "snippets: README.md differs from the code it shows (diff above: - README, + code)" >&2
  exit 1
fi
echo "snippets: $count README blocks match the code they come from"
