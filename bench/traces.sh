#!/usr/bin/env bash
# bench/traces.sh: build bench_traces and bench_memory (Release, the `bench` preset, which sets
# -DSINGLEFLIGHT_BUILD_BENCHMARKS=ON) and run them: the cache's hit ratios on the real traces of
# ../shared/traces against LRU, W-TinyLFU, ARC, LIRS and Belady's OPT, then what an entry costs
# at 1M entries (docs/performance.md, "Eviction, measured", holds one run's figures).
#
#   bench/traces.sh                          # every trace, then bench_memory (a few minutes)
#   bench/traces.sh --only gli --no-r06      # arguments go to bench_traces (see its header)
#   TRACES=/path/to/traces bench/traces.sh   # traces elsewhere (default: ../shared/traces)
#   BUILD_DIR=/tmp/b bench/traces.sh         # build somewhere else than build/bench
#   MEMORY=0 bench/traces.sh                 # skip bench_memory
#
# Needs: cmake + ninja + Google Benchmark (for the preset; without them it builds the two
# programs by hand with g++ -O2, which need neither), xz and gzip (the traces are compressed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD_DIR:-$root/build/bench}
traces=${TRACES:-${SINGLEFLIGHT_TRACES:-$root/../shared/traces}}
log=$build/traces-build.log
mkdir -p "$build"

echo "== building bench_traces, bench_memory (cmake --preset bench -B $build)" >&2
tbin=$build/bench/bench_traces
mbin=$build/bench/bench_memory
if ! { cmake --preset bench -B "$build" >"$log" 2>&1 &&
       cmake --build "$build" --target bench_traces bench_memory >>"$log" 2>&1; }; then
  echo "   cmake build failed (see $log); building by hand with g++ -O2" >&2
  tbin=$build/bench_traces
  mbin=$build/bench_memory
  g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/bench_traces.cpp -o "$tbin" -pthread
  g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/bench_memory.cpp -o "$mbin" -pthread
fi

echo "== bench_traces --traces $traces $*" >&2
"$tbin" --traces "$traces" "$@"

if [[ ${MEMORY:-1} != 0 ]]; then
  echo >&2
  echo "== bench_memory (bytes per entry at 1M entries)" >&2
  "$mbin" unbounded
  "$mbin" bounded
fi
