#!/usr/bin/env bash
# bench/compile_time.sh: what including the library costs a build. Compiles, with g++ and
# clang++ at -O2 (-std=c++20, -c, nothing else), each program of bench/compile_time/ three
# times and prints the medians, against the same program written naively with a mutex and an
# unordered_map:
#   group.cpp  one call of group<std::string, int>::do_     baseline naive_group.cpp
#   cache.cpp  one call of cache<std::string, int>::get     baseline naive_cache.cpp
#   cache_loaders.cpp  eight gets, eight loader types       baseline naive_cache.cpp
#   cache_extern.cpp   cache.cpp with SINGLEFLIGHT_EXTERN_CACHE(std::string, int)
#                                                           baseline naive_cache.cpp
#   cache_async.cpp    one call of cache<std::string, int>::async_get
#                                                           baseline naive_cache.cpp
#   cache_async_extern.cpp  cache_async.cpp with SINGLEFLIGHT_EXTERN_CACHE(std::string, int)
#                                                           baseline naive_cache.cpp
# and cache_instantiate.cpp, the one TU that SINGLEFLIGHT_INSTANTIATE_CACHE(std::string, int)
# adds to a program for cache_extern.cpp's type (a fixed cost per program, not per TU).
# Columns: wall-clock seconds, CPU seconds (user + sys: what a parallel build pays; less
# disturbed than wall time by other work on the machine), peak RSS (from /usr/bin/time, when
# it is installed), and each program's ratio to its baseline (of the CPU seconds).
#
# Then compiled mode (SINGLEFLIGHT_SEPARATE_COMPILATION, docs/performance.md "Compile time"):
# group.cpp and cache.cpp compiled in both modes, alternately (run i of one mode, then run i
# of the other: a machine's load drifts, and both modes see the same drift), with the number
# of functions each TU defines (exact: clang++ -O0 -S -emit-llvm, lines starting "define"), and
# src/singleflight.cpp, the one TU that compiled mode adds to a build (a fixed cost per build,
# not per TU).
#
#   bench/compile_time.sh                     # g++ and clang++, 3 runs each
#   RUNS=5 bench/compile_time.sh              # medians of 5
#   COMPILERS=g++ bench/compile_time.sh       # one compiler
#   CXXFLAGS='-DNDEBUG' bench/compile_time.sh # extra flags for every compile
#
# Quiet machine, nothing else building: the figures are per translation unit, so a build
# running beside them inflates the wall-clock column first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
src=$root/bench/compile_time
runs=${RUNS:-3}
read -r -a compilers <<<"${COMPILERS:-g++ clang++}"
read -r -a extra <<<"${CXXFLAGS:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=$root/include
# median, once, medians
# shellcheck source=bench/compile_time_lib.sh
. "$root/bench/compile_time_lib.sh"

# measure <compiler> <file> [flag...]: prints "wall cpu rss_mb" (medians of $runs)
measure() {
  local i
  rm -f "$tmp"/m.*
  for ((i = 0; i < runs; i++)); do once m "$@"; done
  medians m
}

# functions <file> [flag...]: the number of functions the TU defines (clang++ -O0), or "-"
functions() {
  local file=$1
  shift
  if ! command -v clang++ >/dev/null; then
    echo -
    return
  fi
  clang++ -std=c++20 -O0 "${extra[@]}" "$@" -I "$root/include" -S -emit-llvm "$file" -o - |
    grep -c '^define'
}

echo "compile time, -std=c++20 -O2 -c ${extra[*]:-}, medians of $runs ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
printf '%-10s %-18s %8s %8s %8s %8s\n' compiler program wall_s cpu_s rss_MB ratio
for cxx in "${compilers[@]}"; do
  if ! command -v "$cxx" >/dev/null; then
    echo "$cxx: not found, skipped"
    continue
  fi
  for pair in "group naive_group" "cache naive_cache" "cache_loaders naive_cache" \
    "cache_extern naive_cache" "cache_async naive_cache" "cache_async_extern naive_cache"; do
    read -r prog naive <<<"$pair"
    read -r nw nc nr <<<"$(measure "$cxx" "$src/$naive.cpp")"
    read -r pw pc pr <<<"$(measure "$cxx" "$src/$prog.cpp")"
    ratio=$(awk -v a="$pc" -v b="$nc" 'BEGIN { printf "%.2fx", a / b }')
    printf '%-10s %-18s %8s %8s %8s %8s\n' "$cxx" "$naive.cpp" "$nw" "$nc" "$nr" "1.00x"
    printf '%-10s %-18s %8s %8s %8s %8s\n' "$cxx" "$prog.cpp" "$pw" "$pc" "$pr" "$ratio"
  done
  read -r iw ic ir <<<"$(measure "$cxx" "$src/cache_instantiate.cpp")"
  printf '%-10s %-18s %8s %8s %8s %8s\n' "$cxx" "cache_instantiate" "$iw" "$ic" "$ir" "once"
done

sep=-DSINGLEFLIGHT_SEPARATE_COMPILATION
echo
echo "compiled mode ($sep), the two modes alternately, medians of $runs; functions: clang++ -O0"
printf '%-10s %-18s %-12s %8s %8s %8s %9s\n' compiler program mode wall_s cpu_s rss_MB functions
for cxx in "${compilers[@]}"; do
  command -v "$cxx" >/dev/null || continue
  for prog in group cache cache_extern cache_async cache_async_extern; do
    rm -f "$tmp"/h.* "$tmp"/s.*
    for ((i = 0; i < runs; i++)); do
      once h "$cxx" "$src/$prog.cpp"
      once s "$cxx" "$src/$prog.cpp" "$sep"
    done
    read -r hw hc hr <<<"$(medians h)"
    read -r sw sc sr <<<"$(medians s)"
    printf '%-10s %-18s %-12s %8s %8s %8s %9s\n' "$cxx" "$prog.cpp" header-only "$hw" "$hc" "$hr" \
      "$(functions "$src/$prog.cpp")"
    printf '%-10s %-18s %-12s %8s %8s %8s %9s\n' "$cxx" "$prog.cpp" compiled "$sw" "$sc" "$sr" \
      "$(functions "$src/$prog.cpp" "$sep")"
  done
  read -r lw lc lr <<<"$(measure "$cxx" "$root/src/singleflight.cpp" "$sep")"
  printf '%-10s %-18s %-12s %8s %8s %8s %9s\n' "$cxx" "src/singleflight" "once/build" "$lw" "$lc" \
    "$lr" "$(functions "$root/src/singleflight.cpp" "$sep")"
  read -r iw ic ir <<<"$(measure "$cxx" "$src/cache_instantiate.cpp" "$sep")"
  printf '%-10s %-18s %-12s %8s %8s %8s %9s\n' "$cxx" "cache_instantiate" "once/build" "$iw" "$ic" \
    "$ir" "$(functions "$src/cache_instantiate.cpp" "$sep")"
done
