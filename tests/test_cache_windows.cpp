// singleflight::cache: the three windows (fresh, stale-while-revalidate,
// stale-if-error) and the hard wall after them, XFetch early refresh,
// background refreshes owned by the cache, the identity-checked refresh mark
// and TTL jitter (issue 10, semantics 2, 3, 4, 5, 8). Time is a manual clock;
// interleavings are forced with gates; every wait is bounded.
#define SINGLEFLIGHT_TEST_HOOKS  // two deadlines are held until their refresh has started
#include <singleflight/cache.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"
#include "support/timer_hold.hpp"

namespace sf = singleflight;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using sftest::result;
using sftest::spawn;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options swr(std::chrono::nanoseconds ttl = 1s, std::chrono::nanoseconds window = 1s) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  o.stale_while_revalidate = window;
  return o;
}

struct origin_error : std::runtime_error {
  origin_error() : std::runtime_error("origin down") {}
};

std::string value(const char* v) { return v; }

// A hash that throws on its second call after `calls` is reset to 0: the cache
// hashes the key (first call), then the refresh's async_do hashes it again.
struct flaky_hash {
  static inline std::atomic<int> calls{-1000};
  std::size_t operator()(const std::string& k) const {
    if (calls.fetch_add(1) == 1) throw std::runtime_error("hash");
    return std::hash<std::string>{}(k);
  }
};

// A refresh loader the test holds on a gate; records how it ran.
struct held_origin {
  gate release;
  std::atomic<int> calls{0};
  std::atomic<bool> stopped{false};
  std::atomic<bool> done{false};
  std::atomic<std::thread::id> thread{};
  std::string answer = "v2";
  auto fn() {
    return [this](sf::stop_token st) {
      calls.fetch_add(1);
      thread = std::this_thread::get_id();
      release.wait("refresh origin released");
      stopped = st.stop_requested();
      done = true;
      return answer;
    };
  }
};

// The cache-wide loader of the hard-wall tests below: held on `release` (a hanging refresh)
// or failing, as `failing` says.
struct wide_origin {
  gate release;
  std::atomic<int> calls{0};
  std::atomic<bool> failing{false};
  auto fn() {
    return [this](const std::string&, sf::stop_token) -> std::string {
      calls.fetch_add(1);
      if (failing.load()) throw origin_error();
      release.wait("wide origin released");
      return "v2";
    };
  }
};

sftest::fire_task<std::string> co_read_wide(scache& c, std::string key, sf::wait_bound bound) {
  co_return co_await c.co_get(key, {}, bound);
}

}  // namespace

// ---- 2. stale-while-revalidate and the hard wall -------------------------------

TEST_CASE("within stale_while_revalidate readers get the old value at once and one refresh starts",
          "[cache][c2]") {
  manual_clock::reset();
  scache c(swr());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  held_origin origin;
  for (int i = 0; i < 20; ++i) {
    const sf::cached<std::string> e = c.get_entry("k", origin.fn());  // on the test thread
    CHECK(*e.value == "v1");
    CHECK(e.state == sf::freshness::stale);
    CHECK(e.age == 1500ms);
  }
  must([&] { return origin.calls.load() == 1; }, "refresh started");
  CHECK(c.stats().background_refreshes == 1);
  CHECK(c.stats().stale_hits == 20);
  origin.release.open();
  must([&] { return c.peek("k") && *c.peek("k")->value == "v2"; }, "refresh published");
  CHECK(c.peek("k")->state == sf::freshness::fresh);
  CHECK(origin.calls == 1);
  CHECK(c.stats().loads == 1);
}

TEST_CASE(
    "past ttl + stale_while_revalidate the value is dead even while a refresh hangs "
    "(caffeine#175, #373, #282)",
    "[cache][c2]") {
  manual_clock::reset();
  scache c(swr());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  held_origin origin;
  CHECK(c.get("k", origin.fn()) == "v1");  // stale: starts the refresh, which hangs
  must([&] { return origin.calls.load() == 1; }, "refresh hanging");
  manual_clock::advance(500ms);  // ttl + swr reached
  CHECK(!c.peek("k"));
  sf::stop_source leave;
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] { return c.get("k", origin.fn(), leave.get_token()); });
  // The reader waits on the load (it joined the hanging refresh: it is the load).
  must([&] { return c.flight_stats().joins == 1; }, "reader joined the refresh");
  CHECK(!r.done);
  leave.request_stop();
  sftest::finish(t, r, "reader left");
  CHECK(r.threw<sf::cancelled_error>());  // never "v1"
  origin.release.open();
  must([&] { return origin.done.load(); }, "refresh finished");
  CHECK(!origin.stopped);  // the reader leaving did not cancel the cache's refresh
}

TEST_CASE(
    "past the wall no entry point returns the dead value: get_entry, async_get, co_get and "
    "get_many wait on the hanging refresh until their bound, peek answers nothing",
    "[cache][c2]") {
  manual_clock::reset();
  wide_origin origin;
  scache c(swr(), origin.fn());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  CHECK(c.get("k") == "v1");  // stale: starts the refresh, which hangs
  must([&] { return origin.calls.load() == 1; }, "refresh hanging");
  manual_clock::advance(500ms);  // ttl + stale_while_revalidate reached
  CHECK(!c.peek("k"));
  CHECK_THROWS_AS(c.get_entry("k", {}, 20ms), sf::timeout_error);
  sftest::callback_log<std::string> log;
  c.async_get("k", log.on_done(), {}, 20ms);
  log.wait("the async caller is told");
  CHECK(log.threw<sf::timeout_error>());
  CHECK(!log.value);
  sftest::fire_task<std::string> task = co_read_wide(c, "k", 20ms);
  task.wait("the coroutine resumes");
  CHECK(task.get().threw<sf::timeout_error>());
  const std::vector<std::string> keys{"k"};
  const std::vector<sf::outcome<std::string>> many = c.get_many(keys, {}, 20ms);
  REQUIRE(many.size() == 1);
  REQUIRE(!many[0].has_value());
  CHECK(sftest::holds<sf::timeout_error>(many[0].error()));
  CHECK(origin.calls.load() == 1);  // each joined the refresh: it is the load
  origin.release.open();
  must([&] { return c.peek("k").has_value(); }, "the refresh publishes");
  CHECK(*c.peek("k")->value == "v2");
  CHECK(c.peek("k")->state == sf::freshness::fresh);
}

TEST_CASE(
    "refreshes failing again and again: within stale_if_error every entry point answers "
    "stale_on_error, past it every one loads and throws; the failures are not kept",
    "[cache][c5]") {
  manual_clock::reset();
  wide_origin origin;
  origin.failing = true;
  sf::cache_options o = swr();  // ttl 1 s, stale_while_revalidate 1 s
  o.stale_if_error = 2s;        // error_until: 3 s; error_ttl 0: a failure throttles for 1 s
  scache c(o, origin.fn());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  CHECK(c.get("k") == "v1");  // stale: its refresh fails, throttling the key until 2.5 s
  // The failure is counted before the refresh's flight settles: until it has, a load at 2.6 s
  // would join it (and get its failure) rather than call the origin again.
  must([&] { return c.stats().load_failures == 1 && c.flight_stats().in_flight == 0; },
       "the refresh failed and its flight settled");
  const std::vector<std::string> keys{"k"};
  const auto every_entry_point = [&](const char* when) {
    INFO(when);
    std::vector<std::optional<std::string>> got;
    std::vector<std::exception_ptr> failed;
    const auto record = [&](auto&& f) {
      try {
        got.emplace_back(f());
        failed.emplace_back();
      } catch (...) {
        got.emplace_back();
        failed.emplace_back(std::current_exception());
      }
    };
    record([&] { return *c.get_entry("k").value; });
    record([&] {
      sftest::callback_log<std::string> log;
      c.async_get("k", log.on_done());
      log.wait("the async caller is told");
      if (log.error) std::rethrow_exception(log.error);
      return *log.value;
    });
    record([&] {
      sftest::fire_task<std::string> task = co_read_wide(c, "k", 10s);
      task.wait("the coroutine resumes");
      if (task.get().error) std::rethrow_exception(task.get().error);
      return *task.get().value;
    });
    record([&] {
      std::vector<sf::outcome<std::string>> many = c.get_many(keys);
      if (!many.at(0).has_value()) std::rethrow_exception(many[0].error());
      return std::move(many[0]).value();
    });
    return std::make_pair(got, failed);
  };

  manual_clock::advance(600ms);  // 2.1 s: past stale_while_revalidate, throttled, within 3 s
  REQUIRE(c.peek("k"));
  CHECK(c.peek("k")->state == sf::freshness::stale_on_error);
  CHECK(c.get_entry("k").state == sf::freshness::stale_on_error);
  {
    const auto [got, failed] = every_entry_point("throttled, within stale_if_error");
    for (const auto& g : got) CHECK(g == std::optional<std::string>("v1"));
  }
  CHECK(origin.calls.load() == 1);  // throttled: no load

  manual_clock::advance(500ms);  // 2.6 s: the throttle is over: a load, failing again
  const sf::cached<std::string> again = c.get_entry("k");
  CHECK(*again.value == "v1");
  CHECK(again.state == sf::freshness::stale_on_error);
  CHECK(origin.calls.load() == 2);  // and the key is throttled again, until 3.6 s

  manual_clock::advance(500ms);  // 3.1 s: past stale_if_error (the throttle still runs)
  CHECK(!c.peek("k"));
  {
    const auto [got, failed] = every_entry_point("dead, throttled");
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(!got[i]);  // never "v1"
      CHECK(sftest::holds<origin_error>(failed[i]));
    }
  }
  CHECK(origin.calls.load() == 6);  // each one loaded: no failure kept without error_ttl
}

TEST_CASE("a reader past the wall is bounded by flight.timeout while a refresh hangs",
          "[cache][c2]") {
  manual_clock::reset();
  sf::cache_options o = swr();
  o.flight.timeout = 50ms;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  // The refresh's task waits for a refresh thread; a deadline passing before
  // it starts would skip the loader (sftest::hold_timer).
  gate refresh_started;
  const sftest::hold_timer timer(refresh_started);
  std::atomic<bool> hung{false};
  auto hang = [&](sf::stop_token st) {
    hung = true;
    refresh_started.open();
    while (!st.stop_requested()) std::this_thread::yield();
    return value("late");
  };
  CHECK(c.get("k", hang) == "v1");
  must([&] { return hung.load(); }, "refresh hanging");
  manual_clock::advance(1s);
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] { return c.get("k", hang); });
  sftest::finish(t, r, "reader bounded by the deadline");
  CHECK(r.threw<sf::timeout_error>());
}

// ---- 3. XFetch ------------------------------------------------------------------------

TEST_CASE("XFetch refreshes early and the reader gets the current value at once", "[cache][c3]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 10s;
  o.jitter = 0;
  o.early_refresh_beta = 1.0;
  scache c(o);
  // The first load takes 1 s of clock time: delta = 1 s.
  CHECK(c.get("k", [] {
    manual_clock::advance(1s);
    return value("v1");
  }) == "v1");
  held_origin origin;
  manual_clock::advance(9900ms);  // 100 ms before expiry: P(fire) = e^-0.1 per read
  int reads = 0;
  while (c.stats().early_refreshes == 0 && reads < 1000) {
    const sf::cached<std::string> e = c.get_entry("k", origin.fn());
    CHECK(*e.value == "v1");
    CHECK(e.state == sf::freshness::fresh);
    ++reads;
  }
  CHECK(c.stats().early_refreshes == 1);
  must([&] { return origin.calls.load() == 1; }, "early refresh running");
  for (int i = 0; i < 100; ++i) CHECK(c.get("k", origin.fn()) == "v1");  // absorbed
  CHECK(c.stats().early_refreshes == 1);
  origin.release.open();
  must([&] { return *c.peek("k")->value == "v2"; }, "early refresh published");
  CHECK(origin.calls == 1);
  CHECK(c.stats().misses == 1);  // only the very first load waited
}

TEST_CASE("XFetch never fires far from expiry, nor with beta 0", "[cache][c3]") {
  manual_clock::reset();
  for (const double beta : {0.0, 1.0}) {
    sf::cache_options o;
    o.ttl = 1h;
    o.jitter = 0;
    o.early_refresh_beta = beta;
    scache c(o);
    CHECK(c.get("k", [] {
      manual_clock::advance(1s);
      return value("v1");
    }) == "v1");
    // beta 1, delta 1 s: more than 36.8 s before expiry no draw can fire.
    manual_clock::advance(beta > 0 ? 59min - 40s : 59min + 59s);
    for (int i = 0; i < 10000; ++i) (void)c.get("k", [] { return value("never"); });
    CHECK(c.stats().early_refreshes == 0);
    CHECK(c.stats().loads == 1);
  }
}

// ---- 4. refreshes belong to the cache -----------------------------------------------

TEST_CASE("a background refresh is not cancelled by the stop of the reader that triggered it",
          "[cache][c4]") {
  manual_clock::reset();
  scache c(swr());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  held_origin origin;
  sf::stop_source reader;
  CHECK(c.get("k", origin.fn(), reader.get_token()) == "v1");
  must([&] { return origin.calls.load() == 1; }, "refresh running");
  reader.request_stop();
  origin.release.open();
  must([&] { return origin.done.load(); }, "refresh finished");
  CHECK(!origin.stopped);
  must([&] { return *c.peek("k")->value == "v2"; }, "refresh published");
}

TEST_CASE("background refreshes run on a thread of the cache, never on the reader", "[cache][c4]") {
  manual_clock::reset();
  scache c(swr());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  held_origin origin;
  origin.release.open();
  CHECK(c.get("k", origin.fn()) == "v1");
  must([&] { return origin.done.load(); }, "refresh finished");
  CHECK(origin.thread.load() != std::this_thread::get_id());
}

TEST_CASE("background refreshes run on flight.executor when it is set", "[cache][c4]") {
  manual_clock::reset();
  sftest::manual_executor ex;
  sf::cache_options o = swr();
  o.flight.executor = ex.executor();
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  std::atomic<int> calls{0};
  CHECK(c.get("k", [&] {
    calls.fetch_add(1);
    return value("v2");
  }) == "v1");
  CHECK(calls == 0);  // queued, not run by the reader
  sf::task refresh = ex.take("refresh queued on the executor");
  refresh();
  CHECK(calls == 1);
  CHECK(*c.peek("k")->value == "v2");
}

TEST_CASE("close waits for a running background refresh and joins its thread", "[cache][c4]") {
  manual_clock::reset();
  std::atomic<bool> returned{false};
  std::atomic<bool> running{false};
  {
    scache c(swr());
    c.put("k", "v1");
    manual_clock::advance(1500ms);
    CHECK(c.get("k", [&](sf::stop_token st) {
      running = true;
      while (!st.stop_requested()) std::this_thread::yield();  // until close() stops it
      returned = true;
      return value("v2");
    }) == "v1");
    must([&] { return running.load(); }, "refresh running");
    c.close();
    CHECK(returned);
  }
}

TEST_CASE("a background refresh is bounded by flight.timeout", "[cache][c4]") {
  manual_clock::reset();
  sf::cache_options o = swr();
  o.flight.timeout = 50ms;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  gate refresh_started;  // as above: the deadline cannot pass before the loader starts
  const sftest::hold_timer timer(refresh_started);
  std::atomic<bool> saw_stop{false};
  CHECK(c.get("k", [&](sf::stop_token st) {
    refresh_started.open();
    while (!st.stop_requested()) std::this_thread::yield();
    saw_stop = true;
    return value("late");
  }) == "v1");
  must([&] { return saw_stop.load(); }, "refresh stopped by its deadline");
  must([&] { return c.flight_stats().timeouts == 1; }, "deadline counted");
}

// ---- 5. stale-if-error ---------------------------------------------------------------

TEST_CASE("a load failing within stale_if_error returns the old value, not the exception",
          "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 10s;
  o.error_ttl = 2s;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(3s);
  std::atomic<int> calls{0};
  auto failing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  sf::cached<std::string> e = c.get_entry("k", failing);
  CHECK(*e.value == "v1");
  CHECK(e.state == sf::freshness::stale_on_error);
  CHECK(e.taken_as == sf::role::leader);
  CHECK(calls == 1);
  // Throttled: no load for error_ttl; readers keep the old value.
  manual_clock::advance(1900ms);
  e = c.get_entry("k", failing);
  CHECK(e.state == sf::freshness::stale_on_error);
  CHECK(e.taken_as == sf::role::none);
  CHECK(calls == 1);
  manual_clock::advance(100ms);  // error_ttl over: one more attempt
  CHECK(c.get("k", failing) == "v1");
  CHECK(calls == 2);
  const sf::cache_stats s = c.stats();
  CHECK(s.stale_on_error == 3);
  CHECK(s.load_failures == 2);
}

namespace {
struct copy_error : std::runtime_error {
  copy_error() : std::runtime_error("copy") {}
};
// A T whose next `throw_copies` copies throw (moves never do).
struct fragile {
  static inline int throw_copies = 0;
  std::string v;
  explicit fragile(std::string s) : v(std::move(s)) {}
  fragile(const fragile& o) : v(o.v) {
    if (throw_copies > 0) {
      --throw_copies;
      throw copy_error();
    }
  }
  fragile(fragile&&) noexcept = default;
  fragile& operator=(const fragile&) = default;
  fragile& operator=(fragile&&) noexcept = default;
  ~fragile() = default;
};
}  // namespace

TEST_CASE(
    "a throwing copy of T after a successful load is the caller's error, not the origin's (R08)",
    "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 10s;
  sf::cache<std::string, fragile, sf::default_hash, std::equal_to<>, manual_clock> c(o);
  c.put("k", fragile("v1"));
  manual_clock::advance(2s);  // past ttl, within stale_if_error: a get loads
  int calls = 0;
  const auto origin = [&](sf::stop_token) {
    ++calls;
    return fragile("v2");
  };
  fragile::throw_copies = 1;                              // the caller's copy of the loaded value
  CHECK_THROWS_AS(c.get_entry("k", origin), copy_error);  // was: v1 as stale_on_error
  fragile::throw_copies = 0;
  CHECK(calls == 1);
  CHECK(c.stats().stale_on_error == 0);
  CHECK(c.stats().load_failures == 0);
  // The load published: the next read is a fresh hit of the new value, and no throttle.
  sf::cached<fragile> e = c.get_entry("k", origin);
  CHECK(e.value->v == "v2");
  CHECK(e.state == sf::freshness::fresh);
  manual_clock::advance(2s);  // expired again: a load runs (was: stale_on_error, 0 calls)
  e = c.get_entry("k", origin);
  CHECK(e.state == sf::freshness::fresh);
  CHECK(e.taken_as == sf::role::leader);
  CHECK(calls == 2);
}

TEST_CASE("without error_ttl a failure throttles loads for default_error_throttle", "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 1h;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(2s);
  std::atomic<int> calls{0};
  auto failing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  for (int i = 0; i < 10; ++i) CHECK(c.get("k", failing) == "v1");
  CHECK(calls == 1);
  manual_clock::advance(sf::cache_options::default_error_throttle);
  CHECK(c.get("k", failing) == "v1");
  CHECK(calls == 2);
}

TEST_CASE("a failed background refresh holds off the next one for error_ttl", "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o = swr(1s, 1h);
  o.error_ttl = 2s;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  std::atomic<int> calls{0};
  auto throwing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  CHECK(c.get("k", throwing) == "v1");
  must([&] { return c.stats().load_failures == 1; }, "refresh failed");
  // Until error_ttl has passed, stale reads start no refresh: the failing
  // origin is not asked again on every read.
  for (int i = 0; i < 50; ++i) {
    manual_clock::advance(39ms);
    CHECK(c.get("k", throwing) == "v1");
  }
  CHECK(calls == 1);
  manual_clock::advance(50ms);
  must([&] { return c.get("k", throwing) == "v1" && calls.load() == 2; },
       "a refresh after error_ttl");
}

TEST_CASE("past ttl + stale_if_error a failing load throws: the old value is dead", "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 1s;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(2s);
  CHECK_THROWS_AS(c.get("k", []() -> std::string { throw origin_error(); }), origin_error);
}

TEST_CASE("a cancelled reader gets cancelled_error, not the stale value", "[cache][c5]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 1h;
  o.flight.executor = sf::thread_executor{};
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(2s);
  gate release;
  sf::stop_source leave;
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get(
        "k",
        [&] {
          release.wait("origin released");
          return value("v2");
        },
        leave.get_token());
  });
  must([&] { return c.flight_stats().flights == 1; }, "load running");
  leave.request_stop();
  sftest::finish(t, r, "reader left");
  CHECK(r.threw<sf::cancelled_error>());
  release.open();
}

// ---- 8. the refresh mark ----------------------------------------------------------------

TEST_CASE("the refresh mark is cleared when the loader throws synchronously (FusionCache#647)",
          "[cache][c8]") {
  manual_clock::reset();
  scache c(swr(1s, 1h));
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  std::atomic<int> calls{0};
  auto throwing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  CHECK(c.get("k", throwing) == "v1");
  must([&] { return c.stats().load_failures == 1; }, "refresh failed");
  manual_clock::advance(sf::cache_options::default_error_throttle);  // past the throttle
  // Stale reads go on; once the first refresh has fully ended, one of them
  // starts the next (a mark left behind would block refreshes for good).
  must([&] { return c.get("k", throwing) == "v1" && calls.load() == 2; },
       "a second refresh started");
  CHECK(c.stats().background_refreshes == 2);
}

TEST_CASE("the refresh mark is cleared when the executor drops the refresh task", "[cache][c8]") {
  manual_clock::reset();
  sf::cache_options o = swr();
  o.flight.executor = [](sf::task) {};  // destroys every task without running it
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  CHECK(c.get("k", [] { return value("v2"); }) == "v1");
  CHECK(c.get("k", [] { return value("v2"); }) == "v1");
  CHECK(c.stats().background_refreshes == 2);  // the first one's mark did not stick
}

TEST_CASE("the refresh mark is cleared when starting the refresh throws", "[cache][c8]") {
  manual_clock::reset();
  sf::cache<std::string, std::string, flaky_hash, std::equal_to<>, manual_clock> c(swr());
  c.put(std::string("k"), "v1");
  manual_clock::advance(1500ms);
  flaky_hash::calls = 0;
  std::atomic<int> calls{0};
  auto load = [&] {
    calls.fetch_add(1);
    return value("v2");
  };
  CHECK(c.get(std::string("k"), load) == "v1");  // the refresh could not start
  CHECK(calls == 0);
  CHECK(c.get(std::string("k"), load) == "v1");  // ...and its mark did not stick
  must([&] { return calls.load() == 1; }, "refresh started on the next read");
}

TEST_CASE("a finished refresh does not clear a newer refresh's mark (caffeine#711)",
          "[cache][c8]") {
  // R1 joins a load A started. When that load settles, A's callback runs first
  // (arrival order): it puts a new value (which resets the mark) and reads it
  // stale, starting R2 as a new flight. Then R1's completion runs: it must not
  // clear R2's mark, or the next stale read starts a third refresh.
  manual_clock::reset();
  scache c(swr(1s, 1h));
  sftest::completion_box<std::string> box;
  sftest::callback_log<std::string> a_log;
  a_log.probe = [&] {
    c.put("k", "v2");
    manual_clock::advance(1500ms);
    CHECK(c.get("k", box.fn()) == "v2");  // stale: R2 starts (a new flight)
  };
  c.async_get("k", box.fn(), a_log.on_done());  // A: a miss, its load parks
  auto [st1, load_a] = box.take("A's load started");
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  CHECK(c.get("k", box.fn()) == "v1");  // stale: R1 starts and joins A's load
  CHECK(c.stats().background_refreshes == 1);
  load_a.set_value("from-A");  // settles: A's callback (starts R2), then R1's
  a_log.wait("A delivered");
  CHECK(c.stats().background_refreshes == 2);
  auto [st2, load_r2] = box.take("R2's load started");
  CHECK(c.get("k", box.fn()) == "v2");  // R2 still running: no third refresh
  CHECK(c.stats().background_refreshes == 2);
  load_r2.set_value("v3");
  must([&] { return *c.peek("k")->value == "v3"; }, "R2 published");
}

// ---- jitter -------------------------------------------------------------------------------

TEST_CASE("jitter spreads the expiries of keys written together over [0.9, 1.1] ttl",
          "[cache][jitter]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 100s;
  o.jitter = 0.1;
  o.stale_while_revalidate = 1h;  // so that peek tells fresh from stale
  scache c(o);
  constexpr int n = 1000;
  for (int i = 0; i < n; ++i) c.put("key-" + std::to_string(i), "v");
  std::vector<int> expired_in(30, 0);  // 1 s (1% of ttl) windows from 0.85 ttl
  manual_clock::advance(85s);
  int before = 0;
  for (int w = 0; w < 30; ++w) {
    manual_clock::advance(1s);
    int stale = 0;
    for (int i = 0; i < n; ++i) {
      if (c.peek("key-" + std::to_string(i))->state == sf::freshness::stale) ++stale;
    }
    expired_in[w] = stale - before;
    before = stale;
  }
  CHECK(before == n);
  for (int w = 0; w < 30; ++w) {
    // Windows (85+w, 86+w] s: all expiries in [90 s, 110 s].
    if (w < 4 || w >= 25) CHECK(expired_in[w] == 0);
    CHECK(expired_in[w] <= n * 8 / 100);
  }
}

TEST_CASE("without jitter keys written together expire together", "[cache][jitter]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = 100s;
  o.jitter = 0;
  scache c(o);
  for (int i = 0; i < 100; ++i) c.put("key-" + std::to_string(i), "v");
  manual_clock::advance(100s - 1ns);
  CHECK(c.size() == 100);
  int fresh = 0;
  for (int i = 0; i < 100; ++i) fresh += c.peek("key-" + std::to_string(i)) ? 1 : 0;
  CHECK(fresh == 100);
  manual_clock::advance(1ns);
  for (int i = 0; i < 100; ++i) CHECK(!c.peek("key-" + std::to_string(i)));
}

// ---- expire: stale, but kept ----------------------------------------------------

TEST_CASE(
    "expire makes a fresh value stale now, under a new version: within stale_while_revalidate "
    "(from the expire) readers get it and one refresh starts",
    "[cache][expire]") {
  manual_clock::reset();
  scache c(swr(60s, 1s));
  const std::uint64_t put_version = c.put("k", "v1");
  manual_clock::advance(10s);
  const std::uint64_t v = c.expire("k");
  CHECK(v > put_version);
  CHECK(c.peek("k")->version == v);
  CHECK(c.peek("k")->state == sf::freshness::stale);
  CHECK(c.expire("k") == v);  // already stale: unchanged
  CHECK(c.expire("absent") == 0);
  held_origin origin;
  for (int i = 0; i < 5; ++i) {
    const sf::cached<std::string> e = c.get_entry("k", origin.fn());
    CHECK(*e.value == "v1");
    CHECK(e.state == sf::freshness::stale);
  }
  must([&] { return origin.calls.load() == 1; }, "one refresh started");
  origin.release.open();
  must([&] { return c.peek("k")->state == sf::freshness::fresh; }, "refresh published");
  CHECK(*c.peek("k")->value == "v2");
  CHECK(origin.calls.load() == 1);

  // Past stale_while_revalidate measured from the expire, the value is dead (no stale_if_error).
  c.put("k", "v3");
  (void)c.expire("k");
  manual_clock::advance(1s);
  CHECK(!c.peek("k"));
}

TEST_CASE("expire keeps the value for stale_if_error: a failed load after it answers with it",
          "[cache][expire]") {
  manual_clock::reset();
  sf::cache_options o = swr(60s, 0s);
  o.stale_if_error = 60s;
  scache c(o);
  c.put("k", "v1");
  (void)c.expire("k");
  const sf::cached<std::string> e = c.get_entry("k", []() -> std::string { throw origin_error(); });
  CHECK(*e.value == "v1");
  CHECK(e.state == sf::freshness::stale_on_error);
  // A cached not-found is dropped by expire, as by invalidate.
  CHECK(c.get_entry("nf", [] { return sf::load_result<std::string>::not_found(); }).found() ==
        false);
  (void)c.expire("nf");
  CHECK(!c.peek("nf"));
}

TEST_CASE(
    "expire_stops_a_load_under_way_of_a_value_already_stale_from_publishing: the refresh of a "
    "stale value and the load of a dead one, held across expire(key), hand their callers what "
    "they read and store nothing; the windows and the refresh mark stay",
    "[cache][expire]") {
  manual_clock::reset();
  scache c(swr(60s, 60s));
  const std::uint64_t dead_version = c.put("dead", "v1");
  manual_clock::advance(121s);  // past ttl + stale_while_revalidate: dead
  c.put("stale", "v1");
  manual_clock::advance(61s);  // past its ttl: stale
  REQUIRE(c.peek("stale"));
  CHECK(c.peek("stale")->state == sf::freshness::stale);
  CHECK(!c.peek("dead"));

  held_origin origin;
  CHECK(c.get_entry("stale", origin.fn()).state == sf::freshness::stale);  // starts its refresh
  result<std::string> miss;
  sftest::jthread t = spawn(miss, [&] { return c.get("dead", origin.fn()); });
  must([&] { return origin.calls.load() == 2; }, "the refresh and the load reach the origin");
  const std::uint64_t stale_version = c.peek("stale")->version;

  // Both loads read the origin before these marks: neither may store what it read.
  CHECK(c.expire("stale") > stale_version);
  CHECK(c.expire("dead") > dead_version);
  // A repeated expire while the refresh runs starts no second refresh: the mark stays.
  (void)c.expire("stale");
  CHECK(c.get_entry("stale", origin.fn()).state == sf::freshness::stale);
  CHECK(origin.calls.load() == 2);

  origin.release.open();
  sftest::finish(t, miss, "the dead key's caller");
  REQUIRE(miss.value);
  CHECK(*miss.value == "v2");  // its callers receive what it loaded
  must([&] { return c.stats().rejected_publishes == 2; }, "both loads end unpublished");
  REQUIRE(c.peek("stale"));
  CHECK(*c.peek("stale")->value == "v1");
  CHECK(c.peek("stale")->state == sf::freshness::stale);  // its windows kept
  CHECK(!c.peek("dead"));
  // The refresh's end cleared its mark: a read after it starts one that publishes.
  must(
      [&] {
        (void)c.get_entry("stale", origin.fn());
        return origin.calls.load() == 3;
      },
      "a refresh after the mark starts");
  must([&] { return c.peek("stale")->state == sf::freshness::fresh; }, "a new refresh publishes");
  CHECK(*c.peek("stale")->value == "v2");
  // Without a load under way, an expire of a stale value is unchanged.
  manual_clock::advance(90s);
  const std::uint64_t v = c.peek("stale")->version;
  CHECK(c.expire("stale") == v);
}

// ---- expire_all: every key stale, but kept ------------------------------------

TEST_CASE(
    "expire_all makes every fresh value stale now, under new versions: readers get the old "
    "values and one refresh per key starts",
    "[cache][expire]") {
  manual_clock::reset();
  scache c(swr(60s, 1s));
  const std::uint64_t v1 = c.put("k1", "v1");
  const std::uint64_t v2 = c.put("k2", "v1");
  manual_clock::advance(10s);
  c.expire_all();
  for (const char* k : {"k1", "k2"}) {
    REQUIRE(c.peek(k));
    CHECK(c.peek(k)->state == sf::freshness::stale);
    CHECK(c.peek(k)->version > std::max(v1, v2));
  }
  held_origin origin;
  for (int i = 0; i < 5; ++i) {
    for (const char* k : {"k1", "k2"}) {
      const sf::cached<std::string> e = c.get_entry(k, origin.fn());
      CHECK(*e.value == "v1");
      CHECK(e.state == sf::freshness::stale);
    }
  }
  must([&] { return origin.calls.load() == 2; }, "one refresh per key started");
  CHECK(c.stats().background_refreshes == 2);
  CHECK(c.stats().misses == 0);
  origin.release.open();
  for (const char* k : {"k1", "k2"}) {
    must([&] { return c.peek(k)->state == sf::freshness::fresh; }, "refresh published");
    CHECK(*c.peek(k)->value == "v2");
  }
  CHECK(origin.calls.load() == 2);

  // The windows are measured from the mark: past stale_while_revalidate after it, dead.
  c.put("k1", "v3");
  c.expire_all();
  manual_clock::advance(1s);
  CHECK(!c.peek("k1"));
}

TEST_CASE(
    "expire_all_stops_loads_under_way_from_publishing: a miss's load, a get_fresh's load and a "
    "stale value's refresh held across it hand their callers what they read, and store nothing",
    "[cache][expire]") {
  manual_clock::reset();
  scache c(swr(60s, 60s));
  c.put("fresh", "v1");
  c.put("stale", "v1");
  manual_clock::advance(90s);  // "stale" and "fresh" are past their ttl: stale
  c.put("fresh", "v1");        // "fresh" is fresh again
  held_origin origin;
  result<std::string> miss;
  result<std::string> forced;
  sftest::jthread t1 = spawn(miss, [&] { return c.get("absent", origin.fn()); });
  sftest::jthread t2 = spawn(forced, [&] { return c.get_fresh("fresh", origin.fn()); });
  const sf::cached<std::string> e = c.get_entry("stale", origin.fn());  // starts its refresh
  CHECK(e.state == sf::freshness::stale);
  must([&] { return origin.calls.load() == 3; }, "three loads reach the origin");
  const std::uint64_t stale_version = c.peek("stale")->version;

  c.expire_all();
  CHECK(c.peek("stale")->version > stale_version);  // already stale: a new version all the same
  origin.release.open();
  sftest::finish(t1, miss, "the miss's caller");
  sftest::finish(t2, forced, "the get_fresh caller");
  REQUIRE(miss.value);
  CHECK(*miss.value == "v2");  // its callers receive what it loaded
  REQUIRE(forced.value);
  CHECK(*forced.value == "v2");
  must([&] { return c.stats().rejected_publishes == 3; }, "the three loads end unpublished");
  CHECK(!c.peek("absent"));
  for (const char* k : {"fresh", "stale"}) {
    REQUIRE(c.peek(k));
    CHECK(*c.peek(k)->value == "v1");
    CHECK(c.peek(k)->state == sf::freshness::stale);
  }
  // The refresh mark went with the mark: the next read starts a refresh that publishes.
  CHECK(c.get_entry("stale", origin.fn()).state == sf::freshness::stale);
  must([&] { return c.peek("stale")->state == sf::freshness::fresh; }, "a new refresh publishes");
  CHECK(origin.calls.load() == 4);
}

TEST_CASE(
    "expire_all_stale_for_ends_stale_answers_then_joins_the_refresh: within the bound a get "
    "answers stale and starts one refresh; past it a get waits on that refresh (joins it) and "
    "returns its value; one loader call",
    "[cache][expire]") {
  manual_clock::reset();
  scache c(swr(60s, 10s));
  c.put("k", "v1");
  manual_clock::advance(1s);
  c.expire_all(20ms);
  c.put("single", "v1");
  (void)c.expire("single");  // a key's own expire keeps the whole stale_while_revalidate
  held_origin origin;
  const sf::cached<std::string> first = c.get_entry("k", origin.fn());
  CHECK(*first.value == "v1");
  CHECK(first.state == sf::freshness::stale);
  must([&] { return origin.calls.load() == 1; }, "the refresh reaches the origin");
  manual_clock::advance(19ms);  // still within the bound
  const sf::cached<std::string> within = c.get_entry("k", origin.fn());
  CHECK(*within.value == "v1");
  CHECK(within.state == sf::freshness::stale);
  REQUIRE(c.peek("k"));

  manual_clock::advance(1ms);  // the bound has passed: no stale answer
  CHECK(!c.peek("k"));
  const std::uint64_t joins = c.flight_stats().joins;
  result<sf::cached<std::string>> past;
  sftest::jthread t = spawn(past, [&] { return c.get_entry("k", origin.fn()); });
  must([&] { return c.flight_stats().joins == joins + 1; }, "the get joins the refresh");
  CHECK(!past.done.load());  // waits: the refresh is held
  origin.release.open();
  sftest::finish(t, past, "the get past the bound");
  REQUIRE(past.value);
  REQUIRE(past.value->value);
  CHECK(*past.value->value == "v2");
  CHECK(origin.calls.load() == 1);  // joined, no second load
  CHECK(c.stats().background_refreshes == 1);

  // The key expired by itself is still answered stale, within its own window.
  const sf::cached<std::string> single = c.get_entry("single", [] { return std::string("s2"); });
  CHECK(*single.value == "v1");
  CHECK(single.state == sf::freshness::stale);
}

TEST_CASE(
    "expire_all(stale_for): a bound at or above stale_while_revalidate is expire_all(); zero "
    "serves nothing stale, and cuts stale_if_error as much as the stale window",
    "[cache][expire]") {
  manual_clock::reset();
  sf::cache_options o = swr(60s, 1s);
  o.stale_if_error = 3s;
  scache c(o);
  c.put("k", "v1");
  c.expire_all(5s);  // as expire_all(): stale for the whole second
  manual_clock::advance(999ms);
  REQUIRE(c.peek("k"));
  CHECK(c.peek("k")->state == sf::freshness::stale);
  manual_clock::advance(1ms);
  CHECK(!c.peek("k"));

  c.put("k", "v1");
  c.expire_all(0s);
  CHECK(!c.peek("k"));  // no stale answer
  // Kept for stale_if_error less the second of stale_while_revalidate cut: 2 s.
  manual_clock::advance(1999ms);
  const sf::cached<std::string> e = c.get_entry("k", []() -> std::string { throw origin_error(); });
  CHECK(*e.value == "v1");
  CHECK(e.state == sf::freshness::stale_on_error);
}

TEST_CASE("expire_all without stale_while_revalidate: the next get waits on a load, as after clear",
          "[cache][expire]") {
  manual_clock::reset();
  sf::cache_options o = swr(60s, 0s);
  o.stale_if_error = 60s;
  scache c(o);
  c.put("k", "v1");
  c.expire_all();
  CHECK(!c.peek("k"));
  const sf::cached<std::string> e = c.get_entry("k", [] { return std::string("v2"); });
  CHECK(*e.value == "v2");
  CHECK(e.state == sf::freshness::fresh);
  CHECK(c.stats().misses == 1);
  CHECK(c.stats().stale_hits == 0);
  // The value was kept for stale_if_error, measured from the mark.
  c.expire_all();
  const sf::cached<std::string> f = c.get_entry("k", []() -> std::string { throw origin_error(); });
  CHECK(*f.value == "v2");
  CHECK(f.state == sf::freshness::stale_on_error);
}

TEST_CASE(
    "a_put_during_a_failing_load_is_not_throttled_by_its_callers: the callers of a load that "
    "started before a put and then failed answer from the cache, and record neither the failure "
    "nor a throttle on the put's value",
    "[cache][c5]") {
  // The load's own failure is not recorded (its version is old); neither may its callers'
  // stale-if-error answer record it, through get or async_get: the put's value would then be
  // throttled for error_ttl (no refresh, no load) and answered as if its origin had failed.
  manual_clock::reset();
  sf::cache_options o = swr(1s, 0s);
  o.stale_if_error = 1h;
  o.error_ttl = 10s;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(2s);  // past ttl: a get loads, within stale_if_error
  gate release;
  std::atomic<int> calls{0};
  auto failing = [&]() -> std::string {
    calls.fetch_add(1);
    release.wait("the failing load released");
    throw origin_error();
  };
  result<sf::cached<std::string>> blocking;
  sftest::jthread t = spawn(blocking, [&] { return c.get_entry("k", failing); });
  must([&] { return calls.load() == 1; }, "the load runs");
  sftest::callback_log<std::string> async;
  c.async_get("k", failing, async.on_done());
  must([&] { return c.flight_stats().joins == 1; }, "the async caller joined the load");
  (void)c.put("k", "v2");
  release.open();
  sftest::finish(t, blocking, "the blocking caller");
  async.wait("the async caller");
  REQUIRE(blocking.value);
  CHECK(blocking.value->value == "v2");  // the cache's value: the put's
  CHECK(async.value == "v2");
  CHECK(c.stats().rejected_publishes == 1);

  manual_clock::advance(1500ms);  // the put's value past its ttl: the next get loads it
  int loaded = 0;
  const sf::cached<std::string> next = c.get_entry("k", [&] {
    ++loaded;
    return std::string("v3");
  });
  CHECK(loaded == 1);  // no throttle: the origin did not fail since the put
  CHECK(next.value == "v3");
  CHECK(next.state == sf::freshness::fresh);
}

TEST_CASE(
    "a refresh that puts its own key and then fails leaves the put's value fresh and unthrottled",
    "[cache][c5]") {
  // The put gives the key a new version: the refresh, registered before it, records nothing,
  // neither its failure (which would throttle the key or stand in for the value) nor a stale
  // mark on the newer value.
  manual_clock::reset();
  sf::cache_options o = swr(1s, 1h);
  o.error_ttl = 2s;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  std::atomic<int> calls{0};
  auto put_then_fail = [&]() -> std::string {
    calls.fetch_add(1);
    (void)c.put("k", "v2");
    throw origin_error();
  };
  CHECK(c.get("k", put_then_fail) == "v1");  // stale: the refresh starts
  must([&] { return c.stats().load_failures == 1; }, "the refresh failed");
  CHECK(c.stats().rejected_publishes == 1);
  const auto e = c.peek("k");
  REQUIRE(e.has_value());
  CHECK(e->value == "v2");
  CHECK(e->state == sf::freshness::fresh);
  int ran = 0;
  CHECK(c.get("k", [&] {
    ++ran;
    return std::string("x");
  }) == "v2");
  CHECK(ran == 0);
  // Stale again: the next read starts a refresh at once (the failure throttles nothing).
  manual_clock::advance(1500ms);
  std::atomic<int> refreshed{0};
  CHECK(c.get("k", [&] {
    refreshed.fetch_add(1);
    return std::string("v3");
  }) == "v2");
  must([&] { return refreshed.load() == 1; }, "a refresh of the put's value");
  must([&] { return c.peek("k").has_value() && c.peek("k")->value == "v3"; }, "v3 published");
  CHECK(calls.load() == 1);
}
