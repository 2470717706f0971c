// singleflight::fleet_cache (fleet_cache.hpp): a T destructor run while a caller applies what
// the bus told the process (catch_up: a local entry dropped) may re-enter the fleet_cache,
// close() included, like any destructor the library runs. Other callers wait for that
// application before they read, so it must not hold them up while user code runs: a close()
// there waits for a load whose loader reads the fleet_cache, and that read would wait for the
// application. Two fleet_cache objects stand for two processes against the redis-server of
// SINGLEFLIGHT_TEST_REDIS (skipped without it); every wait is bounded (a hang aborts with its
// name).
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "support/catch.hpp"
#include "support/dtor_hook.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using mode = sf::fleet_coherence;
using sftest::until_listening;

using sftest::old_value_dtor;
using oval = sftest::old_value;

struct oval_codec {
  static constexpr std::string_view tag = "oval";
  std::string encode(const oval& v) const { return v.s; }
  oval decode(std::string_view bytes) const { return oval(std::string(bytes).c_str()); }
};

using fc_t = sf::fleet_cache<std::string, oval, oval_codec>;

}  // namespace

TEST_CASE(
    "a T destructor run by applying the bus may close the fleet_cache while a loader reads it",
    "[fleet][fleet_cache][destructors][close]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-dtor");
  fc_t a(sftest::fleet_cache_opts(uri, prefix, m));
  fc_t b(sftest::fleet_cache_opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  // a's entry comes from its own load (a leader's store is not reported back to its process).
  CHECK(a.get("k", [] { return oval("old"); }).s == "old");
  REQUIRE(a.peek("k").has_value());

  // A load on a's own threads, held until the destructor below runs; then its loader reads a.
  sftest::gate started;
  sftest::gate go;
  std::atomic<bool> loader_read{false};
  sftest::thread loading([&] {
    try {
      (void)a.get("other", [&] {
        started.open();
        go.wait("the old value's destructor lets the loader go on");
        (void)a.peek("elsewhere");  // applies what a heard: waits for an application under way
        loader_read.store(true);
        return oval("new");
      });
    } catch (const sf::closed_error&) {
    }
  });
  started.wait("the load starts");

  const std::uint64_t heard = a.stats().invalidations_heard;
  (void)b.invalidate("k");
  sftest::must([&] { return a.stats().invalidations_heard > heard; }, "a hears b's invalidation");

  std::atomic<bool> closed{false};
  sftest::thread reader([&] {
    old_value_dtor.arm(std::this_thread::get_id(), [&] {
      go.open();
      a.close();  // waits for the load above, whose loader reads a
      closed.store(true);
    });
    (void)a.peek("k");  // applies b's invalidation: drops "old"
  });
  reader.join("the reader returns (close() from the dropped value's destructor)");
  old_value_dtor.on.store(std::thread::id{});
  loading.join("the load returns");
  CHECK(closed.load());
  CHECK(loader_read.load());
  CHECK_FALSE(a.peek("k").has_value());
}
