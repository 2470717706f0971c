// bench/bench_group.cpp
//
// Google Benchmark suite for singleflight::group, with the baselines of
// bench/baselines.hpp in the same binary so that results can be read as
// ratios (bench/report.py does that, bench/run.sh drives it).
//
// Benchmark names are "<scenario>[/<param>:<value>...]/impl:<impl>" followed
// by Google Benchmark's own suffixes (/real_time, /threads:N, ...). Impls:
//   direct        (a) no coalescing, fn called directly
//   naive_future  (b) std::mutex + unordered_map<Key, shared_future<T>>
//   naive_cv      (c) std::mutex + unordered_map<Key, shared_ptr<call>> + per-call cv
//   naive_cv_any  (c) with std::condition_variable_any (stop_token waits; churn only)
//   lib           singleflight::group, fn()                 (no stop_source per flight)
//   lib_tok       singleflight::group, fn(std::stop_token)  (one stop_source per flight)
//
// Allocation counting: this binary replaces the global operator new/delete
// (bench/support/alloc.hpp). Every allocation is counted in thread-local counters (used to
// attribute allocations to individual calls, e.g. per join) and, unless a benchmark switches it
// off, in global relaxed atomics (g_allocs / g_alloc_bytes). The multi-threaded throughput
// benchmarks switch the global atomics off so that the counter's cache line does not bounce between
// cores inside the timing.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "baselines.hpp"
#include "singleflight/singleflight.hpp"
// This binary's operator new/delete, with live bytes and process-wide tallies as well.
#define SFBENCH_ALLOC_LIVE_AND_GLOBAL 1
#include "support/alloc.hpp"
#include "support/crew.hpp"

namespace {

using clk = std::chrono::steady_clock;
using value_t = std::uint64_t;

double ns_between(clk::time_point a, clk::time_point b) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A key shaped like the ones the library's docs recommend (longer than the
// small-string buffer, so storing it in a map allocates).
std::string make_key(int tenant, int user, int thread = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "tenant-%03d|user-%06d|en-GB|v3|t%d", tenant, user, thread);
  return buf;
}

std::vector<std::string> make_keys(int n, int thread = 0) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) keys.push_back(make_key(i % 97, i, thread));
  return keys;
}

// ---------------------------------------------------------------------------
// Implementations under test, behind one interface:
//   T do_(const Key&, F&&);  T do_(const Key&, F&&, std::stop_token) (some);
//   sfbench::counts stats() const;  static constexpr const char* name;
// ---------------------------------------------------------------------------
template <class Key, class T>
struct direct_impl : sfbench::direct_call<Key, T> {
  static constexpr const char* name = "direct";
  sfbench::counts stats() const { return {}; }
};

template <class Key, class T>
struct future_impl : sfbench::future_group<Key, T> {
  static constexpr const char* name = "naive_future";
};

template <class Key, class T>
struct cv_impl : sfbench::cv_group<Key, T> {
  static constexpr const char* name = "naive_cv";
};

template <class Key, class T>
struct cv_any_impl : sfbench::cv_group<Key, T, std::hash<Key>, std::condition_variable_any> {
  static constexpr const char* name = "naive_cv_any";
};

template <class Key, class T>
struct lib_impl {
  static constexpr const char* name = "lib";
  singleflight::group<Key, T> g;
  lib_impl() = default;
  explicit lib_impl(singleflight::options o) : g(std::move(o)) {}
  template <class F>
  T do_(const Key& k, F&& f) {
    return g.do_(k, std::forward<F>(f));
  }
  template <class F>
  T do_(const Key& k, F&& f, std::stop_token st) {
    return g.do_(k, std::forward<F>(f), std::move(st));
  }
  sfbench::counts stats() const {
    const singleflight::stats s = g.stats();
    return {s.calls, s.flights, s.joins};
  }
};

// The same group, but fn takes the flight's stop_token (the documented usage):
// each flight then owns a std::stop_source.
template <class Key, class T>
struct lib_tok_impl : lib_impl<Key, T> {
  static constexpr const char* name = "lib_tok";
  lib_tok_impl() = default;
  explicit lib_tok_impl(singleflight::options o) : lib_impl<Key, T>(std::move(o)) {}
  template <class F>
  T do_(const Key& k, F&& f) {
    return this->g.do_(k, [&f](std::stop_token) { return f(); });
  }
  template <class F>
  T do_(const Key& k, F&& f, std::stop_token st) {
    return this->g.do_(
        k, [&f](std::stop_token) { return f(); }, std::move(st));
  }
};

template <class Impl>
std::uint64_t joins_of(const Impl& g) {
  return g.stats().joins;
}

template <class Impl>
void set_ratio(benchmark::State& state, const Impl& g) {
  const sfbench::counts c = g.stats();
  state.counters["coalescing_ratio"] =
      c.calls == 0 ? 1.0 : static_cast<double>(c.flights) / static_cast<double>(c.calls);
}

// ---------------------------------------------------------------------------
// crew (bench/support/crew.hpp): parked threads that run one job per round;
// created once (1100 threads), so thread creation never lands in a measurement.
// ---------------------------------------------------------------------------
sfbench::crew& the_crew() {
  static sfbench::crew c(1100);
  return c;
}

// A one-shot gate: fn blocks on it to hold a flight open.
class gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  void reset() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = false;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Polls until pred() holds (yielding); false after `limit`.
template <class Pred>
bool await(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
  const auto until = clk::now() + limit;
  while (!pred()) {
    if (clk::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// ---------------------------------------------------------------------------
// 1. Uncontended leader path: every call starts, runs and settles a flight.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl, class Key>
void bm_leader_same_key(benchmark::State& state, Key key) {
  Impl<Key, value_t> g;
  value_t x = 0;
  auto fn = [&x] { return ++x; };
  (void)g.do_(key, fn);  // warm the map's bucket array
  const sfbench::alloc::probe p;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g.do_(key, fn));
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["allocs_per_call"] = static_cast<double>(p.allocs()) / n;
  state.counters["alloc_bytes_per_call"] = static_cast<double>(p.bytes()) / n;
  set_ratio(state, g);
  state.SetItemsProcessed(state.iterations());
}

template <template <class, class> class Impl>
void bm_leader_distinct(benchmark::State& state) {
  const std::vector<std::string> keys = make_keys(1024);
  Impl<std::string, value_t> g;
  value_t x = 0;
  auto fn = [&x] { return ++x; };
  for (const auto& k : keys) (void)g.do_(k, fn);
  std::size_t i = 0;
  const sfbench::alloc::probe p;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g.do_(keys[i], fn));
    i = (i + 1) & 1023;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["allocs_per_call"] = static_cast<double>(p.allocs()) / n;
  state.counters["alloc_bytes_per_call"] = static_cast<double>(p.bytes()) / n;
  set_ratio(state, g);
  state.SetItemsProcessed(state.iterations());
}

// ---------------------------------------------------------------------------
// 2. Distinct keys on all cores: one group, each thread its own 1,024 keys.
//    `shards` (the library only; 0: the default) sets options::shards: two
//    threads meet in a shard when their keys share one, so the spread of
//    keys over shards is what the scaling depends on.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
void bm_distinct_mt(benchmark::State& state, std::size_t shards = 0) {
  static std::unique_ptr<Impl<std::string, value_t>> g;
  if (state.thread_index() == 0) {
    if constexpr (std::is_constructible_v<Impl<std::string, value_t>, singleflight::options>) {
      singleflight::options o;
      o.shards = shards;
      g = std::make_unique<Impl<std::string, value_t>>(std::move(o));
    } else {
      g = std::make_unique<Impl<std::string, value_t>>();
    }
    sfbench::alloc::g_enabled.store(false, std::memory_order_relaxed);
  }
  const std::vector<std::string> keys = make_keys(1024, state.thread_index());
  value_t x = 0;
  auto fn = [&x] { return ++x; };
  std::size_t i = 0;
  const sfbench::alloc::probe p;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g->do_(keys[i], fn));
    i = (i + 1) & 1023;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["allocs_per_call"] =
      benchmark::Counter(static_cast<double>(p.allocs()) / n, benchmark::Counter::kAvgThreads);
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    // Other threads have passed the stop barrier: nobody touches g any more.
    set_ratio(state, *g);
    g.reset();
    sfbench::alloc::g_enabled.store(true, std::memory_order_relaxed);
  }
}

// The same work with nothing shared: each thread its own group (the library,
// default options) and its own 1,024 keys. Two threads against one here is
// what this machine gives a table that two cores never both write: the
// ceiling for distinct_keys_mt's scaling.
void bm_distinct_own_group(benchmark::State& state) {
  const std::vector<std::string> keys = make_keys(1024, state.thread_index());
  lib_impl<std::string, value_t> g;
  value_t x = 0;
  auto fn = [&x] { return ++x; };
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g.do_(keys[i], fn));
    i = (i + 1) & 1023;
  }
  state.SetItemsProcessed(state.iterations());
}

// ---------------------------------------------------------------------------
// 3. Join path: a flight held open by a fn blocked on a gate; N callers join
//    it; the gate opens; everyone returns. Per join: CPU time of the joining
//    call (attach + block + wake + copy; CLOCK_THREAD_CPUTIME_ID around do_)
//    and allocations made by the joining call.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
void bm_join(benchmark::State& state, int n) {
  Impl<std::string, value_t> g;
  const std::string key = make_key(1, 1);
  sfbench::crew& c = the_crew();
  gate hold;
  std::atomic<bool> started{false};
  std::atomic<int> origin{0};
  std::atomic<int> wrong{0};
  std::atomic<std::int64_t> cpu_ns{0};
  std::atomic<std::uint64_t> join_allocs{0};
  std::uint64_t rounds = 0;
  double attach_ns = 0;
  bool failed = false;

  for (auto _ : state) {
    hold.reset();
    started.store(false);
    origin.store(0);
    std::latch line(n + 1);  // the n joiners and this thread
    const std::uint64_t j0 = joins_of(g);
    c.start(n + 1, [&](int i) {
      if (i == 0) {
        (void)g.do_(key, [&] {
          origin.fetch_add(1);
          started.store(true);
          started.notify_all();
          hold.wait();
          return value_t{42};
        });
        return;
      }
      started.wait(false);
      line.arrive_and_wait();
      const sfbench::alloc::probe p;
      const std::int64_t t0 = thread_cpu_ns();
      const value_t v = g.do_(key, [&] {
        origin.fetch_add(1);
        return value_t{7};
      });
      const std::int64_t t1 = thread_cpu_ns();
      join_allocs.fetch_add(p.allocs());
      cpu_ns.fetch_add(t1 - t0);
      if (v != 42) wrong.fetch_add(1);
    });
    started.wait(false);
    line.arrive_and_wait();
    const clk::time_point released = clk::now();
    const bool formed = await([&] { return joins_of(g) - j0 == static_cast<std::uint64_t>(n); });
    attach_ns += ns_between(released, clk::now());
    hold.open();
    c.wait();
    ++rounds;
    if (!formed || origin.load() != 1 || wrong.load() != 0) {
      failed = true;
      break;
    }
  }
  if (failed) {
    state.SkipWithError("join: origin calls per round != 1 (or a joiner got another value)");
    return;
  }
  const double joins = static_cast<double>(rounds) * n;
  state.counters["attach_ns_per_join"] = attach_ns / joins;
  state.counters["join_cpu_ns"] = static_cast<double>(cpu_ns.load()) / joins;
  state.counters["allocs_per_join"] = static_cast<double>(join_allocs.load()) / joins;
  state.counters["round_ns_per_join"] =
      benchmark::Counter(joins, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["origin_calls_per_round"] = 1;
  set_ratio(state, g);
}

// ---------------------------------------------------------------------------
// 4. Hot-key burst: N callers released together by a std::latch.
//    gated: fn first waits until the other N-1 callers have joined (so that
//           exactly one origin call per burst is the contract being checked),
//           then works for fn_us (sleep; 0 = returns at once).
//    natural: no such wait; origin calls per burst is what it is.
//    settle_to_last_us: from fn's return to the return of the last caller.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
void bm_burst(benchmark::State& state, int n, int fn_us, bool gated) {
  Impl<std::string, value_t> g;
  const std::string key = make_key(2, 2);
  sfbench::crew& c = the_crew();
  std::atomic<int> origin{0};
  std::atomic<int> wrong{0};
  std::atomic<std::uint64_t> call_allocs{0};
  std::vector<clk::time_point> returned(static_cast<std::size_t>(n));
  clk::time_point fn_returned;
  double settle_last_sum = 0, settle_median_sum = 0;
  std::uint64_t rounds = 0, origin_total = 0;
  bool failed = false;

  for (auto _ : state) {
    origin.store(0);
    std::latch go(n);
    const std::uint64_t j0 = joins_of(g);
    c.run(n, [&](int i) {
      const sfbench::alloc::probe p;
      go.arrive_and_wait();
      const value_t v = g.do_(key, [&] {
        origin.fetch_add(1);
        if (gated) {
          (void)await([&] { return joins_of(g) - j0 >= static_cast<std::uint64_t>(n - 1); });
        }
        if (fn_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(fn_us));
        fn_returned = clk::now();
        return value_t{42};
      });
      returned[static_cast<std::size_t>(i)] = clk::now();
      call_allocs.fetch_add(p.allocs());
      if (v != 42) wrong.fetch_add(1);
    });
    ++rounds;
    const int o = origin.load();
    origin_total += static_cast<std::uint64_t>(o);
    if (wrong.load() != 0 || (gated && o != 1)) {
      failed = true;
      break;
    }
    std::sort(returned.begin(), returned.end());
    settle_last_sum += ns_between(fn_returned, returned.back());
    settle_median_sum += ns_between(fn_returned, returned[returned.size() / 2]);
  }
  if (failed) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "burst: origin calls per burst = %d, expected exactly 1",
                  origin.load());
    state.SkipWithError(msg);
    return;
  }
  const double r = static_cast<double>(rounds);
  state.counters["origin_calls_per_burst"] = static_cast<double>(origin_total) / r;
  if (gated) {  // with several flights per burst "the" settle time is undefined
    state.counters["settle_to_last_us"] = settle_last_sum / r / 1000.0;
    state.counters["settle_to_median_us"] = settle_median_sum / r / 1000.0;
  }
  state.counters["allocs_per_call"] = static_cast<double>(call_allocs.load()) / (r * n);
  set_ratio(state, g);
}

// ---------------------------------------------------------------------------
// 5. Seed scenario: 100 callers arriving evenly over 40 ms, origin takes 200 ms.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
void bm_seed(benchmark::State& state) {
  constexpr int callers = 100;
  const std::string key = make_key(3, 3);
  sfbench::crew& c = the_crew();
  std::vector<double> lat;
  std::vector<double> round_lat(callers);
  std::atomic<int> origin{0};
  std::uint64_t rounds = 0, origin_total = 0;
  sfbench::counts totals;
  for (auto _ : state) {
    Impl<std::string, value_t> g;
    origin.store(0);
    const clk::time_point t0 = clk::now() + std::chrono::milliseconds(5);
    c.run(callers, [&](int i) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(400) * i);
      const clk::time_point a = clk::now();
      (void)g.do_(key, [&] {
        origin.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return value_t{1};
      });
      round_lat[static_cast<std::size_t>(i)] = ns_between(a, clk::now());
    });
    lat.insert(lat.end(), round_lat.begin(), round_lat.end());
    ++rounds;
    const sfbench::counts s = g.stats();
    totals.calls += s.calls;
    totals.flights += s.flights;
    origin_total += static_cast<std::uint64_t>(origin.load());
  }
  std::sort(lat.begin(), lat.end());
  const auto pct = [&](double q) {
    const std::size_t idx =
        std::min(lat.size() - 1, static_cast<std::size_t>(q * static_cast<double>(lat.size())));
    return lat[idx] / 1e6;
  };
  state.counters["p50_ms"] = pct(0.50);
  state.counters["p99_ms"] = pct(0.99);
  state.counters["max_ms"] = lat.back() / 1e6;
  state.counters["origin_calls"] = static_cast<double>(origin_total) / static_cast<double>(rounds);
  state.counters["coalescing_ratio"] =
      totals.calls == 0 ? 1.0
                        : static_cast<double>(totals.flights) / static_cast<double>(totals.calls);
}

// ---------------------------------------------------------------------------
// 6. Cancellation churn: a long flight (fn blocked on a gate for the whole
//    run) under ownership::group; one waiter at a time joins it with its own
//    stop_token and is stopped by the benchmark thread. One iteration = one
//    join + leave. The flight must survive: exactly one origin call, and a
//    caller joining after the churn still gets the flight's value.
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
void bm_churn(benchmark::State& state) {
  using G = Impl<std::string, value_t>;
  std::unique_ptr<G> gp;
  if constexpr (std::is_same_v<G, lib_impl<std::string, value_t>>) {
    singleflight::options o;
    o.owner = singleflight::ownership::group;
    gp = std::make_unique<G>(std::move(o));
  } else {
    gp = std::make_unique<G>();
  }
  G& g = *gp;
  const std::string key = make_key(4, 4);
  sfbench::crew& c = the_crew();
  gate hold;
  std::atomic<bool> started{false};
  std::atomic<int> origin{0};

  // Worker 0: the leader holding the flight open. Worker 1: the churner.
  std::mutex mu;
  std::condition_variable cv;
  std::stop_source* current = nullptr;  // published by the churner, guarded by mu
  std::uint64_t left = 0;               // completed join+leave cycles, guarded by mu
  bool quit = false;
  std::atomic<bool> churner_exited{false};
  std::atomic<std::uint64_t> churn_allocs{0};
  std::atomic<std::uint64_t> wrong{0};
  value_t final_value = 0;

  c.start(2, [&](int i) {
    if (i == 0) {
      (void)g.do_(key, [&] {
        origin.fetch_add(1);
        started.store(true);
        started.notify_all();
        hold.wait();
        return value_t{42};
      });
      return;
    }
    started.wait(false);
    for (;;) {
      std::stop_source src;
      {
        std::unique_lock<std::mutex> lk(mu);
        if (quit) {
          churner_exited.store(true);
          return;
        }
        current = &src;
        cv.notify_all();
      }
      const sfbench::alloc::probe p;
      try {
        (void)g.do_(
            key,
            [&] {
              origin.fetch_add(1);
              return value_t{7};
            },
            src.get_token());
        wrong.fetch_add(1);  // must have been stopped
      } catch (const std::exception&) {
      }
      churn_allocs.fetch_add(p.allocs());
      std::lock_guard<std::mutex> lk(mu);
      current = nullptr;
      ++left;
      cv.notify_all();
    }
  });

  std::uint64_t done = 0;
  bool failed = false;
  for (auto _ : state) {
    std::stop_source* s = nullptr;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return current != nullptr; });
      s = current;
    }
    // Wait until the churner has attached (its join is counted), then stop it.
    if (!await([&] { return joins_of(g) >= done + 1; })) {
      failed = true;
      break;
    }
    s->request_stop();
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return left == done + 1; });
    ++done;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    quit = true;
    if (current != nullptr) current->request_stop();
  }
  (void)await([&] { return churner_exited.load(); });
  const std::uint64_t joins_before_late = joins_of(g);
  // The flight is still joinable: a late caller gets its value.
  std::thread late([&] {
    final_value = g.do_(key, [&] {
      origin.fetch_add(1);
      return value_t{7};
    });
  });
  (void)await([&] { return joins_of(g) >= joins_before_late + 1; },
              std::chrono::milliseconds(2000));
  hold.open();
  late.join();
  c.wait();
  if (failed || origin.load() != 1 || wrong.load() != 0 || final_value != 42) {
    state.SkipWithError("churn: the long flight did not survive (origin calls != 1)");
    return;
  }
  state.counters["allocs_per_join_leave"] = static_cast<double>(churn_allocs.load()) /
                                            static_cast<double>(std::max<std::uint64_t>(done, 1));
  state.counters["origin_calls"] = origin.load();
}

// ---------------------------------------------------------------------------
// 7. Bytes per in-flight call: D flights open at once, nested on one thread
//    (each fn starts the next flight), live heap bytes measured at the
//    deepest point (this thread's malloc_usable_size sum), divided by D.
// ---------------------------------------------------------------------------
template <class G>
struct nest {
  G& g;
  const std::vector<std::string>& keys;
  std::int64_t live0;
  std::int64_t peak = 0;
  value_t go(std::size_t d) {
    if (d == keys.size()) {
      peak = sfbench::alloc::t_live - live0;
      return 0;
    }
    return g.do_(keys[d], [this, d] { return go(d + 1) + 1; });
  }
};

template <template <class, class> class Impl>
void bm_inflight_bytes(benchmark::State& state, int depth) {
  const std::vector<std::string> keys = make_keys(depth);
  double per = 0;
  for (auto _ : state) {
    Impl<std::string, value_t> g;
    nest<Impl<std::string, value_t>> n{g, keys, sfbench::alloc::t_live};
    const value_t v = n.go(0);
    if (v != static_cast<value_t>(depth)) state.SkipWithError("inflight: wrong result");
    per = static_cast<double>(n.peak) / depth;
  }
  state.counters["bytes_per_inflight"] = per;
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------
template <template <class, class> class Impl>
std::string nm(const std::string& scenario) {
  return scenario + "/impl:" + Impl<int, int>::name;
}

template <template <class, class> class Impl>
void register_leader() {
  benchmark::RegisterBenchmark(
      nm<Impl>("leader_same_key_str").c_str(),
      [](benchmark::State& s) { bm_leader_same_key<Impl>(s, make_key(7, 7)); })
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark(
      nm<Impl>("leader_same_key_int").c_str(),
      [](benchmark::State& s) { bm_leader_same_key<Impl>(s, std::uint64_t{77}); })
      ->UseRealTime()
      ->MinTime(0.2);
  benchmark::RegisterBenchmark(nm<Impl>("leader_distinct_1024").c_str(),
                               [](benchmark::State& s) { bm_leader_distinct<Impl>(s); })
      ->UseRealTime()
      ->MinTime(0.2);
}

template <template <class, class> class Impl>
void register_distinct_mt() {
  auto* b = benchmark::RegisterBenchmark(nm<Impl>("distinct_keys_mt").c_str(),
                                         [](benchmark::State& s) { bm_distinct_mt<Impl>(s); });
  b->UseRealTime()->MinTime(0.2);
  // ThreadPerCpu() plus 1/2/4/8 threads, without duplicates (on a 2-core
  // machine ThreadPerCpu() *is* Threads(2), and equal names would collide).
  std::vector<int> counts{1, 2, 4, 8};
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (std::find(counts.begin(), counts.end(), cpus) == counts.end()) counts.push_back(cpus);
  std::sort(counts.begin(), counts.end());
  for (int t : counts) b->Threads(t);
}

// The library with a chosen shard count, at 1 and 2 threads (the scaling the
// docs/performance.md reports against the shard count).
void register_distinct_mt_shards() {
  for (std::size_t n : {256u, 4096u, 16384u}) {
    benchmark::RegisterBenchmark(
        nm<lib_impl>("distinct_keys_mt_shards:" + std::to_string(n)).c_str(),
        [n](benchmark::State& s) { bm_distinct_mt<lib_impl>(s, n); })
        ->UseRealTime()
        ->MinTime(0.2)
        ->Threads(1)
        ->Threads(2);
  }
  benchmark::RegisterBenchmark(nm<lib_impl>("distinct_keys_mt_own_group").c_str(),
                               [](benchmark::State& s) { bm_distinct_own_group(s); })
      ->UseRealTime()
      ->MinTime(0.2)
      ->Threads(1)
      ->Threads(2);
}

template <template <class, class> class Impl>
void register_coalescing() {
  for (int n : {16, 128}) {
    benchmark::RegisterBenchmark(nm<Impl>("join/N:" + std::to_string(n)).c_str(),
                                 [n](benchmark::State& s) { bm_join<Impl>(s, n); })
        ->UseRealTime()
        ->MinTime(0.1);
  }
  for (int n : {8, 64, 1024}) {
    for (int us : {0, 100, 1000}) {
      benchmark::RegisterBenchmark(
          nm<Impl>("burst/N:" + std::to_string(n) + "/fn_us:" + std::to_string(us)).c_str(),
          [n, us](benchmark::State& s) { bm_burst<Impl>(s, n, us, true); })
          ->UseRealTime()
          ->MinTime(0.1);
    }
  }
  for (int n : {64, 1024}) {
    for (int us : {100, 1000}) {
      benchmark::RegisterBenchmark(
          nm<Impl>("burst_natural/N:" + std::to_string(n) + "/fn_us:" + std::to_string(us)).c_str(),
          [n, us](benchmark::State& s) { bm_burst<Impl>(s, n, us, false); })
          ->UseRealTime()
          ->MinTime(0.1);
    }
  }
}

template <template <class, class> class Impl>
void register_seed() {
  benchmark::RegisterBenchmark(nm<Impl>("seed_100x40ms_origin200ms").c_str(),
                               [](benchmark::State& s) { bm_seed<Impl>(s); })
      ->UseRealTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
}

template <template <class, class> class Impl>
void register_inflight() {
  benchmark::RegisterBenchmark(nm<Impl>("inflight_bytes/D:256").c_str(),
                               [](benchmark::State& s) { bm_inflight_bytes<Impl>(s, 256); })
      ->UseRealTime()
      ->Iterations(3);
}

template <template <class, class> class Impl>
void register_churn() {
  benchmark::RegisterBenchmark(nm<Impl>("churn_join_leave").c_str(),
                               [](benchmark::State& s) { bm_churn<Impl>(s); })
      ->UseRealTime()
      ->MinTime(0.2);
}

// ---------------------------------------------------------------------------
// 9. Calls that end in an error the caller expects: do_ + catch against
//    try_do (no throw; the library's errors are shared exception objects).
//    "cancelled": the caller's token is already stopped; "closed": the group
//    is closed; "value": the plain leader path, to show try_do costs nothing
//    there.
// ---------------------------------------------------------------------------
enum class nothrow_case { cancelled, closed, value };

void bm_nothrow(benchmark::State& state, nothrow_case c, bool use_try) {
  singleflight::group<std::string, value_t> g;
  const std::string key = make_key(7, 7);
  value_t x = 0;
  auto fn = [&x] { return ++x; };
  std::stop_source stopped;
  stopped.request_stop();
  std::stop_token tok = c == nothrow_case::cancelled ? stopped.get_token() : std::stop_token{};
  if (c == nothrow_case::closed) g.close();
  (void)g.try_do(key, fn);  // warm
  std::uint64_t errors = 0;
  const sfbench::alloc::probe p;
  for (auto _ : state) {
    if (use_try) {
      auto o = g.try_do(key, fn, tok);
      errors += o.status() != singleflight::status::value;
      benchmark::DoNotOptimize(o);
    } else {
      try {
        benchmark::DoNotOptimize(g.do_(key, fn, tok));
      } catch (const singleflight::error&) {
        ++errors;
      }
    }
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["allocs_per_call"] = static_cast<double>(p.allocs()) / n;
  state.counters["errors_per_call"] = static_cast<double>(errors) / n;
  state.SetItemsProcessed(state.iterations());
}

void register_nothrow() {
  const std::pair<const char*, nothrow_case> cases[] = {
      {"nothrow/case:cancelled", nothrow_case::cancelled},
      {"nothrow/case:closed", nothrow_case::closed},
      {"nothrow/case:value", nothrow_case::value}};
  for (const auto& [name, c] : cases) {
    for (const bool use_try : {false, true}) {
      const nothrow_case cc = c;
      benchmark::RegisterBenchmark(
          (std::string(name) + (use_try ? "/impl:lib_try" : "/impl:lib_throw")).c_str(),
          [cc, use_try](benchmark::State& s) { bm_nothrow(s, cc, use_try); })
          ->UseRealTime()
          ->MinTime(0.2);
    }
  }
}

const bool registered = [] {
  register_leader<direct_impl>();
  register_leader<lib_impl>();
  register_leader<lib_tok_impl>();
  register_leader<future_impl>();
  register_leader<cv_impl>();

  register_distinct_mt<direct_impl>();
  register_distinct_mt<lib_impl>();
  register_distinct_mt<future_impl>();
  register_distinct_mt<cv_impl>();
  register_distinct_mt_shards();

  register_inflight<lib_impl>();
  register_inflight<lib_tok_impl>();
  register_inflight<future_impl>();
  register_inflight<cv_impl>();

  register_coalescing<lib_impl>();
  register_coalescing<future_impl>();
  register_coalescing<cv_impl>();

  register_churn<lib_impl>();
  register_churn<cv_any_impl>();

  register_seed<direct_impl>();
  register_seed<lib_impl>();
  register_seed<future_impl>();
  register_seed<cv_impl>();

  register_nothrow();
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
