// singleflight::cache_stats' gauges of running loads and its soft-timeout counter (issue 32):
// loads_running (loaders called and not returned), loads_stuck (of those, the ones whose stop
// was requested: flight.timeout passed and the loader ignores its token), oldest_load_age (by
// the cache's Clock) and stale_on_timeout (answers served as freshness::stale_on_timeout).
// Origins are held with gates; ages run on a manual clock; every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <functional>
#include <string>

#include "support/catch.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

struct held_origin {
  gate release;
  std::atomic<int> calls{0};
  auto loader() {
    return [this](sf::stop_token) {  // ignores its token
      calls.fetch_add(1);
      release.wait("origin released");
      return std::string("v");
    };
  }
};

}  // namespace

TEST_CASE("loads_running and oldest_load_age follow the loaders that run", "[cache][gauges]") {
  manual_clock::reset();
  scache c;
  CHECK(c.stats().loads_running == 0);
  CHECK(c.stats().oldest_load_age == 0ns);
  held_origin o;
  sftest::result<std::string> a, b;
  auto ta = sftest::spawn(a, [&] { return c.get("a", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "a's loader runs");
  manual_clock::advance(5s);
  sf::cache_stats st = c.stats();
  CHECK(st.loads_running == 1);
  CHECK(st.loads_stuck == 0);
  CHECK(st.oldest_load_age == 5s);
  auto tb = sftest::spawn(b, [&] { return c.get("b", o.loader()); });
  must([&] { return o.calls.load() == 2; }, "b's loader runs");
  manual_clock::advance(1s);
  st = c.stats();
  CHECK(st.loads_running == 2);
  CHECK(st.oldest_load_age == 6s);  // a's, not b's (1 s)
  o.release.open();
  sftest::finish(ta, a, "a returns");
  sftest::finish(tb, b, "b returns");
  must([&] { return c.stats().loads_running == 0; }, "both loads over");
  CHECK(c.stats().oldest_load_age == 0ns);
  CHECK(c.stats().loads == 2);
}

TEST_CASE("loads_stuck counts a loader still running after its stop was requested",
          "[cache][gauges]") {
  manual_clock::reset();
  sf::cache_options op;
  op.flight.timeout = 50ms;  // the load's token fires; the loader ignores it
  scache c(op);
  held_origin o;
  sftest::result<std::string> r;
  auto t = sftest::spawn(r, [&] { return c.get("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the loader runs");
  must([&] { return c.stats().loads_stuck == 1; }, "the load's stop is requested");
  CHECK(c.stats().loads_running == 1);
  sftest::finish(t, r, "the caller leaves at flight.timeout");
  CHECK(r.threw<sf::timeout_error>());
  CHECK(c.stats().loads_stuck == 1);  // the caller left; the loader still holds its thread
  o.release.open();
  must([&] { return c.stats().loads_running == 0; }, "the loader returns");
  CHECK(c.stats().loads_stuck == 0);
}

TEST_CASE("stale_on_timeout counts the answers served at soft_timeout", "[cache][gauges]") {
  manual_clock::reset();
  sf::cache_options op;
  op.ttl = 1s;
  op.jitter = 0;
  op.stale_if_error = 1h;
  op.soft_timeout = 20ms;
  scache c(op);
  c.put("k", "v1");
  manual_clock::advance(2s);  // dead for normal use, within stale_if_error
  held_origin o;
  sftest::result<std::string> fresh;  // starts the load (get_fresh has no soft timeout)
  auto t = sftest::spawn(fresh, [&] { return c.get_fresh("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  const sf::cache_stats before = c.stats();
  CHECK(before.stale_on_timeout == 0);
  const sf::cached<std::string> e = c.get_entry("k", o.loader());
  CHECK(e.state == sf::freshness::stale_on_timeout);
  CHECK(c.get("k", o.loader()) == "v1");
  const sf::cache_stats after = c.stats();
  CHECK(after.stale_on_timeout == 2);
  CHECK(after.stale_on_error == 0);
  CHECK(after.misses - before.misses == 2);  // each waited on the load
  o.release.open();
  sftest::finish(t, fresh, "get_fresh returns");
  CHECK(c.stats().stale_on_timeout == 2);
}
