#!/usr/bin/env bash
# bench/fleet_cache/run.sh: fleet_cache's coherence bound measured (docs/fleet_cache.md,
# "The bound, measured").
#   1. builds fleet_cache_driver (Release, `cmake --preset bench`);
#   2. runs it: it starts its own redis-server (a free loopback port, a temporary directory, a
#      pidfile; stopped and restarted by pid), a writer process that changes the origin and
#      calls invalidate every 100 ms, and 4 then 8 reader processes on one hot key, under
#      client tracking and the bus, steady, with CLIENT KILL TYPE pubsub every 200 ms, and
#      with one redis-server restart; then the control (a writer the bus does not carry);
#   3. the gap rows with stale_while_revalidate 10 s (local ttl 60 s): CLIENT KILL at an
#      invalidate (kill) and between two (kill-quiet), and the restart, in both modes.
#
#   bench/fleet_cache/run.sh                # all: 12 runs of 10 s, the control, 12 SWR runs
#   bench/fleet_cache/run.sh base           # the first 12 runs and the control (~3 minutes)
#   bench/fleet_cache/run.sh swr            # the stale_while_revalidate rows (~2.5 minutes)
#   SECONDS_PER_RUN=20 bench/fleet_cache/run.sh
#   BUILD_DIR=/tmp/b bench/fleet_cache/run.sh
# Needs: cmake, ninja, Google Benchmark (the bench preset), libhiredis-dev, redis-server.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
build=${BUILD_DIR:-$PWD/build/bench}
out=$PWD/build/bench-results
mkdir -p "$out"

echo "== building (cmake --preset bench -B $build)" >&2
cmake --preset bench -B "$build" >"$out/fleet-cache-cmake.log" 2>&1
cmake --build "$build" --target fleet_cache_driver >>"$out/fleet-cache-cmake.log" 2>&1 ||
  { cat "$out/fleet-cache-cmake.log" >&2; exit 1; }

secs=${SECONDS_PER_RUN:-10}
rows=${1:-all}
if [[ $rows == all || $rows == base ]]; then
  echo "== fleet_cache_driver" >&2
  "$build/bench/fleet_cache_driver" --seconds "$secs" | tee "$out/fleet_cache_driver.md"
  echo "== the control: the writer invalidates through a plain fleet (no bus message)" >&2
  "$build/bench/fleet_cache_driver" --seconds "$secs" --variants unheard --readers 4 |
    tee -a "$out/fleet_cache_driver.md"
fi
if [[ $rows == all || $rows == swr ]]; then
  echo "== gaps with stale_while_revalidate 10 s (local ttl 60 s)" >&2
  "$build/bench/fleet_cache_driver" --seconds "$secs" --swr-ms 10000 --ttl-s 60 \
    --variants kill,kill-quiet,restart --modes tracking,publish --readers 4,8 |
    tee "$out/fleet_cache_driver_swr.md"
fi
