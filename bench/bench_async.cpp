// bench/bench_async.cpp
//
// Google Benchmark suite for singleflight's asynchronous waiters
// (group::async_do callbacks and group::co_do coroutines), measured against
// blocking do_ callers and against hand-rolled floors in the same binary, so
// that results read as ratios (bench/report.py prints them as the "Async"
// block; bench/run.sh drives it).
//
// Benchmark names are "<scenario>[/<param>:<value>...]/impl:<impl>" followed
// by Google Benchmark's own suffixes. Impls:
//   do_        blocking callers, one parked thread each (a reused pool)
//   async_do   callback waiters: on_done(outcome<T>)
//   co_do      coroutine waiters: co_await g.co_do(key, fn), from `eager`
//              below (a tiny eager, self-destroying coroutine type)
//   handles    floor for co_do: the same coroutine type suspended on a plain
//              awaiter that pushes its handle into a std::vector; resumed in a
//              loop. No group, no lock: the least a coroutine waiter can cost.
//   functions  floor for async_do: a std::vector of std::function callbacks
//              invoked in a loop.
//
// Scenarios:
//   async_waiters/N:n  N waiters on one flight whose async fn holds its
//       completion; the first waiter leads (untimed), the other N-1 join
//       (join phase), then the benchmark thread resolves it (settle phase).
//       attach_ns_per_join: wall time of the join phase / (N-1). For do_ the
//           phase runs from releasing the parked threads until g.stats().joins
//           shows all of them attached (the method of bench_group's join/);
//           for the others, from the first to the last join call (they
//           attach inline). Coroutine rows include creating the coroutine
//           (frame allocation): a coroutine waiter cannot exist without it.
//       settle_to_last_us: from calling set_value (floors: the resume loop)
//           until the last waiter has resumed. Async waiters resume inline on
//           the resolving thread, so that is when set_value returns; for do_
//           it is the latest wake-up time the threads recorded.
//       resolver_us: how long set_value kept the resolving thread.
//       attach_cpu_ns_per_join, settle_cpu_us, cpu_ns_per_resume: the same
//           phases in thread CPU time (single-threaded impls only; steadier
//           than wall time on a shared machine; CLOCK_THREAD_CPUTIME_ID
//           reads are system calls: their calibrated cost is subtracted).
//       cpu_ns_per_waiter: CPU time over the waiters' whole life (start,
//           joins, settle, wake-ups; for do_ the waiting threads' own CPU in
//           do_ plus the resolver's) / N.
//       allocs_per_join, bytes_per_join: heap allocations made by the join
//           calls, coroutine frames excluded; frame_bytes: one coroutine's
//           frame (the promise's operator new), reported separately;
//           awaiter_bytes, operation_bytes (co_do): sizeof the awaiter that
//           holds the waiter and of what co_do returns, both in the frame.
//   async_bytes/fn:string_copy  The same with N=64 and an fn that captures a
//       std::string (48 chars) by value, passed as an lvalue, as a caller
//       reusing one fn object would: what a join stores of fn.
//   async_leader_sync / async_leader_async_inline  Uncontended leader path:
//       every call starts and settles its own flight; fn is synchronous
//       (returns ++x) or asynchronous and resolves its completion before
//       returning (a cache hit inside an async fn). ns/call, allocs/call.
//
// Every round checks its outcome (value, number of fn calls, flights, joins,
// resumptions) and aborts with a message when it is wrong. Every wait is
// bounded, and a watchdog thread aborts a round that takes longer than 60 s.
//
// Allocation counting: this binary replaces the global operator new/delete
// and counts allocations per thread (bench/support/alloc.hpp).
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// include/singleflight/detail/group/flight.hpp may trip -Wshadow (see bench_group.cpp);
// the bench is built with -Werror -Wshadow.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/singleflight.hpp"
#pragma GCC diagnostic pop

#include "support/alloc.hpp"  // this binary's operator new/delete (per-thread counters)
#include "support/crew.hpp"

namespace {

using clk = std::chrono::steady_clock;
using value_t = std::uint64_t;
using group_t = singleflight::group<std::string, value_t>;
using completion_t = singleflight::completion<value_t>;
using outcome_t = singleflight::outcome<value_t>;

double ns_between(clk::time_point a, clk::time_point b) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Thread CPU charged between two back-to-back thread_cpu_ns() reads (a system
// call, not vDSO): the median of 201 pairs, subtracted from each CPU phase.
std::int64_t cpu_read_overhead_ns() {
  static const std::int64_t overhead = [] {
    std::vector<std::int64_t> d;
    for (int i = 0; i < 201; ++i) {
      const std::int64_t a = thread_cpu_ns();
      d.push_back(thread_cpu_ns() - a);
    }
    std::nth_element(d.begin(), d.begin() + 100, d.end());
    return d[100];
  }();
  return overhead;
}

std::string make_key(int tenant, int user) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "tenant-%03d|user-%06d|en-GB|v3|t0", tenant, user);
  return buf;
}

[[noreturn]] void fail(const std::string& where, const char* what) {
  std::fprintf(stderr, "bench_async: %s: %s\n", where.c_str(), what);
  std::fflush(stderr);
  std::abort();
}

void check(bool ok, const std::string& where, const char* what) {
  if (!ok) fail(where, what);
}

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
// watchdog: aborts the process when an armed round overruns (a lost wake-up
// inside the library would otherwise hang the run).
// ---------------------------------------------------------------------------
class watchdog {
 public:
  static void arm(const std::string& what) {
    instance();
    what_ = what;  // read only by the watchdog after the deadline store below
    deadline_ns_.store(now_ns() + 60'000'000'000, std::memory_order_release);
  }
  static void disarm() { deadline_ns_.store(0, std::memory_order_release); }

 private:
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch())
        .count();
  }
  static void instance() {
    static const bool started = [] {
      std::thread([] {
        for (;;) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          const std::int64_t d = deadline_ns_.load(std::memory_order_acquire);
          if (d != 0 && now_ns() > d) fail(what_, "round did not finish within 60 s (hang?)");
        }
      }).detach();
      return true;
    }();
    (void)started;
  }
  static inline std::atomic<std::int64_t> deadline_ns_{0};
  static inline std::string what_;
};

// ---------------------------------------------------------------------------
// crew (bench/support/crew.hpp): parked threads that run one job per round;
// created once (1024 threads), so thread creation never lands in a measurement.
// ---------------------------------------------------------------------------
sfbench::crew& the_crew() {
  static sfbench::crew c(1024);
  return c;
}

// ---------------------------------------------------------------------------
// eager: a minimal coroutine type. Starts at once, runs until its first real
// suspension, destroys its own frame at the end. Frame allocations are
// counted per thread (they are also in sfbench::alloc::t_bytes).
// ---------------------------------------------------------------------------
namespace frames {
constinit thread_local std::uint64_t t_count = 0;
constinit thread_local std::uint64_t t_bytes = 0;
}  // namespace frames

struct eager {
  struct promise_type {
    static void* operator new(std::size_t n) {
      ++frames::t_count;
      frames::t_bytes += n;
      return ::operator new(n);
    }
    static void operator delete(void* p, std::size_t) noexcept { ::operator delete(p); }
    eager get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept {
      try {
        throw;
      } catch (const std::exception& e) {
        fail("eager coroutine", e.what());
      } catch (...) {
        fail("eager coroutine", "unknown exception");
      }
    }
  };
};

// Where the waiters of one round report (on the resolving thread).
struct sink {
  value_t expected = 0;
  std::uint64_t resumed = 0;
  std::uint64_t wrong = 0;
  void reset(value_t e) {
    expected = e;
    resumed = 0;
    wrong = 0;
  }
  void got(value_t v) {
    if (v != expected) ++wrong;
    ++resumed;
  }
  void got(const outcome_t& o) {
    if (!o.has_value() || o.value() != expected) ++wrong;
    ++resumed;
  }
};

// The held flight: the async fn parks its completion here.
struct holder {
  std::optional<completion_t> slot;
  std::atomic<std::uint64_t> starts{0};
  void take(completion_t c) {
    slot.emplace(std::move(c));
    starts.fetch_add(1, std::memory_order_release);
  }
};

// The async fn every waiter passes (only the leader's runs): 8 bytes.
struct hold_fn {
  holder* h;
  void operator()(std::stop_token, completion_t c) const { h->take(std::move(c)); }
};

// The same with a std::string captured by value (48 chars: heap-allocated).
struct fat_hold_fn {
  std::string payload;
  holder* h;
  void operator()(std::stop_token, completion_t c) const {
    benchmark::DoNotOptimize(payload.data());
    h->take(std::move(c));
  }
};

template <class Fn>
eager co_waiter(group_t& g, const std::string& key, Fn& fn, sink& s) {
  s.got(co_await g.co_do(key, fn));
}

struct parking_lot {
  std::vector<std::coroutine_handle<>> handles;
  value_t value = 0;
};
struct park {
  parking_lot* lot;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) { lot->handles.push_back(h); }
  value_t await_resume() const noexcept { return lot->value; }
};
eager floor_waiter(parking_lot& lot, sink& s) { s.got(co_await park{&lot}); }

enum class impl { blocking, callback, coroutine, handles, functions };

const char* impl_name(impl k) {
  switch (k) {
    case impl::blocking:
      return "do_";
    case impl::callback:
      return "async_do";
    case impl::coroutine:
      return "co_do";
    case impl::handles:
      return "handles";
    case impl::functions:
      return "functions";
  }
  return "?";
}

struct round_totals {
  std::uint64_t rounds = 0;
  double attach_ns = 0;
  double settle_ns = 0;
  double resolver_ns = 0;
  double cpu_ns = 0;
  std::uint64_t join_allocs = 0;
  std::uint64_t join_bytes = 0;
  std::uint64_t frame_bytes = 0;
  std::uint64_t frames = 0;
  std::uint64_t settle_allocs = 0;
  bool phase_cpu = false;  // single-threaded impls: thread CPU of each phase
  double attach_cpu_ns = 0;
  double settle_cpu_ns = 0;

  void report(benchmark::State& state, int n) const {
    const double r = static_cast<double>(rounds);
    const double joins = r * (n - 1);
    state.counters["attach_ns_per_join"] = attach_ns / joins;
    state.counters["settle_to_last_us"] = settle_ns / r / 1000.0;
    state.counters["ns_per_resume"] = settle_ns / r / n;
    state.counters["resolver_us"] = resolver_ns / r / 1000.0;
    state.counters["cpu_ns_per_waiter"] = cpu_ns / r / n;
    state.counters["allocs_per_join"] = static_cast<double>(join_allocs) / joins;
    state.counters["bytes_per_join"] = static_cast<double>(join_bytes) / joins;
    if (frames != 0) {
      state.counters["frame_bytes"] =
          static_cast<double>(frame_bytes) / static_cast<double>(frames);
    }
    state.counters["settle_allocs_per_waiter"] = static_cast<double>(settle_allocs) / (r * n);
    state.counters["waiters"] = n;
    if (phase_cpu) {
      state.counters["attach_cpu_ns_per_join"] = attach_cpu_ns / joins;
      state.counters["settle_cpu_us"] = settle_cpu_ns / r / 1000.0;
      state.counters["cpu_ns_per_resume"] = settle_cpu_ns / r / n;
    }
  }
};

// ---------------------------------------------------------------------------
// 1-3. N waiters on one held flight: join phase, settle phase, bytes.
//      Single-threaded impls (async_do, co_do and the floors).
// ---------------------------------------------------------------------------
template <impl K, class Fn>
void bm_waiters(benchmark::State& state, std::string where, int n, Fn fn_proto) {
  group_t g;
  const std::string key = make_key(1, 1);
  holder h;
  Fn fn = fn_proto;
  fn.h = &h;
  sink s;
  parking_lot lot;
  lot.handles.reserve(static_cast<std::size_t>(n));
  std::vector<std::function<void(const value_t&)>> fns;
  fns.reserve(static_cast<std::size_t>(n));
  round_totals tot;
  constexpr bool grouped = K == impl::callback || K == impl::coroutine;
  const std::int64_t cpu_overhead = cpu_read_overhead_ns();

  const auto join_one = [&] {
    if constexpr (K == impl::callback) {
      g.async_do(key, fn, [sp = &s](outcome_t o) { sp->got(o); });
    } else if constexpr (K == impl::coroutine) {
      co_waiter(g, key, fn, s);
    } else if constexpr (K == impl::handles) {
      floor_waiter(lot, s);
    } else {
      fns.emplace_back([sp = &s](const value_t& v) { sp->got(v); });
    }
  };

  for (auto _ : state) {
    const value_t expected = 1000 + tot.rounds;
    s.reset(expected);
    watchdog::arm(where);
    const singleflight::stats st0 = g.stats();
    const std::int64_t cpu0 = thread_cpu_ns();

    join_one();  // the leader (untimed)
    if constexpr (grouped) {
      check(h.starts.load(std::memory_order_acquire) == tot.rounds + 1 && h.slot.has_value(), where,
            "the leader's async fn did not run (exactly once) inside the first call");
    }

    const sfbench::alloc::probe pj;
    const std::uint64_t fb0 = frames::t_bytes, fc0 = frames::t_count;
    const std::int64_t c0 = thread_cpu_ns();
    const clk::time_point t0 = clk::now();
    for (int i = 1; i < n; ++i) join_one();
    const clk::time_point t1 = clk::now();
    const std::int64_t c1 = thread_cpu_ns();
    const std::uint64_t fb = frames::t_bytes - fb0;
    tot.join_allocs += pj.allocs() - (frames::t_count - fc0);
    tot.join_bytes += pj.bytes() - fb;
    tot.frame_bytes += fb;
    tot.frames += frames::t_count - fc0;

    check(s.resumed == 0, where, "a waiter was resumed before the flight was resolved");
    if constexpr (grouped) {
      const singleflight::stats st1 = g.stats();
      check(st1.joins - st0.joins == static_cast<std::uint64_t>(n - 1) &&
                st1.flights - st0.flights == 1,
            where, "expected 1 flight and N-1 joins");
      check(h.starts.load() == tot.rounds + 1, where, "a joiner's fn ran");
    }

    const sfbench::alloc::probe ps;
    const std::int64_t c2 = thread_cpu_ns();
    const clk::time_point t2 = clk::now();
    if constexpr (grouped) {
      h.slot->set_value(expected);
    } else if constexpr (K == impl::handles) {
      lot.value = expected;
      for (std::coroutine_handle<> c : lot.handles) c.resume();
    } else {
      for (auto& f : fns) f(expected);
    }
    const clk::time_point t3 = clk::now();
    const std::int64_t c3 = thread_cpu_ns();
    tot.settle_allocs += ps.allocs();
    tot.cpu_ns += static_cast<double>(thread_cpu_ns() - cpu0);
    lot.handles.clear();
    fns.clear();
    h.slot.reset();

    if (s.resumed != static_cast<std::uint64_t>(n)) {
      char msg[128];
      std::snprintf(msg, sizeof msg, "%llu of %d waiters resumed by the time set_value returned",
                    static_cast<unsigned long long>(s.resumed), n);
      fail(where, msg);
    }
    check(s.wrong == 0, where, "a waiter received a wrong value or an error");
    if constexpr (grouped) check(g.in_flight() == 0, where, "the key is still in flight");
    watchdog::disarm();

    ++tot.rounds;
    tot.attach_ns += ns_between(t0, t1);
    tot.settle_ns += ns_between(t2, t3);
    tot.resolver_ns += ns_between(t2, t3);
    tot.attach_cpu_ns += static_cast<double>(c1 - c0 - cpu_overhead);
    tot.settle_cpu_ns += static_cast<double>(c3 - c2 - cpu_overhead);
  }
  tot.phase_cpu = true;
  tot.report(state, n);
  if constexpr (K == impl::coroutine) {
    // What co_do puts in the awaiting coroutine's frame (the types are the
    // library's private ones; decltype reaches them without naming them).
    using operation_t = decltype(g.co_do(key, fn));
    using awaiter_t = decltype(std::declval<operation_t>().operator co_await());
    state.counters["awaiter_bytes"] = static_cast<double>(sizeof(awaiter_t));
    state.counters["operation_bytes"] = static_cast<double>(sizeof(operation_t));
  }
}

// The same with blocking do_ callers, one crew thread each; thread 0 leads
// (do_ with the async fn: it blocks like the others).
void bm_waiters_blocking(benchmark::State& state, std::string where, int n) {
  group_t g;
  const std::string key = make_key(1, 1);
  holder h;
  const hold_fn fn{&h};
  sfbench::crew& c = the_crew();
  std::vector<clk::time_point> woke(static_cast<std::size_t>(n));
  std::atomic<std::uint64_t> wrong{0}, allocs{0}, bytes{0};
  std::atomic<std::int64_t> cpu{0};
  round_totals tot;

  for (auto _ : state) {
    const value_t expected = 1000 + tot.rounds;
    watchdog::arm(where);
    const singleflight::stats st0 = g.stats();
    std::latch line(n);  // the n-1 joiners and this thread
    const std::uint64_t starts = tot.rounds + 1;
    c.start(n, [&](int i) {
      if (i != 0) {
        if (!await([&] { return h.starts.load(std::memory_order_acquire) >= starts; })) {
          wrong.fetch_add(1);
        }
        line.arrive_and_wait();
      }
      const sfbench::alloc::probe p;
      const std::int64_t c0 = thread_cpu_ns();
      value_t v = 0;
      try {
        v = g.do_(key, fn);
      } catch (...) {
        wrong.fetch_add(1);
      }
      woke[static_cast<std::size_t>(i)] = clk::now();
      cpu.fetch_add(thread_cpu_ns() - c0);
      if (i != 0) {  // the leader's allocations (starting the flight) are not a join's
        allocs.fetch_add(p.allocs());
        bytes.fetch_add(p.bytes());
      }
      if (v != expected) wrong.fetch_add(1);
    });
    check(await([&] { return h.starts.load(std::memory_order_acquire) >= starts; }), where,
          "the leader's async fn did not start");
    line.arrive_and_wait();
    const clk::time_point t0 = clk::now();
    const bool formed =
        await([&] { return g.stats().joins - st0.joins >= static_cast<std::uint64_t>(n - 1); });
    const clk::time_point t1 = clk::now();
    if (!formed) {
      h.slot.reset();  // fails the flight (broken promise): the threads return
      (void)c.wait_for(std::chrono::milliseconds(10000));
      fail(where, "not all threads joined within 10 s");
    }

    const std::int64_t rc0 = thread_cpu_ns();
    const sfbench::alloc::probe ps;
    const clk::time_point t2 = clk::now();
    h.slot->set_value(expected);
    const clk::time_point t3 = clk::now();
    tot.settle_allocs += ps.allocs();
    tot.cpu_ns += static_cast<double>(thread_cpu_ns() - rc0);
    h.slot.reset();
    check(c.wait_for(std::chrono::milliseconds(10000)), where,
          "a blocked caller was not woken within 10 s");

    const singleflight::stats st1 = g.stats();
    check(st1.joins - st0.joins == static_cast<std::uint64_t>(n - 1) &&
              st1.flights - st0.flights == 1 && h.starts.load() == starts,
          where, "expected 1 flight (1 fn call) and N-1 joins");
    check(wrong.load() == 0, where, "a caller received a wrong value or an error");
    check(g.in_flight() == 0, where, "the key is still in flight");
    watchdog::disarm();

    ++tot.rounds;
    tot.attach_ns += ns_between(t0, t1);
    tot.settle_ns += ns_between(t2, *std::max_element(woke.begin(), woke.end()));
    tot.resolver_ns += ns_between(t2, t3);
  }
  tot.cpu_ns += static_cast<double>(cpu.load());
  // Allocations of the joiners' whole do_ calls (attach, block, wake, copy).
  tot.join_allocs = allocs.load();
  tot.join_bytes = bytes.load();
  tot.report(state, n);
}

// ---------------------------------------------------------------------------
// 4. Uncontended leader path: each call starts, runs and settles a flight.
// ---------------------------------------------------------------------------
struct loop_result {
  std::uint64_t calls = 0;
  std::uint64_t wrong = 0;
  bool finished = false;
};

template <class Fn>
eager co_leader_loop(benchmark::State& state, group_t& g, const std::string& key, Fn& fn,
                     const value_t& x, loop_result& r) {
  for (auto _ : state) {
    const value_t v = co_await g.co_do(key, fn);
    benchmark::DoNotOptimize(v);
    if (v != x) ++r.wrong;
    ++r.calls;
  }
  r.finished = true;
}

template <impl K, bool AsyncFn>
void bm_leader(benchmark::State& state, std::string where) {
  group_t g;
  const std::string key = make_key(7, 7);
  value_t x = 0;
  auto sync_fn = [&x] { return ++x; };
  auto async_fn = [&x](std::stop_token, completion_t c) { c.set_value(++x); };
  auto& fn = [&]() -> auto& {
    if constexpr (AsyncFn) {
      return async_fn;
    } else {
      return sync_fn;
    }
  }
  ();
  loop_result r;
  (void)g.do_(key, fn);  // warm the map's bucket array and the pools
  const sfbench::alloc::probe p;
  if constexpr (K == impl::blocking) {
    for (auto _ : state) {
      const value_t v = g.do_(key, fn);
      benchmark::DoNotOptimize(v);
      if (v != x) ++r.wrong;
      ++r.calls;
    }
    r.finished = true;
  } else if constexpr (K == impl::callback) {
    for (auto _ : state) {
      value_t v = 0;
      g.async_do(key, fn, [&v](outcome_t o) { v = o.value(); });
      benchmark::DoNotOptimize(v);
      if (v != x) ++r.wrong;  // also catches an on_done that did not run inline
      ++r.calls;
    }
    r.finished = true;
  } else {
    co_leader_loop(state, g, key, fn, x, r);
  }
  const double n = static_cast<double>(state.iterations());
  check(r.finished, where, "co_do suspended although its fn completes inline");
  check(r.wrong == 0 && r.calls == static_cast<std::uint64_t>(state.iterations()), where,
        "a call returned a wrong value (or on_done did not run before async_do returned)");
  check(g.stats().flights == r.calls + 1, where, "expected one flight per call");
  state.counters["allocs_per_call"] = static_cast<double>(p.allocs()) / n;
  state.counters["alloc_bytes_per_call"] = static_cast<double>(p.bytes()) / n;
  state.SetItemsProcessed(state.iterations());
}

// ---------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------
std::string nm(const std::string& scenario, impl k) { return scenario + "/impl:" + impl_name(k); }

template <impl K, class Fn>
void register_waiters(const std::string& scenario, int n, Fn proto) {
  const std::string name = nm(scenario, K);
  benchmark::RegisterBenchmark(
      name.c_str(), [name, n, proto](benchmark::State& s) { bm_waiters<K>(s, name, n, proto); })
      ->UseRealTime()
      ->MinTime(0.1);
}

template <impl K, bool AsyncFn>
void register_leader(const std::string& scenario) {
  const std::string name = nm(scenario, K);
  benchmark::RegisterBenchmark(name.c_str(),
                               [name](benchmark::State& s) { bm_leader<K, AsyncFn>(s, name); })
      ->UseRealTime()
      ->MinTime(0.2);
}

const bool registered = [] {
  for (int n : {64, 1024, 10000}) {
    const std::string sc = "async_waiters/N:" + std::to_string(n);
    if (n <= 1024) {
      const std::string name = nm(sc, impl::blocking);
      benchmark::RegisterBenchmark(
          name.c_str(), [name, n](benchmark::State& s) { bm_waiters_blocking(s, name, n); })
          ->UseRealTime()
          ->MinTime(0.1);
    }
    register_waiters<impl::callback>(sc, n, hold_fn{nullptr});
    register_waiters<impl::coroutine>(sc, n, hold_fn{nullptr});
    register_waiters<impl::handles>(sc, n, hold_fn{nullptr});
    register_waiters<impl::functions>(sc, n, hold_fn{nullptr});
  }
  const fat_hold_fn fat{std::string(48, 'k'), nullptr};
  register_waiters<impl::callback>("async_bytes/fn:string_copy", 64, fat);
  register_waiters<impl::coroutine>("async_bytes/fn:string_copy", 64, fat);

  register_leader<impl::blocking, false>("async_leader_sync");
  register_leader<impl::callback, false>("async_leader_sync");
  register_leader<impl::coroutine, false>("async_leader_sync");
  register_leader<impl::blocking, true>("async_leader_async_inline");
  register_leader<impl::callback, true>("async_leader_async_inline");
  register_leader<impl::coroutine, true>("async_leader_async_inline");
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
