// singleflight::cache's wait bounds (issue 32): get, get_entry, get_fresh, async_get and
// co_get take a wait_bound after their stop_token, with a per-call loader or the cache-wide
// one; a bound that passes before the load settles throws timeout_error (async: delivers it)
// and the call leaves the load. Loads are held open with gates and parked completions, so a
// bound always passes while its load is still running (a short real bound: wait_bound is on
// steady_clock); the cache's windows run on a manual clock. Every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <functional>
#include <string>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::callback_log;
using sftest::completion_box;
using sftest::fire_task;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

// Short enough to keep the tests quick, long enough that a call gets to wait before it passes.
constexpr auto short_bound = 20ms;

sf::cache_options opts() {
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  return o;
}

// A synchronous loader held at a gate: counts its calls, reports that it runs, then waits.
struct held_loader {
  gate* release;
  std::atomic<int>* calls;
  std::string operator()(sf::stop_token) const {
    calls->fetch_add(1);
    release->wait("held loader released");
    return "loaded";
  }
};

fire_task<std::string> co_read(
    scache& c, std::string key,
    std::function<void(sf::stop_token, sf::completion<std::string>)> load, sf::wait_bound bound) {
  co_return co_await c.co_get(key, load, {}, bound);
}

fire_task<std::string> co_read_wide(scache& c, std::string key, sf::wait_bound bound) {
  co_return co_await c.co_get(key, {}, bound);
}

}  // namespace

TEST_CASE("get with a wait_bound leaves a load that outlasts it with timeout_error",
          "[cache][bound]") {
  manual_clock::reset();
  scache c(opts());
  gate release;
  std::atomic<int> calls{0};
  const held_loader loader{&release, &calls};
  sftest::result<std::string> first;
  auto t = sftest::spawn(first, [&] { return c.get("k", loader); });  // no bound
  must([&] { return calls.load() == 1; }, "the load runs");

  SECTION("get") { CHECK_THROWS_AS(c.get("k", loader, {}, short_bound), sf::timeout_error); }
  SECTION("get_entry") {
    CHECK_THROWS_AS(c.get_entry("k", loader, {}, short_bound), sf::timeout_error);
  }
  SECTION("get_fresh (waiting for the load under way to end)") {
    CHECK_THROWS_AS(c.get_fresh("k", loader, {}, short_bound), sf::timeout_error);
  }
  SECTION("a bound given as a time point") {
    CHECK_THROWS_AS(c.get("k", loader, {}, std::chrono::steady_clock::now() + short_bound),
                    sf::timeout_error);
  }
  CHECK(calls.load() == 1);  // the bounded caller started nothing
  release.open();
  sftest::finish(t, first, "the unbounded caller returns");
  CHECK(first.value == "loaded");
  CHECK(*c.peek("k")->value == "loaded");
  CHECK(c.flight_stats().wait_timeouts >= 1);
}

TEST_CASE("the cache-wide loader's get forms take a wait_bound", "[cache][bound]") {
  manual_clock::reset();
  gate release;
  std::atomic<int> calls{0};
  scache c(opts(), [&](const std::string&, sf::stop_token) {
    calls.fetch_add(1);
    release.wait("wide loader released");
    return std::string("loaded");
  });
  sftest::result<std::string> first;
  auto t = sftest::spawn(first, [&] { return c.get("k"); });
  must([&] { return calls.load() == 1; }, "the load runs");
  CHECK_THROWS_AS(c.get("k", {}, short_bound), sf::timeout_error);
  CHECK_THROWS_AS(c.get_entry("k", {}, short_bound), sf::timeout_error);
  CHECK_THROWS_AS(c.get_fresh("k", {}, short_bound), sf::timeout_error);
  callback_log<std::string> log;
  c.async_get("k", log.on_done(), {}, short_bound);
  log.wait("the bounded async caller is told");
  CHECK(log.threw<sf::timeout_error>());
  fire_task<std::string> task = co_read_wide(c, "k", short_bound);
  task.wait("the bounded coroutine resumes");
  CHECK(task.get().threw<sf::timeout_error>());
  release.open();
  sftest::finish(t, first, "the unbounded caller returns");
  CHECK(first.value == "loaded");
  CHECK(calls.load() == 1);
  // A value in the cache is answered whatever the bound, even one already passed.
  CHECK(c.get("k", {}, std::chrono::steady_clock::now() - 1s) == "loaded");
}

TEST_CASE("async_get with a wait_bound delivers timeout_error; the load still publishes",
          "[cache][bound][async]") {
  manual_clock::reset();
  scache c(opts());
  completion_box<std::string> box;
  callback_log<std::string> first;  // starts the load: a bound passed before its call began
  c.async_get("k", box.fn(), first.on_done());  // would start nothing
  auto [st, done] = box.take("loader started");
  callback_log<std::string> log;
  c.async_get("k", box.fn(), log.on_done(), {}, short_bound);
  log.wait("the bound passes");
  CHECK(log.threw<sf::timeout_error>());
  CHECK(log.calls.load() == 1);
  done.set_value("late");
  must([&] { return c.peek("k").has_value(); }, "the late load is stored");
  CHECK(*c.peek("k")->value == "late");
}

TEST_CASE("co_get with a wait_bound resumes with timeout_error", "[cache][bound][async]") {
  manual_clock::reset();
  scache c(opts());
  completion_box<std::string> box;
  callback_log<std::string> first;  // starts the load (see above)
  c.async_get("k", box.fn(), first.on_done());
  auto [st, done] = box.take("loader started");
  fire_task<std::string> task = co_read(c, "k", box.fn(), short_bound);
  task.wait("the bound passes");
  CHECK(task.get().threw<sf::timeout_error>());
  done.set_value("late");
  must([&] { return c.peek("k").has_value(); }, "the late load is stored");
}

TEST_CASE("a hit answers whatever the bound", "[cache][bound]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v");
  const auto passed = std::chrono::steady_clock::now() - 1s;
  CHECK(c.get(
            "k", [] { return std::string("never"); }, {}, passed) == "v");
  CHECK(c.get_entry(
             "k", [] { return std::string("never"); }, {}, passed)
            .value == "v");
  callback_log<std::string> log;
  c.async_get(
      "k", [] { return std::string("never"); }, log.on_done(), {}, passed);
  REQUIRE(log.is_done());
  CHECK(log.value == "v");
}

TEST_CASE("a caller's own bound is not an origin failure: no stale_on_error, no throttle",
          "[cache][bound]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.stale_if_error = 1h;
  scache c(o);
  c.put("k", "v1");
  manual_clock::advance(2s);  // dead for normal use, within stale_if_error
  gate release;
  std::atomic<int> calls{0};
  const held_loader loader{&release, &calls};
  callback_log<std::string> first;  // starts the load (a bound passed first would start none)
  c.async_get("k", loader, first.on_done());
  must([&] { return calls.load() == 1; }, "the load runs");
  SECTION("get") { CHECK_THROWS_AS(c.get("k", loader, {}, short_bound), sf::timeout_error); }
  SECTION("async_get") {
    callback_log<std::string> log;
    c.async_get("k", loader, log.on_done(), {}, short_bound);
    log.wait("the bound passes");
    CHECK(log.threw<sf::timeout_error>());
  }
  CHECK(c.stats().stale_on_error == 0);
  release.open();
  must([&] { return c.peek("k") && *c.peek("k")->value == "loaded"; }, "the load publishes");
  first.wait("the unbounded caller is told");  // before `first` goes out of scope
  // Not throttled: the value the load stored is the key's, served fresh.
  CHECK(c.get_entry("k", loader).state == sf::freshness::fresh);
}
