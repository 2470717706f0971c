#!/usr/bin/env bash
# ctest example.08-prometheus.scrape: starts examples/08-prometheus serving /metrics on a free
# port (the system picks it: --listen 127.0.0.1:0), scrapes it with curl as Prometheus would,
# and checks the answer: content type, TYPE lines, and the values of its scripted workload.
#
# Usage: tests/prometheus/scrape.sh <path to the 08-prometheus executable>
set -euo pipefail

exe="$1"
fail() {
  printf 'scrape: FAIL: %s\n' "$*" >&2
  exit 1
}
command -v curl >/dev/null 2>&1 || fail "curl not found (apt-get install curl)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/singleflight-scrape.XXXXXX")"
pid=""
cleanup() {
  exec 3>&- 2>/dev/null || true
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The example serves until its stdin closes: give it a FIFO that this script holds open.
mkfifo "$tmp/stdin"
"$exe" --listen 127.0.0.1:0 --port-file "$tmp/port" --serve <"$tmp/stdin" >"$tmp/out" 2>&1 &
pid=$!
exec 3>"$tmp/stdin"

# Bounded wait for the port (sanitizer builds on a busy 2-core machine are slow).
for _ in $(seq 1 600); do
  [ -s "$tmp/port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/out" >&2; fail "08-prometheus exited early"; }
  sleep 0.1
done
[ -s "$tmp/port" ] || { cat "$tmp/out" >&2; fail "no port after 60 s"; }
port="$(cat "$tmp/port")"
echo "scrape: http://127.0.0.1:$port/metrics"

curl -fsS --max-time 20 -D "$tmp/headers" -o "$tmp/metrics" "http://127.0.0.1:$port/metrics" ||
  fail "curl could not scrape http://127.0.0.1:$port/metrics"
grep -qi '^content-type: text/plain' "$tmp/headers" ||
  fail "content type is not text/plain: $(grep -i '^content-type' "$tmp/headers" || true)"

expect() {  # expect <exact line>
  grep -qxF -- "$1" "$tmp/metrics" || {
    grep '^singleflight_' "$tmp/metrics" >&2 || true
    fail "no line '$1' in the scrape (singleflight lines above)"
  }
}
expect '# TYPE singleflight_calls_total counter'
expect '# TYPE singleflight_flights_total counter'
expect '# TYPE singleflight_fn_starts_total counter'
expect '# TYPE singleflight_joins_total counter'
expect '# TYPE singleflight_rejections_total counter'
expect '# TYPE singleflight_failures_total counter'
expect '# TYPE singleflight_cancellations_total counter'
expect '# TYPE singleflight_timeouts_total counter'
expect '# TYPE singleflight_overloaded_total counter'
expect '# TYPE singleflight_in_flight gauge'
expect 'singleflight_calls_total{group="profiles"} 100'
expect 'singleflight_flights_total{group="profiles"} 1'
expect 'singleflight_fn_starts_total{group="profiles"} 1'
expect 'singleflight_joins_total{group="profiles"} 99'
expect 'singleflight_in_flight{group="profiles"} 0'
expect 'singleflight_failures_total{group="avatars"} 1'
expect 'singleflight_cancellations_total{group="avatars"} 1'
# One TYPE line per family, whatever the number of groups.
[ "$(grep -c '^# TYPE singleflight_calls_total ' "$tmp/metrics")" -eq 1 ] ||
  fail "singleflight_calls_total has more than one TYPE line"
echo "scrape: $(grep -c '^singleflight_' "$tmp/metrics") singleflight samples, all as expected"

# Close the example's stdin: it must exit 0 (bounded).
exec 3>&-
for _ in $(seq 1 300); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then fail "08-prometheus did not exit after its stdin closed"; fi
status=0
wait "$pid" || status=$?
pid=""
[ "$status" -eq 0 ] || { cat "$tmp/out" >&2; fail "08-prometheus exited with status $status"; }
