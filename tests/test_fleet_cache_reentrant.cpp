// singleflight::fleet_cache (fleet_cache.hpp): close() from the user code the fleet_cache runs
// (an async_get callback on the thread that settles the load, a loader on the caller's thread)
// returns: no thread waits for itself, and the destructor then finishes. (A T destructor run by
// applying the bus: test_fleet_cache_destructors.cpp.) Against the redis-server of
// SINGLEFLIGHT_TEST_REDIS (skipped without it); every wait is bounded.
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <string>

#include "support/catch.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/jthread.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
}  // namespace

TEST_CASE(
    "close() from async_get's on_done on the thread that settles the load returns; the "
    "destructor then finishes",
    "[fleet][fleet_cache][close]") {
  const std::string uri = sftest::need_redis();
  const sf::fleet_cache_options o =
      sftest::fleet_cache_opts(uri, sftest::unique_prefix("fc-close-ondone"));
  std::atomic<bool> returned{false};
  std::atomic<bool> valued{false};
  {
    sf::fleet_cache<std::string, std::string> c(o);
    c.async_get(
        std::string("k"), [] { return std::string("v"); },
        [&](sf::outcome<std::string> out) {
          valued = out.has_value();
          c.close();
          returned = true;
        });
    sftest::must([&] { return returned.load(); }, "close() in on_done returned");
    CHECK(valued.load());
    CHECK_FALSE(c.healthy());
  }  // the destructor joins the thread that ran on_done
}

TEST_CASE(
    "close() from a loader run on the caller's thread (load_owner::caller) returns; the get "
    "ends, the destructor then finishes",
    "[fleet][fleet_cache][close]") {
  const std::string uri = sftest::need_redis();
  sf::fleet_cache_options o =
      sftest::fleet_cache_opts(uri, sftest::unique_prefix("fc-close-inline"));
  o.local.loads = sf::load_owner::caller;
  sf::fleet_cache<std::string, std::string> c(o);
  std::atomic<bool> closed{false};
  sftest::result<std::string> r;
  sftest::jthread t = sftest::spawn(r, [&] {
    return c.get("k", [&] {
      c.close();
      closed = true;
      return std::string("v");
    });
  });
  sftest::finish(t, r, "the get whose loader closes the fleet_cache returns");
  CHECK(closed.load());
  CHECK_THROWS_AS(c.get("k", [] { return std::string("x"); }), sf::closed_error);
}
