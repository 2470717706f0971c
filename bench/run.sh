#!/usr/bin/env bash
# bench/run.sh: build the C++ benchmarks (Release), run them and the Go peer, and
# print one side-by-side markdown table plus the "Async" block (bench_async:
# callback and coroutine waiters) and the "Cache" block (bench_cache: the goals
# of singleflight::cache); writes bench/results.json (and bench/chart.png when
# gnuplot is installed).
#
#   bench/run.sh                 # everything (about 6-7 minutes on 2 cores)
#   FILTER='leader' bench/run.sh # only matching C++ benchmarks / Go scenarios
#   REPS=1 bench/run.sh          # quicker, noisier
#   BUILD_DIR=/tmp/b bench/run.sh  # build somewhere else than build/bench
#
# Needs: cmake + ninja + Google Benchmark; Debian's golang-go and
# golang-golang-x-sync-dev for the Go peer (skipped with a note if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/build/bench-results
mkdir -p "$out"
reps=${REPS:-3}
filter=${FILTER:-}

build=${BUILD_DIR:-$root/build/bench}
echo "== building (cmake --preset bench -B $build)" >&2
bin=$build/bench/bench_group
abin=$build/bench/bench_async
cbin=$build/bench/bench_cache
if ! { cmake --preset bench -B "$build" >"$out/cmake.log" 2>&1 && cmake --build "$build" --target bench_group bench_async bench_cache >>"$out/cmake.log" 2>&1; }; then
  echo "   cmake build failed (see $out/cmake.log); building by hand with g++ -O2" >&2
  bin=$out/bench_group
  abin=$out/bench_async
  cbin=$out/bench_cache
  g++ -O2 -DNDEBUG -std=c++20 -I include bench/bench_group.cpp -o "$bin" -lbenchmark -pthread
  g++ -O2 -DNDEBUG -std=c++20 -I include bench/bench_async.cpp -o "$abin" -lbenchmark -pthread
  g++ -O2 -DNDEBUG -std=c++20 -I include bench/bench_cache.cpp -o "$cbin" -lbenchmark -pthread
fi

echo "== running C++ ($bin, $reps repetitions)" >&2
args=(--benchmark_format=json --benchmark_out="$out/cpp.json" --benchmark_out_format=json
      --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true)
[[ -n $filter ]] && args+=(--benchmark_filter="$filter")
"$bin" "${args[@]}" >/dev/null 2>"$out/cpp.stderr" || { cat "$out/cpp.stderr" >&2; exit 1; }

echo "== running async waiters ($abin, $reps repetitions)" >&2
rm -f "$out/async.json"
aargs=(--benchmark_format=json --benchmark_out="$out/async.json" --benchmark_out_format=json
       --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true)
[[ -n $filter ]] && aargs+=(--benchmark_filter="$filter")
"$abin" "${aargs[@]}" >/dev/null 2>"$out/async.stderr" || { cat "$out/async.stderr" >&2; exit 1; }
async_args=()
[[ -s $out/async.json ]] && async_args=(--async "$out/async.json")

echo "== running cache ($cbin, $reps repetitions)" >&2
rm -f "$out/cache.json"
cargs=(--benchmark_format=json --benchmark_out="$out/cache.json" --benchmark_out_format=json
       --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true)
[[ -n $filter ]] && cargs+=(--benchmark_filter="$filter")
"$cbin" "${cargs[@]}" >/dev/null 2>"$out/cache.stderr" || { cat "$out/cache.stderr" >&2; exit 1; }
[[ -s $out/cache.json ]] && async_args+=(--cache "$out/cache.json")

go_json=""
if command -v go >/dev/null && [[ -d /usr/share/gocode/src/golang.org/x/sync/singleflight ]]; then
  echo "== running Go peer (golang.org/x/sync/singleflight)" >&2
  export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE=${GOCACHE:-$out/gocache}
  (cd bench/peers/go && go build -o "$out/sfgo" .)
  "$out/sfgo" -reps "$reps" ${filter:+-filter "$filter"} >"$out/go.json" 2>"$out/go.stderr"
  go_json=$out/go.json
else
  echo "== Go peer skipped: apt-get install -y golang-go golang-golang-x-sync-dev" >&2
fi

echo "== report" >&2
status=0
python3 bench/report.py "$out/cpp.json" $go_json "${async_args[@]}" --out bench/results.json | tee "$out/table.md" || status=$?

if command -v gnuplot >/dev/null; then
  python3 - "$root/bench/results.json" "$out/chart.dat" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
with open(sys.argv[2], "w") as f:
    for r in rows:
        if r["scenario"].startswith("leader_") and r["metric"] == "ns_per_call":
            v = r["values"]
            f.write("%s %s %s %s %s\n" % (r["scenario"].replace("_", "-"),
                    *[v.get(k) if v.get(k) is not None else "NaN" for k in ("lib", "naive_future", "naive_cv", "go")]))
PY
  gnuplot -e "set terminal png size 900,500; set output '$root/bench/chart.png';
    set title 'Uncontended leader path (ns/call, lower is better)'; set style data histograms;
    set style fill solid; set ylabel 'ns/call'; set key top left;
    plot '$out/chart.dat' using 2:xtic(1) title 'lib', '' using 3 title 'naive future (b)',
         '' using 4 title 'naive cv (c)', '' using 5 title 'Go x/sync'" && echo "   wrote bench/chart.png" >&2
fi
exit $status
