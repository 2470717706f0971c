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

// A caller whose old value is gone at the soft timeout (removed by invalidate, or run out of
// stale_if_error during the wait) has nothing to give there, so, having no bound of its own, it
// goes on waiting for the load it joined and gets its outcome, as a caller that had no old value
// does; it used to get timeout_error at the soft timeout. A load started before an invalidation
// does not publish; its callers still get its value.
namespace {
sftest::fire_task<std::string> co_read(scache& c, held_origin& o) {
  co_return co_await c.co_get("k", o.loader());
}
}  // namespace

TEST_CASE("soft_timeout_without_an_old_value_left_waits_for_the_joined_load", "[cache][soft]") {
  // The old value is removed (invalidate), or runs out of stale_if_error, during the wait.
  const bool removed = GENERATE(true, false);
  manual_clock::reset();
  sf::cache_options op = opts();
  op.soft_timeout = 300ms;  // long enough for the invalidation to land before it passes
  scache c(op);
  c.put("k", "v1");
  manual_clock::advance(2s);
  held_origin o;
  sftest::result<std::string> fresh;
  auto t = sftest::spawn(fresh, [&] { return c.get_fresh("k", o.loader()); });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  const auto joins = [&] { return c.flight_stats().joins; };
  const auto left = [&] { return c.flight_stats().wait_timeouts; };
  // done(): whether the caller has its answer.
  std::function<bool()> done;
  std::function<void()> check;
  sftest::result<std::string> r;
  std::optional<sftest::jthread> reader;
  callback_log<std::string> log;
  std::optional<sftest::fire_task<std::string>> co;
  SECTION("get") {
    reader.emplace(sftest::spawn(r, [&] { return c.get("k", o.loader()); }));
    done = [&] { return r.done.load(); };
    check = [&] {
      sftest::finish(*reader, r, "get returns");
      CHECK(r.value == "v2");
    };
  }
  SECTION("async_get") {
    c.async_get("k", o.loader(), log.on_done());
    done = [&] { return log.is_done(); };
    check = [&] {
      log.wait("async_get delivers");
      CHECK(!log.error);
      CHECK(log.value == "v2");
    };
  }
  SECTION("co_get") {
    co.emplace(co_read(c, o));
    done = [&] { return co->done(); };
    check = [&] {
      co->wait("co_get resumes");
      CHECK(!co->get().error);
      CHECK(co->get().value == "v2");
    };
  }
  must([&] { return joins() == 1; }, "the caller joins the load");
  if (removed) {
    (void)c.invalidate("k");
    CHECK(!c.peek("k"));
  } else {
    manual_clock::advance(2h);  // past stale_if_error
  }
  // The soft timeout passes with no old value to give: the caller leaves the group's wait and
  // joins the same load again, without a bound.
  must([&] { return left() == 1; }, "the soft timeout passes");
  must([&] { return joins() == 2 || done(); }, "the caller waits on");
  CHECK(!done());
  CHECK(o.calls.load() == 1);
  o.release.open();
  check();
  sftest::finish(t, fresh, "get_fresh returns");
  CHECK(o.calls.load() == 1);
  CHECK(c.stats().stale_on_timeout == 0);
}
