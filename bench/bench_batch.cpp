// bench/bench_batch.cpp
//
// Google Benchmark suite for singleflight::batch_loader, measured against a plain
// singleflight::group in the same binary, so that results read as ratios.
//
// Benchmark names are "<scenario>/<param>:<value>.../impl:<impl>". Impls:
//   batch_loader  callers call loader.load(key); the bulk function answers every key of its
//                 batch in one origin call
//   group         callers call group.do_(key, fn); fn is one origin call for one key
//
// The origin: one call costs `rtt_us` (a round trip, slept) whatever it carries, and is
// counted. Callers run on parked threads of a crew (bench/support/crew.hpp), released together
// each round; each records its latency from the release to its value.
//
// Scenarios:
//   distinct_cold/callers:100/max_batch:M/window_us:W/rtt_us:R  100 callers, each asking for a
//       key of its own that nobody asked for before (cold). The group makes 100 origin calls;
//       the loader ceil(100 / M).
//   two_keys/callers:100/...  100 callers of 2 keys (50 each): the group 2 origin calls, the
//       loader 1 bulk call of 2 keys.
//   call_cost_vs_running  the cost of one call made from outside the loader while 0, 100 and
//       500 bulk calls run (held inside the bulk function, each on a worker of its own): a
//       try_load whose caller token is already stopped, so that the figure is the loader's
//       per-call checks plus the group's early rejection (no flight, no thread hand-off).
//       Counters ns_0, ns_100, ns_500 (ns per call, the best of 5 passes of 20,000 calls) and
//       ratio_100, ratio_500 (against ns_0): a call must not pay for other threads' batches.
// Counters (per round):
//   origin_calls     origin calls made
//   keys_per_call    keys carried per origin call
//   median_us, p90_us, max_us   the callers' latencies
//   added_median_us  median_us - rtt_us: what the library added to the origin's round trip at
//                    the median (for the loader: the window, when the caller's batch was not
//                    filled by max_batch, plus the hand-offs)
//
// Every round checks every caller's value and the number of origin calls, and aborts with a
// message when one is wrong. Run from an optimised build:
//   cmake --workflow --preset bench && ./build/bench/bench/bench_batch
#include <singleflight/batch_loader.hpp>
#include <singleflight/group.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/crew.hpp"

namespace {

namespace sf = singleflight;
using clock_type = std::chrono::steady_clock;

sfbench::crew& the_crew() {
  static sfbench::crew c(100);
  return c;
}

[[noreturn]] void fail(const char* what, long long got, long long want) {
  std::fprintf(stderr, "bench_batch: %s: got %lld, want %lld\n", what, got, want);
  std::abort();
}

struct origin {
  std::chrono::microseconds rtt{0};
  std::atomic<long long> calls{0};
  std::atomic<long long> keys{0};
  void call(std::size_t n) {
    calls.fetch_add(1, std::memory_order_relaxed);
    keys.fetch_add(static_cast<long long>(n), std::memory_order_relaxed);
    if (rtt.count() > 0) std::this_thread::sleep_for(rtt);
  }
};

enum class impl { batch_loader, group };

struct scenario {
  int callers = 100;
  int distinct = 100;  // distinct keys per round (callers share them round-robin)
  std::size_t max_batch = 64;
  std::chrono::microseconds window{2000};
  std::chrono::microseconds rtt{0};
};

void run(benchmark::State& state, impl which, const scenario& sc) {
  origin o;
  o.rtt = sc.rtt;
  sf::batch_options opts;
  opts.max_batch = sc.max_batch;
  opts.window = sc.window;
  sf::batch_loader<long long, long long> loader(
      [&o](std::span<const long long> keys) {
        o.call(keys.size());
        return std::vector<long long>(keys.begin(), keys.end());
      },
      opts);
  sf::group<long long, long long> g;
  sfbench::crew& c = the_crew();
  std::vector<double> latencies;
  std::vector<double> round_lat(static_cast<std::size_t>(sc.callers));
  long long base = 0;
  long long rounds = 0;
  const long long want_calls = which == impl::group
                                   ? sc.distinct
                                   : (sc.distinct + static_cast<long long>(sc.max_batch) - 1) /
                                         static_cast<long long>(sc.max_batch);
  for (auto _ : state) {
    const long long calls_before = o.calls.load();
    const auto t0 = clock_type::now();
    c.run(sc.callers, [&](int i) {
      const long long key = base + i % sc.distinct;
      const long long v = which == impl::batch_loader ? loader.load(key) : g.do_(key, [&o, key] {
        o.call(1);
        return key;
      });
      const auto t1 = clock_type::now();
      if (v != key) fail("value", v, key);
      round_lat[static_cast<std::size_t>(i)] =
          std::chrono::duration<double, std::micro>(t1 - t0).count();
    });
    const long long made = o.calls.load() - calls_before;
    // A caller released late may miss a running batch or flight and start its own: the
    // ideal count is a floor, not an exact figure.
    if (made < want_calls) fail("origin calls", made, want_calls);
    latencies.insert(latencies.end(), round_lat.begin(), round_lat.end());
    base += sc.distinct;
    ++rounds;
  }
  std::sort(latencies.begin(), latencies.end());
  auto at = [&](double q) {
    return latencies.empty() ? 0.0
                             : latencies[std::min(latencies.size() - 1,
                                                  static_cast<std::size_t>(q * latencies.size()))];
  };
  const double calls = static_cast<double>(o.calls.load());
  state.counters["origin_calls"] = calls / static_cast<double>(rounds);
  state.counters["keys_per_call"] = static_cast<double>(o.keys.load()) / calls;
  state.counters["median_us"] = at(0.5);
  state.counters["p90_us"] = at(0.9);
  state.counters["max_us"] = latencies.empty() ? 0.0 : latencies.back();
  state.counters["added_median_us"] = at(0.5) - static_cast<double>(sc.rtt.count());
  state.counters["window_us"] = static_cast<double>(sc.window.count());
}

void distinct_cold(benchmark::State& state, impl which) {
  scenario sc;
  sc.max_batch = static_cast<std::size_t>(state.range(0));
  sc.window = std::chrono::microseconds(state.range(1));
  sc.rtt = std::chrono::microseconds(state.range(2));
  run(state, which, sc);
}

void two_keys(benchmark::State& state, impl which) {
  scenario sc;
  sc.distinct = 2;
  sc.window = std::chrono::microseconds(state.range(0));
  sc.rtt = std::chrono::microseconds(state.range(1));
  run(state, which, sc);
}

// The best ns per call of 5 passes of 20,000 try_load calls with a stopped caller token.
double call_ns(sf::batch_loader<long long, long long>& loader, const sf::stop_token& stopped) {
  constexpr int calls = 20000;
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < calls; ++i) {
      sf::outcome<long long> o = loader.try_load(i, stopped);
      if (o.has_value()) fail("a call with a stopped token got a value", 1, 0);
      benchmark::DoNotOptimize(o);
    }
    const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
                      static_cast<double>(calls);
    if (pass == 0 || ns < best) best = ns;
  }
  return best;
}

void call_cost_vs_running(benchmark::State& state) {
  // Negative keys are held inside the bulk function until `release`.
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::atomic<long long> held{0};
  sf::batch_options opts;
  opts.max_batch = 1;  // one batch, one bulk call and one worker per held key
  opts.window = std::chrono::microseconds(0);
  opts.max_in_flight_batches = 0;
  opts.max_threads = 0;
  sf::batch_loader<long long, long long> loader(
      [&](std::span<const long long> keys) {
        if (keys[0] < 0) {
          held.fetch_add(1);
          std::unique_lock<std::mutex> lk(m);
          cv.wait(lk, [&] { return release; });
        }
        return std::vector<long long>(keys.begin(), keys.end());
      },
      opts);
  std::atomic<long long> delivered{0};
  long long next = 0;
  auto hold_until = [&](long long n) {
    while (next < n) {
      loader.async_load(-(++next), [&](sf::outcome<long long>) { delivered.fetch_add(1); });
    }
    while (held.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (loader.stats().running_batches != static_cast<std::uint64_t>(n)) {
      fail("running batches", static_cast<long long>(loader.stats().running_batches), n);
    }
  };
  sf::stop_source src;
  src.request_stop();
  const sf::stop_token stopped = src.get_token();
  double ns0 = 0, ns100 = 0, ns500 = 0;
  for (auto _ : state) {
    ns0 = call_ns(loader, stopped);
    hold_until(100);
    ns100 = call_ns(loader, stopped);
    hold_until(500);
    ns500 = call_ns(loader, stopped);
  }
  {
    const std::lock_guard<std::mutex> lk(m);
    release = true;
  }
  cv.notify_all();
  loader.close();  // waits for every bulk call and delivery
  if (delivered.load() != next) fail("held keys delivered", delivered.load(), next);
  state.counters["ns_0"] = ns0;
  state.counters["ns_100"] = ns100;
  state.counters["ns_500"] = ns500;
  state.counters["ratio_100"] = ns100 / ns0;
  state.counters["ratio_500"] = ns500 / ns0;
}

void cold_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"max_batch", "window_us", "rtt_us"});
  for (long long m : {64, 100}) {
    for (long long w : {200, 2000}) {
      for (long long r : {0, 200}) b->Args({m, w, r});
    }
  }
}

// The group has neither max_batch nor a window: only the round trip varies.
void group_cold_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"max_batch", "window_us", "rtt_us"});
  for (long long r : {0, 200}) b->Args({0, 0, r});
}

void group_two_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"window_us", "rtt_us"});
  for (long long r : {0, 200}) b->Args({0, r});
}

void two_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"window_us", "rtt_us"});
  for (long long w : {200, 2000}) {
    for (long long r : {0, 200}) b->Args({w, r});
  }
}

BENCHMARK_CAPTURE(distinct_cold, callers : 100 / impl
                  : batch_loader, impl::batch_loader)
    ->Apply(cold_args)
    ->UseRealTime()
    ->Iterations(100);
BENCHMARK_CAPTURE(distinct_cold, callers : 100 / impl
                  : group, impl::group)
    ->Apply(group_cold_args)
    ->UseRealTime()
    ->Iterations(100);
BENCHMARK_CAPTURE(two_keys, callers : 100 / impl
                  : batch_loader, impl::batch_loader)
    ->Apply(two_args)
    ->UseRealTime()
    ->Iterations(100);
BENCHMARK_CAPTURE(two_keys, callers : 100 / impl
                  : group, impl::group)
    ->Apply(group_two_args)
    ->UseRealTime()
    ->Iterations(100);

BENCHMARK(call_cost_vs_running)->UseRealTime()->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
