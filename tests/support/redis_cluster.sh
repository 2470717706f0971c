#!/usr/bin/env bash
# tests/support/redis_cluster.sh start|stop <dir> [replicas]: the Redis Cluster of the fleet's
# cluster tests when ctest runs them without SINGLEFLIGHT_TEST_REDIS_CLUSTER: 3 masters
# (replicas 0, the default: the fixture fleet_redis_cluster of test_fleet_cluster), or 3 masters
# with one replica each (replicas 1: the fixture fleet_redis_failover of
# test_fleet_cluster_failover, which kills and fails masters over); tests/CMakeLists.txt.
#
#   start: with SINGLEFLIGHT_TEST_REDIS_CLUSTER set, does nothing (a developer or CI gave one).
#          Otherwise starts 3 x (1 + replicas) redis-servers with cluster-enabled on free
#          127.0.0.1 ports (files in <dir>: nodes-P.conf, P.pid, P.log), joins them with
#          `redis-cli --cluster create --cluster-replicas <replicas>` (16384 slots over 3
#          masters), waits (bounded) until every node reports cluster_state:ok and every replica
#          is in sync with its master (master_link_status:up), and writes the first node's URI
#          to <dir>/uri, which tests/support/redis.hpp reads when the variable is unset (a
#          test that kills a node finds its pid in <dir>/P.pid). Without redis-server or
#          redis-cli on PATH it says so loudly and writes no URI: the cluster tests then WARN
#          and pass without running.
#          Every node: cluster-require-full-coverage no (a master that is down costs its own
#          slots only, not the whole cluster: Redis' default answers CLUSTERDOWN for every key
#          until a replica takes over), repl-diskless-sync-delay 0 (replicas in sync at once),
#          shutdown-timeout 0 (stop does not wait for replicas).
#   stop:  stops the servers <dir>/*.pid name, by pid (never by name), and removes <dir>.
set -u
cmd="${1:?start|stop}"
dir="${2:?a directory}"
replicas="${3:-0}"
masters=3
nodes_total=$((masters * (1 + replicas)))

# stop_servers: SIGTERM to every node at once, then waits for each (bounded), then SIGKILL.
stop_servers() {
  pids=()
  for pidfile in "$dir"/*.pid; do
    [ -s "$pidfile" ] || continue
    pids+=("$(cat "$pidfile")")
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$dir"
}

# free_port: a free loopback port whose cluster bus port (+10000) is a port too: a node on a
# port above 55535 refuses to start ("Redis port number too high").
free_port() {
  perl -MIO::Socket::INET -e 'for (1 .. 100) { my $s = IO::Socket::INET->new(LocalAddr =>
    "127.0.0.1", LocalPort => 0, Proto => "tcp", Listen => 1) or die;
    if ($s->sockport <= 55535) { print $s->sockport; exit 0 } } exit 1'
}

# start_node: a cluster-enabled redis-server on a free port; prints the port.
start_node() {
  for _ in 1 2 3 4 5; do
    port="$(free_port)"
    rm -f "$dir/$port.pid"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/nodes-$port.conf" --cluster-node-timeout 1000 \
      --repl-diskless-sync-delay 0 --shutdown-timeout 0 --cluster-require-full-coverage no \
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
    for _ in $(seq 1 "$nodes_total"); do
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
    if ! redis-cli --cluster create "${nodes[@]}" --cluster-replicas "$replicas" --cluster-yes \
      >"$dir/create.log" 2>&1; then
      cat "$dir/create.log" >&2
      echo "*** cluster tests: redis-cli --cluster create failed" >&2
      stop_servers
      exit 1
    fi
    # Bounded (20 s): every node sees the whole cluster as ok, and every replica is in sync.
    for _ in $(seq 1 400); do
      ok=0
      synced=0
      for p in "${ports[@]}"; do
        if redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
          ok=$((ok + 1))
        fi
        repl="$(redis-cli -h 127.0.0.1 -p "$p" info replication 2>/dev/null | tr -d '\r')"
        if printf '%s\n' "$repl" | grep -q '^role:slave' &&
          printf '%s\n' "$repl" | grep -q '^master_link_status:up' &&
          printf '%s\n' "$repl" | grep -q '^master_sync_in_progress:0'; then
          synced=$((synced + 1))
        fi
      done
      if [ "$ok" -eq "$nodes_total" ] && [ "$synced" -eq $((masters * replicas)) ]; then
        echo "tcp://127.0.0.1:${ports[0]}" >"$dir/uri"
        echo "cluster tests: $masters masters, $replicas replica(s) each, on ports ${ports[*]}" \
          "(pids $(cat "$dir"/*.pid | tr '\n' ' '))"
        exit 0
      fi
      sleep 0.05
    done
    for p in "${ports[@]}"; do
      redis-cli -h 127.0.0.1 -p "$p" cluster info >&2 2>/dev/null
      redis-cli -h 127.0.0.1 -p "$p" info replication >&2 2>/dev/null
    done
    echo "*** cluster tests: the cluster did not reach cluster_state:ok with its replicas in sync within 20 s" >&2
    stop_servers
    exit 1
    ;;
  stop)
    stop_servers
    ;;
  *)
    echo "usage: $0 start|stop <dir> [replicas]" >&2
    exit 2
    ;;
esac
