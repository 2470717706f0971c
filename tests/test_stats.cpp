// Guarantee 14: stats() counters and call_info.
//
// Every call ends as exactly one of started, joined or rejected, so
// calls == flights + joins + rejections once no call is running. call_info
// tells one caller its role (leader / follower / none) and the flight's number.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

void check_identity(const sf::stats& s) { CHECK(s.calls == s.flights + s.joins + s.rejections); }

}  // namespace

TEST_CASE("stats count a scripted scenario", "[stats]") {
  sf::options o;
  o.timeout = 1s;  // only flight "t" lives that long
  o.max_in_flight = 2;
  group_t g{o};

  // "t": a flight that only ends at its deadline.
  std::atomic<bool> t_started{false};
  sftest::result<int> t_leader;
  auto tt = sftest::spawn(t_leader, [&] {
    return g.do_("t", [&](sf::stop_token st) {
      t_started = true;
      sftest::must([&] { return st.stop_requested(); }, "t's deadline");
      return 0;
    });
  });
  sftest::must([&] { return t_started.load(); }, "t started");

  // "x": a leader and two followers, one of which leaves.
  sftest::gate release_x;
  std::atomic<bool> x_started{false};
  sf::stop_source leaving;
  sftest::result<int> x0, x1, x2;
  auto tx0 = sftest::spawn(x0, [&] {
    return g.do_("x", [&] {
      x_started = true;
      release_x.wait("release x");
      return 1;
    });
  });
  sftest::must([&] { return x_started.load(); }, "x started");
  auto tx1 = sftest::spawn(x1, [&] { return g.do_("x", [] { return -1; }); });
  auto tx2 = sftest::spawn(x2, [&] {
    return g.do_(
        "x", [] { return -1; }, leaving.get_token());
  });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined x");
  auto s = g.stats();
  CHECK(s.calls == 4);
  CHECK(s.flights == 2);
  CHECK(s.in_flight == 2);

  // "w": a third key while two flights run.
  CHECK_THROWS_AS(g.do_("w", [] { return 2; }), sf::overloaded_error);
  // A follower leaves on its own token; a caller arrives already stopped.
  leaving.request_stop();
  sftest::finish(tx2, x2, "leaving follower");
  CHECK(x2.threw<sf::cancelled_error>());
  sf::stop_source stopped;
  stopped.request_stop();
  CHECK_THROWS_AS(g.do_(
                      "x", [] { return -1; }, stopped.get_token()),
                  sf::cancelled_error);
  s = g.stats();
  CHECK(s.calls == 6);
  CHECK(s.rejections == 2);
  CHECK(s.overloaded == 1);
  CHECK(s.cancellations == 2);
  CHECK(s.joins == 2);

  release_x.open();
  sftest::finish(tx0, x0, "x leader");
  sftest::finish(tx1, x1, "x follower");
  CHECK(*x0.value == 1);
  CHECK(*x1.value == 1);

  // "y": fn fails.
  CHECK_THROWS_AS(g.do_("y", []() -> int { throw std::runtime_error("origin down"); }),
                  std::runtime_error);

  // "t" reaches its deadline.
  sftest::finish(tt, t_leader, "t times out");
  CHECK(t_leader.threw<sf::timeout_error>());

  g.close();
  CHECK_THROWS_AS(g.do_("z", [] { return 3; }), sf::closed_error);

  s = g.stats();
  CHECK(s.calls == 8);
  CHECK(s.flights == 3);
  CHECK(s.joins == 2);
  CHECK(s.rejections == 3);
  CHECK(s.failures == 1);
  CHECK(s.cancellations == 2);
  CHECK(s.timeouts == 1);
  CHECK(s.overloaded == 1);
  CHECK(s.in_flight == 0);
  check_identity(s);
}

TEST_CASE("calls == flights + joins + rejections after quiescence, under concurrency", "[stats]") {
  group_t g;
  sftest::gate go;
  std::atomic<int> fn_calls{0};
  constexpr int kThreads = 8;
  constexpr int kCallsEach = 200;
  std::atomic<int> done{0};
  {
    sftest::jthread threads[kThreads];
    for (int i = 0; i < kThreads; ++i) {
      threads[i] = sftest::jthread([&, i] {
        go.wait("start");
        for (int j = 0; j < kCallsEach; ++j) {
          (void)g.do_(std::to_string((i + j) % 3), [&] {
            ++fn_calls;
            return j;
          });
        }
        ++done;
      });
    }
    go.open();
  }
  CHECK(done == kThreads);
  const auto s = g.stats();
  CHECK(s.calls == kThreads * kCallsEach);
  CHECK(s.flights == static_cast<unsigned>(fn_calls.load()));
  CHECK(s.rejections == 0);
  CHECK(s.in_flight == 0);
  check_identity(s);
}

TEST_CASE("call_info: role and flight number", "[stats][call_info]") {
  group_t g{sftest::numbered()};

  // A leader without followers is a leader.
  sf::call_info alone;
  CHECK(g.do_(
            "k", [] { return 1; }, {}, alone) == 1);
  CHECK(alone.role == sf::role::leader);
  CHECK(alone.flight == 1);

  // A leader with followers is still a leader (unlike Go's `shared`, which is
  // true for the leader too); followers share its flight number.
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  sf::call_info li, f1i, f2i;
  sftest::result<int> l, f1, f2;
  auto tl = sftest::spawn(l, [&] {
    return g.do_(
        "k",
        [&] {
          fn_started = true;
          release.wait("release fn");
          return 2;
        },
        {}, li);
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto t1 = sftest::spawn(f1, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, f1i);
  });
  auto t2 = sftest::spawn(f2, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, f2i);
  });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");
  release.open();
  sftest::finish(tl, l, "leader");
  sftest::finish(t1, f1, "follower 1");
  sftest::finish(t2, f2, "follower 2");
  CHECK(li.role == sf::role::leader);
  CHECK(f1i.role == sf::role::follower);
  CHECK(f2i.role == sf::role::follower);
  CHECK(li.flight == 2);
  CHECK(f1i.flight == 2);
  CHECK(f2i.flight == 2);

  // Filled on the exception path too.
  sf::call_info failed;
  CHECK_THROWS_AS(g.do_(
                      "other", []() -> int { throw std::runtime_error("x"); }, {}, failed),
                  std::runtime_error);
  CHECK(failed.role == sf::role::leader);
  CHECK(failed.flight == 3);

  // A rejected call is role::none with no flight, whatever the struct held.
  sf::stop_source stopped;
  stopped.request_stop();
  sf::call_info rejected{sf::role::follower, 2};
  CHECK_THROWS_AS(g.do_(
                      "k", [] { return 3; }, stopped.get_token(), rejected),
                  sf::cancelled_error);
  CHECK(rejected.role == sf::role::none);
  CHECK(rejected.flight == 0);

  // do_fresh fills it as well; numbering continues.
  sf::call_info fresh;
  CHECK(g.do_fresh(
            "k", [] { return 4; }, {}, fresh) == 4);
  CHECK(fresh.role == sf::role::leader);
  CHECK(fresh.flight == 4);

  g.close();
  sf::call_info closed{sf::role::leader, 4};
  CHECK_THROWS_AS(g.do_(
                      "k", [] { return 5; }, {}, closed),
                  sf::closed_error);
  CHECK(closed.role == sf::role::none);
  CHECK(closed.flight == 0);
}

TEST_CASE("fn_starts counts fns that ran: a flight stopped while queued is a flight, not a start",
          "[stats]") {
  // Users reconcile fn_starts with their origin's logs: a flight whose task
  // was still queued when its last waiter left never calls fn.
  std::mutex qm;
  std::vector<sf::task> queue;
  sf::options o;
  o.executor = [&](sf::task t) {
    std::lock_guard<std::mutex> lk(qm);
    queue.push_back(std::move(t));
  };
  std::atomic<int> fn_calls{0};
  {
    group_t g{o};
    sf::stop_source leave;
    sftest::result<int> r;
    auto t = sftest::spawn(r, [&] {
      return g.do_(
          "k", [&] { return ++fn_calls; }, leave.get_token());
    });
    sftest::must(
        [&] {
          std::lock_guard<std::mutex> lk(qm);
          return queue.size() == 1;
        },
        "the task is queued");
    leave.request_stop();  // the only waiter leaves: the flight is stopped while queued
    sftest::finish(t, r, "the caller left");
    CHECK(r.threw<sf::cancelled_error>());
    sf::task queued;
    {
      std::lock_guard<std::mutex> lk(qm);
      queued = std::move(queue.front());
      queue.clear();
    }
    queued();  // skips fn: nobody wants the work any more

    // A flight whose fn does run counts in both.
    sftest::result<int> r2;
    auto t2 = sftest::spawn(r2, [&] { return g.do_("k", [&] { return ++fn_calls; }); });
    sftest::must(
        [&] {
          std::lock_guard<std::mutex> lk(qm);
          return queue.size() == 1;
        },
        "the second task is queued");
    {
      std::lock_guard<std::mutex> lk(qm);
      queued = std::move(queue.front());
      queue.clear();
    }
    queued();
    sftest::finish(t2, r2, "the second caller");
    CHECK(r2.value == std::optional<int>(1));

    const sf::stats s = g.stats();
    CHECK(s.flights == 2);
    CHECK(s.fn_starts == 1);
    CHECK(fn_calls.load() == 1);
    check_identity(s);
  }
}

TEST_CASE("fn_starts equals flights for an inline leader", "[stats]") {
  group_t g;
  for (int i = 0; i < 3; ++i) (void)g.do_("k", [] { return 1; });
  const sf::stats s = g.stats();
  CHECK(s.flights == 3);
  CHECK(s.fn_starts == 3);
}
