// One predicate for "a thread the library started" (detail/library_thread.hpp) across layers:
// a close() called on any library thread -- a group's thread_executor worker, timer or
// delivery thread, or a worker of a cache, a batch loader or a fleet -- stops and rejects and
// waits for nothing, whichever layer started the thread. Each case builds the cycle an
// outside wait would close: the closed object's own thread waits, through a group, for the
// very thread that calls close(). Every wait is bounded: a close that waits hangs the cycle
// and aborts the test with the wait's name.
#include <singleflight/batch_loader.hpp>
#include <singleflight/cache.hpp>
#include <singleflight/group.hpp>
#include <singleflight/thread_executor.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::must;

namespace {

using group_t = sf::group<std::string, std::string>;

// A group whose fns run on thread_executor workers: threads the group starts and owns.
sf::options owned_threads() {
  sf::options o;
  o.executor = sf::thread_executor{};
  return o;
}

// How long a close that must not wait for anything may take (sanitizers, two busy cores).
constexpr std::chrono::milliseconds returns = 5s;

}  // namespace

TEST_CASE("a cache closed from a group's worker while its load waits on that group returns",
          "[threads][close][cache]") {
  // The cache's load runs on a cache worker and waits in g.do_ for a fn that runs on one of
  // the group's threads; that fn closes the cache. Waiting there for the cache's workers
  // would wait for the load, which waits for the fn: the close must return at once.
  group_t g(owned_threads());
  std::optional<sf::cache<std::string, std::string>> c;
  c.emplace(sf::cache_options{});
  std::atomic<bool> closed{false};
  const auto loader = [&](const std::string& k, sf::stop_token) {
    return g.do_("inner:" + k, [&] {
      c->close();
      closed.store(true);
      return std::string("v");
    });
  };
  sftest::result<std::string> r;
  auto caller = sftest::spawn(r, [&] { return c->get("k", loader); });
  must([&] { return closed.load(); }, "close() on the group's thread returns", returns);
  sftest::finish(caller, r, "the cache's caller returns");
  // The load ran on: its value, or the close's closed_error if close stopped the wait first.
  CHECK((r.value.has_value() || r.threw<sf::closed_error>()));
  c.reset();  // the destructor, from outside, waits for the cache's workers
}

TEST_CASE("a batch loader closed from a group's worker while its bulk call waits returns",
          "[threads][close][batch]") {
  // The bulk call runs on a loader worker and waits in g.do_ for a fn on a group thread
  // that closes the loader: the same cycle through the batch loader's threads.
  group_t g(owned_threads());
  std::optional<sf::batch_loader<std::string, std::string>> l;
  std::atomic<bool> closed{false};
  sf::batch_options bo;
  bo.window = 0ms;
  l.emplace(
      [&](std::span<const std::string> keys) {
        g.do_("inner", [&] {
          l->close();
          closed.store(true);
          return std::string("x");
        });
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      bo);
  sftest::result<std::string> r;
  auto caller = sftest::spawn(r, [&] { return l->load("k"); });
  must([&] { return closed.load(); }, "close() on the group's thread returns", returns);
  sftest::finish(caller, r, "the loader's caller returns");
  CHECK((r.value.has_value() || r.threw<sf::closed_error>()));
  l.reset();
}

TEST_CASE("a group closed from a cache's worker returns", "[threads][close][group]") {
  // The other direction: a cache load (on a cache worker) closes a group one of whose fns,
  // on the group's own thread, waits for that load.
  group_t g(owned_threads());
  sf::cache<std::string, std::string> c{sf::cache_options{}};
  std::atomic<bool> closed{false};
  sftest::result<std::string> r;
  auto caller = sftest::spawn(r, [&] {
    return g.do_("outer", [&] {
      return c.get("k", [&](sf::stop_token) {
        g.close();
        closed.store(true);
        return std::string("v");
      });
    });
  });
  must([&] { return closed.load(); }, "close() on the cache's worker returns", returns);
  sftest::finish(caller, r, "the group's caller returns");
  CHECK((r.value.has_value() || r.threw<sf::closed_error>()));
}
