// try_do: do_ without a throw for the call's outcome (issue "Ecosystem and
// first-hour experience", item 3), and the caller's role and flight number
// for async callers (item 7): outcome<T>::status() and info(), and
// co_do(..., call_info&).
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::callback_log;
using sftest::gate;
using sftest::must;
using group_t = sf::group<std::string, int>;

// Runs f and reports whether it threw anything at all.
template <class F>
bool throws(F f) {
  try {
    (void)f();
    return false;
  } catch (...) {
    return true;
  }
}
}  // namespace

TEST_CASE("try_do returns the value with status value and the leader's call_info", "[try_do]") {
  group_t g;
  const sf::outcome<int> o = g.try_do("k", [] { return 7; });
  REQUIRE(o.has_value());
  CHECK(o.value() == 7);
  CHECK(o.status() == sf::status::value);
  CHECK(o.error() == nullptr);
  CHECK(o.info().role == sf::role::leader);
  CHECK(o.info().flight != 0);
}

TEST_CASE("try_do delivers fn's exception as status failed, the same object for every caller",
          "[try_do]") {
  group_t g;
  gate release;
  std::atomic<bool> started{false};
  sftest::result<sf::outcome<int>> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g.try_do("k", [&]() -> int {
      started = true;
      release.wait("fn held");
      throw std::runtime_error("origin down");
    });
  });
  must([&] { return started.load(); }, "fn started");
  sftest::result<sf::outcome<int>> follower;
  auto tf = sftest::spawn(follower, [&] { return g.try_do("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 1; }, "follower joined");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(tf, follower, "follower");
  REQUIRE(leader.value);
  REQUIRE(follower.value);
  CHECK(leader.error == nullptr);  // nothing was thrown to either caller
  CHECK(follower.error == nullptr);
  CHECK(leader.value->status() == sf::status::failed);
  CHECK(follower.value->status() == sf::status::failed);
  CHECK(sftest::address_of<std::runtime_error>(leader.value->error()) ==
        sftest::address_of<std::runtime_error>(follower.value->error()));
  CHECK(leader.value->info().role == sf::role::leader);
  CHECK(follower.value->info().role == sf::role::follower);
  CHECK(follower.value->info().flight == leader.value->info().flight);
}

TEST_CASE("try_do reports cancelled, closed, overloaded and timeout as statuses without a throw",
          "[try_do]") {
  SECTION("cancelled: the caller's token already stopped") {
    group_t g;
    sf::stop_source s;
    s.request_stop();
    std::atomic<int> runs{0};
    sf::outcome<int> o(std::in_place, 0);
    CHECK_FALSE(throws([&] {
      return o = g.try_do(
                 "k", [&] { return ++runs; }, s.get_token());
    }));
    CHECK(o.status() == sf::status::cancelled);
    CHECK(sftest::holds<sf::cancelled_error>(o.error()));
    CHECK(o.info().role == sf::role::none);
    CHECK(runs == 0);
    CHECK(g.stats().cancellations == 1);
  }
  SECTION("cancelled: the caller's token fires while it waits") {
    group_t g;
    gate release;
    std::atomic<bool> started{false};
    sftest::result<int> leader;
    auto tl = sftest::spawn(leader, [&] {
      return g.do_("k", [&] {
        started = true;
        release.wait("fn held");
        return 1;
      });
    });
    must([&] { return started.load(); }, "fn started");
    sf::stop_source s;
    sftest::result<sf::outcome<int>> follower;
    auto tf = sftest::spawn(follower, [&] {
      return g.try_do(
          "k", [] { return -1; }, s.get_token());
    });
    must([&] { return g.stats().joins == 1; }, "follower joined");
    s.request_stop();
    sftest::finish(tf, follower, "follower left");
    REQUIRE(follower.value);
    CHECK(follower.error == nullptr);
    CHECK(follower.value->status() == sf::status::cancelled);
    CHECK(follower.value->info().role == sf::role::follower);
    release.open();
    sftest::finish(tl, leader, "leader");
  }
  SECTION("closed") {
    group_t g;
    g.close();
    const auto o = g.try_do("k", [] { return 1; });
    CHECK(o.status() == sf::status::closed);
    CHECK(sftest::holds<sf::closed_error>(o.error()));
  }
  SECTION("overloaded") {
    sf::options opts;
    opts.max_in_flight = 1;
    group_t g(opts);
    gate release;
    std::atomic<bool> started{false};
    sftest::result<int> holder;
    auto th = sftest::spawn(holder, [&] {
      return g.do_("a", [&] {
        started = true;
        release.wait("fn held");
        return 1;
      });
    });
    must([&] { return started.load(); }, "the cap is reached");
    const auto o = g.try_do("b", [] { return 2; });
    CHECK(o.status() == sf::status::overloaded);
    CHECK(sftest::holds<sf::overloaded_error>(o.error()));
    release.open();
    sftest::finish(th, holder, "holder");
  }
  SECTION("timeout: the flight's deadline") {
    // The follower must join before the deadline: one second leaves a loaded machine's thread
    // start ample room (at 50 ms a busy tsan build beside it made the follower arrive after the
    // flight had settled, and lead a flight of its own).
    sf::options opts;
    opts.timeout = 1s;
    group_t g(opts);
    std::atomic<bool> started{false};
    sftest::result<sf::outcome<int>> follower;
    sftest::result<int> leader;
    auto tl = sftest::spawn(leader, [&] {
      return g.do_("k", [&](sf::stop_token st) {
        started = true;
        must([&] { return st.stop_requested(); }, "the deadline stops fn");
        return 1;
      });
    });
    must([&] { return started.load(); }, "fn started");
    auto tf = sftest::spawn(follower, [&] { return g.try_do("k", [] { return -1; }); });
    sftest::finish(tf, follower, "follower got the deadline");
    REQUIRE(follower.value);
    CHECK(follower.value->status() == sf::status::timeout);
    CHECK(sftest::holds<sf::timeout_error>(follower.value->error()));
    sftest::finish(tl, leader, "leader");
  }
}

TEST_CASE("try_do still throws for a programming error: fn calling it for its own key",
          "[try_do][self-deadlock]") {
  group_t g;
  bool logic = false;
  (void)g.try_do("k", [&] {
    try {
      (void)g.try_do("k", [] { return 1; });
    } catch (const std::logic_error&) {
      logic = true;
    }
    return 0;
  });
  CHECK(logic);
}

TEST_CASE("try_do_fresh is do_fresh without a throw", "[try_do]") {
  group_t g(sftest::numbered());
  gate release;
  std::atomic<bool> started{false};
  sftest::result<int> old;
  auto to = sftest::spawn(old, [&] {
    return g.do_("k", [&] {
      started = true;
      release.wait("old fn held");
      return 1;
    });
  });
  must([&] { return started.load(); }, "old flight started");
  sftest::result<sf::outcome<int>> fresh;
  auto tf = sftest::spawn(fresh, [&] { return g.try_do_fresh("k", [] { return 2; }); });
  must([&] { return g.stats().calls == 2; }, "fresh caller arrived");
  release.open();
  sftest::finish(to, old, "old leader");
  sftest::finish(tf, fresh, "fresh caller");
  REQUIRE(fresh.value);
  CHECK(fresh.value->value() == 2);  // not the flight that started before it arrived
  CHECK(fresh.value->info().role == sf::role::leader);
  CHECK(fresh.value->info().flight == 2);
}

TEST_CASE("async_do's outcome tells each caller its role and the flight number",
          "[try_do][async]") {
  group_t g;
  sftest::completion_box<int> box;
  callback_log<int> lead_log, follow_log, rejected_log;
  sf::call_info lead_info, follow_info, rejected_info{sf::role::leader, 99};
  auto capture = [](callback_log<int>& log, sf::call_info& info) {
    return [&log, &info](sf::outcome<int> o) {
      info = o.info();
      log.record(std::move(o));
    };
  };
  g.async_do("k", box.fn(), capture(lead_log, lead_info));
  g.async_do("k", box.fn(), capture(follow_log, follow_info));
  sf::stop_source stopped;
  stopped.request_stop();
  g.async_do("k", box.fn(), capture(rejected_log, rejected_info), stopped.get_token());
  box.take("fn parked").second.set_value(3);
  lead_log.wait("leader");
  follow_log.wait("follower");
  rejected_log.wait("rejected");
  CHECK(lead_info.role == sf::role::leader);
  CHECK(follow_info.role == sf::role::follower);
  CHECK(follow_info.flight == lead_info.flight);
  CHECK(lead_info.flight != 0);
  CHECK(rejected_info.role == sf::role::none);
  CHECK(rejected_info.flight == 0);
}

namespace {
sftest::fire_task<int> co_with_info(group_t& g, sftest::completion_box<int>& box,
                                    sf::call_info& info) {
  auto fn = box.fn();
  co_return co_await g.co_do(std::string("k"), fn, {}, info);
}
}  // namespace

TEST_CASE("co_do with call_info reports the role and flight number", "[try_do][coro]") {
  group_t g;
  sftest::completion_box<int> box;
  sf::call_info a{}, b{};
  auto ta = co_with_info(g, box, a);
  auto tb = co_with_info(g, box, b);
  box.take("fn parked").second.set_value(5);
  ta.wait("a");
  tb.wait("b");
  CHECK(*ta.get().value == 5);
  CHECK(a.role == sf::role::leader);
  CHECK(b.role == sf::role::follower);
  CHECK(a.flight == b.flight);
}
