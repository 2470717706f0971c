// singleflight::fleet_cache::expire (fleet_cache.hpp): fleet-wide "stale, but kept", in both
// coherence modes. Two fleet_cache objects stand for two processes, each over its own fleet (its
// own connections and subscriber), with a local ttl of 60 s: only the expire can make an entry
// stale within a test. "Once B has heard it" is B's stats().expires_heard having grown (and,
// under client tracking, its invalidations_heard: the server's report of the expire's deletion,
// which comes after the expire's message on the same connection and must not drop the entry).
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>

#include "support/catch.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/jthread.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using fc_t = sf::fleet_cache<std::string, std::string>;
using mode = sf::fleet_coherence;

sf::fleet_cache_options opts(const std::string& uri, const std::string& prefix, mode m) {
  sf::fleet_cache_options o = sftest::fleet_cache_opts(uri, prefix, m);
  o.local.stale_while_revalidate = 60s;
  return o;
}

using sftest::heard_echo;
using sftest::until_listening;

using sftest::must_not_load;
using sftest::versioned_origin;

}  // namespace

TEST_CASE(
    "expire on one process: every process's local entry is stale but kept (served at once, one "
    "refresh across the fleet), the Redis value is gone, so a process without a copy loads",
    "[fleet][fleet_cache][expire]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-expire");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  heard_echo(b, m, 1, "b hears a's store");
  // a stored on its tracker: that store is not reported to a, which keeps its copy.
  CHECK(a.get("k", must_not_load(ran)) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // from Redis
  const std::uint64_t b_heard = b.stats().invalidations_heard;

  const std::uint64_t gen = a.expire("k");
  CHECK(gen > 0);
  CHECK(a.stats().broadcasts == 1);
  CHECK(sftest::stored(redis, prefix, "k").empty());  // a process without a copy loads
  sftest::must([&] { return b.stats().expires_heard >= 1; }, "b hears the expire");
  // Under tracking the server's report of the deletion follows; b takes it as the expire's.
  heard_echo(b, m, b_heard + 1, "b hears the report of the deletion");
  heard_echo(a, m, 1, "a hears the report of its own deletion (a script's: reported)");
  CHECK(a.stats().expires_heard == 0);  // its own expire is not counted

  // b: the old value at once, stale, and one refresh (held in the origin).
  sftest::held_origin fresh("v2");
  const sf::cached<std::string> eb = b.get_entry("k", fresh.loader());
  REQUIRE(eb.value);
  CHECK(*eb.value == "v1");
  CHECK(eb.state == sf::freshness::stale);
  fresh.started.wait("b's refresh reaches the origin");
  // a (its own expire): the same, and its refresh joins b's through the fleet.
  const sf::cached<std::string> ea = a.get_entry("k", fresh.loader());
  REQUIRE(ea.value);
  CHECK(*ea.value == "v1");
  CHECK(ea.state == sf::freshness::stale);
  fresh.release.open();
  sftest::must(
      [&] {
        const sf::cached<std::string> e = b.get_entry("k", must_not_load(ran));
        return e.state == sf::freshness::fresh && e.value && *e.value == "v2";
      },
      "b's refresh published v2");
  sftest::must(
      [&] {
        const sf::cached<std::string> e = a.get_entry("k", must_not_load(ran));
        return e.state == sf::freshness::fresh && e.value && *e.value == "v2";
      },
      "a reads v2");
  CHECK(fresh.calls.load() == 1);  // one refresh's origin call across the fleet
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "expire keeps the value for stale_if_error: after it, a failing origin is answered with the "
    "old value, in the process that expired and in another one",
    "[fleet][fleet_cache][expire]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-expire-sie");
  sf::fleet_cache_options o = opts(uri, prefix, m);
  o.local.stale_while_revalidate = 0s;
  o.local.stale_if_error = 60s;
  fc_t a(o);
  fc_t b(o);
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  heard_echo(b, m, 1, "b hears a's store");
  // a stored on its tracker: that store is not reported to a, which keeps its copy.
  CHECK(a.get("k", must_not_load(ran)) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");
  const std::uint64_t b_heard = b.stats().invalidations_heard;

  (void)a.expire("k");
  sftest::must([&] { return b.stats().expires_heard >= 1; }, "b hears the expire");
  heard_echo(b, m, b_heard + 1, "b hears the report of the deletion");
  heard_echo(a, m, 1, "a hears the report of its own deletion (a script's: reported)");
  const auto failing = []() -> std::string { throw std::runtime_error("origin down"); };
  for (fc_t* c : {&a, &b}) {
    const sf::cached<std::string> e = c->get_entry("k", failing);
    REQUIRE(e.value);
    CHECK(*e.value == "v1");
    CHECK(e.state == sf::freshness::stale_on_error);
  }
  CHECK(ran.load() == 0);
}

TEST_CASE("after invalidate, an expire does not bring a value back; after close it throws",
          "[fleet][fleet_cache][expire]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-expire-inval");
  fc_t a(opts(uri, prefix, m));
  until_listening(a, "a listens");
  versioned_origin origin;
  CHECK(a.get("k", origin.loader()) == "v1");
  (void)a.invalidate("k");
  (void)a.expire("k");
  origin.version = 2;
  const sf::cached<std::string> e = a.get_entry("k", origin.loader());
  CHECK(*e.value == "v2");
  CHECK(e.state == sf::freshness::fresh);
  a.close();
  CHECK_THROWS_AS(a.expire("k"), sf::closed_error);
}
