// A caller's own wait bound (issue "Ecosystem and first-hour experience",
// item 2): do_/do_fresh/try_do/async_do/co_do with a wait_bound wait at most
// until it, independent of options.timeout, and leave exactly as on their
// stop (the ownership policy decides what that does to the work). Each test
// pins one point; times are only ever lower bounds ("not before the bound"),
// every other wait is bounded by name.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
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
using steady = std::chrono::steady_clock;
using group_t = sf::group<std::string, int>;

constexpr auto bound = 60ms;

sf::options owned_by(sf::ownership o) {
  sf::options opts;
  opts.owner = o;
  return opts;
}

// fn that runs until its token is stopped (then returns 1) or `release`.
struct held_fn {
  std::atomic<bool>* started;
  std::atomic<bool>* stopped;
  gate* release;
  int operator()(sf::stop_token st) const {
    *started = true;
    must([&] { return st.stop_requested() || release->is_open(); }, "held fn");
    *stopped = st.stop_requested();
    return 1;
  }
};
}  // namespace

TEST_CASE("a blocked follower's wait_bound ends its wait with timeout_error; the work goes on",
          "[wait_bound]") {
  group_t g;  // ownership::waiters: the inline leader still wants the work
  std::atomic<bool> started{false}, stopped{false};
  gate release;
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", held_fn{&started, &stopped, &release});
  });
  must([&] { return started.load(); }, "fn started");
  const auto t0 = steady::now();
  auto tf = sftest::spawn(follower, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, bound);
  });
  sftest::finish(tf, follower, "the follower's bound");
  CHECK(steady::now() - t0 >= bound);
  CHECK(follower.threw<sf::timeout_error>());
  CHECK_FALSE(stopped.load());  // the leader still waits for the work
  release.open();
  sftest::finish(tl, leader, "leader");
  CHECK(leader.value == std::optional<int>(1));
  const auto s = g.stats();
  CHECK(s.wait_timeouts == 1);
  CHECK(s.joins == 1);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

TEST_CASE("ownership::waiters: the last waiter's wait_bound stops the work, as its stop would",
          "[wait_bound][ownership]") {
  SECTION("an executor leader") {
    sf::options o;
    o.executor = sf::thread_executor{};
    group_t g(o);
    std::atomic<bool> started{false}, stopped{false};
    gate release;  // never opened: only the stop ends fn
    sftest::result<int> leader;
    auto tl = sftest::spawn(leader, [&] {
      return g.do_("k", held_fn{&started, &stopped, &release}, {}, bound);
    });
    sftest::finish(tl, leader, "the leader's bound");
    CHECK(leader.threw<sf::timeout_error>());
    must([&] { return g.in_flight() == 0; }, "the stopped fn returned");
    CHECK(stopped.load());
  }
  SECTION("an inline leader: the timer leaves on its behalf while fn runs") {
    group_t g;  // no options.timeout: the bound starts the timer
    std::atomic<bool> started{false}, stopped{false};
    gate release;
    sftest::result<int> leader;
    const auto t0 = steady::now();
    auto tl = sftest::spawn(leader, [&] {
      return g.do_("k", held_fn{&started, &stopped, &release}, {}, bound);
    });
    sftest::finish(tl, leader, "the leader returned when its stopped fn did");
    CHECK(steady::now() - t0 >= bound);
    CHECK(leader.threw<sf::timeout_error>());
    CHECK(stopped.load());
    CHECK(g.in_flight() == 0);
    CHECK(g.stats().wait_timeouts == 1);
  }
}

TEST_CASE("ownership::leader: the inline leader's wait_bound cancels the flight for its followers",
          "[wait_bound][ownership]") {
  group_t g(owned_by(sf::ownership::leader));
  std::atomic<bool> started{false}, stopped{false};
  gate release;
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", held_fn{&started, &stopped, &release}, {}, bound);
  });
  must([&] { return started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] { return g.do_("k", [] { return -1; }); });
  sftest::finish(tf, follower, "the follower, cancelled at the leader's bound");
  CHECK(follower.threw<sf::cancelled_error>());
  sftest::finish(tl, leader, "leader");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(stopped.load());
}

TEST_CASE("ownership::group: a waiter's wait_bound never stops the work",
          "[wait_bound][ownership]") {
  sf::options o = owned_by(sf::ownership::group);
  o.executor = sf::thread_executor{};
  group_t g(o);
  std::atomic<bool> started{false}, stopped{false};
  gate release;
  sftest::result<int> first;
  auto t1 = sftest::spawn(first, [&] {
    return g.do_("k", held_fn{&started, &stopped, &release}, {}, bound);
  });
  sftest::finish(t1, first, "the only waiter's bound");
  CHECK(first.threw<sf::timeout_error>());
  CHECK_FALSE(stopped.load());
  sftest::result<int> second;
  auto t2 = sftest::spawn(second, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 1; }, "a newcomer joins the same work");
  release.open();
  sftest::finish(t2, second, "newcomer");
  CHECK(second.value == std::optional<int>(1));
}

TEST_CASE("a wait_bound already passed starts and joins nothing", "[wait_bound]") {
  group_t g;
  std::atomic<int> runs{0};
  CHECK_THROWS_AS(g.do_(
                      "k", [&] { return ++runs; }, {}, steady::now() - 1ms),
                  sf::timeout_error);
  const auto o = g.try_do(
      "k", [&] { return ++runs; }, {}, 0ms);
  CHECK(o.status() == sf::status::timeout);
  CHECK(runs == 0);
  const auto s = g.stats();
  CHECK(s.flights == 0);
  CHECK(s.rejections == 2);
  CHECK(s.wait_timeouts == 2);
}

TEST_CASE("a wait_bound is independent of options.timeout, and bounds a wait for a predecessor",
          "[wait_bound][deadline]") {
  sf::options o;
  o.timeout = 10s;  // the flight's own deadline is far away
  group_t g(o);
  std::atomic<bool> started{false}, stopped{false};
  gate release;
  sftest::result<int> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", held_fn{&started, &stopped, &release});
  });
  must([&] { return started.load(); }, "fn started");
  SECTION("a follower") {
    sftest::result<int> follower;
    const auto t0 = steady::now();
    auto tf = sftest::spawn(follower, [&] {
      return g.do_(
          "k", [] { return -1; }, {}, bound);
    });
    sftest::finish(tf, follower, "the follower's bound");
    CHECK(steady::now() - t0 >= bound);
    CHECK(follower.threw<sf::timeout_error>());
  }
  SECTION("a do_fresh caller waiting for the earlier flight's fn") {
    sftest::result<int> fresh;
    const auto t0 = steady::now();
    auto tf = sftest::spawn(fresh, [&] {
      return g.do_fresh(
          "k", [] { return -1; }, {}, bound);
    });
    sftest::finish(tf, fresh, "the fresh caller's bound");
    CHECK(steady::now() - t0 >= bound);
    CHECK(fresh.threw<sf::timeout_error>());
    CHECK(g.stats().wait_timeouts == 1);
  }
  release.open();
  sftest::finish(tl, leader, "leader");
}

TEST_CASE("async_do and co_do with a wait_bound: timeout_error on the delivery thread",
          "[wait_bound][async]") {
  group_t g;
  sftest::completion_box<int> box;
  callback_log<int> holder, bounded;
  g.async_do("k", box.fn(), holder.on_done());  // keeps the flight wanted
  auto item = box.take("fn parked");
  const auto t0 = steady::now();
  SECTION("a callback") {
    g.async_do("k", box.fn(), bounded.on_done(), {}, bound);
    bounded.wait("the callback's bound");
    CHECK(steady::now() - t0 >= bound);
    CHECK(bounded.threw<sf::timeout_error>());
    CHECK(bounded.thread != std::this_thread::get_id());
    CHECK_FALSE(item.first.stop_requested());  // the holder still wants the work
  }
  SECTION("a coroutine") {
    auto t = [](group_t& grp, sftest::completion_box<int>& b) -> sftest::fire_task<int> {
      auto fn = b.fn();
      co_return co_await grp.co_do(std::string("k"), fn, {}, bound);
    }(g, box);
    t.wait("the coroutine's bound");
    CHECK(steady::now() - t0 >= bound);
    CHECK(sftest::holds<sf::timeout_error>(t.get().error));
    CHECK(t.get().finished_on != std::this_thread::get_id());
  }
  CHECK(g.stats().wait_timeouts == 1);
  item.second.set_value(3);
  holder.wait("holder");
  CHECK(*holder.value == 3);
}

TEST_CASE("an async leader's wait_bound, as its only waiter, stops the work",
          "[wait_bound][async]") {
  group_t g;
  sftest::completion_box<int> box;
  callback_log<int> leader;
  g.async_do("k", box.fn(), leader.on_done(), {}, bound);
  auto item = box.take("fn parked");
  leader.wait("the leader's bound");
  CHECK(leader.threw<sf::timeout_error>());
  must([&] { return item.first.stop_requested(); }, "the flight's token stopped");
  CHECK(g.in_flight() == 1);  // the completion is unresolved: the key stays taken
  item.second.set_value(1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("a wait_bound from another clock's time point", "[wait_bound]") {
  group_t g;
  std::atomic<bool> started{false}, stopped{false};
  gate release;
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", held_fn{&started, &stopped, &release});
  });
  must([&] { return started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, std::chrono::system_clock::now() + bound);
  });
  sftest::finish(tf, follower, "the follower's bound");
  CHECK(follower.threw<sf::timeout_error>());
  release.open();
  sftest::finish(tl, leader, "leader");
}
