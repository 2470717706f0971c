#!/usr/bin/env bash
# ctest docs.architecture: docs/architecture.md is the one map of the library's files. Every
# header under include/singleflight/ is named there (as `path`, relative to
# include/singleflight/), and every `*.hpp` path named there exists.
#
# Usage: tests/docs/check_architecture.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)}"
page="$root/docs/architecture.md"
inc="$root/include/singleflight"
failed=0

# The `...hpp` spans of the page, outside fenced code blocks.
named="$(awk '
  /^```/ { fence = !fence; next }
  !fence {
    line = $0
    while (match(line, /`[^` ]+[.]hpp`/)) {
      print substr(line, RSTART + 1, RLENGTH - 2)
      line = substr(line, RSTART + RLENGTH)
    }
  }' "$page" | sort -u)"

headers="$(cd "$inc" && find . -name '*.hpp' | sed 's|^\./||' | sort)"
count=0
while IFS= read -r h; do
  [ -n "$h" ] || continue
  count=$((count + 1))
  if ! grep -qxF -- "$h" <<<"$named"; then
    echo "architecture: include/singleflight/$h is not named in docs/architecture.md (add it to the map)" >&2
    failed=1
  fi
done <<<"$headers"
while IFS= read -r n; do
  [ -n "$n" ] || continue
  if [ ! -f "$inc/$n" ]; then
    echo "architecture: docs/architecture.md names $n, which is not a file under include/singleflight/" >&2
    failed=1
  fi
done <<<"$named"

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "architecture: all $count headers are on the map, and the map names no other file"
