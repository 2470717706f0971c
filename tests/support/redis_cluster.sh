#!/usr/bin/env bash
# tests/support/redis_cluster.sh start|stop <dir>: the 3-master Redis Cluster of the fleet's
# cluster tests (test_fleet_cluster) when ctest runs them without SINGLEFLIGHT_TEST_REDIS_CLUSTER
# (the ctest fixture fleet_redis_cluster, tests/CMakeLists.txt).
#
#   start: with SINGLEFLIGHT_TEST_REDIS_CLUSTER set, does nothing (a developer or CI gave one).
#          Otherwise starts 3 redis-servers with cluster-enabled on free 127.0.0.1 ports (files
#          in <dir>: nodes-P.conf, P.pid, P.log), joins them with `redis-cli --cluster create`
#          (16384 slots over 3 masters, no replicas), waits (bounded) until every node reports
#          cluster_state:ok, and writes the first node's URI to <dir>/uri, which
#          tests/support/redis.hpp reads when the variable is unset. Without redis-server or
#          redis-cli on PATH it says so loudly and writes no URI: the cluster tests then WARN
#          and pass without running.
#   stop:  stops the servers <dir>/*.pid name, by pid (never by name), and removes <dir>.
set -u
cmd="${1:?start|stop}"
dir="${2:?a directory}"
masters=3

stop_servers() {
  for pidfile in "$dir"/*.pid; do
    [ -s "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

free_port() {
  perl -MIO::Socket::INET -e 'my $s = IO::Socket::INET->new(LocalAddr =>
    "127.0.0.1", LocalPort => 0, Proto => "tcp", Listen => 1) or die; print $s->sockport'
}

# start_node: a cluster-enabled redis-server on a free port; prints the port.
start_node() {
  for _ in 1 2 3 4 5; do
    port="$(free_port)"
    rm -f "$dir/$port.pid"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/nodes-$port.conf" --cluster-node-timeout 1000 \
      --save '' --appendonly no --daemonize yes --pidfile "$dir/$port.pid" \
      --logfile "$dir/$port.log" --dir "$dir" >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
      if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
        echo "$port"
        return 0
      fi
      sleep 0.05
    done
    if [ -s "$dir/$port.pid" ]; then kill "$(cat "$dir/$port.pid")" 2>/dev/null || true; fi
  done
  return 1
}

case "$cmd" in
  start)
    if [ -n "${SINGLEFLIGHT_TEST_REDIS_CLUSTER:-}" ]; then
      echo "cluster tests: SINGLEFLIGHT_TEST_REDIS_CLUSTER=$SINGLEFLIGHT_TEST_REDIS_CLUSTER (given; none started)"
      exit 0
    fi
    stop_servers  # a cluster a previous run left behind: ours, by its pidfiles
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
      echo "*** cluster tests: redis-server or redis-cli is not on PATH: the Redis Cluster" >&2
      echo "*** tests will NOT RUN (they warn and pass). Install redis-server (>= 7.0)," >&2
      echo "*** or set SINGLEFLIGHT_TEST_REDIS_CLUSTER=tcp://HOST:PORT (one node)." >&2
      exit 0
    fi
    mkdir -p "$dir"
    ports=()
    for _ in $(seq 1 "$masters"); do
      if ! p="$(start_node)"; then
        echo "*** cluster tests: a cluster node did not start" >&2
        cat "$dir"/*.log >&2 2>/dev/null || true
        stop_servers
        exit 1
      fi
      ports+=("$p")
    done
    nodes=()
    for p in "${ports[@]}"; do nodes+=("127.0.0.1:$p"); done
    if ! redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
      >"$dir/create.log" 2>&1; then
      cat "$dir/create.log" >&2
      echo "*** cluster tests: redis-cli --cluster create failed" >&2
      stop_servers
      exit 1
    fi
    # Bounded: every node must see the whole cluster as ok (10 s).
    for _ in $(seq 1 200); do
      ok=0
      for p in "${ports[@]}"; do
        if redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
          ok=$((ok + 1))
        fi
      done
      if [ "$ok" -eq "$masters" ]; then
        echo "tcp://127.0.0.1:${ports[0]}" >"$dir/uri"
        echo "cluster tests: 3 masters on ports ${ports[*]} (pids $(cat "$dir"/*.pid | tr '\n' ' '))"
        exit 0
      fi
      sleep 0.05
    done
    for p in "${ports[@]}"; do redis-cli -h 127.0.0.1 -p "$p" cluster info >&2 2>/dev/null; done
    echo "*** cluster tests: the cluster did not reach cluster_state:ok within 10 s" >&2
    stop_servers
    exit 1
    ;;
  stop)
    stop_servers
    ;;
  *)
    echo "usage: $0 start|stop <dir>" >&2
    exit 2
    ;;
esac
