// fleet's loaders calling the fleet back on the threads it hands them: an async_get or co_get
// flight's loader runs on a fleet worker after the group's fn returned, so the group cannot tell
// that thread runs the flight; a blocking get() there for the flight's own key must throw
// std::logic_error (docs/threads.md) rather than wait for itself. Other keys, and the key's next
// flight once this one settled, are fine. Each test bounds its wait and closes the fleet on a
// hang (close() settles the waiting get with closed_error), so a regression fails, not hangs.
#include <singleflight/fleet.hpp>
#include <singleflight/thread_executor.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/fleet.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;
}  // namespace

TEST_CASE("an async leader's loader that calls get for its own key gets logic_error, not a hang",
          "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  fleet_t f(sftest::fleet_opts(uri, sftest::unique_prefix("selfwait")));
  std::atomic<int> inner{0};  // 1 logic_error, 2 other exception, 3 a value
  std::atomic<bool> done{false};
  f.async_get(
      std::string("k"),
      [&] {
        try {
          (void)f.get("k", [] { return std::string("inner"); });
          inner = 3;
        } catch (const std::logic_error&) {
          inner = 1;
        } catch (...) {
          inner = 2;
        }
        return std::string("outer");
      },
      [&](sf::outcome<std::string>) { done = true; });
  const bool settled = sftest::becomes([&] { return done.load(); }, 3s);
  if (!settled) f.close();  // unblocks the inner wait (closed_error)
  CHECK(settled);
  CHECK(inner.load() == 1);
}

namespace {
sftest::fire_task<std::string> co_self(fleet_t& f, std::atomic<int>& inner) {
  auto loader = [&f, &inner] {
    try {
      (void)f.get("k", [] { return std::string("inner"); });
      inner = 3;
    } catch (const std::logic_error&) {
      inner = 1;
    } catch (...) {
      inner = 2;
    }
    return std::string("outer");
  };  // named: GCC 12 (README)
  co_return co_await f.co_get(std::string("k"), loader);
}
}  // namespace

TEST_CASE("a co_get leader's loader that calls get for its own key gets logic_error",
          "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  fleet_t f(sftest::fleet_opts(uri, sftest::unique_prefix("coself")));
  std::atomic<int> inner{0};
  auto t = co_self(f, inner);
  const bool settled = sftest::becomes([&] { return t.done(); }, 3s);
  if (!settled) f.close();
  CHECK(settled);
  CHECK(inner.load() == 1);
}

TEST_CASE("an async loader may call get for another key; on_done may call get for its own key",
          "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  fleet_t f(sftest::fleet_opts(uri, sftest::unique_prefix("selfother")));
  std::atomic<bool> other_ok{false};
  std::atomic<int> again{0};  // 1 a value, 2 an exception
  std::atomic<bool> done{false};
  f.async_get(
      std::string("k"),
      [&] {
        other_ok = f.get("other", [] { return std::string("o"); }) == "o";
        return std::string("outer");
      },
      [&](sf::outcome<std::string> o) {
        // The flight settled: a get for its key here is the key's next call (a hit).
        try {
          again = f.get("k", [] { return std::string("reloaded"); }) == o.value() ? 1 : 3;
        } catch (...) {
          again = 2;
        }
        done = true;
      });
  const bool settled = sftest::becomes([&] { return done.load(); }, 3s);
  if (!settled) f.close();
  CHECK(settled);
  CHECK(other_ok.load());
  CHECK(again.load() == 1);
}

TEST_CASE("a get loader that calls get for its own key gets logic_error, inline or on the executor",
          "[fleet]") {
  const std::string uri = sftest::need_redis();
  sf::fleet_options o = sftest::fleet_opts(uri, sftest::unique_prefix("selfsync"));
  const bool with_executor = GENERATE(false, true);
  if (with_executor) o.local.executor = sf::thread_executor{};
  o.local.timeout = 3s;  // a regression fails with timeout_error instead of hanging
  fleet_t f(o);
  std::atomic<int> inner{0};
  CHECK(f.get("k", [&] {
    try {
      (void)f.get("k", [] { return std::string("inner"); });
      inner = 3;
    } catch (const std::logic_error&) {
      inner = 1;
    } catch (...) {
      inner = 2;
    }
    return std::string("outer");
  }) == "outer");
  CHECK(inner.load() == 1);
}

namespace {
// Awaits co_get, then closes the fleet from where it was resumed (a fleet worker).
sftest::fire_task<std::string> co_then_close(fleet_t& f, std::atomic<bool>& closed) {
  auto loader = [] { return std::string("v"); };  // named: GCC 12 (README)
  std::string v = co_await f.co_get(std::string("k"), loader);
  f.close();
  closed = true;
  co_return v;
}
}  // namespace

TEST_CASE("a coroutine resumed by co_get may close() the fleet there; the destructor then joins",
          "[fleet][async][close]") {
  const std::string uri = sftest::need_redis();
  std::atomic<bool> closed{false};
  std::optional<sftest::fire_task<std::string>> t;
  {
    fleet_t f(sftest::fleet_opts(uri, sftest::unique_prefix("coclose")));
    t.emplace(co_then_close(f, closed));
    t->wait("the coroutine closed the fleet and finished");
    CHECK(closed.load());
    CHECK(t->get().finished_on != std::this_thread::get_id());
    CHECK_THROWS_AS(f.get("k", [] { return std::string("x"); }), sf::closed_error);
  }  // the destructor joins the worker the coroutine finished on
  REQUIRE(t->get().value);
  CHECK(*t->get().value == "v");
}

TEST_CASE(
    "a loader on the only fleet worker that calls get for a key whose async flight is queued "
    "behind it runs that flight itself instead of waiting forever",
    "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  sf::fleet_options o = sftest::fleet_opts(uri, sftest::unique_prefix("pool1"));
  o.max_async_threads = 1;  // a's loader holds the only worker while b's flight is queued
  fleet_t f(o);
  sftest::gate b_queued;
  std::atomic<int> b_loads{0};
  std::atomic<int> inner{0};  // 1 b's value, 2 an exception, 3 another value
  std::atomic<int> settled{0};
  std::atomic<int> values{0};
  f.async_get(
      std::string("a"),
      [&] {
        b_queued.wait("b queued");
        try {
          inner = f.get("b", [] { return std::string("b-inline"); }) == "vb" ? 1 : 3;
        } catch (...) {
          inner = 2;
        }
        return std::string("va");
      },
      [&](sf::outcome<std::string> r) {
        if (r.has_value() && r.value() == "va") values.fetch_add(1);
        settled.fetch_add(1);
      });
  f.async_get(
      std::string("b"),
      [&] {
        b_loads.fetch_add(1);
        return std::string("vb");
      },
      [&](sf::outcome<std::string> r) {
        if (r.has_value() && r.value() == "vb") values.fetch_add(1);
        settled.fetch_add(1);
      });
  b_queued.open();
  const bool both = sftest::becomes([&] { return settled.load() == 2; }, 3s);
  if (!both) f.close();  // unblocks the waiting get (closed_error)
  CHECK(both);
  CHECK(inner.load() == 1);  // it joined b's queued flight and ran it: one load of b
  CHECK(b_loads.load() == 1);
  CHECK(values.load() == 2);
}
