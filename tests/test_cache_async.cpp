// singleflight::cache's asynchronous callers: async_get (a callback) and
// co_get (a coroutine), with synchronous and asynchronous loaders. Where each
// outcome is delivered, what it holds, and that a callback may still be
// running after the cache is gone. Every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

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

sf::cache_options opts() {
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  return o;
}

struct origin_error : std::runtime_error {
  origin_error() : std::runtime_error("origin down") {}
};

fire_task<std::string> co_read(
    scache& c, std::string key,
    std::function<void(sf::stop_token, sf::completion<std::string>)> load) {
  co_return co_await c.co_get(key, load);
}

}  // namespace

TEST_CASE("async_get answers a hit on the calling thread before it returns", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v");
  callback_log<std::string> log;
  c.async_get(
      "k", [] { return std::string("never"); }, log.on_done());
  REQUIRE(log.is_done());
  CHECK(log.value == "v");
  CHECK(log.thread == std::this_thread::get_id());
  CHECK(c.stats().hits == 1);
}

TEST_CASE("async_get of a miss is delivered where the async loader completes", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  callback_log<std::string> log;
  completion_box<std::string> box;
  c.async_get("k", box.fn(), log.on_done());
  CHECK(!log.is_done());
  auto [st, done] = box.take("loader started");
  std::thread::id resolver;
  sftest::jthread t([&, d = std::move(done)]() mutable {
    resolver = std::this_thread::get_id();
    d.set_value("loaded");
  });
  log.wait("delivered");
  t.join();
  CHECK(log.value == "loaded");
  CHECK(log.thread == resolver);
  CHECK(*c.peek("k")->value == "loaded");  // published before the callers were told
}

TEST_CASE("async_get delivers not_found_error, cached failures and stale-if-error values",
          "[cache][async]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.not_found_ttl = 1s;
  o.error_ttl = 1s;
  o.stale_if_error = 1h;
  scache c(o);
  callback_log<std::string> missing;
  c.async_get(
      "nf", [] { return sf::load_result<std::string>::not_found(); }, missing.on_done());
  missing.wait("not found delivered");  // the loader runs on the cache's thread
  CHECK(missing.threw<sf::not_found_error>());

  callback_log<std::string> failed1;
  callback_log<std::string> failed2;
  auto failing = []() -> std::string { throw origin_error(); };
  c.async_get("bad", failing, failed1.on_done());
  c.async_get("bad", failing, failed2.on_done());
  failed1.wait("failure delivered");
  failed2.wait("failure delivered");
  CHECK(failed1.error == failed2.error);  // the cached failure: the same exception object
  CHECK(c.stats().loads == 2);

  c.put("old", "v1");
  manual_clock::advance(2s);
  callback_log<std::string> stale;
  c.async_get("old", failing, stale.on_done());
  stale.wait("stale value delivered");
  CHECK(stale.value == "v1");
}

TEST_CASE("async_get on a closed cache delivers closed_error at once", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  c.close();
  callback_log<std::string> log;
  c.async_get(
      "k", [] { return std::string("x"); }, log.on_done());
  REQUIRE(log.is_done());
  CHECK(log.threw<sf::closed_error>());
}

TEST_CASE("co_get of a hit does not suspend", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  c.put("k", "v");
  completion_box<std::string> box;
  fire_task<std::string> task = co_read(c, "k", box.fn());
  REQUIRE(task.done());
  CHECK(task.get().value == "v");
  CHECK(task.get().suspensions == 0);
}

TEST_CASE("co_get of a miss resumes where the loader completes", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  completion_box<std::string> box;
  fire_task<std::string> task = co_read(c, "k", box.fn());
  CHECK(!task.done());
  auto [st, done] = box.take("loader started");
  std::thread::id resolver;
  sftest::jthread t([&, d = std::move(done)]() mutable {
    resolver = std::this_thread::get_id();
    d.set_value("loaded");
  });
  task.wait("coroutine finished");
  t.join();
  CHECK(task.get().value == "loaded");
  CHECK(task.get().finished_on == resolver);
  CHECK(task.get().suspensions == 1);
}

TEST_CASE("co_get of a failed load throws the loader's exception in the coroutine",
          "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  completion_box<std::string> box;
  fire_task<std::string> task = co_read(c, "k", box.fn());
  auto [st, done] = box.take("loader started");
  done.set_exception(std::make_exception_ptr(origin_error()));
  REQUIRE(task.done());
  CHECK(task.get().threw<origin_error>());
}

TEST_CASE("an async caller's completion may still run after the cache is destroyed",
          "[cache][async]") {
  // Two async callers share a load. When it settles, A's callback blocks; the
  // cache closes (both outcomes are decided) and is destroyed; then B's
  // completion runs the cache's own bookkeeping (unpinning the stale-if-error
  // entry it held): that must not touch freed memory (ASan).
  manual_clock::reset();
  sf::cache_options o = opts();
  o.stale_if_error = 1h;
  auto c = std::make_unique<scache>(o);
  c->put("k", "v1");
  manual_clock::advance(2s);
  completion_box<std::string> box;
  gate in_a;
  gate release_a;
  callback_log<std::string> a;
  a.probe = [&] {
    in_a.open();
    release_a.wait("A released");
  };
  callback_log<std::string> b;
  c->async_get("k", box.fn(), a.on_done());
  c->async_get("k", box.fn(), b.on_done());
  auto [st, done] = box.take("load started");
  sftest::jthread resolver([d = std::move(done)]() mutable { d.set_value("v2"); });
  in_a.wait("A's callback running");
  c->close();
  c.reset();
  release_a.open();
  b.wait("B delivered");
  resolver.join();
  CHECK(a.value == "v2");
  CHECK(b.value == "v2");
}

TEST_CASE("an async loader's synchronous throw fails the load for every caller", "[cache][async]") {
  manual_clock::reset();
  scache c(opts());
  auto thrower = [](sf::stop_token, sf::completion<std::string>) { throw origin_error(); };
  CHECK_THROWS_AS(c.get("k", thrower), origin_error);
  callback_log<std::string> log;
  c.async_get("k", thrower, log.on_done());
  REQUIRE(log.is_done());
  CHECK(log.threw<origin_error>());
  CHECK(c.stats().load_failures == 2);
  CHECK(c.size() == 0);
}
