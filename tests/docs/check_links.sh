#!/usr/bin/env bash
# ctest docs.readme_links: README.md's relative links resolve, and every example is listed.
#  * every link target that is not a URL (`](path)`, `](path#anchor)`) names a file or directory
#    of the repository;
#  * every in-page anchor (`](#anchor)`) is the slug of one of README's headings (GitHub's rule:
#    lower case, punctuation dropped, spaces to hyphens);
#  * every examples/NN-*.cpp is linked from README.md (the Examples list: one line each).
#
# Usage: tests/docs/check_links.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)}"
readme="$root/README.md"
failed=0

# Headings' slugs, outside fenced code blocks.
slugs="$(awk '
  /^```/ { fence = !fence; next }
  !fence && /^#+ / {
    h = $0; sub(/^#+ +/, "", h); h = tolower(h)
    gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h
  }' "$readme")"

# Link targets, outside fenced code blocks.
targets="$(awk '
  /^```/ { fence = !fence; next }
  !fence {
    line = $0
    gsub(/`[^`]*`/, "", line)  # inline code is not a link
    while (match(line, /\]\([^)[:space:]]+\)/)) {
      print substr(line, RSTART + 2, RLENGTH - 3)
      line = substr(line, RSTART + RLENGTH)
    }
  }' "$readme")"

count=0
while IFS= read -r t; do
  [ -n "$t" ] || continue
  case "$t" in
    http://* | https://* | mailto:*) continue ;;
  esac
  count=$((count + 1))
  if [ "${t#\#}" != "$t" ]; then
    if ! grep -qxF -- "${t#\#}" <<<"$slugs"; then
      echo "links: README.md links to #${t#\#}, which is no heading's anchor" >&2
      failed=1
    fi
    continue
  fi
  path="${t%%#*}"
  if [ ! -e "$root/$path" ]; then
    echo "links: README.md links to $path, which does not exist" >&2
    failed=1
  fi
done <<<"$targets"

examples=0
for e in "$root"/examples/[0-9][0-9]-*.cpp; do
  [ -e "$e" ] || continue
  examples=$((examples + 1))
  rel="examples/$(basename "$e")"
  if ! grep -qF -- "]($rel)" "$readme"; then
    echo "links: $rel is not linked from README.md (add a line to the Examples list)" >&2
    failed=1
  fi
done

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "links: $count relative links resolve; all $examples examples are listed"
