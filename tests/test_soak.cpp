// Soak: 8 threads on 3 hot keys, a random mix of do_ / do_fresh whose fns
// return values, throw (int and std::runtime_error), block until their token
// is stopped (released by the deadline, by the ownership policy or by
// close()), or do a little work; per-call stop_sources fired at random
// moments by a canceller thread; forget() at random; a final close() racing
// the workers. An oracle checks, for every call and every fn:
//
//  * no overlap: two fns of one key never run together unless the older one's
//    flight was forgotten (forget() and fn start are serialised per key by
//    the test, so "forgotten" is exact up to the flights started by then);
//  * no stale outcome: a caller's flight (call_info.flight) is newer than any
//    flight of its key that had visibly settled (some caller had received its
//    outcome) before the caller arrived; do_fresh's flight is newer than any
//    flight of its key visibly started before it arrived (flight numbers
//    increase per key; across keys they say nothing once there are several
//    shards);
//  * identity: a value / exception carries the number of the flight that made
//    it, which must be the flight the caller was told it was in, and every
//    caller of one flight that was not itself cancelled sees the same outcome;
//  * cancelled_error only for a caller whose own token fired;
//  * every call ends (a watchdog aborts if one runs past the bound);
//  * stats add up exactly against the test's own counts, and in_flight() is 0
//    after close().
//
// The forget oracle needs every flight number started so far (stats().flights
// with one shard, where numbers count flights); the configurations with
// forget() run on one shard, and one configuration runs on the default
// shards without forget(), where any overlap is a violation.
//
// Seeded: the seed is printed; SINGLEFLIGHT_SOAK_SEED=<n> replays each
// thread's sequence of operations (not the thread interleaving).
// SINGLEFLIGHT_SOAK_SECONDS=<s> sets the duration of each test case
// (default 2).
#include <singleflight/singleflight.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;
constexpr int n_workers = 8;
constexpr int n_keys = 3;

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoull(v, nullptr, 10);
}

double env_seconds() {
  const char* v = std::getenv("SINGLEFLIGHT_SOAK_SECONDS");
  if (v == nullptr || *v == '\0') return 2.0;
  const double s = std::strtod(v, nullptr);
  return s > 0 ? s : 2.0;
}

// Outcome codes: what one caller received, comparable across callers.
enum outcome_tag : std::uint64_t {
  o_value = 1,
  o_int = 2,
  o_runtime = 3,
  o_timeout = 4,
  o_closed = 5,
};
std::uint64_t code(outcome_tag t, std::uint64_t payload) {
  return (std::uint64_t{t} << 56) | payload;
}

long long encode_value(int key, std::uint64_t seq) {
  return static_cast<long long>((std::uint64_t(key) << 40) | seq);
}

// What the leader's fn needs to know about its own call: the flight number
// lead() writes into call_info before fn runs.
struct call_ctx {
  sf::call_info info;
};

enum class fn_kind { value, throw_int, throw_runtime, until_stopped, work };

struct soak {
  sf::group<int, long long>& g;

  // No-overlap oracle. Guarded by km[k].
  std::array<std::mutex, n_keys> km;
  std::array<std::vector<std::uint64_t>, n_keys> running;
  std::array<std::uint64_t, n_keys> forgiven{};  // flights <= this were forgotten or done
  std::atomic<std::uint64_t> overlaps{0};        // overlaps seen (all justified by forget)
  std::atomic<int> peak_running{0};

  // Staleness oracle.
  std::array<std::atomic<std::uint64_t>, n_keys> settled_floor{};
  std::array<std::atomic<std::uint64_t>, n_keys> started_floor{};
  bool forgets_on = true;  // only with one shard (see above)

  // Identity oracle: the outcome every non-cancelled caller of a flight saw.
  std::mutex om;
  std::unordered_map<std::uint64_t, std::uint64_t> outcome_of;

  // The test's own counts.
  std::atomic<std::uint64_t> calls{0}, leaders{0}, followers{0}, nones{0}, cancelled{0}, fn_runs{0},
      fn_throws{0}, forgets{0}, forgets_hit{0}, values{0}, closed_calls{0}, timeouts_seen{0},
      cancels_fired{0};

  // Violations, recorded by any thread, asserted by the test thread.
  std::mutex vm;
  std::vector<std::string> violations;
  void violation(std::string what) {
    std::lock_guard<std::mutex> lk(vm);
    if (violations.size() < 20) violations.push_back(std::move(what));
  }

  explicit soak(sf::group<int, long long>& grp) : g(grp) {}

  static void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t v) {
    std::uint64_t cur = a.load();
    while (v > cur && !a.compare_exchange_weak(cur, v)) {
    }
  }

  void fn_enter(int k, std::uint64_t seq) {
    std::lock_guard<std::mutex> lk(km[k]);
    for (std::uint64_t other : running[k]) {
      overlaps.fetch_add(1);
      if (std::min(other, seq) > forgiven[k]) {
        violation("overlap: key " + std::to_string(k) + " flights " + std::to_string(other) +
                  " and " + std::to_string(seq) + " ran together without a forget");
      }
    }
    running[k].push_back(seq);
    const int n = static_cast<int>(running[k].size());
    int seen = peak_running.load();
    while (n > seen && !peak_running.compare_exchange_weak(seen, n)) {
    }
  }
  void fn_leave(int k, std::uint64_t seq) {
    std::lock_guard<std::mutex> lk(km[k]);
    auto& r = running[k];
    r.erase(std::find(r.begin(), r.end(), seq));
  }

  void forget(int k) {
    forgets.fetch_add(1);
    std::lock_guard<std::mutex> lk(km[k]);
    if (g.forget(k)) {
      forgets_hit.fetch_add(1);
      forgiven[k] = g.stats().flights;  // seq_ == flights: every flight started so far
    }
  }

  void record(std::uint64_t seq, std::uint64_t c) {
    std::lock_guard<std::mutex> lk(om);
    auto [it, inserted] = outcome_of.emplace(seq, c);
    if (!inserted && it->second != c) {
      violation("flight " + std::to_string(seq) + ": callers saw different outcomes");
    }
  }
};

struct worker_slot {
  std::mutex m;
  std::shared_ptr<sf::stop_source> src;     // the current call's, while cancellable
  std::atomic<std::int64_t> op_started{0};  // steady ticks; 0 when idle
};

// Blocks until `st` is stopped; bounded (aborts past the bound).
// (A stop_callback and a condition_variable: std::condition_variable_any's stop_token wait
// takes only std::stop_token, which libc++ before 20 lacks.)
void block_until_stopped(const sf::stop_token& st) {
  std::mutex m;
  std::condition_variable cv;
  bool stopped = false;
  // Runs in request_stop() (or here, when st is already stopped); ~stop_callback, after lk's
  // destructor below, waits for a run on another thread.
  sf::stop_callback wake(st, [&] {
    const std::lock_guard<std::mutex> g(m);
    stopped = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lk(m);
  if (!cv.wait_for(lk, sftest::bound, [&] { return stopped; })) {
    sftest::hang("soak fn blocked until stopped: never stopped");
  }
}

// `keep`: every shared exception this worker caught, held until the test
// thread has joined all workers. ThreadSanitizer cannot see a
// std::exception_ptr's reference count (libstdc++ is not instrumented), so
// if the last of several waiters sharing one exception object freed it, TSan
// would report the others' earlier reads (e.what(), catch (int)) as racing
// with that free. Keeping a reference moves every such free after the joins.
void run_worker(soak& s, worker_slot& slot, std::uint64_t seed, const std::atomic<bool>& finished,
                std::vector<std::exception_ptr>& keep) {
  std::mt19937_64 rng(seed);
  auto pct = [&] { return static_cast<int>(rng() % 100); };
  while (!finished.load(std::memory_order_acquire)) {
    const int k = static_cast<int>(rng() % n_keys);
    const int r = pct();
    if (r < 3) {
      if (s.forgets_on) s.forget(k);
      continue;
    }
    const bool fresh = pct() < 30;
    const int kr = pct();
    const fn_kind kind = kr < 40   ? fn_kind::value
                         : kr < 50 ? fn_kind::throw_int
                         : kr < 60 ? fn_kind::throw_runtime
                         : kr < 70 ? fn_kind::until_stopped
                                   : fn_kind::work;
    const int work = static_cast<int>(rng() % 200);
    std::shared_ptr<sf::stop_source> src;
    if (pct() < 40) src = std::make_shared<sf::stop_source>();
    {
      std::lock_guard<std::mutex> lk(slot.m);
      slot.src = src;
    }
    auto ctx = std::make_shared<call_ctx>();
    auto fn = [&s, k, ctx, kind, work](sf::stop_token st) -> long long {
      const std::uint64_t seq = ctx->info.flight;  // written by lead() before fn runs
      s.fn_runs.fetch_add(1);
      s.fn_enter(k, seq);
      struct leave_guard {
        soak& s;
        int k;
        std::uint64_t seq;
        ~leave_guard() { s.fn_leave(k, seq); }
      } guard{s, k, seq};
      for (int i = 0; i < work; ++i) std::this_thread::yield();
      switch (kind) {
        case fn_kind::throw_int:
          s.fn_throws.fetch_add(1);
          throw static_cast<int>(seq);
        case fn_kind::throw_runtime:
          s.fn_throws.fetch_add(1);
          throw std::runtime_error(std::to_string(seq));
        case fn_kind::until_stopped:
          block_until_stopped(st);
          break;
        case fn_kind::value:
        case fn_kind::work:
          break;
      }
      return encode_value(k, seq);
    };
    const std::uint64_t settled_before = s.settled_floor[k].load();
    const std::uint64_t started_before = s.started_floor[k].load();
    slot.op_started.store(steady::now().time_since_epoch().count(), std::memory_order_release);
    s.calls.fetch_add(1);
    sf::stop_token tok = src ? src->get_token() : sf::stop_token{};
    std::uint64_t got = 0;  // outcome code; 0: cancelled / rejected
    bool was_cancelled = false;
    bool saw_closed = false;  // close() has begun: this worker is done after this call
    try {
      const long long v =
          fresh ? s.g.do_fresh(k, fn, tok, ctx->info) : s.g.do_(k, fn, tok, ctx->info);
      s.values.fetch_add(1);
      const auto uv = static_cast<std::uint64_t>(v);
      if (static_cast<int>(uv >> 40) != k) s.violation("value of another key");
      if ((uv & ((std::uint64_t{1} << 40) - 1)) != ctx->info.flight) {
        s.violation("value from flight " + std::to_string(uv & ((std::uint64_t{1} << 40) - 1)) +
                    " delivered as flight " + std::to_string(ctx->info.flight));
      }
      got = code(o_value, uv);
    } catch (int e) {
      keep.push_back(std::current_exception());
      if (static_cast<std::uint64_t>(e) != ctx->info.flight) s.violation("int from another flight");
      got = code(o_int, static_cast<std::uint64_t>(e));
    } catch (const sf::cancelled_error&) {
      was_cancelled = true;
      s.cancelled.fetch_add(1);
      if (!src || !src->stop_requested()) s.violation("cancelled_error without the caller's stop");
    } catch (const sf::timeout_error&) {
      if (ctx->info.role != sf::role::none) {
        got = code(o_timeout, 0);
        s.timeouts_seen.fetch_add(1);
      }
    } catch (const sf::closed_error&) {
      s.closed_calls.fetch_add(1);
      saw_closed = true;
      if (ctx->info.role != sf::role::none) got = code(o_closed, 0);
    } catch (const sf::error& e) {
      s.violation(std::string("unexpected singleflight::error: ") + e.what());
    } catch (const std::runtime_error& e) {
      keep.push_back(std::current_exception());
      if (std::to_string(ctx->info.flight) != e.what())
        s.violation("runtime_error from another flight");
      got = code(o_runtime, ctx->info.flight);
    } catch (...) {
      keep.push_back(std::current_exception());
      s.violation("unexpected exception type");
    }
    slot.op_started.store(0, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lk(slot.m);
      slot.src.reset();
    }
    const sf::call_info info = ctx->info;
    switch (info.role) {
      case sf::role::none:
        s.nones.fetch_add(1);
        break;
      case sf::role::leader:
        s.leaders.fetch_add(1);
        break;
      case sf::role::follower:
        s.followers.fetch_add(1);
        break;
    }
    if (info.role == sf::role::none) {
      if (saw_closed) break;
      continue;
    }
    if (info.flight <= settled_before) {
      s.violation("stale: key " + std::to_string(k) + " got flight " + std::to_string(info.flight) +
                  " but flight " + std::to_string(settled_before) +
                  " had settled before it arrived");
    }
    if (fresh && info.flight <= started_before) {
      s.violation("do_fresh got flight " + std::to_string(info.flight) + " but flight " +
                  std::to_string(started_before) + " had started before it arrived");
    }
    soak::raise_to(s.started_floor[k], info.flight);
    if (got != 0 && !was_cancelled) {
      s.record(info.flight, got);
      soak::raise_to(s.settled_floor[k], info.flight);
    }
    if (saw_closed) break;
  }
}

void run_soak(const char* name, sf::options opts) {
  const std::uint64_t seed = env_u64("SINGLEFLIGHT_SOAK_SEED", std::random_device{}());
  const double seconds = env_seconds();
  std::printf("soak %s: seed %llu (SINGLEFLIGHT_SOAK_SEED), %.1f s (SINGLEFLIGHT_SOAK_SECONDS)\n",
              name, static_cast<unsigned long long>(seed), seconds);
  std::fflush(stdout);
  INFO("seed " << seed);

  const bool one_shard = opts.shards == 1;
  sf::group<int, long long> g(std::move(opts));
  soak s(g);
  s.forgets_on = one_shard;
  std::array<worker_slot, n_workers> slots;
  std::atomic<bool> finished{false}, cancel_stop{false};
  std::atomic<int> exited{0};
  std::vector<std::thread> workers;
  std::array<std::vector<std::exception_ptr>, n_workers> kept;
  for (int i = 0; i < n_workers; ++i) {
    workers.emplace_back([&, i] {
      run_worker(s, slots[i], seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i) + 1,
                 finished, kept[i]);
      exited.fetch_add(1);
    });
  }
  std::thread canceller([&] {
    std::mt19937_64 rng(seed ^ 0xC0FFEEull);
    while (!cancel_stop.load(std::memory_order_acquire)) {
      // Pacing only (how often cancellations land), never synchronisation.
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
      worker_slot& w = slots[rng() % n_workers];
      std::shared_ptr<sf::stop_source> src;
      {
        std::lock_guard<std::mutex> lk(w.m);
        src = w.src;
      }
      if (src) {
        src->request_stop();  // outside the slot's lock: stop callbacks run here
        s.cancels_fired.fetch_add(1);
      }
    }
  });

  const auto t0 = steady::now();
  const auto until =
      t0 + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(seconds));
  auto t1 = t0;
  while ((t1 = steady::now()) < until) {
    std::this_thread::sleep_for(10ms);  // the run's duration, and the watchdog's period
    const auto now = steady::now().time_since_epoch().count();
    for (auto& w : slots) {
      const auto started = w.op_started.load(std::memory_order_acquire);
      if (started != 0 && steady::duration(now - started) > sftest::bound)
        sftest::hang("soak call never ended");
    }
  }
  // The final close() races the workers' calls: each stops after its first
  // closed_error (or when it sees `finished`).
  const std::uint64_t calls_before_close = s.calls.load();
  g.close();
  finished.store(true, std::memory_order_release);
  sftest::must([&] { return exited.load() == n_workers; }, "every soak worker ended");
  for (auto& t : workers) t.join();
  for (auto& k : kept) k.clear();  // the shared exceptions die here, after the joins
  cancel_stop.store(true, std::memory_order_release);
  canceller.join();

  const auto st = g.stats();
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  std::uint64_t flight_timeouts = 0, flight_errors = 0;
  for (const auto& [seq, c] : s.outcome_of) {
    const auto tag = c >> 56;
    if (tag == o_timeout) ++flight_timeouts;
    if (tag == o_int || tag == o_runtime) ++flight_errors;
  }
  std::printf(
      "soak %s: %llu calls before close() in %.2f s (%.0f calls/s), %llu in all; flights %llu "
      "joins %llu rejections %llu "
      "failures %llu cancellations %llu timeouts %llu; values %llu closed %llu; forgets %llu "
      "(hit %llu), justified overlaps %llu, peak fns per key %d; cancels fired %llu\n",
      name, static_cast<unsigned long long>(calls_before_close), secs,
      static_cast<double>(calls_before_close) / secs,
      static_cast<unsigned long long>(s.calls.load()), static_cast<unsigned long long>(st.flights),
      static_cast<unsigned long long>(st.joins), static_cast<unsigned long long>(st.rejections),
      static_cast<unsigned long long>(st.failures),
      static_cast<unsigned long long>(st.cancellations),
      static_cast<unsigned long long>(st.timeouts),
      static_cast<unsigned long long>(s.values.load()),
      static_cast<unsigned long long>(s.closed_calls.load()),
      static_cast<unsigned long long>(s.forgets.load()),
      static_cast<unsigned long long>(s.forgets_hit.load()),
      static_cast<unsigned long long>(s.overlaps.load()), s.peak_running.load(),
      static_cast<unsigned long long>(s.cancels_fired.load()));
  std::fflush(stdout);

  {
    std::lock_guard<std::mutex> lk(s.vm);
    for (const auto& v : s.violations) FAIL_CHECK(v);
    CHECK(s.violations.empty());
  }
  CHECK(g.in_flight() == 0);
  CHECK(st.in_flight == 0);
  // Every call ended as exactly one of started / joined / rejected, and the
  // group's counts agree with the callers' call_info one for one.
  CHECK(st.calls == s.calls.load());
  CHECK(st.calls == st.flights + st.joins + st.rejections);
  CHECK(st.flights == s.leaders.load());
  CHECK(st.joins == s.followers.load());
  CHECK(st.rejections == s.nones.load());
  CHECK(st.cancellations == s.cancelled.load());
  // Plausibility: a failure is a flight whose fn threw first; a timeout is a
  // flight its deadline settled (some of those had no caller left to see it).
  CHECK(st.failures <= s.fn_throws.load());
  CHECK(st.failures >= flight_errors);
  CHECK(st.timeouts >= flight_timeouts);
  CHECK(st.timeouts <= st.flights);
  CHECK(s.fn_runs.load() <= st.flights);
  CHECK(st.overloaded == 0);
  // The run did what it is for.
  CHECK(st.flights > 0);
  CHECK(st.joins > 0);
  CHECK(s.cancelled.load() > 0);
}

}  // namespace

TEST_CASE("soak: inline leaders, ownership::waiters, deadline", "[soak][slow]") {
  // Catches any of the oracle's violations above, e.g. a stale outcome handed
  // to a late caller, a second fn per key without forget, a lost caller
  // (watchdog), or a miscount in stats.
  sf::options o;
  o.owner = sf::ownership::waiters;
  o.timeout = 10ms;
  o.shards = 1;  // with forget(): see the oracle
  run_soak("inline/waiters", std::move(o));
}

TEST_CASE("soak: thread_executor, ownership::group, deadline", "[soak][slow]") {
  sf::options o;
  o.owner = sf::ownership::group;
  o.executor = sf::thread_executor{};
  o.timeout = 10ms;
  o.shards = 1;
  run_soak("executor/group", std::move(o));
}

TEST_CASE("soak: thread_executor, ownership::waiters, deadline", "[soak][slow]") {
  sf::options o;
  o.owner = sf::ownership::waiters;
  o.executor = sf::thread_executor{};
  o.timeout = 10ms;
  o.shards = 1;
  run_soak("executor/waiters", std::move(o));
}

TEST_CASE("soak: inline leaders, ownership::waiters, deadline, default shards, no forget",
          "[soak][slow]") {
  // The sharded table under the same load: keys in different shards, the
  // timer and close() across shards, stats() summed over them. Without
  // forget(), any overlap of two fns of one key is a violation.
  sf::options o;
  o.owner = sf::ownership::waiters;
  o.timeout = 10ms;
  run_soak("inline/waiters/sharded", std::move(o));
}
