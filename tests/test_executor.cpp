// Guarantee 6: where fn runs.
//
//  * Without an executor the first caller (the leader) runs fn on its own thread
//    and returns only when fn does.
//  * With options.executor every caller, the first included, is a waiter that can
//    leave at once on its stop_token while fn is still running.
//  * thread_executor runs fn on a thread the group owns; close() joins it.
//  * An executor may drop the task (the flight fails with singleflight::error),
//    throw (the flight fails with that exception) or run it synchronously.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

// Set on a worker thread by touching it; its destructor runs when that thread
// exits, i.e. before any join() of the thread returns.
struct exit_marker {
  std::atomic<bool>* exited = nullptr;
  ~exit_marker() {
    if (exited != nullptr) exited->store(true);
  }
};
thread_local exit_marker tls_exit_marker;

struct executor_full : std::runtime_error {
  executor_full() : std::runtime_error("executor full") {}
};

// The singleflight::error a dropped task fails its flight with; not one of the
// more specific library errors.
bool is_drop_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const sf::cancelled_error&) {
    return false;
  } catch (const sf::closed_error&) {
    return false;
  } catch (const sf::timeout_error&) {
    return false;
  } catch (const sf::overloaded_error&) {
    return false;
  } catch (const sf::error&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

TEST_CASE("without an executor the leader runs fn on its own thread and returns when fn does",
          "[executor][inline]") {
  group_t g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<bool> fn_returned_before_leader{false};
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<std::thread::id> leader_thread{};
  sf::call_info info;

  sftest::result<int> leader;
  auto t = sftest::spawn(leader, [&] {
    leader_thread = std::this_thread::get_id();
    const int v = g.do_(
        "k",
        [&] {
          fn_thread = std::this_thread::get_id();
          fn_started = true;
          release.wait("release fn");
          fn_returned = true;
          return 7;
        },
        {}, info);
    fn_returned_before_leader = fn_returned.load();
    return v;
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  CHECK_FALSE(leader.done.load());
  release.open();
  sftest::finish(t, leader, "leader returns");

  REQUIRE(leader.value);
  CHECK(*leader.value == 7);
  CHECK(info.role == sf::role::leader);
  CHECK(fn_thread.load() == leader_thread.load());
  CHECK(fn_returned_before_leader.load());
  CHECK(g.in_flight() == 0);
}

TEST_CASE("without an executor a leader whose token fires still returns only after fn returns",
          "[executor][inline]") {
  group_t g;
  sftest::gate release;
  sf::stop_source leader_stop;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<bool> fn_returned_before_leader{false};
  std::atomic<bool> flight_token_stopped{false};
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<std::thread::id> leader_thread{};

  sftest::result<int> leader;
  auto t = sftest::spawn(leader, [&] {
    leader_thread = std::this_thread::get_id();
    try {
      return g.do_(
          "k",
          [&](sf::stop_token st) {
            fn_thread = std::this_thread::get_id();
            fn_started = true;
            release.wait("release fn");  // ignores st while blocked
            flight_token_stopped = st.stop_requested();
            fn_returned = true;
            return 7;
          },
          leader_stop.get_token());
    } catch (...) {
      fn_returned_before_leader = fn_returned.load();
      throw;
    }
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  leader_stop.request_stop();  // runs the leader's stop callback on this thread
  // The leader is the thread running fn: it cannot leave while fn is blocked.
  CHECK_FALSE(sftest::becomes([&] { return leader.done.load(); }, 50ms));
  release.open();
  sftest::finish(t, leader, "leader returns");

  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(fn_returned_before_leader.load());
  CHECK(fn_thread.load() == leader_thread.load());
  // ownership::waiters: the only waiter left, so the flight's token was stopped.
  CHECK(flight_token_stopped.load());
  CHECK(g.in_flight() == 0);
}

TEST_CASE("with an executor every caller, the first included, leaves at once on its token",
          "[executor]") {
  group_t g{sf::options{.executor = sf::thread_executor{}}};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<std::thread::id> first_thread{};
  sf::stop_source s0, s1, s2;
  sf::call_info i0, i1, i2;
  auto fn = [&](sf::stop_token) {  // ignores its token: blocked until the test opens
    fn_thread = std::this_thread::get_id();
    fn_started = true;
    release.wait("release fn");
    fn_returned = true;
    return 1;
  };

  sftest::result<int> r0, r1, r2;
  auto t0 = sftest::spawn(r0, [&] {
    first_thread = std::this_thread::get_id();
    return g.do_("k", fn, s0.get_token(), i0);
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto t1 = sftest::spawn(r1, [&] { return g.do_("k", fn, s1.get_token(), i1); });
  auto t2 = sftest::spawn(r2, [&] { return g.do_("k", fn, s2.get_token(), i2); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");

  s0.request_stop();
  sftest::finish(t0, r0, "first caller leaves while fn is blocked");
  CHECK_FALSE(fn_returned.load());
  CHECK(r0.threw<sf::cancelled_error>());
  CHECK(i0.role == sf::role::leader);

  s1.request_stop();
  s2.request_stop();
  sftest::finish(t1, r1, "follower 1 leaves while fn is blocked");
  sftest::finish(t2, r2, "follower 2 leaves while fn is blocked");
  CHECK_FALSE(fn_returned.load());
  CHECK(r1.threw<sf::cancelled_error>());
  CHECK(r2.threw<sf::cancelled_error>());
  CHECK(i1.role == sf::role::follower);

  CHECK(fn_thread.load() != first_thread.load());
  CHECK(g.in_flight() == 1);  // the fn has not returned: its entry stays
  release.open();
  sftest::must([&] { return g.in_flight() == 0; }, "entry removed once fn returns");
  CHECK(fn_returned.load());
}

TEST_CASE("thread_executor runs fn on another thread and close() joins it", "[executor][close]") {
  group_t g{sf::options{.executor = sf::thread_executor{}}};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_saw_stop{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<bool> worker_exited{false};
  std::atomic<bool> close_returned{false};
  std::atomic<bool> close_returned_early{false};
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<std::thread::id> caller_thread{};

  sftest::result<int> caller;
  auto tc = sftest::spawn(caller, [&] {
    caller_thread = std::this_thread::get_id();
    return g.do_("k", [&](sf::stop_token st) {
      tls_exit_marker.exited = &worker_exited;
      fn_thread = std::this_thread::get_id();
      fn_started = true;
      sftest::must([&] { return st.stop_requested(); }, "close() stops the flight's token");
      fn_saw_stop = true;
      release.wait("release fn after its stop");
      fn_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");

  // Opens the gate only after checking that close() is still waiting for fn.
  sftest::jthread opener([&] {
    sftest::must([&] { return fn_saw_stop.load(); }, "fn saw its token stopped");
    close_returned_early = sftest::becomes([&] { return close_returned.load(); }, 50ms);
    release.open();
  });
  g.close();
  const bool fn_done_at_close = fn_returned.load();
  const bool worker_exited_at_close = worker_exited.load();
  close_returned = true;
  opener.join();
  sftest::finish(tc, caller, "caller returns");

  CHECK(fn_thread.load() != caller_thread.load());
  CHECK_FALSE(close_returned_early.load());
  CHECK(fn_done_at_close);
  CHECK(worker_exited_at_close);  // joined, not merely finished
  CHECK(caller.threw<sf::closed_error>());
}

TEST_CASE("an executor that drops the task inside the call fails the flight for every waiter",
          "[executor][drop]") {
  group_t* gp = nullptr;
  std::atomic<bool> drop{true};
  std::atomic<int> fn_calls{0};
  group_t g{sf::options{.executor = [&](sf::task t) {
    if (drop) {
      // Let two followers join while the submission is in progress, then drop.
      sftest::must([&] { return gp->stats().joins == 2; }, "two followers joined");
      return;  // t is destroyed unrun
    }
    t();
  }}};
  gp = &g;
  auto fn = [&] {
    ++fn_calls;
    return 1;
  };

  sftest::result<int> r0, r1, r2;
  auto t0 = sftest::spawn(r0, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().flights == 1; }, "leader started the flight");
  auto t1 = sftest::spawn(r1, [&] { return g.do_("k", fn); });
  auto t2 = sftest::spawn(r2, [&] { return g.do_("k", fn); });
  sftest::finish(t0, r0, "leader fails");
  sftest::finish(t1, r1, "follower 1 fails");
  sftest::finish(t2, r2, "follower 2 fails");

  CHECK(is_drop_error(r0.error));
  CHECK(is_drop_error(r1.error));
  CHECK(is_drop_error(r2.error));
  CHECK(r0.error == r1.error);  // one exception object for all
  CHECK(r0.error == r2.error);
  CHECK(fn_calls == 0);
  CHECK(g.in_flight() == 0);
  CHECK(g.stats().failures == 1);

  drop = false;
  CHECK(g.do_("k", fn) == 1);  // the group is healthy afterwards
  CHECK(g.close_for(sftest::bound));
}

TEST_CASE("an executor that drops a queued task later fails the flight for every waiter",
          "[executor][drop]") {
  std::mutex m;
  std::optional<sf::task> queued;
  group_t g{sf::options{.executor = [&](sf::task t) {
    std::lock_guard<std::mutex> lk(m);
    queued.emplace(std::move(t));
  }}};
  std::atomic<int> fn_calls{0};
  auto fn = [&] {
    ++fn_calls;
    return 1;
  };

  sftest::result<int> r0, r1, r2;
  auto t0 = sftest::spawn(r0, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().flights == 1; }, "leader started the flight");
  auto t1 = sftest::spawn(r1, [&] { return g.do_("k", fn); });
  auto t2 = sftest::spawn(r2, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");
  sftest::must(
      [&] {
        std::lock_guard<std::mutex> lk(m);
        return queued.has_value();
      },
      "task queued");
  CHECK_FALSE(r0.done.load());
  {
    std::lock_guard<std::mutex> lk(m);
    queued.reset();  // destroyed unrun, on this thread, after the submission returned
  }
  sftest::finish(t0, r0, "leader fails");
  sftest::finish(t1, r1, "follower 1 fails");
  sftest::finish(t2, r2, "follower 2 fails");

  CHECK(is_drop_error(r0.error));
  CHECK(is_drop_error(r1.error));
  CHECK(is_drop_error(r2.error));
  CHECK(r0.error == r1.error);
  CHECK(r0.error == r2.error);
  CHECK(fn_calls == 0);
  CHECK(g.in_flight() == 0);
  CHECK(g.stats().failures == 1);
  CHECK(g.close_for(sftest::bound));  // a dropped task is not waited for
}

TEST_CASE("an executor that throws fails the flight with that exception for every waiter",
          "[executor][throw]") {
  group_t* gp = nullptr;
  std::atomic<bool> refuse{true};
  std::atomic<int> fn_calls{0};
  group_t g{sf::options{.executor = [&](sf::task t) {
    if (refuse) {
      sftest::must([&] { return gp->stats().joins == 2; }, "two followers joined");
      throw executor_full();  // t is destroyed unrun during unwinding
    }
    t();
  }}};
  gp = &g;
  auto fn = [&] {
    ++fn_calls;
    return 1;
  };

  sftest::result<int> r0, r1, r2;
  auto t0 = sftest::spawn(r0, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().flights == 1; }, "leader started the flight");
  auto t1 = sftest::spawn(r1, [&] { return g.do_("k", fn); });
  auto t2 = sftest::spawn(r2, [&] { return g.do_("k", fn); });
  sftest::finish(t0, r0, "leader fails");
  sftest::finish(t1, r1, "follower 1 fails");
  sftest::finish(t2, r2, "follower 2 fails");

  CHECK(r0.threw<executor_full>());
  CHECK(r1.threw<executor_full>());
  CHECK(r2.threw<executor_full>());
  CHECK(r0.error == r1.error);
  CHECK(r0.error == r2.error);
  CHECK(fn_calls == 0);
  CHECK(g.in_flight() == 0);
  CHECK(g.stats().failures == 1);

  refuse = false;
  CHECK(g.do_("k", fn) == 1);
  CHECK(g.close_for(sftest::bound));  // no user count leaked by the failed submission
}

TEST_CASE("an executor that runs the task synchronously inside the call works",
          "[executor][sync]") {
  group_t g{sf::options{.executor = [](sf::task t) { t(); }}};
  std::atomic<std::thread::id> fn_thread{};
  sf::call_info info;

  CHECK(g.do_(
            "k",
            [&] {
              fn_thread = std::this_thread::get_id();
              return 5;
            },
            {}, info) == 5);
  CHECK(fn_thread.load() == std::this_thread::get_id());
  CHECK(info.role == sf::role::leader);
  CHECK(g.in_flight() == 0);

  CHECK_THROWS_AS(g.do_("k", []() -> int { throw std::out_of_range("origin"); }),
                  std::out_of_range);
  CHECK(g.in_flight() == 0);

  // A second flight after the first, and the token variant of fn.
  CHECK(g.do_("k", [](sf::stop_token st) { return st.stop_requested() ? -1 : 6; }) == 6);
  const auto s = g.stats();
  CHECK(s.flights == 3);
  CHECK(s.failures == 1);
  CHECK(g.close_for(sftest::bound));
}

// Schedule: the executor hands the task to a thread, which starts running fn;
// then the executor call itself throws (say, its bookkeeping after the handoff
// failed). The group must not treat a task that is running as one that will
// never run: the fn is still running, so its entry must stay (guarantee 1: no
// second fn for the key starts) and close() must still drain.
TEST_CASE("executor_throwing_after_handoff_keeps_one_fn_per_key", "[executor][throw][bug]") {
  std::mutex m;
  std::vector<std::unique_ptr<sftest::thread>> workers;
  std::atomic<bool> fail_after_handoff{true};
  std::atomic<bool> fn1_started{false};
  std::atomic<bool> fn1_returned{false};
  std::atomic<bool> fn2_started{false};
  std::atomic<bool> fn2_overlapped{false};
  sftest::gate release1;

  auto* g = new group_t{sf::options{.executor = [&](sf::task t) {
    {
      std::lock_guard<std::mutex> lk(m);
      workers.push_back(std::make_unique<sftest::thread>([tk = std::move(t)]() mutable { tk(); }));
    }
    if (fail_after_handoff.exchange(false)) {
      sftest::must([&] { return fn1_started.load(); }, "fn 1 running on the worker");
      throw executor_full();
    }
  }}};

  sftest::result<int> r1, r2;
  auto t1 = sftest::spawn(r1, [&] {
    return g->do_("k", [&] {
      fn1_started = true;
      release1.wait("release fn 1");
      fn1_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn1_started.load(); }, "fn 1 started");
  // The flight fails with the executor's exception (docs/group.md: "An executor
  // that throws after keeping the task fails the flight with that
  // exception"), so the first caller returns with it while fn 1 still runs.
  sftest::finish(t1, r1, "first caller got the executor's exception");
  CHECK(r1.threw<executor_full>());
  CHECK_FALSE(fn1_returned.load());
  // fn 1 is still running, so its entry stays and a newcomer must wait for
  // it rather than start fn 2 beside it.
  auto t2 = sftest::spawn(r2, [&] {
    return g->do_("k", [&] {
      fn2_overlapped = !fn1_returned.load();
      fn2_started = true;
      return 2;
    });
  });
  sftest::must([&] { return g->stats().calls == 2; }, "newcomer arrived");
  const bool second_fn_started_early = sftest::becomes([&] { return fn2_started.load(); }, 200ms);
  const std::size_t in_flight_while_fn1_runs = g->in_flight();
  release1.open();
  sftest::finish(t2, r2, "newcomer returns");
  sftest::must([&] { return fn1_returned.load(); }, "fn 1 returned");
  {
    std::lock_guard<std::mutex> lk(m);
    for (auto& w : workers) w->join("the executor's thread returned");
  }
  const bool drained = g->close_for(sftest::bound);

  CHECK_FALSE(second_fn_started_early);
  CHECK_FALSE(fn2_overlapped.load());
  CHECK(in_flight_while_fn1_runs == 1);
  CHECK(drained);
  if (drained) {
    delete g;
  }
  // else: the group's user count is corrupt and its destructor would wait
  // forever; leak it so the test fails instead of hanging.
}
