// Guarantee 9: forget(key) removes the entry: the next caller starts a new
// flight even while the old fn runs; callers already waiting keep the old
// flight; the old flight's completion never evicts the new entry.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

}  // namespace

// golang/go#31420: a forgotten flight's cleanup deleted the map entry by key,
// evicting the newer flight for the same key, so a third caller started a
// third execution instead of joining the second.
TEST_CASE("late_cleanup_does_not_evict_newer_flight", "[forget][regression]") {
  group_t g{sftest::numbered()};
  sftest::gate release1, release2;
  std::atomic<int> fn_calls{0};
  std::atomic<bool> fn1_started{false}, fn2_started{false};
  std::atomic<bool> fn1_returned{false};

  sf::call_info i_old_leader, i_old_follower, i_new_leader, i_new_follower;
  sftest::result<int> old_leader, old_follower, new_leader, new_follower;
  auto t1 = sftest::spawn(old_leader, [&] {
    return g.do_(
        "k",
        [&] {
          ++fn_calls;
          fn1_started = true;
          release1.wait("release old fn");
          fn1_returned = true;
          return 1;
        },
        {}, i_old_leader);
  });
  sftest::must([&] { return fn1_started.load(); }, "old fn started");
  auto t2 = sftest::spawn(old_follower, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, i_old_follower);
  });
  sftest::must([&] { return g.stats().joins == 1; }, "old follower joined");

  CHECK(g.forget("k"));
  CHECK(g.in_flight() == 0);
  auto t3 = sftest::spawn(new_leader, [&] {
    return g.do_(
        "k",
        [&] {
          ++fn_calls;
          fn2_started = true;
          release2.wait("release new fn");
          return 2;
        },
        {}, i_new_leader);
  });
  sftest::must([&] { return fn2_started.load(); }, "new fn started beside the old one");
  CHECK_FALSE(fn1_returned.load());
  CHECK(fn_calls == 2);

  // The old flight completes: its waiters get the old value...
  release1.open();
  sftest::finish(t1, old_leader, "old leader");
  sftest::finish(t2, old_follower, "old follower");
  REQUIRE(old_leader.value);
  REQUIRE(old_follower.value);
  CHECK(*old_leader.value == 1);
  CHECK(*old_follower.value == 1);
  // ...and its cleanup leaves the newer entry alone.
  CHECK(g.in_flight() == 1);
  auto t4 = sftest::spawn(new_follower, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, i_new_follower);
  });
  sftest::must([&] { return g.stats().joins == 2; }, "third caller joined the new flight");
  CHECK(g.stats().flights == 2);

  release2.open();
  sftest::finish(t3, new_leader, "new leader");
  sftest::finish(t4, new_follower, "new follower");
  REQUIRE(new_leader.value);
  REQUIRE(new_follower.value);
  CHECK(*new_leader.value == 2);
  CHECK(*new_follower.value == 2);
  CHECK(fn_calls == 2);
  CHECK(g.stats().flights == 2);
  CHECK(g.in_flight() == 0);

  CHECK(i_old_leader.flight == 1);
  CHECK(i_old_follower.flight == 1);
  CHECK(i_new_leader.flight == 2);
  CHECK(i_new_follower.flight == 2);
  CHECK(i_new_follower.role == sf::role::follower);
}

TEST_CASE("forget() of an absent key returns false", "[forget]") {
  group_t g;
  CHECK_FALSE(g.forget("nothing"));
  CHECK(g.do_("k", [] { return 1; }) == 1);
  CHECK_FALSE(g.forget("k"));  // settled flights are gone already
  CHECK(g.in_flight() == 0);
}

TEST_CASE("forget() of one key leaves the other keys' flights joinable", "[forget]") {
  group_t g;
  sftest::gate release;
  std::atomic<int> started{0};
  auto blocked = [&](int v) {
    return [&, v] {
      ++started;
      release.wait("release fns");
      return v;
    };
  };
  sftest::result<int> a, b, b2;
  auto ta = sftest::spawn(a, [&] { return g.do_("a", blocked(1)); });
  auto tb = sftest::spawn(b, [&] { return g.do_("b", blocked(2)); });
  sftest::must([&] { return started == 2; }, "both fns started");
  CHECK(g.forget("a"));
  CHECK_FALSE(g.forget("a"));
  CHECK(g.in_flight() == 1);
  auto tb2 = sftest::spawn(b2, [&] { return g.do_("b", [] { return -1; }); });
  sftest::must([&] { return g.stats().joins == 1; }, "b is still joinable");
  release.open();
  sftest::finish(ta, a, "a");
  sftest::finish(tb, b, "b");
  sftest::finish(tb2, b2, "b2");
  CHECK(*a.value == 1);
  CHECK(*b.value == 2);
  CHECK(*b2.value == 2);
}

// A newcomer waiting for a stopped fn to wind down (no-overlap rule) is let go
// by forget(), which lifts that rule: it starts a new flight at once.
TEST_CASE("forget() releases a newcomer waiting for a winding-down fn", "[forget][deadline]") {
  sf::options o;
  o.timeout = 300ms;
  group_t g{o};
  sftest::gate release;
  std::atomic<bool> fn1_started{false}, fn1_returned{false};
  std::atomic<bool> fn2_overlapped{false};

  sftest::result<int> leader, newcomer;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      fn1_started = true;
      release.wait("release the timed-out fn");
      fn1_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn1_started.load(); }, "fn started");
  sftest::must([&] { return g.stats().timeouts == 1; }, "flight timed out", 10s);
  auto tn = sftest::spawn(newcomer, [&] {
    return g.do_("k", [&] {
      fn2_overlapped = !fn1_returned.load();
      return 2;
    });
  });
  sftest::must([&] { return g.stats().calls == 2; }, "newcomer waiting");
  CHECK(g.stats().flights == 1);
  CHECK(g.forget("k"));
  sftest::finish(tn, newcomer, "newcomer starts its own flight after forget()");
  REQUIRE(newcomer.value);
  CHECK(*newcomer.value == 2);
  CHECK(fn2_overlapped.load());  // forget() is the one way to overlap
  CHECK(g.stats().flights == 2);
  release.open();
  sftest::finish(tl, leader, "leader");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(g.in_flight() == 0);
}
