// SINGLEFLIGHT_EXTERN_CACHE / SINGLEFLIGHT_INSTANTIATE_CACHE: a cache type whose slow path is
// compiled in one TU (support/cache_extern_types.cpp) behaves, from a TU that only declares it
// extern, as the header-only one: loaders of every synchronous shape borrowed by the slow path
// (a key probed with another type converted once), get_entry and get_fresh, a refresh that
// outlives the call (the loader copied for it), stale-if-error, an asynchronous loader (still
// compiled here), close from a loader. That this TU compiles none of it is checked on its
// object file by the ctest test cache_extern.object (support/check_extern.sh).
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include "support/cache_extern_types.hpp"
#include "support/catch.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::extern_cache;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

sf::cache_options opts(std::chrono::nanoseconds ttl = 1s) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  return o;
}

std::string plain_loader() { return "fp"; }

}  // namespace

TEST_CASE("an extern cache type loads through every synchronous loader shape", "[cache][extern]") {
  manual_clock::reset();
  extern_cache c(opts());
  int calls = 0;
  CHECK(c.get("a", [&] { return ++calls, std::string("v-a"); }) == "v-a");
  CHECK(c.get(std::string("a"), [&] { return ++calls, std::string("other"); }) == "v-a");  // hit
  CHECK(calls == 1);
  CHECK(c.get(std::string_view("b"), [](const std::string& k) { return "k-" + k; }) == "k-b");
  CHECK(c.get("c", [](const std::string& k, sf::stop_token) { return "t-" + k; }) == "t-c");
  CHECK(c.get("d", &plain_loader) == "fp");
  CHECK_THROWS_AS(c.get("e", [] { return sf::load_result<std::string>::not_found(); }),
                  sf::not_found_error);
  const auto by_const = [](const std::string& k) { return "const-" + k; };
  CHECK(c.get("f", by_const) == "const-f");
  const sf::cached<std::string> e = c.get_entry("b", [] { return std::string("unused"); });
  REQUIRE(e.value);
  CHECK(*e.value == "k-b");
  CHECK(c.get_fresh("b", [] { return std::string("fresh-b"); }) == "fresh-b");
  CHECK(c.get("b", [] { return std::string("unused"); }) == "fresh-b");
  CHECK(c.stats().loads >= 6);
}

TEST_CASE("an extern cache type's refresh runs a copy of the call's loader after the call",
          "[cache][extern]") {
  manual_clock::reset();
  sf::cache_options o = opts(1s);
  o.stale_while_revalidate = 10s;
  extern_cache c(o);
  std::atomic<int> loads{0};
  CHECK(c.get("k", [&loads] { return "v" + std::to_string(++loads); }) == "v1");
  manual_clock::advance(2s);  // stale, within stale_while_revalidate
  {
    // The loader lives in this scope only: the refresh holds its own copy.
    auto scoped = [&loads, tag = std::string("r")] { return tag + std::to_string(++loads); };
    CHECK(c.get("k", scoped) == "v1");  // the old value at once; a refresh starts
  }
  must([&] { return c.peek("k") && c.peek("k")->value == "r2"; }, "the refresh published");
  CHECK(c.stats().background_refreshes == 1);
}

TEST_CASE("an extern cache type with a cache-wide loader serves stale on error",
          "[cache][extern]") {
  manual_clock::reset();
  sf::cache_options o = opts(1s);
  o.stale_if_error = 10s;
  o.loads = sf::load_owner::caller;
  std::atomic<bool> fail{false};
  extern_cache c(o, [&fail](const std::string& k) {
    if (fail.load()) throw std::runtime_error("origin down");
    return "w-" + k;
  });
  CHECK(c.get("x") == "w-x");
  fail = true;
  manual_clock::advance(2s);                        // expired, within stale_if_error
  CHECK(c.get("x") == "w-x");                       // the load failed: the old value
  CHECK_THROWS_AS(c.get("y"), std::runtime_error);  // nothing to fall back on
}

TEST_CASE("an extern cache type still takes an asynchronous loader, and close from a loader",
          "[cache][extern]") {
  sf::cache<std::uint64_t, int> c(opts(1s));
  std::thread origin;
  const auto async_load = [&origin](const std::uint64_t& k, sf::stop_token,
                                    sf::completion<int> done) {
    origin =
        std::thread([k, d = std::move(done)]() mutable { d.set_value(static_cast<int>(k) * 2); });
  };
  CHECK(c.get(21, async_load) == 42);
  origin.join();
  CHECK(c.get(21, [] { return -1; }) == 42);  // a hit
  // close() from a loader on the cache's own thread (load_owner::cache) stops and rejects
  // without waiting for that thread: this call returns (the load's value, or closed_error),
  // and the cache is closed.
  int got = 0;
  try {
    got = c.get(5, [&c] {
      c.close();
      return 5;
    });
  } catch (const sf::closed_error&) {
    got = -1;
  }
  CHECK((got == 5 || got == -1));
  CHECK_THROWS_AS(c.get(6, [] { return 6; }), sf::closed_error);
}
