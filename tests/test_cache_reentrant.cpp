// singleflight::cache: loaders that call back into their cache from the cache's own refresh
// threads (issue 23, R01-R03). close() from such a loader stops and rejects without waiting
// for any other refresh (two that both close would otherwise join each other); a refresh's
// loader that calls the cache for its own key gets std::logic_error, as it does on the
// caller's thread, instead of waiting for itself. Time is a manual clock; interleavings are
// forced with gates and counters; every wait is bounded (a hang aborts with its name).
#include <singleflight/cache.hpp>

#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>

#include "support/catch.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options swr() {
  sf::cache_options o;
  o.ttl = 1s;
  o.jitter = 0;
  o.stale_while_revalidate = 1s;
  return o;
}

// Two keys whose values are stale: a get of each starts a background refresh on the cache's
// threads (each on its own thread: a refresh never waits behind another).
void two_stale_keys(scache& c) {
  c.put("a", "a1");
  c.put("b", "b1");
  manual_clock::advance(1500ms);
}

}  // namespace

TEST_CASE("two refresh loaders that both close the cache both return (R01)",
          "[cache][c4][reentrant]") {
  manual_clock::reset();
  scache c(swr());
  two_stale_keys(c);
  std::atomic<int> started{0};
  std::atomic<int> closed{0};
  const auto closer = [&](sf::stop_token) {
    started.fetch_add(1);
    must([&] { return started.load() == 2; }, "both refreshes running");
    c.close();  // joined the other refresh's thread: each waited for the other forever
    closed.fetch_add(1);
    return std::string("v2");
  };
  CHECK(c.get("a", closer) == "a1");
  CHECK(c.get("b", closer) == "b1");
  must([&] { return closed.load() == 2; }, "both close() calls returned");
  CHECK_THROWS_AS(c.get("a", closer), sf::closed_error);
}

TEST_CASE("close() from a refresh loader does not wait for another refresh (R02)",
          "[cache][c4][reentrant]") {
  manual_clock::reset();
  scache c(swr());
  two_stale_keys(c);
  gate b_running;
  gate b_release;  // opened once a's close() has returned
  std::atomic<bool> a_closed{false};
  std::atomic<bool> b_done{false};
  CHECK(c.get("b", [&](sf::stop_token) {
    b_running.open();
    b_release.wait("b released after a's close() returned");  // a stuck loader: no token
    b_done = true;
    return std::string("b2");
  }) == "b1");
  b_running.wait("refresh of b running");
  CHECK(c.get("a", [&](sf::stop_token) {
    c.close();
    a_closed = true;
    return std::string("a2");
  }) == "a1");
  must([&] { return a_closed.load(); }, "close() in a's refresh returned");
  CHECK_FALSE(b_done.load());  // it returned while b's loader still ran
  b_release.open();
  c.close();  // from the test's thread: waits for b
  CHECK(b_done.load());
}

TEST_CASE("a refresh loader calling the cache for its own key gets logic_error (R03)",
          "[cache][c4][reentrant]") {
  manual_clock::reset();
  scache c(swr());
  c.put("k", "v1");
  manual_clock::advance(1500ms);
  std::atomic<int> refreshes{0};
  std::atomic<bool> saw_logic_error{false};
  std::atomic<bool> other_key_ok{false};
  const auto other = [](sf::stop_token) { return std::string("o1"); };
  CHECK(c.get("k", [&](sf::stop_token) {
    try {
      (void)c.get_fresh("k", other);  // joins this very refresh: would wait for itself
    } catch (const std::logic_error&) {
      saw_logic_error = true;
    }
    other_key_ok = c.get("other", other) == "o1";  // another key is fine
    refreshes.fetch_add(1);
    return std::string("v2");
  }) == "v1");
  must([&] { return refreshes.load() == 1; }, "refresh returned");
  CHECK(saw_logic_error.load());
  CHECK(other_key_ok.load());
  must([&] { return c.peek("k") && *c.peek("k")->value == "v2"; }, "refresh published");
}

TEST_CASE("a loader calling the cache for its own key on the thread running it gets logic_error",
          "[cache][reentrant]") {
  manual_clock::reset();
  sf::cache_options o = swr();
  SECTION("load_owner::cache: the load runs on the cache's thread") {
    o.loads = sf::load_owner::cache;
  }
  SECTION("load_owner::caller: the load runs on the caller's thread") {
    o.loads = sf::load_owner::caller;
  }
  scache c(o);
  std::atomic<bool> saw_logic_error{false};
  CHECK(c.get("k", [&](sf::stop_token) {
    try {
      (void)c.get_fresh("k", [](sf::stop_token) { return std::string("inner"); });
    } catch (const std::logic_error&) {
      saw_logic_error = true;
    }
    return std::string("v1");
  }) == "v1");
  CHECK(saw_logic_error.load());
}
