// singleflight::cache as users call it: loaders that take the key, in every shape (sync,
// with or without a token, load_result, asynchronous). Time is a manual clock; interleavings
// are forced with gates; every wait is bounded.
#include <singleflight/cache.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
namespace d = singleflight::detail;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options opts(std::chrono::nanoseconds ttl = 1s) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  return o;
}

template <class L>
sftest::fire_task<std::string> co_read(scache& c, std::string key, L load) {
  co_return co_await c.co_get(key, load);
}

}  // namespace

// ---- the shapes, defined once (detail/fn_shapes.hpp) ------------------------------------

TEST_CASE("one set of shapes: each form is recognised, key forms first", "[cache][loaders]") {
  using K = std::string;
  using R = int;
  auto plain = [] { return 1; };
  auto token = [](sf::stop_token) { return 1; };
  auto async = [](sf::stop_token, sf::completion<R>) {};
  auto key = [](const K&) { return 1; };
  auto key_token = [](const K&, sf::stop_token) { return 1; };
  auto key_async = [](const K&, sf::stop_token, sf::completion<R>) {};
  auto generic = [](const auto&...) { return 1; };
  STATIC_REQUIRE(d::form_of<decltype(plain), K, R>() == d::fn_form::plain);
  STATIC_REQUIRE(d::form_of<decltype(token), K, R>() == d::fn_form::token);
  STATIC_REQUIRE(d::form_of<decltype(async), K, R>() == d::fn_form::async);
  STATIC_REQUIRE(d::form_of<decltype(key), K, R>() == d::fn_form::key);
  STATIC_REQUIRE(d::form_of<decltype(key_token), K, R>() == d::fn_form::key_token);
  STATIC_REQUIRE(d::form_of<decltype(key_async), K, R>() == d::fn_form::key_async);
  // Without a key type (a group's fn) the key forms do not exist.
  STATIC_REQUIRE(d::form_of<decltype(key), void, R>() == d::fn_form::none);
  STATIC_REQUIRE(d::form_of<decltype(generic), void, R>() == d::fn_form::token);
  STATIC_REQUIRE(d::form_of<decltype(generic), K, R>() == d::fn_form::key_token);
  // The group's concepts are the same ones.
  STATIC_REQUIRE(d::flight_fn<decltype(async), R>);
  STATIC_REQUIRE(!d::flight_fn<decltype(key), R>);
  // The cache's loader kinds are read off the same forms.
  STATIC_REQUIRE(d::loader_traits<decltype(key_async), K, R>::is_async);
  STATIC_REQUIRE(d::loader_traits<decltype(key_async), K, R>::takes_key);
  auto key_result = [](const K&, sf::stop_token) { return sf::load_result<R>::not_found(); };
  STATIC_REQUIRE(d::loader_traits<decltype(key_result), K, R>::returns_result);
  auto key_async_result = [](const K&, sf::stop_token, sf::completion<sf::load_result<R>>) {};
  STATIC_REQUIRE(d::loader_traits<decltype(key_async_result), K, R>::async_result);
  STATIC_REQUIRE(!d::loader_traits<decltype([](int, int) { return 1; }), K, R>::valid);
}

// ---- loaders that take the key -----------------------------------------------------------

TEST_CASE("a loader may take the key, with or without the flight's token", "[cache][loaders]") {
  manual_clock::reset();
  scache c(opts());
  CHECK(c.get("a", [](const std::string& k) { return "v-" + k; }) == "v-a");
  std::atomic<bool> got_token{false};
  CHECK(c.get("b", [&](const std::string& k, sf::stop_token st) {
    got_token = st.stop_possible();
    return "v-" + k;
  }) == "v-b");
  CHECK(got_token);
  CHECK(c.get_fresh("c", [](const std::string& k) { return "fresh-" + k; }) == "fresh-c");
  // A probe key (string_view, const char*) reaches the loader as a Key.
  const std::string_view probe = "d";
  CHECK(c.get(probe, [](const std::string& k) { return "v-" + k; }) == "v-d");
  CHECK(c.get_entry("e", [](const std::string& k) { return "v-" + k; }).value == "v-e");
  CHECK(c.stats().loads == 5);
}

TEST_CASE("a key-taking loader may return load_result: per-entry ttl and not found",
          "[cache][loaders]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.not_found_ttl = 1min;
  scache c(o);
  const auto load = [](const std::string& k, sf::stop_token) {
    if (k == "missing") return sf::load_result<std::string>::not_found();
    return sf::load_result<std::string>::value("v-" + k, 10s);
  };
  CHECK(c.get("a", load) == "v-a");
  manual_clock::advance(5s);  // past the cache's ttl, within the entry's own
  CHECK(c.get_entry("a", load).state == sf::freshness::fresh);
  CHECK_THROWS_AS(c.get("missing", load), sf::not_found_error);
  CHECK_FALSE(c.get_entry("missing", load).found());
  CHECK(c.stats().loads == 2);
}

TEST_CASE("an asynchronous loader may take the key (async_get, co_get, get)", "[cache][loaders]") {
  manual_clock::reset();
  scache c(opts());
  sftest::callback_log<std::string> log;
  std::atomic<int> calls{0};
  const auto load = [&](const std::string& k, sf::stop_token, sf::completion<std::string> done) {
    calls.fetch_add(1);
    done.set_value("v-" + k);
  };
  c.async_get("a", load, log.on_done());
  log.wait("async_get delivered");
  CHECK(log.value == "v-a");
  CHECK(c.get("b", load) == "v-b");
  sftest::fire_task<std::string> task = co_read(c, "c", load);
  REQUIRE(task.done());
  CHECK(task.get().value == "v-c");
  const auto result = [](const std::string& k, sf::stop_token,
                         sf::completion<sf::load_result<std::string>> done) {
    done.set_value(sf::load_result<std::string>::value("r-" + k));
  };
  CHECK(c.get("d", result) == "r-d");
  CHECK(calls == 3);
}

// ---- a cache-wide loader ------------------------------------------------------------------

TEST_CASE(
    "a cache-wide loader: get(key), get_entry, get_fresh, async_get and co_get load "
    "through it",
    "[cache][loaders]") {
  manual_clock::reset();
  std::atomic<int> calls{0};
  scache c(opts(), [&calls](const std::string& k, sf::stop_token) {
    calls.fetch_add(1);
    return "w-" + k;
  });
  CHECK(c.get("a") == "w-a");
  CHECK(c.get("a") == "w-a");  // a hit
  CHECK(c.get_entry("b").value == "w-b");
  CHECK(c.get_fresh("a") == "w-a");  // a new load, by definition
  sftest::callback_log<std::string> log;
  c.async_get("c", log.on_done());
  log.wait("async_get delivered");
  CHECK(log.value == "w-c");
  sftest::fire_task<std::string> task = [](scache& cc) -> sftest::fire_task<std::string> {
    co_return co_await cc.co_get(std::string("d"));
  }(c);
  task.wait("co_get resumed");  // the loader runs on the cache's thread
  CHECK(task.get().value == "w-d");
  CHECK(calls == 5);
  // A call may still pass a loader of its own.
  CHECK(c.get("e", [](const std::string& k) { return "own-" + k; }) == "own-e");
}

TEST_CASE("a cache-wide loader may return load_result; without one, get(key) is a logic_error",
          "[cache][loaders]") {
  manual_clock::reset();
  sf::cache_options o = opts();
  o.not_found_ttl = 1min;
  scache c(o, [](const std::string& k) {
    return k == "missing" ? sf::load_result<std::string>::not_found()
                          : sf::load_result<std::string>::value("w-" + k);
  });
  CHECK(c.get("a") == "w-a");
  CHECK_THROWS_AS(c.get("missing"), sf::not_found_error);
  scache plain(opts());
  CHECK_THROWS_AS(plain.get("a"), std::logic_error);
  CHECK(plain.size() == 0);
}

TEST_CASE(
    "with a cache-wide loader every background refresh runs it, also one a call with a "
    "loader of its own triggered: the cache never keeps that call's loader",
    "[cache][loaders]") {
  manual_clock::reset();
  sf::cache_options o = opts(1s);
  o.stale_while_revalidate = 10s;
  std::atomic<int> wide_calls{0};
  scache c(o, [&wide_calls](const std::string& k) {
    wide_calls.fetch_add(1);
    return "w-" + k;
  });
  std::atomic<int> own_calls{0};
  const auto own = [&own_calls](const std::string& k) {
    own_calls.fetch_add(1);
    return "own-" + k;
  };
  CHECK(c.get("a", own) == "own-a");  // the miss: this call's loader
  manual_clock::advance(2s);          // stale, within stale_while_revalidate
  CHECK(c.get("a", own) == "own-a");  // the old value at once; a refresh starts
  must([&] { return wide_calls.load() == 1; }, "the refresh ran the cache-wide loader");
  must([&] { return c.peek("a") && c.peek("a")->value == "w-a"; }, "the refresh published");
  CHECK(own_calls == 1);
  CHECK(c.stats().background_refreshes == 1);
}

// The docs' headline snippet (docs/cache.md), verbatim, on a manual clock: this namespace's
// `singleflight` names the real one's cache with sftest::manual_clock, so the snippet's
// `singleflight::cache<std::string, profile>` is the cache under test. Built under ASan (the dev
// preset), it fails with stack-use-after-scope if the snippet's loader refers to the request's
// frame and a refresh runs it after that frame is gone (the earlier snippet did).
namespace headline {

struct profile {
  std::string text;
};

// The origin: each fetch waits for the test's gate when one is set.
struct origin_service {
  std::atomic<int> calls{0};
  std::atomic<sftest::gate*> hold{nullptr};
  profile fetch(singleflight::stop_token, const std::string& key) {
    calls.fetch_add(1);
    if (sftest::gate* g = hold.load()) g->wait("the origin's gate");
    return profile{"profile of " + key + " #" + std::to_string(calls.load())};
  }
};

namespace singleflight {
template <class K, class V>
using cache = ::singleflight::cache<K, V, ::singleflight::default_hash, std::equal_to<>,
                                    sftest::manual_clock>;
using ::singleflight::stop_token;
}  // namespace singleflight

// The test's body: the snippet declares the cache here; each request runs in a frame of its
// own (handle) that is gone when it returns.
void run(origin_service& origin) {
  // --- snippet: cache-headline ---
  singleflight::cache<std::string, profile> profiles(
      {
          .ttl = 30s,                     // fresh window, jittered by ±10% per write
          .stale_while_revalidate = 10s,  // then: old value at once, one background refresh
          .stale_if_error = 5min,         // a failing origin is answered with the old value
          .error_ttl = 1s,                // ...and asked at most once a second per key;
                                          // a key with no old value caches its failure:
                                          // every caller gets it for 1 s, no origin call
          .early_refresh_beta = 1.0,      // XFetch: refresh shortly before expiry
          .max_entries = 100'000,         // W-TinyLFU eviction
      },
      // The cache-wide loader: the cache keeps it and runs it for misses and background
      // refreshes, after the request that caused them has returned. It is given the key;
      // what it captures must outlive the cache (here the origin client).
      [&origin](const std::string& key, singleflight::stop_token st) {
        return origin.fetch(st, key);
      });
  // --- end snippet ---

  const auto handle = [&profiles](const std::string& tenant, const std::string& user,
                                  const std::string& locale,
                                  singleflight::stop_token request_stop_token) {
    // --- snippet: cache-headline-call ---
    profile p = profiles.get(tenant + '|' + user + '|' + locale,  // the key is a contract
                             request_stop_token);
    // --- end snippet ---
    return p;
  };

  CHECK(handle("t1", "u1", "en", {}).text == "profile of t1|u1|en #1");
  manual_clock::advance(35s);  // past ttl (30 s ±10%: 33 s at most), within its SWR (37 s at least)
  sftest::gate release;
  origin.hold = &release;  // the refresh's fetch waits until the request's frame is gone
  CHECK(handle("t1", "u1", "en", {}).text == "profile of t1|u1|en #1");  // the old value
  must([&] { return origin.calls.load() == 2; }, "the refresh called the origin");
  release.open();
  must(
      [&] {
        const auto e = profiles.peek("t1|u1|en");
        return e && e->value && e->value->text == "profile of t1|u1|en #2";
      },
      "the refresh published");
  CHECK(profiles.stats().background_refreshes == 1);
  origin.hold = nullptr;
}

}  // namespace headline

TEST_CASE(
    "the docs' headline cache snippet, through a background refresh that runs after the "
    "request's frame is gone (ASan: no stack-use-after-scope)",
    "[cache][loaders][docs]") {
  manual_clock::reset();
  headline::origin_service origin;
  headline::run(origin);
}
