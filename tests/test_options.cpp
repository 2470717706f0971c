// Options written the way the docs write them: designated initialisers that name only the
// fields they set. Built, like every test, with -Wall -Wextra -Wpedantic -Werror, so a field
// of a public options struct without a default member initialiser breaks this build
// (GCC's -Wmissing-field-initializers, part of -Wextra, names every omitted field that has
// none). Each case also checks that the named fields took effect.
#include <singleflight/singleflight.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "support/catch.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;

}  // namespace

TEST_CASE("options: group({.timeout = 1s}) names one field and gets a deadline", "[options]") {
  sf::group<std::string, int> g({.timeout = 1s});
  CHECK(g.do_("k", [] { return 7; }) == 7);
  // The deadline is in force: a fn that waits for its token is stopped by it.
  CHECK_THROWS_AS(g.do_("slow",
                        [](sf::stop_token st) {
                          const auto give_up = std::chrono::steady_clock::now() + 30s;
                          while (!st.stop_requested() && std::chrono::steady_clock::now() < give_up)
                            std::this_thread::yield();
                          return 0;
                        }),
                  sf::timeout_error);
}

TEST_CASE("options: group({.owner, .max_in_flight}) and the executor named alone", "[options]") {
  sf::group<std::string, int> capped({.owner = sf::ownership::group, .max_in_flight = 1});
  // An fn that starts the one flight allowed and, from inside it, a second key: overloaded.
  const int v = capped.do_("a", [&] {
    try {
      (void)capped.do_("b", [] { return 0; });
    } catch (const sf::overloaded_error&) {
      return 1;
    }
    return 0;
  });
  CHECK(v == 1);
  sf::group<std::string, int> threaded({.executor = sf::thread_executor{}});
  CHECK(threaded.do_("k", [] { return 3; }) == 3);
}

TEST_CASE("options: cache options as docs/cache.md writes them, the flight's nested", "[options]") {
  sf::cache<std::string, int> profiles({
      .ttl = 30s,
      .stale_while_revalidate = 10s,
      .stale_if_error = 5min,
      .error_ttl = 1s,
      .early_refresh_beta = 1.0,
      .max_entries = 100'000,
  });
  CHECK(profiles.get("k", [] { return 5; }) == 5);
  CHECK(profiles.get("k", [] { return 6; }) == 5);  // a hit: ttl is 30 s
  sf::cache<std::string, int> bounded({.ttl = 30s, .flight = {.timeout = 2s}});
  CHECK(bounded.get("k", [] { return 1; }) == 1);
}
