// Where user code runs, defect F, replayed step by step with the test hooks:
// a flight started by an async observer going round again is deferred until
// the settler's notification loop is over; a *later* waiter of the same batch
// whose on_done blocks inside the group (a blocking do_ for that key, or
// close()) must not wait for work that only that very loop would start.
// The rule: a thread about to block inside the group first runs what it
// itself deferred.
#define SINGLEFLIGHT_TEST_HOOKS  // parks the notifying thread between two observers
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;
using sftest::callback_log;
using sftest::completion_box;
using sftest::gate;
using sftest::must;

// Parks the notifying thread at its second `observer_returning` (the second
// observer of the batch, before it attaches again) until released. Each test
// case has its own parking (static: a library thread may still be in the hook
// when the case ends), so that a case never finds gates another one opened
// (in one process the second case used to find both already open).
struct parking {
  std::atomic<int> returning_hits{0};
  gate second_parked;
  gate second_release;
};
parking parkings[2];
std::atomic<parking*> current_parking{nullptr};
void park_second_returning(sf::detail::hook_point p, const void*) {
  if (p != sf::detail::hook_point::observer_returning) return;
  parking* const pk = current_parking.load(std::memory_order_acquire);
  if (pk == nullptr || pk->returning_hits.fetch_add(1) != 1) return;
  pk->second_parked.open();
  pk->second_release.wait("second observer released");
}

// A stopped flight for "k" (its only waiter left; its completion is held by
// the returned item), then two async observers of it, a1 first, b2 second.
// Resolving the held completion claims both into one batch: a1 goes round
// and leads the next flight (a sync fn: deferred until the loop ends); b2 is
// parked by the hook, its stop is requested (lost claim: it sees the stop
// when it attaches again) and it is delivered cancelled_error within the
// loop, running its on_done there.
struct stage {
  group_t& g;
  completion_box<int> box;
  callback_log<int> x, a1, b2;
  sf::stop_source sx, s2;
  std::atomic<int> a1_fn_runs{0};

  explicit stage(group_t& grp) : g(grp) {}

  std::pair<sf::stop_token, sf::completion<int>> setup() {
    g.async_do("k", box.fn(), x.on_done(), sx.get_token());
    auto first = box.take("first flight started");
    sx.request_stop();  // ownership::waiters: stopped, its completion still held
    REQUIRE(x.threw<sf::cancelled_error>());
    g.async_do(
        "k",
        [this] {
          ++a1_fn_runs;
          return 10;
        },
        a1.on_done());
    g.async_do(
        "k", [] { return 20; }, b2.on_done(), s2.get_token());
    REQUIRE_FALSE(a1.is_done());
    REQUIRE_FALSE(b2.is_done());
    return first;
  }
};

}  // namespace

TEST_CASE(
    "F: a later waiter of the batch whose on_done calls a blocking do_ for the key does not "
    "wait for the deferred flight",
    "[user-code][observer][schedule][reentrant]") {
  group_t g;
  stage s(g);
  auto first = s.setup();
  std::atomic<int> retried{0};
  s.b2.probe = [&] { retried = g.do_("k", [] { return 30; }); };
  parking& pk = parkings[0];
  current_parking.store(&pk, std::memory_order_release);
  sf::detail::test_hook.store(&park_second_returning, std::memory_order_release);
  std::thread resolver([&] { first.second.set_value(1); });
  pk.second_parked.wait("b2 claimed, a1's flight deferred");
  s.s2.request_stop();  // b2's stop callback loses the claim; b2 sees it when it attaches
  pk.second_release.open();
  s.b2.wait("b2's on_done, with its blocking do_, returned");
  resolver.join();
  sf::detail::test_hook.store(nullptr, std::memory_order_release);
  current_parking.store(nullptr, std::memory_order_release);
  CHECK(s.b2.threw<sf::cancelled_error>());
  CHECK(retried != 0);  // 10 if it joined a1's flight, 30 if it led its own
  s.a1.wait("a1 served");
  CHECK(*s.a1.value == 10);
  CHECK(s.a1_fn_runs == 1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE(
    "F: a later waiter of the batch whose on_done calls close() does not wait for the "
    "deferred flight",
    "[user-code][observer][schedule][close][reentrant]") {
  auto g = std::make_unique<group_t>();
  stage s(*g);
  auto first = s.setup();
  std::atomic<bool> closed_inside{false};
  s.b2.probe = [&] {
    g->close();
    closed_inside = true;
  };
  parking& pk = parkings[1];
  current_parking.store(&pk, std::memory_order_release);
  sf::detail::test_hook.store(&park_second_returning, std::memory_order_release);
  std::thread resolver([&] { first.second.set_value(1); });
  pk.second_parked.wait("b2 claimed, a1's flight deferred");
  s.s2.request_stop();
  pk.second_release.open();
  s.b2.wait("b2's on_done, with close() inside, returned");
  resolver.join();
  sf::detail::test_hook.store(nullptr, std::memory_order_release);
  current_parking.store(nullptr, std::memory_order_release);
  CHECK(closed_inside);
  CHECK(s.b2.threw<sf::cancelled_error>());
  s.a1.wait("a1 got an outcome");
  CHECK(s.a1.threw<sf::closed_error>());  // close() settled the deferred flight before it ran
  CHECK(s.a1_fn_runs == 0);
  g.reset();
}
