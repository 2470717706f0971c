// singleflight::cache: hits and misses, the group's guarantees through the
// cache, negative caching, versioned publish, read-your-writes, the bound on
// entries and the hit path (issue 10, semantics 1, 6, 7, 9, 10). One test case
// per point, named after the failure it pins. Time is a manual clock; every
// interleaving is forced with gates and observable state; every wait is bounded.
#include <singleflight/cache.hpp>
#include <singleflight/coarse_clock.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/alloc.hpp"  // this executable's operator new/delete
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using sftest::result;
using sftest::spawn;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;
using icache = sf::cache<std::string, int, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options opts(std::chrono::nanoseconds ttl = 1s) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  return o;
}

struct origin_error : std::runtime_error {
  origin_error() : std::runtime_error("origin down") {}
};

}  // namespace

// ---- 1. hits and coalesced misses ---------------------------------------------

TEST_CASE("a fresh hit makes no origin call", "[cache][c1]") {
  manual_clock::reset();
  scache c(opts());
  std::atomic<int> calls{0};
  auto load = [&] {
    calls.fetch_add(1);
    return std::string("v");
  };
  CHECK(c.get("k", load) == "v");
  manual_clock::advance(999ms);
  const sf::cached<std::string> e = c.get_entry("k", load);
  CHECK(*e.value == "v");
  CHECK(e.state == sf::freshness::fresh);
  CHECK(e.taken_as == sf::role::none);
  CHECK(e.age == 999ms);
  CHECK(calls == 1);
  const sf::cache_stats s = c.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 1);
  CHECK(s.loads == 1);
  CHECK(s.size == 1);
  manual_clock::advance(1ms);  // ttl over, no stale window: the next get loads
  CHECK(c.get("k", load) == "v");
  CHECK(calls == 2);
}

TEST_CASE("many callers of a missing key make one coalesced load", "[cache][c1]") {
  manual_clock::reset();
  scache c(opts());
  constexpr int n = 8;
  std::atomic<int> calls{0};
  gate release;
  std::vector<result<std::string>> r(n);
  std::vector<sftest::jthread> t;
  auto load = [&] {
    calls.fetch_add(1);
    release.wait("origin released");
    return std::string("v");
  };
  t.push_back(spawn(r[0], [&] { return c.get("k", load); }));
  must([&] { return calls.load() == 1; }, "leader in the loader");
  for (int i = 1; i < n; ++i) t.push_back(spawn(r[i], [&] { return c.get("k", load); }));
  must([&] { return c.flight_stats().joins == n - 1; }, "followers joined the load");
  release.open();
  for (int i = 0; i < n; ++i) sftest::finish(t[i], r[i], "caller returned");
  CHECK(calls == 1);
  for (auto& x : r) CHECK(x.value == "v");
  CHECK(c.stats().misses == n);
  CHECK(c.stats().loads == 1);
}

TEST_CASE("a hit does not wait for another key's load", "[cache][c1][c10]") {
  manual_clock::reset();
  scache c(opts());
  c.put("hot", "h");
  gate release;
  std::atomic<bool> loading{false};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("cold", [&] {
      loading = true;
      release.wait("cold origin released");
      return std::string("c");
    });
  });
  must([&] { return loading.load(); }, "cold load running");
  // On the test thread, while "cold" loads: the hit returns at once.
  CHECK(c.get("hot", [] { return std::string("never"); }) == "h");
  CHECK(!r.done);
  release.open();
  sftest::finish(t, r, "cold returned");
  CHECK(r.value == "c");
}

TEST_CASE("a caller leaving does not cancel the load its followers need", "[cache][c1]") {
  manual_clock::reset();
  scache c(opts());
  gate release;
  std::atomic<bool> loader_stopped{false};
  sf::stop_source leader_stop;
  auto load = [&](sf::stop_token st) {
    release.wait("origin released");
    loader_stopped = st.stop_requested();
    return std::string("v");
  };
  result<std::string> leader;
  result<std::string> follower;
  sf::options fo;
  fo.executor = sf::thread_executor{};  // the leader may leave before the loader returns
  sf::cache_options o = opts();
  o.flight = fo;
  scache ce(o);
  sftest::jthread t1 = spawn(leader, [&] { return ce.get("k", load, leader_stop.get_token()); });
  must([&] { return ce.flight_stats().flights == 1; }, "load started");
  sftest::jthread t2 = spawn(follower, [&] { return ce.get("k", load); });
  must([&] { return ce.flight_stats().joins == 1; }, "follower joined");
  leader_stop.request_stop();
  sftest::finish(t1, leader, "leader left");
  CHECK(leader.threw<sf::cancelled_error>());
  release.open();
  sftest::finish(t2, follower, "follower served");
  CHECK(follower.value == "v");
  CHECK(!loader_stopped);
}

TEST_CASE("flight.timeout bounds a caller waiting on a hung load", "[cache][c1]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.flight.timeout = 50ms;
  o.flight.executor = sf::thread_executor{};
  scache c(o);
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("k", [](sf::stop_token st) {
      while (!st.stop_requested()) std::this_thread::yield();  // hangs until stopped
      return std::string("late");
    });
  });
  sftest::finish(t, r, "caller timed out");
  CHECK(r.threw<sf::timeout_error>());
}

TEST_CASE("close stops loads, rejects callers and waits for the loader", "[cache][c1]") {
  manual_clock::reset();
  scache c(opts());
  std::atomic<bool> in_loader{false};
  std::atomic<bool> loader_returned{false};
  sf::options fo;
  fo.executor = sf::thread_executor{};
  sf::cache_options o = opts();
  o.flight = fo;
  scache ce(o);
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return ce.get("k", [&](sf::stop_token st) {
      in_loader = true;
      while (!st.stop_requested()) std::this_thread::yield();
      loader_returned = true;
      return std::string("v");
    });
  });
  must([&] { return in_loader.load(); }, "loader running");
  ce.close();
  CHECK(loader_returned);  // close() returned only after the loader did
  sftest::finish(t, r, "waiter released");
  CHECK(r.threw<sf::closed_error>());
  CHECK_THROWS_AS(ce.get("k", [] { return std::string("x"); }), sf::closed_error);
  CHECK_THROWS_AS(ce.get_fresh("k", [] { return std::string("x"); }), sf::closed_error);
}

TEST_CASE("max_in_flight rejects a load beyond the cap with overloaded_error", "[cache][c1]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.flight.max_in_flight = 1;
  scache c(o);
  gate release;
  std::atomic<bool> loading{false};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("a", [&] {
      loading = true;
      release.wait("origin released");
      return std::string("a");
    });
  });
  must([&] { return loading.load(); }, "first load running");
  CHECK_THROWS_AS(c.get("b", [] { return std::string("b"); }), sf::overloaded_error);
  release.open();
  sftest::finish(t, r, "first load done");
  CHECK(r.value == "a");
}

TEST_CASE("the flight checks the cache again before calling the origin", "[cache][c1]") {
  // The seed's double check inside the flight: a caller that missed, whose
  // flight starts after a value was stored, gets that value and no origin call.
  manual_clock::reset();
  sftest::manual_executor ex;
  sf::cache_options o = opts();
  o.flight.executor = ex.executor();
  scache c(o);
  std::atomic<int> calls{0};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("k", [&] {
      calls.fetch_add(1);
      return std::string("origin");
    });
  });
  sf::task flight = ex.take("miss queued its flight");
  c.put("k", "stored");
  flight();
  sftest::finish(t, r, "caller served");
  CHECK(r.value == "stored");
  CHECK(calls == 0);
  CHECK(c.stats().loads == 0);
}

// ---- 6. negative caching ---------------------------------------------------------

TEST_CASE("a failure is not cached without error_ttl (no poisoned key)", "[cache][c6]") {
  manual_clock::reset();
  scache c(opts());
  std::atomic<int> calls{0};
  auto failing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  CHECK_THROWS_AS(c.get("k", failing), origin_error);
  CHECK_THROWS_AS(c.get("k", failing), origin_error);
  CHECK(calls == 2);
  CHECK(c.get("k", [] { return std::string("ok"); }) == "ok");
  CHECK(c.stats().load_failures == 2);
}

TEST_CASE("error_ttl hands callers the same exception object without an origin call",
          "[cache][c6]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.error_ttl = 1s;
  scache c(o);
  std::atomic<int> calls{0};
  auto failing = [&]() -> std::string {
    calls.fetch_add(1);
    throw origin_error();
  };
  std::exception_ptr first;
  std::exception_ptr second;
  try {
    (void)c.get("k", failing);
  } catch (...) {
    first = std::current_exception();
  }
  manual_clock::advance(999ms);
  try {
    (void)c.get("k", failing);
  } catch (...) {
    second = std::current_exception();
  }
  REQUIRE(first);
  REQUIRE(second);
  CHECK(sftest::address_of<origin_error>(first) == sftest::address_of<origin_error>(second));
  CHECK(calls == 1);
  CHECK(c.stats().negative_hits == 1);
  CHECK(!c.peek("k"));         // peek does not throw the cached failure
  manual_clock::advance(1ms);  // error_ttl over: the next get asks the origin again
  CHECK(c.get("k", [] { return std::string("ok"); }) == "ok");
}

TEST_CASE("not_found is cached for not_found_ttl and reported without throwing by get_entry",
          "[cache][c6]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.not_found_ttl = 500ms;
  scache c(o);
  std::atomic<int> calls{0};
  auto missing = [&](sf::stop_token) {
    calls.fetch_add(1);
    return sf::load_result<std::string>::not_found();
  };
  CHECK_THROWS_AS(c.get("k", missing), sf::not_found_error);
  const sf::cached<std::string> e = c.get_entry("k", missing);
  CHECK(!e.found());
  CHECK(e.taken_as == sf::role::none);
  const auto p = c.peek("k");
  REQUIRE(p);
  CHECK(!p->found());
  CHECK(calls == 1);
  CHECK(c.stats().negative_hits == 1);
  manual_clock::advance(500ms);
  CHECK(c.get("k", [] { return sf::load_result<std::string>::value("now", 1h); }) == "now");
  CHECK(calls == 1);
  manual_clock::advance(59min);  // the per-entry ttl (1h) replaced the cache's (1s)
  CHECK(c.peek("k")->state == sf::freshness::fresh);
}

TEST_CASE("not_found is not cached without not_found_ttl", "[cache][c6]") {
  manual_clock::reset();
  scache c(opts());
  std::atomic<int> calls{0};
  auto missing = [&] {
    calls.fetch_add(1);
    return sf::load_result<std::string>::not_found();
  };
  CHECK(!c.get_entry("k", missing).found());
  CHECK(!c.get_entry("k", missing).found());
  CHECK(calls == 2);
  CHECK(c.size() == 0);
}

// ---- 7. versioned publish, read-your-writes ---------------------------------------

TEST_CASE("a load that started before invalidate never publishes (guava#1881)", "[cache][c7]") {
  manual_clock::reset();
  scache c(opts());
  gate release;
  std::atomic<bool> loading{false};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("k", [&] {
      loading = true;
      release.wait("origin released");
      return std::string("before-invalidate");
    });
  });
  must([&] { return loading.load(); }, "load running");
  const std::uint64_t v = c.invalidate("k");  // the key had no value yet: only the load's record
  release.open();
  sftest::finish(t, r, "caller served");
  CHECK(r.value == "before-invalidate");  // its caller still gets it
  CHECK(!c.peek("k"));                    // ...but it was not stored
  CHECK(c.stats().rejected_publishes == 1);
  CHECK(c.size() == 0);
  CHECK(c.invalidate("k") > v);  // versions only grow
}

TEST_CASE("a load that started before put does not overwrite it (trino#22285)", "[cache][c7]") {
  manual_clock::reset();
  scache c(opts());
  gate release;
  std::atomic<bool> loading{false};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("k", [&] {
      loading = true;
      release.wait("origin released");
      return std::string("old-origin");
    });
  });
  must([&] { return loading.load(); }, "load running");
  const std::uint64_t v = c.put("k", "written");
  release.open();
  sftest::finish(t, r, "caller served");
  CHECK(r.value == "old-origin");
  const auto p = c.peek("k");
  REQUIRE(p);
  CHECK(*p->value == "written");
  CHECK(p->version == v);
  CHECK(c.stats().rejected_publishes == 1);
}

TEST_CASE("get_fresh never returns a value loaded by a flight that started before it",
          "[cache][c7]") {
  manual_clock::reset();
  scache c(opts());
  gate release_old;
  std::atomic<int> calls{0};
  result<std::string> old_caller;
  sftest::jthread t1 = spawn(old_caller, [&] {
    return c.get("k", [&] {
      calls.fetch_add(1);
      release_old.wait("old load released");
      return std::string("old");
    });
  });
  must([&] { return calls.load() == 1; }, "old load running");
  result<std::string> fresh_caller;
  sftest::jthread t2 = spawn(fresh_caller, [&] {
    return c.get_fresh("k", [&] {
      calls.fetch_add(1);
      return std::string("new");
    });
  });
  must([&] { return c.stats().misses == 2; }, "get_fresh waiting");
  release_old.open();
  sftest::finish(t1, old_caller, "old caller served");
  sftest::finish(t2, fresh_caller, "fresh caller served");
  CHECK(old_caller.value == "old");
  CHECK(fresh_caller.value == "new");
  CHECK(calls == 2);
  CHECK(*c.peek("k")->value == "new");
}

TEST_CASE("get after invalidate does not join the load that started before it", "[cache][c7]") {
  manual_clock::reset();
  scache c(opts());
  gate release_old;
  std::atomic<int> calls{0};
  result<std::string> old_caller;
  sftest::jthread t1 = spawn(old_caller, [&] {
    return c.get("k", [&] {
      calls.fetch_add(1);
      release_old.wait("old load released");
      return std::string("before");
    });
  });
  must([&] { return calls.load() == 1; }, "old load running");
  c.invalidate("k");
  result<std::string> later;
  sftest::jthread t2 = spawn(later, [&] {
    return c.get("k", [&] {
      calls.fetch_add(1);
      return std::string("after");
    });
  });
  must([&] { return c.stats().misses == 2; }, "second caller waiting");
  release_old.open();
  sftest::finish(t1, old_caller, "old caller served");
  sftest::finish(t2, later, "second caller served");
  CHECK(later.value == "after");
  CHECK(*c.peek("k")->value == "after");
}

TEST_CASE("clear makes loads under way unpublishable", "[cache][c7]") {
  manual_clock::reset();
  scache c(opts());
  c.put("a", "1");
  gate release;
  std::atomic<bool> loading{false};
  result<std::string> r;
  sftest::jthread t = spawn(r, [&] {
    return c.get("b", [&] {
      loading = true;
      release.wait("origin released");
      return std::string("2");
    });
  });
  must([&] { return loading.load(); }, "load running");
  c.clear();
  CHECK(c.size() == 0);
  release.open();
  sftest::finish(t, r, "caller served");
  CHECK(c.size() == 0);
  CHECK(!c.peek("b"));
}

// ---- 9. bounded ---------------------------------------------------------------

TEST_CASE("size never exceeds max_entries", "[cache][c9]") {
  manual_clock::reset();
  sf::cache_options o = opts(1h);
  o.max_entries = 100;
  icache c(o);
  std::size_t peak = 0;
  for (int i = 0; i < 5000; ++i) {
    c.get("key-" + std::to_string(i), [i] { return i; });
    if (i % 3 == 0) c.put("put-" + std::to_string(i), i);
    peak = std::max(peak, c.size());
  }
  CHECK(peak <= 100);
  CHECK(c.size() <= 100);
  const sf::cache_stats s = c.stats();
  CHECK(s.evictions == 5000 + 1667 - s.size);
}

TEST_CASE("a scan of one-hit keys does not flush the hot keys", "[cache][c9]") {
  manual_clock::reset();
  sf::cache_options o = opts(1h);
  o.max_entries = 200;  // one shard on any machine (one shard per 64 entries, at most)
  icache c(o);
  auto value = [](int i) { return [i] { return i; }; };
  for (int round = 0; round < 3; ++round) {
    for (int h = 0; h < 50; ++h) c.get("hot-" + std::to_string(h), value(h));
  }
  // 15x the capacity, within one period of the sketch (halved every 16x; with 10x, the halving
  // on the scan's way cost every hot key).
  for (int s = 0; s < 3000; ++s) c.get("scan-" + std::to_string(s), value(s));
  const std::uint64_t loads = c.stats().loads;
  for (int h = 0; h < 50; ++h) c.get("hot-" + std::to_string(h), value(h));
  CHECK(c.stats().loads == loads);  // every hot key survived the scan (LRU keeps none)
}

// ---- 10. the hit path -----------------------------------------------------------

TEST_CASE("the hit path allocates nothing", "[cache][c10]") {
  if (!sftest::alloc::replaced) {
    WARN("allocation counting is not available under ThreadSanitizer");
    return;
  }
  manual_clock::reset();
  icache c(opts(1h));
  c.put("tenant-7|user-42|en-GB|v3", 42);
  int sum = 0;
  auto load = [] { return -1; };
  const std::string_view k = "tenant-7|user-42|en-GB|v3";
  sum += c.get(k, load);  // warm: a thread's first call picks its stripe
  const long allocs = sftest::alloc::allocations_during([&] {
    for (int i = 0; i < 1000; ++i) sum += c.get(k, load);
  });
  CHECK(allocs == 0);
  CHECK(sum == 42 * 1001);
}

TEST_CASE("hits on distinct keys run while every shard is being written", "[cache][c10]") {
  // Readers never wait for a writer: with a writer storming puts into the
  // same keys, readers still get a value every time (their own or the new one).
  manual_clock::reset();
  icache c(opts(1h));
  for (int i = 0; i < 64; ++i) c.put("key-" + std::to_string(i), i);
  std::atomic<bool> stop{false};
  std::atomic<long> reads{0};
  std::atomic<long> wrong{0};
  sftest::jthread writer([&] {
    int round = 0;
    while (!stop) {
      for (int i = 0; i < 64; ++i) c.put("key-" + std::to_string(i), i + 1000 * (++round % 2));
    }
  });
  sftest::jthread reader([&] {
    for (int n = 0; n < 20000; ++n) {
      const int i = n % 64;
      const int v = c.get("key-" + std::to_string(i), [] { return -1; });
      if (v != i && v != i + 1000) wrong.fetch_add(1);
      reads.fetch_add(1);
    }
  });
  must([&] { return reads.load() == 20000; }, "reader finished");
  stop = true;
  writer.join();
  reader.join();
  CHECK(wrong == 0);
  CHECK(c.stats().loads == 0);
}

// ---- misuse and API ---------------------------------------------------------------

TEST_CASE("invalid options are rejected with a readable error", "[cache]") {
  sf::cache_options o;
  o.ttl = 0s;
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  o.ttl = 1s;
  o.jitter = 1.5;
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  o.jitter = 0.1;
  o.stale_if_error = -1s;
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  o.stale_if_error = 0s;
  o.early_refresh_beta = -1;
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  o.early_refresh_beta = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  // An infinite beta would refresh on every fresh read (R09: 201 loads for 200 reads).
  o.early_refresh_beta = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(scache(o), std::invalid_argument);
  o.early_refresh_beta = 1e6;  // large but finite: allowed
  CHECK_NOTHROW(scache(o));
}

TEST_CASE("a value loaded with a ttl <= 0 is delivered, not stored, and keeps the live one (R09)",
          "[cache]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v1");
  int calls = 0;
  const auto dead = [&](sf::stop_token) {
    ++calls;
    return sf::load_result<std::string>::value("v2", -5s);
  };
  CHECK(c.get_fresh("k", dead) == "v2");  // the caller gets what the loader gave
  REQUIRE(c.peek("k"));
  CHECK(*c.peek("k")->value == "v1");  // the live value stays
  CHECK(c.peek("k")->state == sf::freshness::fresh);
  // On a miss nothing is stored: the next get loads again.
  const auto zero = [&](sf::stop_token) {
    ++calls;
    return sf::load_result<std::string>::value("z", 0s);
  };
  CHECK(c.get("m", zero) == "z");
  CHECK_FALSE(c.peek("m"));
  CHECK(c.get("m", zero) == "z");
  CHECK(calls == 3);
  CHECK(c.size() == 1);
}

TEST_CASE("a ttl of years does not overflow into the past", "[cache]") {
  manual_clock::reset();
  sf::cache_options o;
  o.ttl = std::chrono::nanoseconds::max();
  o.stale_while_revalidate = std::chrono::nanoseconds::max();
  o.jitter = 0.5;
  scache c(o);
  c.put("k", "v");
  manual_clock::advance(24h * 365 * 100);
  const auto p = c.peek("k");
  REQUIRE(p);
  CHECK(p->state == sf::freshness::fresh);
}

TEST_CASE("string_view and const char* keys reach the same entry", "[cache]") {
  manual_clock::reset();
  scache c(opts());
  c.put(std::string("tenant-1|user-2"), "v");
  CHECK(c.get(std::string_view("tenant-1|user-2"), [] { return std::string("x"); }) == "v");
  CHECK(c.get("tenant-1|user-2", [] { return std::string("x"); }) == "v");
  CHECK(c.stats().loads == 0);
}

TEST_CASE("coarse_clock lags the steady clock by at most its resolution", "[cache]") {
  const auto res = sf::coarse_clock::resolution();
  CHECK(res > std::chrono::nanoseconds::zero());
  CHECK(res <= 10ms);
  auto last = sf::coarse_clock::now();
  for (int i = 0; i < 1000; ++i) {
    const auto c = sf::coarse_clock::now().time_since_epoch();
    const auto s = std::chrono::steady_clock::now().time_since_epoch();
    CHECK(c <= s);  // the same epoch (CLOCK_MONOTONIC), read at the last tick
    CHECK(s - c <= res + 5ms);
    CHECK(sf::coarse_clock::now() >= last);
    last = sf::coarse_clock::now();
  }
  sf::cache<std::string, int, sf::default_hash, std::equal_to<>, sf::coarse_clock> c(opts(1h));
  CHECK(c.get("k", [] { return 7; }) == 7);
  CHECK(c.get("k", [] { return 8; }) == 7);
}

TEST_CASE("metrics::cache_metrics exports every cache_stats field once, under its own name",
          "[cache][metrics]") {
  sf::cache_stats s;
  std::uint64_t v = 100;
  for (std::uint64_t* f :
       {&s.hits, &s.stale_hits, &s.misses, &s.loads, &s.load_failures, &s.early_refreshes,
        &s.background_refreshes, &s.negative_hits, &s.evictions, &s.rejected_publishes,
        &s.stale_on_error, &s.stale_on_timeout, &s.size, &s.loads_running, &s.loads_stuck}) {
    *f = ++v;
  }
  s.oldest_load_age = std::chrono::seconds(++v);  // exported in seconds
  static_assert(sizeof(sf::cache_stats) == 16 * sizeof(std::uint64_t),
                "a new cache_stats field needs a line in metrics::cache_metrics");
  std::set<std::string_view> names;
  std::set<double> values;
  for (const auto& d : sf::metrics::cache_metrics) {
    CHECK(d.name.rfind("singleflight_cache_", 0) == 0);
    const bool total = d.name.size() > 6 && d.name.substr(d.name.size() - 6) == "_total";
    CHECK(total ==
          (d.kind == sf::metrics::kind::counter));  // counters, and only they, end in _total
    names.insert(d.name);
    values.insert(d.read(s));
  }
  CHECK(names.size() == sf::metrics::cache_metrics.size());
  CHECK(values.size() == 16);  // every field read, none twice
  CHECK(*values.begin() == 101);
  CHECK(*values.rbegin() == 116);
  sf::cache<std::string, int> c;
  (void)c.get("k", [] { return 1; });
  (void)c.get("k", [] { return 2; });
  const auto live = c.stats();
  for (const auto& d : sf::metrics::cache_metrics) {
    if (d.name == "singleflight_cache_hits_total") CHECK(d.read(live) == 1);
    if (d.name == "singleflight_cache_misses_total") CHECK(d.read(live) == 1);
    if (d.name == "singleflight_cache_entries") CHECK(d.read(live) == 1);
  }
}
