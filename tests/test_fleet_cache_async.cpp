// singleflight::fleet_cache::async_get and co_get (fleet_cache.hpp): the callback and coroutine
// forms of get. A local hit answers on the caller's thread before async_get returns; a miss goes
// through the fleet as get's does (one origin call, the value stored in Redis, where a second
// fleet_cache object, standing for another process, reads it without calling its origin) and is
// delivered on the thread that settles the local load, never the caller's. The tests use the bus
// (fleet_coherence::publish): a process's own store is not reported back to it, so an entry it
// loaded stays in its local cache for the whole test (local ttl 60 s). Waits are bounded polls on
// callbacks and counters; an origin is held open with a gate where a test needs a load under way.
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "support/brittle.hpp"
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using fc_t = sf::fleet_cache<std::string, std::string>;
using sftest::callback_log;
using sftest::fire_task;
using sftest::must_not_load;
using sftest::versioned_origin;

sf::fleet_cache_options opts(const std::string& uri, const std::string& prefix) {
  return sftest::fleet_cache_opts(uri, prefix, sf::fleet_coherence::publish);
}

using sftest::until_listening;

template <class L>
fire_task<std::string> co_read(fc_t& c, std::string key, L load) {
  co_return co_await c.co_get(key, load);
}

fire_task<std::string> co_read_wide(fc_t& c, std::string key) { co_return co_await c.co_get(key); }

}  // namespace

TEST_CASE("fleet_cache::async_get of a local hit calls on_done before it returns, on this thread",
          "[fleet][fleet_cache][async]") {
  const std::string uri = sftest::need_redis();
  fc_t a(opts(uri, sftest::unique_prefix("fc-async-hit")));
  until_listening(a, "a listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  const std::uint64_t redis_hits = a.stats().fleet.gets;

  callback_log<std::string> log;
  a.async_get("k", must_not_load(ran), log.on_done());
  REQUIRE(log.calls.load() == 1);  // before async_get returned
  CHECK(log.thread == std::this_thread::get_id());
  REQUIRE(log.value);
  CHECK(*log.value == "v1");
  CHECK(ran.load() == 0);
  CHECK(a.stats().fleet.gets == redis_hits);  // no Redis round trip
  CHECK(a.stats().local.hits >= 1);
}

TEST_CASE(
    "fleet_cache::async_get of a miss loads through the fleet on a thread of the local cache: "
    "the local cache and Redis are filled, another process reads it with no origin call",
    "[fleet][fleet_cache][async]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-async-miss");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix));
  until_listening(a, "a listens");
  fc_t b(opts(uri, prefix));
  until_listening(b, "b listens");
  std::atomic<int> ran{0};

  sftest::held_origin held("v1");
  callback_log<std::string> log;
  a.async_get("k", held.loader(), log.on_done());
  held.started.wait("a's load reaches the origin");
  CHECK(log.calls.load() == 0);  // async_get returned while the load runs
  held.release.open();
  log.wait("a's on_done");
  CHECK(log.calls.load() == 1);
  CHECK(log.thread != std::this_thread::get_id());
  REQUIRE(log.value);
  CHECK(*log.value == "v1");
  CHECK(held.calls.load() == 1);

  CHECK(sftest::stored(redis, prefix, "k") == "v1");
  const std::uint64_t a_gets = a.stats().fleet.gets;
  CHECK(a.get("k", must_not_load(ran)) == "v1");  // local
  CHECK(a.stats().fleet.gets == a_gets);
  callback_log<std::string> other;
  b.async_get("k", must_not_load(ran), other.on_done());
  other.wait("b's on_done");
  REQUIRE(other.value);
  CHECK(*other.value == "v1");  // from Redis
  CHECK(ran.load() == 0);
  CHECK(b.stats().fleet.origin_calls == 0);
  CHECK(a.stats().fleet.origin_calls == 1);
}

TEST_CASE(
    "fleet_cache::async_get with a wait_bound leaves with timeout_error while the load goes on "
    "and fills the local cache and Redis",
    "[fleet][fleet_cache][async]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-async-bound");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix));
  until_listening(a, "a listens");
  std::atomic<int> ran{0};

  sftest::held_origin held("v1");
  callback_log<std::string> log;
  a.async_get("k", held.loader(), log.on_done(), {}, 300ms);
  held.started.wait("the load reaches the origin");
  log.wait("the caller leaves at its bound");  // the origin is still held
  CHECK(log.threw<sf::timeout_error>());
  CHECK(held.calls.load() == 1);
  held.release.open();
  sftest::must([&] { return a.stats().local.loads_running == 0 && a.stats().local.size == 1; },
               "the load publishes");
  CHECK(a.get("k", must_not_load(ran)) == "v1");
  CHECK(ran.load() == 0);
  CHECK(sftest::stored(redis, prefix, "k") == "v1");
  CHECK(held.calls.load() == 1);
}

TEST_CASE(
    "fleet_cache::co_get yields the value: a miss through the fleet, then a local hit "
    "without suspending",
    "[fleet][fleet_cache][async][coro]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-async-co");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix));
  until_listening(a, "a listens");
  fc_t b(opts(uri, prefix));
  until_listening(b, "b listens");
  versioned_origin origin;
  std::atomic<int> ran{0};

  fire_task<std::string> miss = co_read(a, "k", origin.loader());
  miss.wait("the miss's coroutine ends");
  REQUIRE(miss.get().value);
  CHECK(*miss.get().value == "v1");
  CHECK(origin.calls.load() == 1);
  CHECK(sftest::stored(redis, prefix, "k") == "v1");

  fire_task<std::string> hit = co_read(a, "k", must_not_load(ran));
  REQUIRE(hit.done());  // never suspended
  CHECK(hit.get().suspensions == 0);
  CHECK(hit.get().finished_on == std::this_thread::get_id());
  REQUIRE(hit.get().value);
  CHECK(*hit.get().value == "v1");

  fire_task<std::string> remote = co_read(b, "k", must_not_load(ran));
  remote.wait("b's coroutine ends");
  REQUIRE(remote.get().value);
  CHECK(*remote.get().value == "v1");
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE("fleet_cache::co_get rethrows the loader's error in the coroutine",
          "[fleet][fleet_cache][async][coro]") {
  const std::string uri = sftest::need_redis();
  fc_t a(opts(uri, sftest::unique_prefix("fc-async-co-err")));
  until_listening(a, "a listens");
  const auto failing = []() -> std::string { throw std::runtime_error("origin down"); };
  fire_task<std::string> task = co_read(a, "k", failing);
  task.wait("the coroutine ends");
  CHECK(!task.get().value);
  CHECK(task.get().threw<std::runtime_error>());
}

TEST_CASE(
    "fleet_cache::co_get with a wait_bound resumes with timeout_error; a stored awaitable "
    "owns its key and loader",
    "[fleet][fleet_cache][async][coro]") {
  const std::string uri = sftest::need_redis();
  fc_t a(opts(uri, sftest::unique_prefix("fc-async-co-bound")));
  until_listening(a, "a listens");
  sftest::held_origin held("v1");
  auto bounded = [&a, &held]() -> fire_task<std::string> {
    const std::string key = "k";
    auto load = held.loader();
    co_return co_await a.co_get(key, load, {}, 300ms);
  };
  fire_task<std::string> task = bounded();
  held.started.wait("the load reaches the origin");
  task.wait("the coroutine leaves at its bound");
  CHECK(task.get().threw<sf::timeout_error>());
  held.release.open();
  std::atomic<int> ran{0};
  sftest::must([&] { return a.stats().local.loads_running == 0 && a.stats().local.size == 1; },
               "the load publishes");

  // The awaitable outlives the key and the loader it was made from.
  auto stored = [&a, &ran]() -> fire_task<std::string> {
    auto awaitable = [&] {
      std::string key = "k";
      return a.co_get(key, must_not_load(ran));
    }();
    co_return co_await std::move(awaitable);
  };
  fire_task<std::string> later = stored();
  REQUIRE(later.done());
  REQUIRE(later.get().value);
  CHECK(*later.get().value == "v1");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "fleet_cache::async_get and co_get through the cache-wide loader; without one "
    "async_get throws logic_error and never calls on_done",
    "[fleet][fleet_cache][async]") {
  const std::string uri = sftest::need_redis();
  std::atomic<int> calls{0};
  fc_t a(opts(uri, sftest::unique_prefix("fc-async-wide")), [&calls](const std::string& key) {
    calls.fetch_add(1);
    return "v:" + key;
  });
  until_listening(a, "a listens");
  callback_log<std::string> log;
  a.async_get("k", log.on_done());
  log.wait("on_done");
  REQUIRE(log.value);
  CHECK(*log.value == "v:k");
  callback_log<std::string> bounded;
  a.async_get("k", bounded.on_done(), {}, 10s);
  REQUIRE(bounded.calls.load() == 1);  // a local hit
  CHECK(*bounded.value == "v:k");
  fire_task<std::string> task = co_read_wide(a, "j");
  task.wait("the coroutine ends");
  REQUIRE(task.get().value);
  CHECK(*task.get().value == "v:j");
  CHECK(calls.load() == 2);

  fc_t none(opts(uri, sftest::unique_prefix("fc-async-nowide")));
  until_listening(none, "none listens");
  callback_log<std::string> never;
  CHECK_THROWS_AS(none.async_get("k", never.on_done()), std::logic_error);
  CHECK(never.calls.load() == 0);
}

namespace {

using sftest::brittle;
using sftest::move_threw;

struct brittle_codec {
  static constexpr std::string_view tag = "brittle/test";
  std::string encode(const brittle& b) const { return b.bad ? "1" : "0"; }
  brittle decode(std::string_view bytes) const { return brittle(bytes == "1"); }
};

// What a co_get of `key` ended with: "value", "move threw" or "other".
template <class C>
fire_task<std::string> co_kind(C& c, std::string key) {
  const auto load = [key] { return brittle(key.starts_with("bad")); };  // named: GCC 12
  try {
    const brittle b = co_await c.co_get(key, load);
    co_return b.bad ? "bad value" : "value";
  } catch (const move_threw&) {
    co_return "move threw";
  } catch (...) {
    co_return "other";
  }
}

}  // namespace

TEST_CASE("fleet and fleet_cache co_get: a T whose move into the result throws is thrown there",
          "[fleet][fleet_cache][async][coro]") {
  // Catches: co_get's callback (noexcept) moved the caller's copy into the awaiter's result:
  // a T whose move throws called std::terminate. Now the coroutine receives the exception,
  // and another key is answered.
  const std::string uri = sftest::need_redis();
  sf::fleet_cache<std::string, brittle, brittle_codec> a(
      opts(uri, sftest::unique_prefix("fc-async-co-move")));
  until_listening(a, "a listens");
  for (const char* key : {"bad", "good"}) {
    fire_task<std::string> t = co_kind(a, key);
    t.wait("fleet_cache co_get ends");
    CHECK(t.get().value ==
          std::optional<std::string>(key == std::string("bad") ? "move threw" : "value"));
  }
  sf::fleet<std::string, brittle, brittle_codec> f(
      sftest::fleet_opts(uri, sftest::unique_prefix("fleet-co-move")));
  for (const char* key : {"bad", "good"}) {
    fire_task<std::string> t = co_kind(f, key);
    t.wait("fleet co_get ends");
    CHECK(t.get().value ==
          std::optional<std::string>(key == std::string("bad") ? "move threw" : "value"));
  }
}
