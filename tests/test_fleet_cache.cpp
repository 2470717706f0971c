// The cache in front of the fleet (docs/fleet.md, "The cache in front of the fleet"): a
// singleflight::cache whose loader is fleet.get. Two caches stand for two processes, each over
// its own fleet object (its own connection pool, subscriber and renewer), against the shared
// redis-server of SINGLEFLIGHT_TEST_REDIS (skipped without it). The caches run on a manual
// clock, so their windows move only when a test says so; Redis keeps real time (value_ttl is
// far beyond any test), and a test that needs the Redis copy gone deletes it, which is what its
// expiry does.
#include <singleflight/cache.hpp>
#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fleet.hpp"
#include "support/jthread.hpp"
#include "support/keys.hpp"
#include "support/manual_clock.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using sftest::manual_clock;
using fleet_t = sf::fleet<std::string, std::string>;
using cache_t =
    sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;
using point = d::fleet_point;

// A follower is woken only by the leader's message (or a re-read the protocol makes on its
// own): a wait_slice far beyond every bounded wait of a test. A generous redis_timeout, so
// that a slow (sanitized, shared) machine never turns into a fault.
sf::fleet_options fleet_opts(const std::string& uri, const std::string& prefix) {
  sf::fleet_options o;
  o.redis_uri = uri;
  o.key_prefix = prefix;
  o.lease_ttl = 2000ms;
  o.redis_timeout = 2000ms;
  o.wait_slice = 120s;
  o.max_wait = 600s;
  return o;
}

// ttl 10 s, no jitter (the windows are exact), then 10 s of stale-while-revalidate.
sf::cache_options cache_opts() {
  sf::cache_options o;
  o.ttl = 10s;
  o.jitter = 0;
  o.stale_while_revalidate = 10s;
  return o;
}

// One process of the fleet: its cache reads through its fleet (declared after the fleet:
// destroyed first, it joins its refreshes, which call the fleet).
struct process {
  fleet_t fleet;
  cache_t cache;
  std::atomic<int> waiting{0};  // followers of this fleet about to wait for a message
  std::atomic<int> stored{0};   // store scripts this fleet ran

  process(const std::string& uri, const std::string& prefix)
      : fleet(fleet_opts(uri, prefix)), cache(cache_opts()) {
    d::fleet_test_access::engine(fleet).hook = [this](point p, std::string_view) {
      if (p == point::waiting) waiting.fetch_add(1);
      if (p == point::stored) stored.fetch_add(1);
    };
  }

  // The cache's loader: the fleet, with `origin` as the fleet's loader. The cache hands its
  // flight's token to the fleet as the caller's; it keeps a copy of the loader for a
  // background refresh, so the key and the origin are held by value.
  template <class Origin>
  auto through_fleet(std::string key, Origin origin) {
    return [this, key = std::move(key), origin = std::move(origin)](sf::stop_token st) {
      return fleet.get(key, origin, std::move(st));
    };
  }

  template <class Origin>
  std::string get(const std::string& key, Origin origin) {
    return cache.get(key, through_fleet(key, std::move(origin)));
  }

  // The only correct order: see docs/fleet.md and the test "invalidating the cache first".
  void invalidate(const std::string& key) {
    (void)fleet.invalidate(key);
    (void)cache.invalidate(key);
  }
};

// An origin that answers "v1", "v2", ... in the order of its calls.
struct counting_origin {
  std::atomic<int> calls{0};
  auto loader() {
    return [this] { return sftest::stem_key("v", calls.fetch_add(1) + 1); };
  }
};

using sftest::held_origin;  // blocks until released (a load in progress), counting its calls

using sftest::must_not_load;

// The value stored in Redis for `key`, or "" when none.
std::string in_redis(sftest::redis_client& c, const std::string& prefix, const std::string& key) {
  return sftest::stored(c, prefix, key);
}

// Waits (bounded, by name) until `c` holds a fresh value for `key`: a background refresh has
// published.
void until_fresh(const cache_t& c, const std::string& key, const char* name) {
  sftest::must(
      [&] {
        const auto e = c.peek(key);
        return e && e->state == sf::freshness::fresh;
      },
      name);
}

}  // namespace

TEST_CASE(
    "cache over fleet, two processes: concurrent misses in both make one origin call and one "
    "fleet call per process; later reads are cache hits that reach neither Redis nor the origin",
    "[fleet][cache]") {
  manual_clock::reset();
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("cache-pair");
  process a(uri, prefix);
  process b(uri, prefix);
  held_origin origin("v");
  constexpr int per_process = 3;
  std::vector<sftest::result<std::string>> results(2 * per_process);
  std::vector<sftest::jthread> readers;
  for (int i = 0; i < 2 * per_process; ++i) {
    process& p = i < per_process ? a : b;
    readers.push_back(
        sftest::spawn(results[i], [&p, &origin] { return p.get("k", origin.loader()); }));
  }
  origin.started.wait("one process leads");
  // Each cache coalesced its three readers into one flight, whose loader is that process's
  // only fleet call; the other process's fleet lost the lease race and waits for the message.
  sftest::must([&] { return a.cache.flight_stats().joins == per_process - 1; },
               "a's readers joined");
  sftest::must([&] { return b.cache.flight_stats().joins == per_process - 1; },
               "b's readers joined");
  sftest::must([&] { return a.waiting.load() + b.waiting.load() == 1; }, "the other process waits");
  origin.release.open();
  for (int i = 0; i < 2 * per_process; ++i) sftest::finish(readers[i], results[i], "reader");
  for (const auto& r : results) {
    REQUIRE(r.value);
    CHECK(*r.value == "v");
  }
  CHECK(origin.calls.load() == 1);
  CHECK(a.fleet.stats().gets == 1);
  CHECK(b.fleet.stats().gets == 1);
  CHECK(a.fleet.stats().origin_calls + b.fleet.stats().origin_calls == 1);
  CHECK(a.fleet.stats().leader + b.fleet.stats().leader == 1);
  CHECK(a.fleet.stats().follower_woken + b.fleet.stats().follower_woken == 1);

  // Within the cache's ttl: hits, in memory.
  std::atomic<int> ran{0};
  for (process* p : {&a, &b}) {
    for (int i = 0; i < 5; ++i) CHECK(p->get("k", must_not_load(ran)) == "v");
    CHECK(p->cache.stats().hits == 5);
    CHECK(p->fleet.stats().gets == 1);
  }
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "cache over fleet: a stale entry is refreshed through the fleet while its reader gets the "
    "old value at once; a Redis hit while the value lives there, one origin call for both "
    "processes' refreshes once it has expired",
    "[fleet][cache]") {
  manual_clock::reset();
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("cache-swr");
  sftest::redis_client redis(uri);
  process a(uri, prefix);
  process b(uri, prefix);
  std::atomic<int> ran{0};
  counting_origin origin;
  CHECK(a.get("k", origin.loader()) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // b's miss: a Redis hit
  CHECK(b.fleet.stats().hits == 1);

  // Both caches stale; the value lives in Redis: each refresh is a hit there.
  manual_clock::advance(11s);
  for (process* p : {&a, &b}) {
    const auto e = p->cache.get_entry("k", p->through_fleet("k", must_not_load(ran)));
    CHECK(e.value == "v1");
    CHECK(e.state == sf::freshness::stale);
    CHECK(e.taken_as == sf::role::none);  // did not wait
    until_fresh(p->cache, "k", "refreshed from Redis");
    CHECK(p->cache.stats().background_refreshes == 1);
  }
  CHECK(ran.load() == 0);
  CHECK(a.fleet.stats().hits == 1);
  CHECK(b.fleet.stats().hits == 2);

  // Both caches stale again, and the Redis copy gone (expired: the test deletes it). Both
  // refreshes go to the fleet while the first one's origin call is held: one loads, the other
  // waits for its message.
  manual_clock::advance(11s);
  redis.command({"DEL", d::fleet_names::of(prefix, "k").value});
  held_origin next("v2");
  for (process* p : {&a, &b}) {
    const auto e = p->cache.get_entry("k", p->through_fleet("k", next.loader()));
    CHECK(e.value == "v1");  // served at once, while the refresh runs
    CHECK(e.state == sf::freshness::stale);
    CHECK(e.taken_as == sf::role::none);
  }
  next.started.wait("one refresh loads");
  sftest::must([&] { return a.waiting.load() + b.waiting.load() == 1; },
               "the other process's refresh waits for the message");
  next.release.open();
  for (process* p : {&a, &b}) {
    until_fresh(p->cache, "k", "refreshed by the one load");
    CHECK(p->cache.peek("k")->value == "v2");
  }
  CHECK(next.calls.load() == 1);
  CHECK(origin.calls.load() == 1);
  CHECK(in_redis(redis, prefix, "k") == "v2");
}

TEST_CASE(
    "invalidate through both layers (fleet, then cache): the next get loads anew; the other "
    "process's cache keeps its copy until its own invalidate or staleness, then reads the new "
    "value from Redis without an origin call",
    "[fleet][cache]") {
  manual_clock::reset();
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("cache-inval");
  process a(uri, prefix);
  process b(uri, prefix);
  counting_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");

  a.invalidate("k");
  CHECK(a.get("k", origin.loader()) == "v2");  // neither layer had a value: the origin
  CHECK(origin.calls.load() == 2);
  // b's cache is b's: a's invalidate did not reach it.
  CHECK(b.get("k", must_not_load(ran)) == "v1");

  SECTION("b invalidates its cache (as on an invalidation message)") {
    (void)b.cache.invalidate("k");
    CHECK(b.get("k", must_not_load(ran)) == "v2");
  }
  SECTION("b's copy goes stale: its refresh reads the new value from Redis") {
    manual_clock::advance(11s);
    const auto e = b.cache.get_entry("k", b.through_fleet("k", must_not_load(ran)));
    CHECK(e.value == "v1");  // stale, at once
    CHECK(e.state == sf::freshness::stale);
    until_fresh(b.cache, "k", "b refreshed");
    CHECK(b.get("k", must_not_load(ran)) == "v2");
  }
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 2);
  CHECK(b.fleet.stats().origin_calls == 0);
}

TEST_CASE(
    "invalidating the cache first lets the old value back: a read between the two calls "
    "re-caches the Redis copy for a whole ttl; fleet first, it cannot",
    "[fleet][cache]") {
  manual_clock::reset();
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("cache-order");
  process a(uri, prefix);
  counting_origin origin;
  CHECK(a.get("k", origin.loader()) == "v1");

  SECTION("cache, then fleet: wrong") {
    (void)a.cache.invalidate("k");
    // A reader between the two calls: a cache miss, a Redis hit on the old value, published
    // into the cache (its load started after the cache's invalidate).
    CHECK(a.get("k", origin.loader()) == "v1");
    (void)a.fleet.invalidate("k");
    CHECK(a.get("k", origin.loader()) == "v1");  // still the old value, for the cache's ttl
    CHECK(origin.calls.load() == 1);
  }
  SECTION("fleet, then cache: right") {
    (void)a.fleet.invalidate("k");
    // A reader between the two calls: a cache hit on the old value (the write is not over
    // yet); nothing is loaded, nothing is stored.
    CHECK(a.get("k", origin.loader()) == "v1");
    (void)a.cache.invalidate("k");
    CHECK(a.get("k", origin.loader()) == "v2");
    CHECK(origin.calls.load() == 2);
  }
}

TEST_CASE(
    "a load in flight across the two-layer invalidate publishes in neither layer: its callers "
    "get it, the next get in each process loads the new value",
    "[fleet][cache]") {
  manual_clock::reset();
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("cache-inflight");
  sftest::redis_client redis(uri);
  process a(uri, prefix);
  process b(uri, prefix);
  held_origin before("old");
  sftest::result<std::string> r1;
  auto t1 = sftest::spawn(r1, [&] { return a.get("k", before.loader()); });
  before.started.wait("a loads");
  a.invalidate("k");
  before.release.open();
  sftest::finish(t1, r1, "the load that started before the invalidate");
  REQUIRE(r1.value);
  CHECK(*r1.value == "old");                       // its caller still gets it
  CHECK(a.fleet.stats().invalidated_stores == 1);  // not stored in Redis
  CHECK(a.cache.stats().rejected_publishes == 1);  // nor in the cache
  CHECK_FALSE(a.cache.peek("k"));
  CHECK(in_redis(redis, prefix, "k").empty());

  counting_origin after;
  std::atomic<int> ran{0};
  CHECK(a.get("k", after.loader()) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // from Redis
  CHECK(after.calls.load() == 1);
  CHECK(ran.load() == 0);
}
