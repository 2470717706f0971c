#!/usr/bin/env bash
# bench/compile_time_ab.sh: what a change to the headers does to a translation unit's build, on
# a machine that other builds share. Compiles each program with two versions of include/ -- A,
# a git revision's (git archive), and B, the work tree's -- alternately (run i of A, then run i
# of B: a machine's load drifts, and both versions see the same drift), with g++ and clang++ at
# -std=c++20 -O2 -c, header-only and in compiled mode (SINGLEFLIGHT_SEPARATE_COMPILATION), and
# prints the medians of CPU seconds (user + sys) and peak RSS of each, and B's change.
#
#   bench/compile_time_ab.sh main                       # main's headers against the work tree's
#   RUNS=5 bench/compile_time_ab.sh main                # medians of 5 (default 3)
#   PROGRAMS='cache.hpp cache.cpp' bench/compile_time_ab.sh main
#   COMPILERS=g++ MODES=compiled bench/compile_time_ab.sh HEAD~1
#
# PROGRAMS (default: cache.hpp group.hpp cache.cpp group.cpp): a file of bench/compile_time/,
# or a public header's name, meaning a TU that includes only that header and has an empty
# main (what parsing the header costs). MODES: header-only, compiled, or both (default).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rev=${1:?usage: bench/compile_time_ab.sh REV (a git revision whose include/ is A)}
runs=${RUNS:-3}
read -r -a compilers <<<"${COMPILERS:-g++ clang++}"
read -r -a programs <<<"${PROGRAMS:-cache.hpp group.hpp cache.cpp group.cpp}"
read -r -a modes <<<"${MODES:-header-only compiled}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/a"
git archive "$rev" include | tar -x -C "$tmp/a"

extra=()
# median, once, medians (once compiles against $inc, set for A and B in turn below)
# shellcheck source=bench/compile_time_lib.sh
. "$root/bench/compile_time_lib.sh"

printf '%-8s %-11s %-10s %16s %16s %8s\n' compiler mode program "A: CPU s, MB" "B: CPU s, MB" "B vs A"
for cxx in "${compilers[@]}"; do
  for mode in "${modes[@]}"; do
    flags=()
    if [ "$mode" = compiled ]; then flags=(-DSINGLEFLIGHT_SEPARATE_COMPILATION); fi
    for p in "${programs[@]}"; do
      if [ -f "$root/bench/compile_time/$p" ]; then
        file=$root/bench/compile_time/$p
      else
        file=$tmp/${p%.hpp}_only.cpp
        printf '#include <singleflight/%s>\nint main() {}\n' "$p" >"$file"
      fi
      rm -f "$tmp"/[AB].[wcr]
      for ((i = 0; i < runs; i++)); do
        for v in A B; do
          inc=$root/include
          if [ "$v" = A ]; then inc=$tmp/a/include; fi
          once "$v" "$cxx" "$file" "${flags[@]}"
        done
      done
      read -r _ ac ar <<<"$(medians A)"
      read -r _ bc br <<<"$(medians B)"
      printf '%-8s %-11s %-10s %9.2f, %4.0f %9.2f, %4.0f %+7.1f%%\n' "$cxx" "$mode" "$p" \
        "$ac" "$ar" "$bc" "$br" "$(awk -v a="$ac" -v b="$bc" 'BEGIN { print 100 * (b - a) / a }')"
    done
  done
done
