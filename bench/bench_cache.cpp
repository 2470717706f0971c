// bench/bench_cache.cpp
//
// Google Benchmark suite for singleflight::cache, with its baselines in the
// same binary so that every goal of issue 10 reads as a ratio or a count
// (bench/run.sh runs it, bench/report.py prints the "Cache" block):
//
//   cache_stampede   one hot key, T reader threads, a 20 ms origin and a 1 s
//                    ttl on a controlled clock (scaled_clock: 10x real time).
//                    Origin calls per expiry and readers that waited on the
//                    origin per expiry, after warm-up, for
//                      lib_swr      cache with stale_while_revalidate
//                      lib_xfetch   cache with early_refresh_beta = 1 (no SWR)
//                      lib_both     both (what docs/cache.md recommends)
//                      naive        cache-aside: map + mutex, load on miss
//                      group_only   a map + mutex in front of a group (misses coalesce)
//   cache_failing    16 keys, 8 readers, the origin failing for 10 s (ttl 1 s,
//                    stale_if_error 1 h, error_ttl 1 s): origin calls per key
//                    and errors surfaced, lib vs naive cache-aside.
//   cache_jitter     1,000 keys written at once (ttl 100 s, manual clock):
//                    largest share of expiries in one 1%-of-ttl window, and
//                    share outside [0.9, 1.1] ttl; lib (jitter 0.1) vs jitter 0.
//   cache_hit        hit path, 1 and 2 threads on distinct keys (1,024 per
//                    thread): lib vs std::shared_mutex + std::unordered_map
//                    returning a copy (shared_mutex), and the same plus an
//                    expiry check against steady_clock (shared_mutex_ttl: what
//                    a hand-rolled TTL cache pays); lib_coarse_clock is the
//                    cache on singleflight::coarse_clock, lib_free_clock on a
//                    clock whose now() is one atomic load (its own cost, without
//                    any clock's); T = std::uint64_t and a 100-byte std::string.
//   cache_hit_large  hit path on 1M std::uint64_t entries with uniformly random
//                    keys, read in random order (memory misses dominate, and a
//                    bucket's chain length shows), 1 and 2 threads: lib and
//                    lib_free_clock vs shared_mutex (std::unordered_map<uint64_t,
//                    uint64_t>). lib reads steady_clock, whose rdtscp keeps one
//                    hit's misses from overlapping the next's: close to a hit's
//                    latency; lib_free_clock and shared_mutex are throughput.
//   cache_hit_ratio  Zipf 0.9 over 100,000 keys plus one-hit scans, capacity
//                    1,000 (1%): hit ratio of the cache (W-TinyLFU) vs LRU.
//
// Callers' bounds (issue 32), each with impl:lib (the default, load_owner::cache)
// and impl:caller (load_owner::caller: the first caller runs the loader on its
// own thread), in real time; counters: calls, late (answered > 105 ms after
// the call), p50_ms / p99_ms / max_ms, how calls ended (values, stale,
// timeouts, cancelled, errors), origin_calls, and per scenario:
//   cache_bound_cold     50 keys, each requested once with a 100 ms wait_bound,
//                        a 150 ms origin: keys_cached once the loads are over.
//   cache_leader_token   10 leaders on distinct keys whose stop tokens fire at
//                        100 ms, a 300 ms origin: keys_cached afterwards.
//   cache_soft_timeout   20 keys with an old value (dead, within
//                        stale_if_error), the origin slowed to 2 s,
//                        soft_timeout 100 ms, 16 readers for 2 s:
//                        origin_calls_per_key_max, and fresh_after (keys whose
//                        first read after their slow load is a fresh hit).
//   cache_service        the new user's service: 16 threads, 200 keys, 100 ms
//                        per-request wait_bound, an origin of 20-150 ms
//                        failing 5% of calls and down for 3 s of a 12 s run.
// The get_many / batch_loader goal is a test (tests/test_cache_many.cpp).
//
// Names are "<scenario>[/<param>:<value>...]/impl:<impl>", as bench_group.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

// include/singleflight/detail/group/flight.hpp trips -Wshadow (see bench_group.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/cache.hpp"
#include "singleflight/coarse_clock.hpp"
#pragma GCC diagnostic pop

namespace sf = singleflight;
using namespace std::chrono_literals;

namespace {

// ---------------------------------------------------------------------------
// Clocks
// ---------------------------------------------------------------------------

// scaled_clock: controlled time running `scale` times faster than real time
// from the moment the process started; every impl of a scenario reads it.
struct scaled_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<scaled_clock>;
  static constexpr bool is_steady = true;
  static constexpr int scale = 10;
  static inline const std::chrono::steady_clock::time_point start =
      std::chrono::steady_clock::now();
  static time_point now() noexcept {
    return time_point(duration((std::chrono::steady_clock::now() - start).count() * scale));
  }
  // Sleeps for `d` of controlled time.
  static void sleep(duration d) { std::this_thread::sleep_for(d / scale); }
};

// manual_clock: moved by the benchmark (jitter, hit ratio).
struct manual_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<manual_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
    return time_point(duration(ticks.load(std::memory_order_acquire)));
  }
  static inline std::atomic<rep> ticks{3'600'000'000'000};
};

std::string make_key(int tenant, int user, int thread = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "tenant-%03d|user-%06d|en-GB|v3|t%d", tenant, user, thread);
  return buf;
}

// ---------------------------------------------------------------------------
// 1. Stampede at expiry
// ---------------------------------------------------------------------------

constexpr auto stampede_ttl = 1s;
constexpr auto stampede_origin = 20ms;
constexpr int stampede_expiries = 15;

// What one run saw: origin call start times (controlled ns) and waits.
struct stampede_log {
  std::mutex mu;
  std::vector<std::int64_t> calls;
  std::atomic<long> waited{0};  // reader calls that waited on the origin
  std::atomic<long> reads{0};
  std::atomic<long> warm_waits{0};  // waits during warm-up (the first load)
  void call() {
    const std::int64_t t = scaled_clock::now().time_since_epoch().count();
    std::lock_guard<std::mutex> lk(mu);
    calls.push_back(t);
  }
};

std::uint64_t origin_value(stampede_log& log) {
  log.call();
  scaled_clock::sleep(stampede_origin);
  return 42;
}

// Clusters origin calls into expiries: a call more than ttl/2 after the first
// call of the current cluster starts a new one. Returns (calls, expiries)
// after the first (warm-up) cluster.
std::pair<double, double> per_expiry(std::vector<std::int64_t> calls) {
  std::sort(calls.begin(), calls.end());
  const std::int64_t half = std::chrono::nanoseconds(stampede_ttl).count() / 2;
  double clusters = 0;
  double counted = 0;
  std::int64_t start = 0;
  bool warm = true;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (i == 0 || calls[i] - start > half) {
      if (i != 0) warm = false;
      start = calls[i];
      if (!warm) ++clusters;
    }
    if (!warm) ++counted;
  }
  return {counted, clusters};
}

// The baselines, on the same scaled clock.
struct naive_cache_aside {
  std::mutex mu;
  std::unordered_map<std::string, std::pair<std::uint64_t, scaled_clock::time_point>> map;
  std::uint64_t get(const std::string& k, stampede_log& log, bool& waited) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = map.find(k);
      if (it != map.end() && scaled_clock::now() < it->second.second) return it->second.first;
    }
    waited = true;
    const std::uint64_t v = origin_value(log);
    std::lock_guard<std::mutex> lk(mu);
    map[k] = {v, scaled_clock::now() + stampede_ttl};
    return v;
  }
};

struct group_only {
  std::mutex mu;
  std::unordered_map<std::string, std::pair<std::uint64_t, scaled_clock::time_point>> map;
  sf::group<std::string, std::uint64_t> g;
  std::uint64_t get(const std::string& k, stampede_log& log, bool& waited) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = map.find(k);
      if (it != map.end() && scaled_clock::now() < it->second.second) return it->second.first;
    }
    waited = true;
    return g.do_(k, [&] {
      const std::uint64_t v = origin_value(log);
      std::lock_guard<std::mutex> lk(mu);
      map[k] = {v, scaled_clock::now() + stampede_ttl};
      return v;
    });
  }
};

using stampede_cache =
    sf::cache<std::string, std::uint64_t, sf::default_hash, std::equal_to<>, scaled_clock>;

enum class stampede_impl { lib_swr, lib_xfetch, lib_both, naive, group_only };

void bm_stampede(benchmark::State& state, stampede_impl impl, int threads) {
  for (auto _ : state) {
    stampede_log log;
    const std::string key = make_key(7, 42);
    std::unique_ptr<stampede_cache> c;
    naive_cache_aside naive;
    group_only grp;
    if (impl != stampede_impl::naive && impl != stampede_impl::group_only) {
      sf::cache_options o;
      o.ttl = stampede_ttl;
      o.jitter = 0;
      if (impl != stampede_impl::lib_xfetch) o.stale_while_revalidate = stampede_ttl;
      if (impl != stampede_impl::lib_swr) o.early_refresh_beta = 1.0;
      c = std::make_unique<stampede_cache>(o);
    }
    auto read = [&](bool& waited) -> std::uint64_t {
      switch (impl) {
        case stampede_impl::lib_swr:
        case stampede_impl::lib_xfetch:
        case stampede_impl::lib_both: {
          const sf::cached<std::uint64_t> e = c->get_entry(key, [&] { return origin_value(log); });
          waited = e.taken_as != sf::role::none;
          return *e.value;
        }
        case stampede_impl::naive:
          return naive.get(key, log, waited);
        case stampede_impl::group_only:
          return grp.get(key, log, waited);
      }
      return 0;
    };
    bool w0 = false;
    read(w0);  // warm-up: the first load
    const auto end = scaled_clock::now() + stampede_ttl * stampede_expiries + stampede_ttl / 2;
    std::vector<std::jthread> readers;
    for (int t = 0; t < threads; ++t) {
      readers.emplace_back([&] {
        while (scaled_clock::now() < end) {
          bool waited = false;
          benchmark::DoNotOptimize(read(waited));
          if (waited) log.waited.fetch_add(1);
          log.reads.fetch_add(1);
          std::this_thread::yield();
        }
      });
    }
    readers.clear();
    if (c) c->close();
    const auto [calls, expiries] = per_expiry(log.calls);
    state.counters["origin_calls_per_expiry"] = expiries > 0 ? calls / expiries : 0;
    state.counters["waited_per_expiry"] =
        expiries > 0 ? static_cast<double>(log.waited) / expiries : 0;
    state.counters["expiries"] = expiries;
    state.counters["reads"] = static_cast<double>(log.reads);
  }
}

// ---------------------------------------------------------------------------
// 2. Origin failing for 10 s
// ---------------------------------------------------------------------------

constexpr int failing_keys = 16;

void bm_failing(benchmark::State& state, bool lib) {
  using fcache =
      sf::cache<std::string, std::uint64_t, sf::default_hash, std::equal_to<>, scaled_clock>;
  for (auto _ : state) {
    sf::cache_options o;
    o.ttl = 1s;
    o.jitter = 0.1;
    o.stale_while_revalidate = 1s;
    o.stale_if_error = 1h;
    o.error_ttl = 1s;
    fcache c(o);
    naive_cache_aside naive;
    std::atomic<bool> failing{false};
    std::vector<std::atomic<long>> calls_in_failure(failing_keys);
    std::atomic<long> errors{0};
    std::atomic<long> reads{0};
    std::vector<std::string> keys;
    for (int k = 0; k < failing_keys; ++k) keys.push_back(make_key(k, k));
    auto origin = [&](int k) -> std::uint64_t {
      if (failing.load()) {
        calls_in_failure[static_cast<std::size_t>(k)].fetch_add(1);
        scaled_clock::sleep(20ms);
        throw std::runtime_error("origin down");
      }
      scaled_clock::sleep(20ms);
      return static_cast<std::uint64_t>(k);
    };
    auto read = [&](int k) {
      if (lib) return c.get(keys[static_cast<std::size_t>(k)], [&, k] { return origin(k); });
      // naive cache-aside with a 1 s ttl: a failed load reaches the caller
      stampede_log unused;
      bool waited = false;
      {
        std::lock_guard<std::mutex> lk(naive.mu);
        auto it = naive.map.find(keys[static_cast<std::size_t>(k)]);
        if (it != naive.map.end() && scaled_clock::now() < it->second.second)
          return it->second.first;
      }
      (void)waited;
      const std::uint64_t v = origin(k);
      std::lock_guard<std::mutex> lk(naive.mu);
      naive.map[keys[static_cast<std::size_t>(k)]] = {v, scaled_clock::now() + 1s};
      return v;
    };
    for (int k = 0; k < failing_keys; ++k) read(k);  // warm
    const auto fail_from = scaled_clock::now() + 2s;
    const auto fail_until = fail_from + 10s;
    std::vector<std::jthread> readers;
    for (int t = 0; t < 8; ++t) {
      readers.emplace_back([&, t] {
        std::minstd_rand rng(static_cast<unsigned>(t + 1));
        while (scaled_clock::now() < fail_until) {
          const int k = static_cast<int>(rng() % failing_keys);
          try {
            benchmark::DoNotOptimize(read(k));
          } catch (...) {
            if (failing.load()) errors.fetch_add(1);
          }
          reads.fetch_add(1);
          std::this_thread::yield();
        }
      });
    }
    while (scaled_clock::now() < fail_from) std::this_thread::sleep_for(1ms);  // the run's schedule
    failing = true;
    readers.clear();
    failing = false;
    c.close();
    long worst = 0;
    long total = 0;
    for (auto& n : calls_in_failure) {
      worst = std::max(worst, n.load());
      total += n.load();
    }
    state.counters["origin_calls_per_key_max"] = static_cast<double>(worst);
    state.counters["origin_calls_per_key_mean"] = static_cast<double>(total) / failing_keys;
    state.counters["errors_surfaced"] = static_cast<double>(errors);
    state.counters["reads"] = static_cast<double>(reads);
  }
}

// ---------------------------------------------------------------------------
// 3. Jitter spread
// ---------------------------------------------------------------------------

void bm_jitter(benchmark::State& state, double jitter) {
  using jcache = sf::cache<std::string, int, sf::default_hash, std::equal_to<>, manual_clock>;
  constexpr int n = 1000;
  for (auto _ : state) {
    sf::cache_options o;
    o.ttl = 100s;
    o.jitter = jitter;
    o.stale_while_revalidate = 1h;
    jcache c(o);
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i) keys.push_back(make_key(i % 97, i));
    const std::int64_t t0 = manual_clock::ticks.load();
    for (int i = 0; i < n; ++i) c.put(keys[static_cast<std::size_t>(i)], i);
    // Walk 0.80 .. 1.20 ttl in 1%-of-ttl steps; count keys that went stale in each.
    int before = 0;
    int worst = 0;
    int outside = 0;
    for (int step = 80; step <= 120; ++step) {
      manual_clock::ticks.store(t0 + std::chrono::nanoseconds(1s).count() * step);
      int stale = 0;
      for (const auto& k : keys) stale += c.peek(k)->state == sf::freshness::stale ? 1 : 0;
      const int in_window = stale - before;  // expiries in (step-1, step] % of ttl
      before = stale;
      worst = std::max(worst, in_window);
      if (step <= 90 || step > 110) outside += in_window;
    }
    outside += n - before;  // never expired within 1.2 ttl
    manual_clock::ticks.store(t0 + std::chrono::nanoseconds(1h).count() * 10);
    state.counters["max_window_pct"] = 100.0 * worst / n;
    state.counters["outside_pct"] = 100.0 * outside / n;
  }
}

// ---------------------------------------------------------------------------
// 4. Hit path
// ---------------------------------------------------------------------------

template <class T>
T make_value(int i) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::string(100, static_cast<char>('a' + i % 26));  // a 100-byte profile
  } else {
    return static_cast<T>(i);
  }
}

template <class T>
struct rw_map {
  std::shared_mutex mu;
  std::unordered_map<std::string, T> map;
  T get(const std::string& k) {
    std::shared_lock<std::shared_mutex> lk(mu);
    return map.find(k)->second;  // a copy of T
  }
};

template <class T>
struct rw_map_ttl {
  std::shared_mutex mu;
  std::unordered_map<std::string, std::pair<T, std::chrono::steady_clock::time_point>> map;
  T get(const std::string& k) {
    std::shared_lock<std::shared_mutex> lk(mu);
    auto it = map.find(k);
    if (std::chrono::steady_clock::now() >= it->second.second) throw std::logic_error("expired");
    return it->second.first;
  }
};

enum class hit_impl { lib, lib_coarse_clock, lib_free_clock, shared_mutex, shared_mutex_ttl };

template <class T>
void bm_hit(benchmark::State& state, hit_impl impl) {
  using hcache = sf::cache<std::string, T>;
  // The same cache on a clock that costs one atomic load: the hit path
  // without the price of reading steady_clock.
  using fcache = sf::cache<std::string, T, sf::default_hash, std::equal_to<>, manual_clock>;
  // ...and on singleflight::coarse_clock (CLOCK_MONOTONIC_COARSE).
  using ccache = sf::cache<std::string, T, sf::default_hash, std::equal_to<>, sf::coarse_clock>;
  static std::unique_ptr<hcache> c;
  static std::unique_ptr<fcache> fc;
  static std::unique_ptr<ccache> cc;
  static std::unique_ptr<rw_map<T>> rw;
  static std::unique_ptr<rw_map_ttl<T>> rwt;
  constexpr int per_thread = 1024;
  if (state.thread_index() == 0) {
    sf::cache_options o;
    o.ttl = 1h;
    c = std::make_unique<hcache>(o);
    fc = std::make_unique<fcache>(o);
    cc = std::make_unique<ccache>(o);
    rw = std::make_unique<rw_map<T>>();
    rwt = std::make_unique<rw_map_ttl<T>>();
    for (int t = 0; t < state.threads(); ++t) {
      for (int i = 0; i < per_thread; ++i) {
        const std::string k = make_key(i % 97, i, t);
        c->put(k, make_value<T>(i));
        fc->put(k, make_value<T>(i));
        cc->put(k, make_value<T>(i));
        rw->map.emplace(k, make_value<T>(i));
        rwt->map.emplace(k, std::pair{make_value<T>(i), std::chrono::steady_clock::now() + 1h});
      }
    }
  }
  std::vector<std::string> keys;
  for (int i = 0; i < per_thread; ++i) keys.push_back(make_key(i % 97, i, state.thread_index()));
  auto never = [] { return make_value<T>(-1); };
  std::size_t i = 0;
  for (auto _ : state) {
    switch (impl) {
      case hit_impl::lib:
        benchmark::DoNotOptimize(c->get(keys[i], never));
        break;
      case hit_impl::lib_free_clock:
        benchmark::DoNotOptimize(fc->get(keys[i], never));
        break;
      case hit_impl::lib_coarse_clock:
        benchmark::DoNotOptimize(cc->get(keys[i], never));
        break;
      case hit_impl::shared_mutex:
        benchmark::DoNotOptimize(rw->get(keys[i]));
        break;
      case hit_impl::shared_mutex_ttl:
        benchmark::DoNotOptimize(rwt->get(keys[i]));
        break;
    }
    i = (i + 1) & (per_thread - 1);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    if (c->stats().loads != 0 || fc->stats().loads != 0 || cc->stats().loads != 0) {
      state.SkipWithError("a hit loaded");
    }
    c.reset();
    fc.reset();
    cc.reset();
    rw.reset();
    rwt.reset();
  }
}

// Hit path on a large cache: 1M std::uint64_t entries with uniformly random keys
// (splitmix64 of 1..1M), each thread reading them all in its own random order, so
// that nearly every read misses the CPU's caches and a bucket's chain length shows.
// lib is the cache (default clock), lib_free_clock the same on manual_clock;
// shared_mutex a std::unordered_map<uint64_t, uint64_t> under a std::shared_mutex.
// Each table is built once, on its row's first run, and kept for the process.
constexpr std::size_t large_entries = 1u << 20;

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const std::vector<std::uint64_t>& large_keys() {
  static const std::vector<std::uint64_t> keys = [] {
    std::vector<std::uint64_t> k(large_entries);
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = splitmix64(i + 1);
    return k;
  }();
  return keys;
}

template <class C>
C& large_cache() {
  static C* c = [] {
    sf::cache_options o;
    o.ttl = 24h;
    auto* made = new C(o);  // kept for the process: built once, read by every run
    for (const std::uint64_t k : large_keys()) made->put(k, k);
    return made;
  }();
  return *c;
}

struct large_rw_map {
  std::shared_mutex mu;
  std::unordered_map<std::uint64_t, std::uint64_t> map;
  std::uint64_t get(std::uint64_t k) {
    std::shared_lock<std::shared_mutex> lk(mu);
    return map.find(k)->second;
  }
};

large_rw_map& large_map() {
  static large_rw_map* m = [] {
    auto* made = new large_rw_map;
    for (const std::uint64_t k : large_keys()) made->map.emplace(k, k);
    return made;
  }();
  return *m;
}

void bm_hit_large(benchmark::State& state, hit_impl impl) {
  using lcache = sf::cache<std::uint64_t, std::uint64_t>;
  using fcache =
      sf::cache<std::uint64_t, std::uint64_t, sf::default_hash, std::equal_to<>, manual_clock>;
  if (state.thread_index() == 0) {
    // Built before the threads' loops start (the first iteration waits for every thread).
    if (impl == hit_impl::lib) (void)large_cache<lcache>();
    if (impl == hit_impl::lib_free_clock) (void)large_cache<fcache>();
    if (impl == hit_impl::shared_mutex) (void)large_map();
  }
  std::vector<std::uint64_t> order = large_keys();
  std::shuffle(order.begin(), order.end(),
               std::mt19937_64(static_cast<std::uint64_t>(state.thread_index() + 1)));
  auto never = [] { return std::uint64_t{0}; };
  std::size_t i = 0;
  std::uint64_t wrong = 0;
  for (auto _ : state) {
    const std::uint64_t k = order[i];
    std::uint64_t v = 0;
    switch (impl) {
      case hit_impl::lib:
        v = large_cache<lcache>().get(k, never);
        break;
      case hit_impl::lib_free_clock:
        v = large_cache<fcache>().get(k, never);
        break;
      default:
        v = large_map().get(k);
        break;
    }
    benchmark::DoNotOptimize(v);
    wrong += v != k ? 1 : 0;
    i = (i + 1) & (large_entries - 1);
  }
  state.SetItemsProcessed(state.iterations());
  if (wrong != 0) state.SkipWithError("a read missed");
}

// ---------------------------------------------------------------------------
// 5. Hit ratio: Zipf 0.9 + one-hit scans, capacity 1% of the key space
// ---------------------------------------------------------------------------

constexpr int zipf_keys = 100'000;
constexpr std::size_t zipf_capacity = 1'000;
constexpr int trace_length = 2'000'000;
constexpr int scan_every = 50'000;  // accesses between scans
constexpr int scan_length = 5'000;  // one-hit keys per scan

// The trace: key numbers; >= zipf_keys are one-hit scan keys.
const std::vector<int>& trace() {
  static const std::vector<int> t = [] {
    std::vector<double> cdf(zipf_keys);
    double sum = 0;
    for (int i = 0; i < zipf_keys; ++i) {
      sum += 1.0 / std::pow(i + 1, 0.9);
      cdf[static_cast<std::size_t>(i)] = sum;
    }
    std::mt19937_64 rng(20261201);
    std::uniform_real_distribution<double> u(0, sum);
    std::vector<int> out;
    out.reserve(trace_length);
    int next_scan = zipf_keys;
    while (static_cast<int>(out.size()) < trace_length) {
      for (int i = 0; i < scan_every && static_cast<int>(out.size()) < trace_length; ++i) {
        out.push_back(
            static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()));
      }
      for (int i = 0; i < scan_length && static_cast<int>(out.size()) < trace_length; ++i) {
        out.push_back(next_scan++);
      }
    }
    return out;
  }();
  return t;
}

struct lru {
  explicit lru(std::size_t cap) : capacity(cap) {}
  std::size_t capacity;
  std::list<int> order;
  std::unordered_map<int, std::list<int>::iterator> where;
  bool access(int k) {
    auto it = where.find(k);
    if (it != where.end()) {
      order.splice(order.begin(), order, it->second);
      return true;
    }
    if (order.size() == capacity) {
      where.erase(order.back());
      order.pop_back();
    }
    order.push_front(k);
    where[k] = order.begin();
    return false;
  }
};

void bm_hit_ratio(benchmark::State& state, bool lib) {
  using rcache = sf::cache<int, int, sf::default_hash, std::equal_to<>, manual_clock>;
  const std::vector<int>& t = trace();
  for (auto _ : state) {
    double hits = 0;
    if (lib) {
      sf::cache_options o;
      o.ttl = 24h;
      o.max_entries = zipf_capacity;
      rcache c(o);
      for (const int k : t) benchmark::DoNotOptimize(c.get(k, [k] { return k; }));
      hits = static_cast<double>(c.stats().hits);
      if (c.size() > zipf_capacity) state.SkipWithError("size exceeded max_entries");
    } else {
      lru l(zipf_capacity);
      for (const int k : t) hits += l.access(k) ? 1 : 0;
    }
    state.counters["hit_ratio_pct"] = 100.0 * hits / static_cast<double>(t.size());
  }
}

// ---------------------------------------------------------------------------
// 6. Callers' bounds (issue 32): load_owner::cache (the default) against
//    load_owner::caller (the group's rules: the first caller runs the loader)
// ---------------------------------------------------------------------------

using ms_double = std::chrono::duration<double, std::milli>;

// What a scenario's callers saw: each call's latency (ms) and how it ended.
struct call_log {
  std::mutex mu;
  std::vector<double> ms;
  std::atomic<long> values{0};    // a value (any freshness)
  std::atomic<long> stale{0};     // of those, not fresh (stale, stale_on_error, stale_on_timeout)
  std::atomic<long> timeouts{0};  // timeout_error
  std::atomic<long> cancelled{0};
  std::atomic<long> errors{0};  // anything else (the origin's failure, a cached failure)
  void add(std::vector<double>& mine) {
    std::lock_guard<std::mutex> lk(mu);
    ms.insert(ms.end(), mine.begin(), mine.end());
  }
  // Latency counters: p50 / p99 / max (ms) and calls answered later than `late_after`.
  void report(benchmark::State& state, std::chrono::nanoseconds late_after) {
    std::sort(ms.begin(), ms.end());
    const auto at = [&](double q) {
      if (ms.empty()) return 0.0;
      const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ms.size())));
      return ms[std::min(ms.size() - 1, i == 0 ? 0 : i - 1)];
    };
    const double limit = ms_double(late_after).count();
    state.counters["calls"] = static_cast<double>(ms.size());
    state.counters["late"] =
        static_cast<double>(ms.end() - std::upper_bound(ms.begin(), ms.end(), limit));
    state.counters["p50_ms"] = at(0.50);
    state.counters["p99_ms"] = at(0.99);
    state.counters["max_ms"] = ms.empty() ? 0.0 : ms.back();
    state.counters["values"] = static_cast<double>(values);
    state.counters["stale"] = static_cast<double>(stale);
    state.counters["timeouts"] = static_cast<double>(timeouts);
    state.counters["cancelled"] = static_cast<double>(cancelled);
    state.counters["errors"] = static_cast<double>(errors);
  }
};

// Runs one call, timing it and filing how it ended.
template <class F>
void timed_call(call_log& log, std::vector<double>& mine, F&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const sf::freshness f = call();
    log.values.fetch_add(1);
    if (f != sf::freshness::fresh) log.stale.fetch_add(1);
  } catch (const sf::timeout_error&) {
    log.timeouts.fetch_add(1);
  } catch (const sf::cancelled_error&) {
    log.cancelled.fetch_add(1);
  } catch (...) {
    log.errors.fetch_add(1);
  }
  mine.push_back(ms_double(std::chrono::steady_clock::now() - t0).count());
}

// The origin of these scenarios: int keys, counted calls per key.
struct bound_origin {
  explicit bound_origin(int keys) : per_key(static_cast<std::size_t>(keys)) {}
  std::vector<std::atomic<int>> per_key;
  std::atomic<long> calls{0};
  std::atomic<long> finished{0};  // calls that returned or threw
  void enter(int key) {
    calls.fetch_add(1);
    per_key[static_cast<std::size_t>(key)].fetch_add(1);
  }
  int max_per_key() const {
    int m = 0;
    for (const auto& n : per_key) m = std::max(m, n.load());
    return m;
  }
};

// Waits (at most `limit`) until every origin call has finished and no load runs, so that
// what the loads publish is in the cache.
template <class C>
bool settle(const C& c, const bound_origin& o, std::chrono::nanoseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (o.finished.load() == o.calls.load() && c.stats().loads_running == 0) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

template <class C>
int keys_cached(const C& c, int keys) {
  int n = 0;
  for (int k = 0; k < keys; ++k) n += c.peek(k) && c.peek(k)->found() ? 1 : 0;
  return n;
}

// Starts `n` threads running fn(i) together (all created before any starts) and joins them.
template <class F>
void run_together(int n, F fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::jthread> ts;
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      fn(i);
    });
  }
  while (ready.load() != n) std::this_thread::yield();
  go = true;
}

sf::cache_options bound_options(sf::load_owner owner) {
  sf::cache_options o;
  o.ttl = 1min;
  o.jitter = 0;
  o.loads = owner;
  return o;
}

using bcache = sf::cache<int, std::uint64_t>;

// 6a. 50 keys, each requested once with a 100 ms bound, a 150 ms origin.
void bm_bound_cold(benchmark::State& state, sf::load_owner owner) {
  constexpr int keys = 50;
  for (auto _ : state) {
    bound_origin origin(keys);
    bcache c(bound_options(owner), [&origin](const int& k, sf::stop_token) {
      origin.enter(k);
      std::this_thread::sleep_for(150ms);
      origin.finished.fetch_add(1);
      return static_cast<std::uint64_t>(k);
    });
    call_log log;
    run_together(keys, [&](int k) {
      std::vector<double> mine;
      timed_call(log, mine, [&] { return c.get_entry(k, {}, 100ms).state; });
      log.add(mine);
    });
    if (!settle(c, origin, 5s)) state.SkipWithError("loads did not finish in 5 s");
    log.report(state, 105ms);
    state.counters["origin_calls"] = static_cast<double>(origin.calls);
    state.counters["keys_cached"] = keys_cached(c, keys);
    c.close();
  }
}

// 6b. Leaders whose stop token fires at 100 ms, a 300 ms origin (10 keys at once).
void bm_leader_token(benchmark::State& state, sf::load_owner owner) {
  constexpr int keys = 10;
  for (auto _ : state) {
    bound_origin origin(keys);
    bcache c(bound_options(owner), [&origin](const int& k, sf::stop_token) {
      origin.enter(k);
      std::this_thread::sleep_for(300ms);
      origin.finished.fetch_add(1);
      return static_cast<std::uint64_t>(k);
    });
    std::vector<sf::stop_source> tokens(keys);
    std::atomic<int> calling{0};
    call_log log;
    std::jthread timer([&] {
      while (calling.load() != keys) std::this_thread::yield();
      std::this_thread::sleep_for(100ms);  // the leaders' deadline
      for (auto& t : tokens) t.request_stop();
    });
    run_together(keys, [&](int k) {
      std::vector<double> mine;
      calling.fetch_add(1);
      timed_call(log, mine, [&] {
        return c.get_entry(k, tokens[static_cast<std::size_t>(k)].get_token()).state;
      });
      log.add(mine);
    });
    timer.join();
    if (!settle(c, origin, 5s)) state.SkipWithError("loads did not finish in 5 s");
    log.report(state, 105ms);
    state.counters["origin_calls"] = static_cast<double>(origin.calls);
    state.counters["keys_cached"] = keys_cached(c, keys);
    c.close();
  }
}

// 6c. Soft timeout: 20 keys with an old value (past ttl, within stale_if_error), the origin
// slowed to 2 s, soft_timeout 100 ms, 16 readers for one slow episode (until the slow loads
// have published). The cache's windows are on manual_clock; soft_timeout is on steady_clock.
void bm_soft_timeout(benchmark::State& state, sf::load_owner owner) {
  using scache = sf::cache<int, std::uint64_t, sf::default_hash, std::equal_to<>, manual_clock>;
  constexpr int keys = 20;
  constexpr int readers = 16;
  for (auto _ : state) {
    bound_origin origin(keys);
    std::atomic<bool> slow{false};
    sf::cache_options o = bound_options(owner);
    o.stale_if_error = 1h;
    o.soft_timeout = 100ms;
    scache c(o, [&origin, &slow](const int& k, sf::stop_token) {
      const bool episode = slow.load();
      if (episode) origin.enter(k);
      if (episode) std::this_thread::sleep_for(2s);
      if (episode) origin.finished.fetch_add(1);
      return static_cast<std::uint64_t>(k + (episode ? 1000 : 0));
    });
    for (int k = 0; k < keys; ++k) (void)c.get(k);  // the old values
    slow = true;
    manual_clock::ticks.fetch_add(std::chrono::nanoseconds(2min).count());  // dead, within SIE
    call_log log;
    const auto episode_end = std::chrono::steady_clock::now() + 2s;
    run_together(readers, [&](int t) {
      std::minstd_rand rng(static_cast<unsigned>(t + 1));
      std::vector<double> mine;
      while (std::chrono::steady_clock::now() < episode_end) {
        const int k = static_cast<int>(rng() % keys);
        timed_call(log, mine, [&] { return c.get_entry(k).state; });
        std::this_thread::sleep_for(1ms);
      }
      log.add(mine);
    });
    if (!settle(c, origin, 10s)) state.SkipWithError("loads did not finish in 10 s");
    const long calls = origin.calls.load();
    // The first read of each key after its slow load: fresh, the new value, no load.
    int fresh_after = 0;
    int slow_loaded = 0;  // keys read in the episode (a slow load started)
    for (int k = 0; k < keys; ++k) {
      if (origin.per_key[static_cast<std::size_t>(k)].load() == 0) continue;
      ++slow_loaded;
      const sf::cached<std::uint64_t> e = c.get_entry(k);
      fresh_after += e.state == sf::freshness::fresh && e.taken_as == sf::role::none &&
                             *e.value == static_cast<std::uint64_t>(k + 1000)
                         ? 1
                         : 0;
    }
    log.report(state, 105ms);
    state.counters["origin_calls"] = static_cast<double>(calls);
    state.counters["origin_calls_per_key_max"] = origin.max_per_key();
    state.counters["keys_loaded"] = slow_loaded;
    state.counters["fresh_after"] = fresh_after;
    state.counters["stale_on_timeout"] = static_cast<double>(c.stats().stale_on_timeout);
    c.close();
  }
}

// 6d. The new user's service: 16 request threads over 200 keys, each request a get with a
// 100 ms wait_bound (its deadline), then 2 ms of other work; the origin answers in 20-150 ms
// (uniform), fails 5% of calls, and is down (every call fails, after the same latency) from
// 4 s to 7 s of a 12 s run. The options the docs recommend, their windows scaled to the run:
// ttl 2 s (jitter 0.1), stale_while_revalidate 1 s, stale_if_error 5 min, error_ttl 1 s,
// early_refresh_beta 1. "late": answered (value or exception) more than 105 ms after the call.
constexpr int service_keys = 200;
constexpr int service_threads = 16;
constexpr auto service_run = 12s;
constexpr auto service_down_from = 4s;
constexpr auto service_down_until = 7s;

void bm_service(benchmark::State& state, sf::load_owner owner) {
  for (auto _ : state) {
    bound_origin origin(service_keys);
    const auto start = std::chrono::steady_clock::now();
    std::atomic<std::uint64_t> seeds{1};
    sf::cache_options o;
    o.ttl = 2s;
    o.jitter = 0.1;
    o.stale_while_revalidate = 1s;
    o.stale_if_error = 5min;
    o.error_ttl = 1s;
    o.early_refresh_beta = 1.0;
    o.max_entries = 100'000;
    o.loads = owner;
    bcache c(o, [&origin, &seeds, start](const int& k, sf::stop_token) -> std::uint64_t {
      origin.enter(k);
      // splitmix64 of a call counter: each call's own draw, whatever thread runs it.
      std::uint64_t z = seeds.fetch_add(1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const auto latency = std::chrono::milliseconds(20 + z % 131);
      const bool fails = (z >> 32) % 100 < 5;
      std::this_thread::sleep_for(latency);
      origin.finished.fetch_add(1);
      const auto now = std::chrono::steady_clock::now() - start;
      if (fails || (now >= service_down_from && now < service_down_until)) {
        throw std::runtime_error("origin failed");
      }
      return static_cast<std::uint64_t>(k);
    });
    call_log log;
    run_together(service_threads, [&](int t) {
      std::minstd_rand rng(static_cast<unsigned>(100 + t));
      std::vector<double> mine;
      while (std::chrono::steady_clock::now() - start < service_run) {
        const int k = static_cast<int>(rng() % service_keys);
        timed_call(log, mine, [&] { return c.get_entry(k, {}, 100ms).state; });
        std::this_thread::sleep_for(2ms);
      }
      log.add(mine);
    });
    log.report(state, 105ms);
    state.counters["origin_calls"] = static_cast<double>(origin.calls);
    const sf::cache_stats st = c.stats();
    state.counters["load_failures"] = static_cast<double>(st.load_failures);
    state.counters["negative_hits"] = static_cast<double>(st.negative_hits);  // cached failures
    state.counters["stale_on_error"] = static_cast<double>(st.stale_on_error);
    c.close();
  }
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------

const char* name_of(stampede_impl i) {
  switch (i) {
    case stampede_impl::lib_swr:
      return "lib_swr";
    case stampede_impl::lib_xfetch:
      return "lib_xfetch";
    case stampede_impl::lib_both:
      return "lib_both";
    case stampede_impl::naive:
      return "naive";
    case stampede_impl::group_only:
      return "group_only";
  }
  return "?";
}

const char* name_of(hit_impl i) {
  switch (i) {
    case hit_impl::lib:
      return "lib";
    case hit_impl::lib_free_clock:
      return "lib_free_clock";
    case hit_impl::lib_coarse_clock:
      return "lib_coarse_clock";
    case hit_impl::shared_mutex:
      return "shared_mutex";
    case hit_impl::shared_mutex_ttl:
      return "shared_mutex_ttl";
  }
  return "?";
}

[[maybe_unused]] const bool registered = [] {
  for (const int threads : {1, 8, 64}) {
    for (const auto impl :
         {stampede_impl::lib_swr, stampede_impl::lib_xfetch, stampede_impl::lib_both,
          stampede_impl::naive, stampede_impl::group_only}) {
      const std::string n =
          "cache_stampede/threads:" + std::to_string(threads) + "/impl:" + name_of(impl);
      benchmark::RegisterBenchmark(
          n.c_str(), [impl, threads](benchmark::State& s) { bm_stampede(s, impl, threads); })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const bool lib : {true, false}) {
    const std::string n = std::string("cache_failing/impl:") + (lib ? "lib" : "naive");
    benchmark::RegisterBenchmark(n.c_str(), [lib](benchmark::State& s) { bm_failing(s, lib); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const double j : {0.1, 0.0}) {
    const std::string n = std::string("cache_jitter/impl:") + (j > 0 ? "lib" : "no_jitter");
    benchmark::RegisterBenchmark(n.c_str(), [j](benchmark::State& s) { bm_jitter(s, j); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto impl : {hit_impl::lib, hit_impl::lib_coarse_clock, hit_impl::lib_free_clock,
                          hit_impl::shared_mutex, hit_impl::shared_mutex_ttl}) {
    const std::string u = std::string("cache_hit/value:u64/impl:") + name_of(impl);
    benchmark::RegisterBenchmark(u.c_str(),
                                 [impl](benchmark::State& s) { bm_hit<std::uint64_t>(s, impl); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime()
        ->MinTime(0.3);
    const std::string st = std::string("cache_hit/value:str100/impl:") + name_of(impl);
    benchmark::RegisterBenchmark(st.c_str(),
                                 [impl](benchmark::State& s) { bm_hit<std::string>(s, impl); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime()
        ->MinTime(0.3);
  }
  for (const auto impl : {hit_impl::lib, hit_impl::lib_free_clock, hit_impl::shared_mutex}) {
    const std::string n = std::string("cache_hit_large/entries:1M/impl:") + name_of(impl);
    benchmark::RegisterBenchmark(n.c_str(), [impl](benchmark::State& s) { bm_hit_large(s, impl); })
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime()
        ->MinTime(0.5);
  }
  for (const bool lib : {true, false}) {
    const std::string n = std::string("cache_hit_ratio/impl:") + (lib ? "lib" : "lru");
    benchmark::RegisterBenchmark(n.c_str(), [lib](benchmark::State& s) { bm_hit_ratio(s, lib); })
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto owner : {sf::load_owner::cache, sf::load_owner::caller}) {
    const std::string impl = owner == sf::load_owner::cache ? "lib" : "caller";
    const auto add = [&](const std::string& scenario,
                         void (*fn)(benchmark::State&, sf::load_owner)) {
      const std::string n = scenario + "/impl:" + impl;
      benchmark::RegisterBenchmark(n.c_str(), [fn, owner](benchmark::State& s) { fn(s, owner); })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    };
    add("cache_bound_cold", bm_bound_cold);
    add("cache_leader_token", bm_leader_token);
    add("cache_soft_timeout", bm_soft_timeout);
    add("cache_service", bm_service);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
