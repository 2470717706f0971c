// singleflight::cache's loads belong to the cache by default (issue 32, load_owner::cache):
// a synchronous loader runs on the cache's own bounded threads, never on the caller's; every
// caller, the one that started the load included, leaves at its token or wait_bound, and no
// caller leaving stops the load: it finishes and publishes. load_owner::caller keeps the
// group's rules (the first caller runs the loader on its own thread). The origin is held
// with gates, so each caller provably leaves while its load still runs; the cache's windows
// run on a manual clock. Every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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
  o.ttl = 1min;
  o.jitter = 0;
  return o;
}

// The origin: counts its calls and whether any saw its stop token fire, and answers only once
// `release` opens.
struct origin {
  gate release;
  std::atomic<int> calls{0};
  std::atomic<int> stopped{0};
  std::atomic<bool> on_caller{false};
  std::string fetch(const std::string& key, const sf::stop_token& st, std::thread::id caller = {}) {
    calls.fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller = true;
    release.wait("origin released");
    if (st.stop_requested()) stopped.fetch_add(1);
    return "v:" + key;
  }
};

}  // namespace

TEST_CASE(
    "50 keys, each requested once with a bound the origin outlasts: every caller leaves, "
    "every key is loaded and cached",
    "[cache][owned]") {
  manual_clock::reset();
  origin o;
  scache c(opts(), [&o](const std::string& key, sf::stop_token st) { return o.fetch(key, st); });
  constexpr int keys = 50;
  std::atomic<int> timed_out{0};
  std::atomic<int> other{0};
  {
    std::vector<std::unique_ptr<sftest::thread>> callers;
    for (int i = 0; i < keys; ++i) {
      callers.push_back(std::make_unique<sftest::thread>([&, i] {
        try {
          // 1 s, not the 100 ms: a bound that passes before the call reaches the
          // group starts no load, and 50 threads starting on a loaded 2-core machine under
          // TSan can take 100 ms. The origin is held by a gate, so the bound still passes
          // first.
          (void)c.get("k" + std::to_string(i), {}, 1s);
          other.fetch_add(1);
        } catch (const sf::timeout_error&) {
          timed_out.fetch_add(1);
        } catch (...) {
          other.fetch_add(1);
        }
      }));
    }
    // Every caller returns while every load is still held at the origin: the one that started
    // a load leaves at its bound like the rest (before: it ran the loader and stayed 150 ms).
    const bool left = sftest::becomes([&] { return timed_out.load() + other.load() == keys; }, 5s);
    o.release.open();
    for (auto& t : callers) t->join("caller");
    REQUIRE(left);
  }
  CHECK(timed_out.load() == keys);
  const auto all_cached = [&] {
    for (int i = 0; i < keys; ++i) {
      if (!c.peek("k" + std::to_string(i))) return false;
    }
    return true;
  };
  must(all_cached, "every load published");
  CHECK(o.calls.load() == keys);
  CHECK(o.stopped.load() == 0);  // no caller leaving stopped a load
  for (int i = 0; i < keys; ++i) {
    const auto e = c.peek("k" + std::to_string(i));
    REQUIRE(e.has_value());
    CHECK(*e->value == "v:k" + std::to_string(i));
  }
  CHECK(c.stats().loads == static_cast<std::uint64_t>(keys));
}

TEST_CASE("a leader whose stop token fires returns at once; its load still publishes",
          "[cache][owned]") {
  manual_clock::reset();
  origin o;
  scache c(opts());
  sf::stop_source leave;
  sftest::result<std::string> leader;
  auto t = sftest::spawn(leader, [&] {
    const std::thread::id me = std::this_thread::get_id();
    return c.get(
        "k", [&o, me](const std::string& key, sf::stop_token st) { return o.fetch(key, st, me); },
        leave.get_token());
  });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  leave.request_stop();
  const bool returned = sftest::becomes([&] { return leader.done.load(); }, 5s);
  o.release.open();
  sftest::finish(t, leader, "leader");
  REQUIRE(returned);
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(!o.on_caller.load());  // the loader ran on the cache's thread, not the leader's
  must([&] { return c.peek("k").has_value(); }, "the load published");
  CHECK(*c.peek("k")->value == "v:k");
  CHECK(o.stopped.load() == 0);
  CHECK(c.get("k", [] { return std::string("never"); }) == "v:k");
}

TEST_CASE("async_get with a synchronous loader does not run it on the calling thread",
          "[cache][owned][async]") {
  manual_clock::reset();
  origin o;
  scache c(opts());
  callback_log<std::string> log;
  const std::thread::id me = std::this_thread::get_id();
  c.async_get(
      "k", [&o, me](const std::string& key, sf::stop_token st) { return o.fetch(key, st, me); },
      log.on_done());
  // async_get returned while the loader is held: it did not run it here.
  must([&] { return o.calls.load() == 1; }, "the load runs");
  CHECK(!log.is_done());
  o.release.open();
  log.wait("delivered");
  CHECK(log.value == "v:k");
  CHECK(!o.on_caller.load());
}

TEST_CASE("the cache's threads are bounded: loads past max_threads queue and still complete",
          "[cache][owned]") {
  manual_clock::reset();
  origin o;
  sf::cache_options op = opts();
  op.max_threads = 2;
  scache c(op, [&o](const std::string& key, sf::stop_token st) { return o.fetch(key, st); });
  constexpr int keys = 6;
  std::vector<std::unique_ptr<callback_log<std::string>>> logs;
  for (int i = 0; i < keys; ++i) {
    logs.push_back(std::make_unique<callback_log<std::string>>());
    c.async_get("k" + std::to_string(i), logs.back()->on_done());
  }
  must([&] { return o.calls.load() == 2; }, "two loads run");
  CHECK(!sftest::becomes([&] { return o.calls.load() > 2; }, 50ms));  // the rest queue
  o.release.open();
  for (auto& l : logs) l->wait("delivered");
  CHECK(o.calls.load() == keys);
  CHECK(c.size() == static_cast<std::size_t>(keys));
}

TEST_CASE("a loader on the cache's only thread loading another key runs that load there",
          "[cache][owned][reentrant]") {
  manual_clock::reset();
  sf::cache_options op = opts();
  op.max_threads = 1;
  scache c(op);
  std::atomic<bool> inner_on_same_thread{false};
  const std::string v = c.get("a", [&c, &inner_on_same_thread](sf::stop_token) {
    const std::thread::id outer = std::this_thread::get_id();
    // Queued behind this very loader on a pool of one thread, it would wait forever.
    const std::string b = c.get("b", [outer, &inner_on_same_thread](sf::stop_token) {
      inner_on_same_thread = std::this_thread::get_id() == outer;
      return std::string("b1");
    });
    return "a1+" + b;
  });
  CHECK(v == "a1+b1");
  CHECK(inner_on_same_thread.load());
}

TEST_CASE("load_owner::caller keeps the group's rules: the leader runs the loader and stays",
          "[cache][owned]") {
  manual_clock::reset();
  origin o;
  sf::cache_options op = opts();
  op.loads = sf::load_owner::caller;
  scache c(op);
  sf::stop_source leave;
  sftest::result<std::string> leader;
  auto t = sftest::spawn(leader, [&] {
    const std::thread::id me = std::this_thread::get_id();
    return c.get(
        "k", [&o, me](const std::string& key, sf::stop_token st) { return o.fetch(key, st, me); },
        leave.get_token());
  });
  must([&] { return o.calls.load() == 1; }, "the load runs");
  leave.request_stop();
  // The leader runs the loader on its own thread and cannot return before it does.
  CHECK(!sftest::becomes([&] { return leader.done.load(); }, 50ms));
  o.release.open();
  sftest::finish(t, leader, "leader");
  CHECK(o.on_caller.load());
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(o.stopped.load() == 1);  // ownership::waiters: the last caller leaving stopped it
}
