#!/usr/bin/env bash
# ctest headers.umbrella: singleflight/singleflight.hpp includes every public header of the core
# (every include/singleflight/*.hpp) except the ones that need another library, which have
# targets of their own: asio.hpp (singleflight::asio), prometheus.hpp (singleflight::prometheus),
# fleet.hpp and fleet_*.hpp (singleflight::fleet); nor src.hpp, compiled mode's one translation unit
# (singleflight::compiled). And it includes none of those.
#
# Usage: tests/check_umbrella.sh [<repository root>]
set -euo pipefail

root="${1:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)}"
inc="$root/include/singleflight"
umbrella="$inc/singleflight.hpp"
failed=0

included="$(sed -nE 's/^#include "([^"/]+[.]hpp)".*/\1/p' "$umbrella" | sort -u)"
optional() { case "$1" in asio.hpp | prometheus.hpp | fleet.hpp | fleet_*.hpp | src.hpp) return 0 ;; esac; return 1; }

count=0
for path in "$inc"/*.hpp; do
  h="$(basename "$path")"
  [ "$h" != singleflight.hpp ] || continue
  if optional "$h"; then
    if grep -qxF -- "$h" <<<"$included"; then
      echo "umbrella: singleflight.hpp includes $h, which needs another library (its own target)" >&2
      failed=1
    fi
    continue
  fi
  count=$((count + 1))
  if ! grep -qxF -- "$h" <<<"$included"; then
    echo "umbrella: singleflight.hpp does not include $h (a core header)" >&2
    failed=1
  fi
done

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "umbrella: singleflight.hpp includes all $count core headers and none of the optional ones"
