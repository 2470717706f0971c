#!/usr/bin/env bash
# tests/support/fleet_redis.sh start|stop <dir>: the redis-server of the fleet tests when ctest
# runs them without SINGLEFLIGHT_TEST_REDIS (the ctest fixture fleet_redis, tests/CMakeLists.txt).
#
#   start: with SINGLEFLIGHT_TEST_REDIS set, does nothing (.ci/run, or a developer, gave one).
#          Otherwise starts redis-server on a free 127.0.0.1 port, its files in <dir> (pidfile,
#          log), and writes its URI to <dir>/uri, which tests/support/redis.hpp reads when the
#          variable is unset. Without redis-server on PATH it says so loudly and writes no
#          URI: the tests that need Redis then report Skipped.
#   stop:  stops the server <dir>/r.pid names, by pid (never by name), and removes <dir>.
set -u
cmd="${1:?start|stop}"
dir="${2:?a directory}"

stop_server() {
  if [ -s "$dir/r.pid" ]; then
    pid="$(cat "$dir/r.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

case "$cmd" in
  start)
    if [ -n "${SINGLEFLIGHT_TEST_REDIS:-}" ]; then
      echo "fleet tests: SINGLEFLIGHT_TEST_REDIS=$SINGLEFLIGHT_TEST_REDIS (given; none started)"
      exit 0
    fi
    stop_server  # a server a previous run left behind: ours, by its pidfile
    if ! command -v redis-server >/dev/null 2>&1; then
      echo "*** fleet tests: redis-server is not on PATH: the fleet tests that need Redis" >&2
      echo "*** will be SKIPPED. Install redis-server, or set SINGLEFLIGHT_TEST_REDIS." >&2
      exit 0
    fi
    mkdir -p "$dir"
    for attempt in 1 2 3 4 5; do
      port="$(perl -MIO::Socket::INET -e 'my $s = IO::Socket::INET->new(LocalAddr =>
        "127.0.0.1", LocalPort => 0, Proto => "tcp", Listen => 1) or die; print $s->sockport')"
      rm -f "$dir/r.pid"
      redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize yes --pidfile "$dir/r.pid" --logfile "$dir/r.log" --dir "$dir" || true
      for _ in $(seq 1 100); do
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
          echo "tcp://127.0.0.1:$port" > "$dir/uri"
          echo "fleet tests: redis-server pid $(cat "$dir/r.pid") on tcp://127.0.0.1:$port"
          exit 0
        fi
        sleep 0.05
      done
      echo "redis-server did not answer on port $port (attempt $attempt)" >&2
      if [ -s "$dir/r.pid" ]; then kill "$(cat "$dir/r.pid")" 2>/dev/null || true; fi
    done
    cat "$dir/r.log" >&2 2>/dev/null || true
    echo "*** fleet tests: redis-server did not start" >&2
    exit 1
    ;;
  stop)
    stop_server
    ;;
  *)
    echo "usage: $0 start|stop <dir>" >&2
    exit 2
    ;;
esac
