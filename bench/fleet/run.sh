#!/usr/bin/env bash
# bench/fleet/run.sh: the fleet's measurements (docs/fleet.md, "Failures, measured").
#   1. builds bench_fleet and fleet_driver (Release, `cmake --preset bench`);
#   2. starts a redis-server on a free loopback port (temp dir, pidfile, --save ''
#      --appendonly no), stopped by pid on exit, and runs bench_fleet against it (Google
#      Benchmark: hit and miss paths vs bare hiredis round trips, round trips per call);
#   3. runs fleet_driver, which starts its own redis-server (it stops, freezes and pauses it)
#      and N worker processes: origin calls per key per expiry (no coalescing / per-process
#      groups / fleet), the fault scenarios, the cost of hits and misses.
#
#   bench/fleet/run.sh            # everything (~2 minutes on 2 cores)
#   QUICK=1 bench/fleet/run.sh    # fewer rounds
#   CLUSTER=1 bench/fleet/run.sh  # instead: fleet_driver --cluster, a Redis Cluster of 3 masters
#                                 # it starts itself (tests/support/redis_cluster.sh; needs
#                                 # redis-cli too): origin calls per key, hit and miss costs,
#                                 # a leader SIGKILLed, a master SIGKILLed (~20 s); then
#                                 # fleet_driver --cluster --trials 20 (QUICK: 3; TRIALS=N to
#                                 # choose, 0 to skip), 3 masters + 3 replicas: the hot key's
#                                 # slot resharded, its master failed over (FORCE) and SIGKILLed,
#                                 # N times each (~4 minutes for 20)
#   BUILD_DIR=/tmp/b bench/fleet/run.sh
# Needs: cmake, ninja, Google Benchmark, libhiredis-dev, redis-server, perl.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
build=${BUILD_DIR:-$PWD/build/bench}
out=$PWD/build/bench-results
mkdir -p "$out"

echo "== building (cmake --preset bench -B $build)" >&2
cmake --preset bench -B "$build" >"$out/fleet-cmake.log" 2>&1
if [ -n "${CLUSTER:-}" ]; then
  cmake --build "$build" --target fleet_driver >>"$out/fleet-cmake.log" 2>&1 ||
    { cat "$out/fleet-cmake.log" >&2; exit 1; }
  args=(--cluster)
  [ -n "${QUICK:-}" ] && args+=(--quick)
  echo "== fleet_driver --cluster" >&2
  "$build/bench/fleet_driver" "${args[@]}" | tee "$out/fleet_driver_cluster.md"
  trials=${TRIALS:-20}
  [ -n "${QUICK:-}" ] && [ -z "${TRIALS:-}" ] && trials=3
  if [ "$trials" -gt 0 ]; then
    echo "== fleet_driver --cluster --trials $trials" >&2
    "$build/bench/fleet_driver" --cluster --trials "$trials" |
      tee "$out/fleet_driver_cluster_trials.md"
  fi
  exit 0
fi
cmake --build "$build" --target bench_fleet fleet_driver >>"$out/fleet-cmake.log" 2>&1 ||
  { cat "$out/fleet-cmake.log" >&2; exit 1; }

dir="$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench.XXXXXX")"
stop_redis() {
  if [ -s "$dir/r.pid" ]; then
    kill "$(cat "$dir/r.pid")" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$(cat "$dir/r.pid")" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -rf "$dir"
}
trap stop_redis EXIT
port="$(perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(LocalAddr => "127.0.0.1",
  LocalPort => 0, Proto => "tcp", Listen => 1)->sockport')"
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
  --pidfile "$dir/r.pid" --logfile "$dir/r.log" --dir "$dir"
for _ in $(seq 1 200); do
  [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
  sleep 0.05
done

echo "== bench_fleet (Google Benchmark, redis-server on port $port)" >&2
SINGLEFLIGHT_BENCH_REDIS="tcp://127.0.0.1:$port" "$build/bench/bench_fleet" \
  --benchmark_repetitions="${REPS:-3}" --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.5 | tee "$out/bench_fleet.txt"

echo "== fleet_driver" >&2
args=()
[ -n "${QUICK:-}" ] && args+=(--quick)
"$build/bench/fleet_driver" "${args[@]}" | tee "$out/fleet_driver.md"
