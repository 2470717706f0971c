// singleflight::cache_options::soft_timeout (issue 32): a caller waiting on a load of a key
// whose old value is within stale_if_error gets that value at the soft timeout, as
// freshness::stale_on_timeout, while the load goes on and publishes; a key without such a
// value waits as before, and nothing is throttled. The origin is held with gates (the soft
// timeout, on steady_clock, always passes while the load still runs); the windows run on a
// manual clock. Every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::callback_log;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options opts() {
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_if_error = 1h;
  o.soft_timeout = 20ms;
  return o;
}

struct held_origin {
  gate release;
  std::atomic<int> calls{0};
  std::atomic<int> stopped{0};
  auto loader() {
    return [this](sf::stop_token st) {
      calls.fetch_add(1);
      release.wait("origin released");
      if (st.stop_requested()) stopped.fetch_add(1);
      return std::string("v2");
    };
  }
};

}  // namespace

TEST_CASE("soft_timeout: a caller of a key with an old value gets it while the load goes on",
          "[cache][soft]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v1");
  manual_clock::advance(2s);  // past ttl: dead for normal use, within stale_if_error
  held_origin o;
  // The load is started by a get_fresh (no soft timeout): a soft bound that passed before its
  // caller reached the group would start no load.
  sftest::result<std::string> fresh;
  auto t = sftest::spawn(fresh, [&] { return c.get_fresh("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  SECTION("get_entry") {
    const sf::cached<std::string> e = c.get_entry("k", o.loader());
    CHECK(e.value == "v1");
    CHECK(e.state == sf::freshness::stale_on_timeout);
    CHECK(e.taken_as == sf::role::follower);
  }
  SECTION("get, with a later bound of its own") { CHECK(c.get("k", o.loader(), {}, 10s) == "v1"); }
  SECTION("async_get") {
    callback_log<std::string> log;
    c.async_get("k", o.loader(), log.on_done());
    log.wait("the soft timeout passes");
    CHECK(log.value == "v1");
  }
  // The load may not have reached the origin yet when the soft timeout passed (a thread of the
  // cache is started for it): it goes on, and does.
  must([&] { return o.calls.load() == 1; }, "the load runs");
  CHECK(c.stats().stale_on_error == 0);
  o.release.open();
  sftest::finish(t, fresh, "get_fresh returns");
  CHECK(fresh.value == "v2");
  must([&] { return c.peek("k") && *c.peek("k")->value == "v2"; }, "the load publishes");
  CHECK(o.stopped.load() == 0);
  // Nothing was throttled: the first read after the load is fresh.
  const sf::cached<std::string> after = c.get_entry("k", o.loader());
  CHECK(after.value == "v2");
  CHECK(after.state == sf::freshness::fresh);
  CHECK(o.calls.load() == 1);
}

TEST_CASE("soft_timeout: a caller's own sooner bound still throws timeout_error", "[cache][soft]") {
  manual_clock::reset();
  sf::cache_options op = opts();
  op.soft_timeout = 10s;
  scache c(op);
  c.put("k", "v1");
  manual_clock::advance(2s);
  held_origin o;
  callback_log<std::string> first;  // starts the load (a bound passed first would start none)
  c.async_get("k", o.loader(), first.on_done());
  must([&] { return o.calls.load() == 1; }, "the load runs");
  CHECK_THROWS_AS(c.get("k", o.loader(), {}, 20ms), sf::timeout_error);
  o.release.open();
  must([&] { return c.peek("k") && *c.peek("k")->value == "v2"; }, "the load publishes");
  first.wait("the unbounded caller is told");  // before `first` goes out of scope
}

TEST_CASE("soft_timeout: a key without an old value waits for its load", "[cache][soft]") {
  manual_clock::reset();
  scache c(opts());
  held_origin o;
  SECTION("a missing key") {}
  SECTION("a key whose value is past stale_if_error") {
    c.put("k", "v1");
    manual_clock::advance(2h);
  }
  sftest::result<std::string> r;
  auto t = sftest::spawn(r, [&] { return c.get("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  // Ten soft timeouts later the caller is still waiting.
  CHECK(!sftest::becomes([&] { return r.done.load(); }, 200ms));
  o.release.open();
  sftest::finish(t, r, "the caller gets the load's value");
  CHECK(r.value == "v2");
}

TEST_CASE("soft_timeout: get_fresh waits for a load that started after it", "[cache][soft]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v1");
  manual_clock::advance(2s);
  held_origin o;
  sftest::result<std::string> r;
  auto t = sftest::spawn(r, [&] { return c.get_fresh("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  CHECK(!sftest::becomes([&] { return r.done.load(); }, 200ms));
  o.release.open();
  sftest::finish(t, r, "get_fresh gets the new value");
  CHECK(r.value == "v2");
}

TEST_CASE("soft_timeout must not be negative", "[cache][soft]") {
  sf::cache_options op = opts();
  op.soft_timeout = -1ms;
  CHECK_THROWS_AS(scache(op), std::invalid_argument);
}
