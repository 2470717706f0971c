// Where user code runs (issue "Where user code runs"): one rule, and the
// defects a review found against it. Each TEST_CASE is named after the defect
// it pins (C, E, A, B, D, G, J, K, I; F is in test_user_code_schedules.cpp, H in
// tests/modules/) and failed on the code before the fix (a hang aborts with
// the name of the bounded wait; a terminate or a wrong exception fails).
//
// The rule (group.hpp, docs/async.md "Re-entrancy"):
//   * every flight a step settles has its token stopped before any waiter of
//     that step is notified;
//   * callbacks and resumptions never run on the group's timer thread;
//   * a thread about to block inside the group (do_, close()) first runs what
//     it itself deferred;
//   * close() (and ~group) on a thread the group owns never joins that thread.
#include <singleflight/singleflight.hpp>

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::callback_log;
using sftest::completion_box;
using sftest::gate;
using sftest::must;
using group_t = sf::group<std::string, int>;

sf::options with_timeout(std::chrono::nanoseconds d) {
  sf::options o;
  o.timeout = d;
  return o;
}

// fn that runs until its token is stopped, then returns `v`.
auto until_stopped(std::atomic<bool>& started, int v = 1) {
  return [&started, v](sf::stop_token st) {
    started = true;
    must([&] { return st.stop_requested(); }, "fn waits for its token");
    return v;
  };
}

}  // namespace

// ---- C: stop first, then notify ---------------------------------------------

TEST_CASE("C1: close() from on_done while an outer close() delivers closed_error does not hang",
          "[user-code][close][reentrant]") {
  // Before the fix the outer close() notified the waiters (running this
  // on_done, which calls close() and waits for fn) before it stopped fn's
  // token: fn never returned.
  auto g = std::make_unique<group_t>();
  std::atomic<bool> started{false};
  callback_log<int> leader, joiner;
  std::atomic<bool> inner_returned{false};
  joiner.probe = [&] {
    g->close();
    inner_returned = true;
  };
  // The leader runs its sync fn inline, on this thread.
  sftest::jthread lead([&] { g->async_do("k", until_stopped(started), leader.on_done()); });
  must([&] { return started.load(); }, "fn started");
  g->async_do("k", until_stopped(started), joiner.on_done());
  REQUIRE(g->stats().joins == 1);
  std::atomic<bool> outer_returned{false};
  sftest::jthread closer([&] {
    g->close();
    outer_returned = true;
  });
  must([&] { return inner_returned.load(); }, "close() inside on_done returned");
  must([&] { return outer_returned.load(); }, "outer close() returned");
  closer.join();
  lead.join();
  joiner.wait("the joiner's on_done recorded its outcome");
  CHECK(joiner.threw<sf::closed_error>());
  CHECK(leader.threw<sf::closed_error>());
  CHECK(g->in_flight() == 0);
}

TEST_CASE("C2: close() from on_done delivered by a deadline does not hang",
          "[user-code][close][deadline][reentrant]") {
  auto g = std::make_unique<group_t>(with_timeout(100ms));
  std::atomic<bool> started{false};
  callback_log<int> leader, joiner;
  std::atomic<bool> inner_returned{false};
  joiner.probe = [&] {
    g->close();
    inner_returned = true;
  };
  sftest::jthread lead([&] { g->async_do("k", until_stopped(started), leader.on_done()); });
  must([&] { return started.load(); }, "fn started");
  g->async_do("k", until_stopped(started), joiner.on_done());
  must([&] { return inner_returned.load(); }, "close() inside the deadline's on_done returned");
  joiner.wait("the joiner's on_done recorded its outcome");
  lead.join();
  CHECK(joiner.threw<sf::timeout_error>());
  CHECK(leader.threw<sf::timeout_error>());
  g.reset();
}

TEST_CASE(
    "C3: ownership::leader: a follower whose on_done retries with a blocking do_ after "
    "cancelled_error gets the new flight's value",
    "[user-code][ownership][reentrant]") {
  // Before the fix the leader's stop notified the follower (whose retry waits
  // for the stopped fn to return) before it stopped fn's token.
  sf::options o;
  o.owner = sf::ownership::leader;
  group_t g(o);
  std::atomic<bool> started{false};
  sf::stop_source leader_stop;
  sftest::result<int> leader;
  auto tl = sftest::spawn(
      leader, [&] { return g.do_("k", until_stopped(started), leader_stop.get_token()); });
  must([&] { return started.load(); }, "fn started");
  callback_log<int> follower;
  std::atomic<int> retried{0};
  std::exception_ptr first_outcome;
  follower.probe = [&] { retried = g.do_("k", [] { return 2; }); };
  g.async_do("k", until_stopped(started), follower.on_done());
  REQUIRE(g.stats().joins == 1);
  sftest::jthread stopper([&] { leader_stop.request_stop(); });
  follower.wait("the follower's on_done (with its retry) returned");
  stopper.join();
  sftest::finish(tl, leader, "leader");
  CHECK(follower.threw<sf::cancelled_error>());
  CHECK(retried == 2);
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(g.in_flight() == 0);
}

// ---- E: nothing of the user's runs on the timer thread ----------------------

TEST_CASE(
    "E: a deadline's on_done that blocks does not park the timer: other flights' deadlines "
    "still fire",
    "[user-code][deadline]") {
  group_t g(with_timeout(100ms));
  // Flight "a": its only waiter is a callback that blocks until released.
  std::atomic<bool> a_started{false};
  std::atomic<std::thread::id> timer_thread{};
  gate release_a;
  callback_log<int> a_waiter;
  a_waiter.probe = [&] { release_a.wait("a's on_done held"); };
  completion_box<int> box;
  g.async_do(
      "a",
      [&](sf::stop_token st, sf::completion<int> c) {
        a_started = true;
        box.put(st, std::move(c));
      },
      a_waiter.on_done());
  must([&] { return a_started.load(); }, "a started");
  auto a_item = box.take("a's completion");
  // The thread that stops a's token at the deadline is the timer thread.
  auto note_timer = [&] { timer_thread = std::this_thread::get_id(); };
  sf::stop_callback<decltype(note_timer)> cb(a_item.first, note_timer);
  must([&] { return timer_thread.load() != std::thread::id{}; }, "a's deadline fired");

  // Flight "b" starts after a's deadline fired, so its deadline comes later;
  // a blocked follower of b must get timeout_error while a's on_done blocks.
  std::atomic<bool> b_started{false};
  sftest::result<int> b_leader, b_follower;
  auto tb = sftest::spawn(b_leader, [&] { return g.do_("b", until_stopped(b_started)); });
  must([&] { return b_started.load(); }, "b started");
  auto tf = sftest::spawn(b_follower, [&] { return g.do_("b", [] { return -1; }); });
  sftest::finish(tf, b_follower, "b's follower got its deadline while a's on_done blocks");
  CHECK(b_follower.threw<sf::timeout_error>());
  CHECK_FALSE(a_waiter.is_done());
  release_a.open();
  a_waiter.wait("a's on_done returned");
  CHECK(a_waiter.threw<sf::timeout_error>());
  CHECK(a_waiter.thread != timer_thread.load());
  sftest::finish(tb, b_leader, "b's leader");
  CHECK(b_leader.threw<sf::timeout_error>());
  a_item.second.set_value(1);
}

// ---- A: close() and ~group on a thread the group owns ------------------------

TEST_CASE("A: close() from on_done on a thread_executor worker does not join itself",
          "[user-code][executor][close][reentrant]") {
  sf::options o;
  o.executor = sf::thread_executor{};
  auto g = std::make_unique<group_t>(o);
  callback_log<int> waiter;
  std::atomic<bool> closed_inside{false};
  waiter.probe = [&] {
    g->close();  // on the worker that ran fn
    closed_inside = true;
  };
  g->async_do(
      "k", [] { return 1; }, waiter.on_done());
  waiter.wait("on_done on the worker");
  CHECK(closed_inside);
  CHECK(*waiter.value == 1);
  CHECK(waiter.thread != std::this_thread::get_id());
  g.reset();  // joins the worker from here
}

TEST_CASE("A: the last shared_ptr to the group released inside on_done on a thread_executor worker",
          "[user-code][executor][destroy][reentrant]") {
  sf::options o;
  o.executor = sf::thread_executor{};
  auto g = std::make_shared<group_t>(o);
  gate go;
  std::atomic<bool> destroyed_inside{false};
  std::atomic<int> value{0};
  g->async_do(
      "k",
      [&] {
        go.wait("fn held");
        return 1;
      },
      [&, keep = g](sf::outcome<int> out) mutable {
        value = out.value();
        keep.reset();  // the last reference: ~group runs here, on the worker
        destroyed_inside = true;
      });
  std::weak_ptr<group_t> watch = g;
  g.reset();
  go.open();
  must([&] { return destroyed_inside.load(); }, "~group on the worker returned");
  CHECK(value == 1);
  CHECK(watch.expired());
}

// ---- B: a settled flight's error is never overwritten --------------------------

TEST_CASE(
    "B: an executor that keeps the task and throws: destroying the kept task later does not "
    "replace the executor's exception",
    "[user-code][executor][throw]") {
  struct exec_error : std::runtime_error {
    exec_error() : std::runtime_error("executor refused") {}
  };
  std::mutex m;
  std::optional<sf::task> kept;
  std::atomic<bool> in_executor{false};
  gate may_throw;
  sf::options o;
  o.executor = [&](sf::task t) {
    {
      std::lock_guard<std::mutex> lk(m);
      kept.emplace(std::move(t));
    }
    in_executor = true;
    may_throw.wait("executor held");
    throw exec_error();
  };
  callback_log<int> first, second;
  {
    group_t g(o);
    first.probe = [&] {
      std::lock_guard<std::mutex> lk(m);
      kept.reset();  // drops the kept task: the flight has already settled
    };
    sftest::result<int> leader;
    auto tl = sftest::spawn(leader, [&] { return g.do_("k", [] { return 1; }); });
    must([&] { return in_executor.load(); }, "leader inside the executor");
    g.async_do(
        "k", [] { return 2; }, first.on_done());
    g.async_do(
        "k", [] { return 3; }, second.on_done());
    REQUIRE(g.stats().joins == 2);
    may_throw.open();
    sftest::finish(tl, leader, "leader");
    first.wait("first follower");
    second.wait("second follower");
    CHECK(leader.threw<exec_error>());
    CHECK(first.threw<exec_error>());
    CHECK(second.threw<exec_error>());
    CHECK(sftest::address_of<exec_error>(leader.error) ==
          sftest::address_of<exec_error>(second.error));
    CHECK(g.in_flight() == 0);  // the dropped task freed the key
  }
}

// ---- D: saturating deadline arithmetic --------------------------------------------

TEST_CASE("D: options.timeout = nanoseconds::max() means no deadline (not an instant one)",
          "[user-code][deadline]") {
  group_t g(with_timeout(std::chrono::nanoseconds::max()));
  gate release;
  std::atomic<bool> started{false};
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      started = true;
      release.wait("fn held");
      return 7;
    });
  });
  must([&] { return started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 1; }, "follower joined");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(tf, follower, "follower");
  CHECK(leader.value == std::optional<int>(7));
  CHECK(follower.value == std::optional<int>(7));
  CHECK(g.stats().timeouts == 0);
}

TEST_CASE("D: close_for(nanoseconds::max()) and close_for(hours::max()) wait for the drain",
          "[user-code][close]") {
  const bool hours = GENERATE(false, true);
  group_t g;
  gate release;
  std::atomic<bool> stopped{false};
  sftest::result<int> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      must([&] { return st.stop_requested(); }, "close() stops fn");
      stopped = true;
      release.wait("fn ignores its stop for a while");
      return 1;
    });
  });
  must([&] { return g.in_flight() == 1; }, "fn running");
  std::atomic<int> closed{-1};
  sftest::jthread closer([&] {
    closed = hours ? g.close_for(std::chrono::hours::max())
                   : g.close_for(std::chrono::nanoseconds::max());
  });
  must([&] { return stopped.load(); }, "close_for stopped fn");
  const bool returned_early = sftest::becomes([&] { return closed.load() != -1; }, 100ms);
  release.open();
  must([&] { return closed.load() != -1; }, "close_for returned");
  closer.join();
  sftest::finish(tl, leader, "leader");
  CHECK_FALSE(returned_early);
  CHECK(closed == 1);
}

// ---- G: a T whose move constructor throws ------------------------------------------

namespace {
struct throwing_move {
  int v = 0;
  explicit throwing_move(int x) : v(x) {}
  throwing_move(const throwing_move&) = default;
  throwing_move& operator=(const throwing_move&) = default;
  // NOLINTNEXTLINE(performance-noexcept-move-constructor): the point of the test
  throwing_move(throwing_move&&) { throw std::runtime_error("move"); }
  throwing_move& operator=(throwing_move&&) { throw std::runtime_error("move"); }
  ~throwing_move() = default;
};
const throwing_move& the_value() {
  static const throwing_move v(42);
  return v;
}
}  // namespace

TEST_CASE("G: async_do with a T whose move throws delivers the value without moving it",
          "[user-code][async][throw]") {
  sf::group<std::string, throwing_move> g;
  std::optional<int> by_value, by_rvalue;
  std::exception_ptr error;
  // on_done taking the outcome by value: the delivery must not move T.
  g.async_do(
      "k", []() -> const throwing_move& { return the_value(); },
      [&](sf::outcome<throwing_move> o) {
        if (o.has_value()) {
          by_value = o.value().v;
        } else {
          error = o.error();
        }
      });
  g.async_do(
      "k", []() -> const throwing_move& { return the_value(); },
      [&](sf::outcome<throwing_move>&& o) { by_rvalue = o.value().v; });
  CHECK(by_value == std::optional<int>(42));
  CHECK_FALSE(error);
  CHECK(by_rvalue == std::optional<int>(42));
}

// ---- J: T's destructor never runs under a lock ---------------------------------------

namespace {
// Whether the thread running some user code holds a lock of group `g`: stats() on another
// thread takes every shard's lock in turn, so it returns only once none is held. Called only
// on the test's thread; the helpers are joined (bounded) by join_all().
template <class Group>
struct lock_probe {
  explicit lock_probe(Group& grp) : g(&grp) {}
  lock_probe(const lock_probe&) = delete;
  lock_probe& operator=(const lock_probe&) = delete;
  ~lock_probe() { join_all(); }

  void check() {
    auto done = std::make_shared<std::atomic<bool>>(false);
    helpers.emplace_back(done, std::thread([g = g, done] {
                           (void)g->stats();
                           done->store(true);
                         }));
    ++runs;
    // A lock held by this thread keeps stats() waiting until the user code returns.
    if (!sftest::becomes([&] { return done->load(); }, 5s)) ++under_lock;
  }
  void join_all() {
    for (auto& h : helpers) {
      const auto& done = h.first;
      must([&] { return done->load(); }, "the probe's stats() returned");
      h.second.join();
    }
    helpers.clear();
  }

  Group* g;
  int runs = 0;
  int under_lock = 0;
  std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::thread>> helpers;
};

// A value whose destructor re-enters its group (it probes the group's locks).
struct reentrant_value {
  using group = sf::group<std::string, reentrant_value>;
  lock_probe<group>* probe = nullptr;
  reentrant_value() = default;
  explicit reentrant_value(lock_probe<group>* p) : probe(p) {}
  reentrant_value(const reentrant_value&) = default;
  reentrant_value& operator=(const reentrant_value&) = default;
  ~reentrant_value() {
    if (probe != nullptr) probe->check();
  }
};
}  // namespace

// An inline leader whose flight settled before its fn returned (close() from inside fn, the
// deadline) has no use for fn's value: it was destroyed under the shard's lock, so a T whose
// destructor re-entered the group (stats(), do_, close()) deadlocked on that lock.
TEST_CASE(
    "J: the value of an inline leader's fn whose flight settled first is destroyed "
    "outside the lock",
    "[user-code][close][deadline]") {
  SECTION("close() from inside fn") {
    reentrant_value::group g;
    lock_probe<reentrant_value::group> probe(g);
    CHECK_THROWS_AS(g.do_("k",
                          [&] {
                            g.close();  // settles this flight with closed_error
                            return reentrant_value(&probe);
                          }),
                    sf::closed_error);
    probe.join_all();
    CHECK(probe.runs >= 1);
    CHECK(probe.under_lock == 0);
  }
  SECTION("the deadline") {
    reentrant_value::group g(with_timeout(10ms));
    lock_probe<reentrant_value::group> probe(g);
    CHECK_THROWS_AS(g.do_("k",
                          [&](sf::stop_token st) {
                            // The deadline settles the flight, then stops its token.
                            must([&] { return st.stop_requested(); }, "the deadline stops fn");
                            return reentrant_value(&probe);
                          }),
                    sf::timeout_error);
    probe.join_all();
    CHECK(probe.runs >= 1);
    CHECK(probe.under_lock == 0);
    CHECK(g.in_flight() == 0);
  }
}

// ---- K: an exception's destructor never runs under a lock, nor before the notifications --

namespace {
using int_group = sf::group<std::string, int>;

// An exception whose destructor probes the group's locks and then runs `then` (close_for, say)
// if no lock was held. Both pointers are the test's; the destructor may run on any thread.
struct probing_error : std::runtime_error {
  probing_error(lock_probe<int_group>* p, std::function<void()>* t)
      : std::runtime_error("probing"), probe(p), then(t) {}
  probing_error(const probing_error&) = default;
  probing_error& operator=(const probing_error&) = default;
  ~probing_error() override {
    if (probe == nullptr) return;
    const int before = probe->under_lock;
    probe->check();
    if (probe->under_lock == before && then != nullptr) (*then)();
  }
  lock_probe<int_group>* probe;
  std::function<void()>* then;
};
}  // namespace

// fn's exception that no caller receives (its flight settled first) was released by an inline
// leader under the shard's lock, and by a task after its lock but before it notified the
// waiters it had claimed: the exception's destructor (user code) deadlocked re-entering the
// group, and a close() from it waited for an observer that only this thread could wake.
TEST_CASE(
    "K: the exception of a fn whose flight settled first is released outside the lock, "
    "after the waiters are notified",
    "[user-code][close]") {
  SECTION("an inline leader, close() from inside fn") {
    int_group g;
    lock_probe<int_group> probe(g);
    CHECK_THROWS_AS(g.do_("k",
                          [&]() -> int {
                            g.close();  // settles this flight with closed_error
                            throw probing_error(&probe, nullptr);
                          }),
                    sf::closed_error);
    probe.join_all();
    CHECK(probe.runs >= 1);
    CHECK(probe.under_lock == 0);
  }
  SECTION("a task whose stopped flight has an observer; close_for() from the destructor") {
    // Threads of the test's own (close() on a thread of the group waits for nothing).
    std::mutex threads_mu;
    std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::thread>> threads;
    sf::options o;
    o.executor = [&](sf::task t) {
      auto ran = std::make_shared<std::atomic<bool>>(false);
      const std::lock_guard<std::mutex> lk(threads_mu);
      threads.emplace_back(ran, std::thread([t = std::move(t), ran]() mutable {
                             t();
                             ran->store(true);
                           }));
    };
    int_group g(o);
    lock_probe<int_group> probe(g);
    std::atomic<int> closed{-1};  // close_for's answer (1: drained)
    std::atomic<bool> dtor_done{false};
    std::function<void()> close_then = [&] {
      closed = g.close_for(5s) ? 1 : 0;
      dtor_done = true;
    };
    std::atomic<bool> started{false};
    gate observer_waits;
    sf::stop_source leader_stop;
    sftest::result<int> leader, observer;
    // fn stopped, then throwing once the observer waits for it.
    auto body = [&](const sf::stop_token& st) {
      started = true;
      must([&] { return st.stop_requested(); }, "the leader's leaving stops fn");
      observer_waits.wait("the observer waits for this fn");
      throw probing_error(&probe, &close_then);
    };
    const bool async_fn = GENERATE(false, true);  // a sync fn, or an async one that throws
    auto tl = sftest::spawn(leader, [&] {
      if (async_fn) {
        return g.do_(
            "k", [&](sf::stop_token st, sf::completion<int>) { body(st); },
            leader_stop.get_token());
      }
      return g.do_(
          "k",
          [&](sf::stop_token st) -> int {
            body(st);
            return 0;
          },
          leader_stop.get_token());
    });
    must([&] { return started.load(); }, "fn started");
    leader_stop.request_stop();  // the only waiter leaves: the flight is cancelled, fn stopped
    sftest::finish(tl, leader, "the leader left");
    CHECK(leader.threw<sf::cancelled_error>());
    // The key's fn still winds down: this caller observes it (linked under the lock that
    // counts its call).
    auto to = sftest::spawn(observer, [&] { return g.do_("k", [] { return 7; }); });
    must([&] { return g.stats().calls == 2; }, "the observer arrived");
    observer_waits.open();
    sftest::finish(to, observer, "the observer got an outcome");
    must([&] { return dtor_done.load(); }, "the exception was destroyed");
    probe.join_all();
    CHECK(probe.under_lock == 0);
    CHECK(closed == 1);  // it waited for no one this thread had yet to wake
    CHECK((observer.value == std::optional<int>(7) || observer.threw<sf::closed_error>()));
    g.close();  // every task has run: no more threads are added
    for (auto& th : threads) {
      const auto& ran = th.first;
      must([&] { return ran->load(); }, "the executor's thread ran its task");
      th.second.join();
    }
  }
}

// An executor that throws: its exception is the flight's failure, unless the flight settled
// while it was being submitted (here: its deadline). Then it goes to no one, and was released
// with the shard's lock held (hand_off returns with it).
TEST_CASE(
    "K: an executor's exception for a flight that settled during the submission is "
    "released outside the lock",
    "[user-code][executor][deadline]") {
  int_group* gp = nullptr;
  lock_probe<int_group>* pp = nullptr;
  sf::options o = with_timeout(10ms);
  o.executor = [&](sf::task) {
    must([&] { return gp->stats().timeouts == 1; }, "the deadline settles the flight");
    throw probing_error(pp, nullptr);
  };
  int_group g(o);
  lock_probe<int_group> probe(g);
  gp = &g;
  pp = &probe;
  CHECK_THROWS_AS(g.do_("k", [] { return 1; }), sf::timeout_error);
  probe.join_all();
  CHECK(probe.runs >= 1);
  CHECK(probe.under_lock == 0);
  CHECK(g.in_flight() == 0);
}

// ---- I: forced unwinding through fn -------------------------------------------------

// Whether this platform survives pthread_exit through a C++ frame that has a destructor, probed
// in a child process. Debian 12's libc++ 14 does not: glibc's forced unwind runs in libgcc_s,
// which calls libc++abi's personality routine, which calls LLVM libunwind's
// _Unwind_GetLanguageSpecificData on libgcc's context and crashes (a three-line program with no
// singleflight in it segfaults the same way). libstdc++ always does; it is probed only under
// libc++.
namespace {
bool forced_unwind_works() {
#if defined(_LIBCPP_VERSION)
  const pid_t pid = fork();
  if (pid == 0) {
    std::thread t([] {
      struct with_destructor {
        ~with_destructor() { std::atomic_signal_fence(std::memory_order_seq_cst); }
      } d;
      pthread_exit(nullptr);
    });
    t.join();
    _exit(0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
#else
  return true;
#endif
}
}  // namespace

TEST_CASE(
    "I: fn that ends its thread with pthread_exit fails the flight for the others and frees "
    "the key",
    "[user-code][unwind]") {
  if (!forced_unwind_works()) {
    WARN(
        "skipped: pthread_exit through a C++ frame with a destructor crashes on this platform "
        "(libc++ with LLVM libunwind and glibc's libgcc_s forced unwind), with or without "
        "singleflight");
    return;
  }
  const bool with_executor = GENERATE(false, true);
  sf::options o;
  if (with_executor) o.executor = sf::thread_executor{};
  group_t g(o);
  std::atomic<bool> started{false};
  gate exit_now;
  std::atomic<bool> thread_ended{false};
  sftest::result<int> follower;
  // The leader runs on a thread of its own (fn may end it).
  std::thread leader([&] {
    struct on_exit {
      std::atomic<bool>* flag;
      ~on_exit() { flag->store(true); }
    } mark{&thread_ended};
    try {
      (void)g.do_("k", [&] {
        started = true;
        exit_now.wait("fn held");
        pthread_exit(nullptr);
        return 0;
      });
    } catch (const sf::error&) {
      // with an executor the leader is a waiter: it receives the error
    }
  });
  must([&] { return started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 1; }, "follower joined");
  exit_now.open();
  sftest::finish(tf, follower, "the follower got an outcome");
  CHECK(follower.threw<sf::abandoned_error>());
  must([&] { return thread_ended.load(); }, "leader's thread ended");
  leader.join();
  CHECK(g.in_flight() == 0);
  CHECK(g.do_("k", [] { return 5; }) == 5);  // the key is free: a new flight
}
