#!/usr/bin/env bash
# ctest docs.links: the relative links of README.md and docs/*.md resolve, every example is
# listed, and every page of docs/ is reachable from README.md.
#  * every link target that is not a URL (`](path)`, `](path#anchor)`) names a file or directory
#    of the repository, relative to the page that links to it;
#  * every anchor (`](#anchor)` in the page itself, `](page.md#anchor)` in another page) is the
#    slug of one of that page's headings (GitHub's rule: lower case, punctuation dropped, spaces to
#    hyphens);
#  * every examples/NN-*.cpp is linked from README.md (the Examples list: one line each);
#  * every docs/*.md is linked from README.md (its Documentation table).
#
# Usage: tests/docs/check_links.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)}"
readme="$root/README.md"
failed=0

# slugs <page>: the anchors of a page's headings, outside fenced code blocks.
slugs() {
  awk '
    /^```/ { fence = !fence; next }
    !fence && /^#+ / {
      h = $0; sub(/^#+ +/, "", h); h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h
    }' "$1"
}

# targets <page>: its link targets, outside fenced code blocks and inline code.
targets() {
  awk '
    /^```/ { fence = !fence; next }
    !fence {
      line = $0
      gsub(/`[^`]*`/, "", line)  # inline code is not a link
      while (match(line, /\]\([^)[:space:]]+\)/)) {
        print substr(line, RSTART + 2, RLENGTH - 3)
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$1"
}

pages=("$readme")
for page in "$root"/docs/*.md; do [ -e "$page" ] && pages+=("$page"); done

count=0
for page in "${pages[@]}"; do
  rel="${page#"$root"/}"
  dir="$(dirname "$page")"
  while IFS= read -r t; do
    [ -n "$t" ] || continue
    case "$t" in
      http://* | https://* | mailto:*) continue ;;
    esac
    count=$((count + 1))
    path="${t%%#*}"
    anchor=""
    [ "$path" = "$t" ] || anchor="${t#*#}"
    target="$page"
    if [ -n "$path" ]; then
      target="$dir/$path"
      if [ ! -e "$target" ]; then
        echo "links: $rel links to $path, which does not exist" >&2
        failed=1
        continue
      fi
    fi
    if [ -n "$anchor" ]; then
      case "$target" in
        *.md) ;;
        *) continue ;;  # an anchor into a source file (a line): not checked
      esac
      if ! grep -qxF -- "$anchor" <<<"$(slugs "$target")"; then
        echo "links: $rel links to ${path}#$anchor, which is no heading's anchor there" >&2
        failed=1
      fi
    fi
  done <<<"$(targets "$page")"
done

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

docs=0
for d in "$root"/docs/*.md; do
  [ -e "$d" ] || continue
  docs=$((docs + 1))
  rel="docs/$(basename "$d")"
  if ! grep -qF -- "]($rel)" "$readme"; then
    echo "links: $rel is not linked from README.md (add a row to its Documentation table)" >&2
    failed=1
  fi
done

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "links: $count relative links resolve; all $examples examples and $docs docs pages are listed"
