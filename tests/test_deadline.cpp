// Guarantee 7: a deadline inside each flight (options.timeout), and the
// per-caller cancellation seeds from the Go singleflight articles.
//
// At the deadline the flight settles with timeout_error for every waiter, its
// token is stopped and it is no longer joinable; the entry stays until fn
// returns, so a newcomer waits for the old fn (bounded by its own deadline)
// instead of starting a second one beside it.
//
// The deadline is real time. It is long enough (kTimeout) that the scripted
// joins always happen well before it, even under sanitizers; every "before the
// deadline" step is a handful of lock round trips.
#define SINGLEFLIGHT_TEST_HOOKS  // one schedule below parks a blocked newcomer
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;
using clock_t_ = std::chrono::steady_clock;

constexpr auto kTimeout = 300ms;

sf::options timed(bool with_executor = false) {
  sf::options o;
  o.timeout = kTimeout;
  if (with_executor) o.executor = sf::thread_executor{};
  return o;
}

}  // namespace

TEST_CASE(
    "at the deadline every waiter gets timeout_error, the token is stopped and the "
    "entry is not joinable",
    "[deadline][executor]") {
  group_t g{sftest::numbered(timed(/*with_executor=*/true))};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_saw_stop{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<int> fn_calls{0};
  std::atomic<bool> fn2_overlapped{false};

  auto slow = [&](sf::stop_token st) {
    ++fn_calls;
    fn_started = true;
    sftest::must([&] { return st.stop_requested(); }, "deadline stops the flight's token");
    fn_saw_stop = true;
    release.wait("release fn 1");
    fn_returned = true;
    return 1;
  };

  const auto t0 = clock_t_::now();
  sftest::result<int> r0, r1, r2;
  auto t_0 = sftest::spawn(r0, [&] { return g.do_("k", slow); });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto t_1 = sftest::spawn(r1, [&] { return g.do_("k", slow); });
  auto t_2 = sftest::spawn(r2, [&] { return g.do_("k", slow); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");

  sftest::finish(t_0, r0, "leader released by the deadline");
  sftest::finish(t_1, r1, "follower 1 released by the deadline");
  sftest::finish(t_2, r2, "follower 2 released by the deadline");
  const auto elapsed = clock_t_::now() - t0;
  CHECK(r0.threw<sf::timeout_error>());
  CHECK(r1.threw<sf::timeout_error>());
  CHECK(r2.threw<sf::timeout_error>());
  CHECK(elapsed >= kTimeout);  // not before the deadline
  sftest::must([&] { return fn_saw_stop.load(); }, "fn saw the stop");
  CHECK_FALSE(fn_returned.load());
  CHECK(g.stats().timeouts == 1);
  CHECK(g.in_flight() == 1);  // winding down: still there, but not joinable

  sf::call_info info;
  sftest::result<int> r3;
  auto t_3 = sftest::spawn(r3, [&] {
    return g.do_(
        "k",
        [&] {
          ++fn_calls;
          fn2_overlapped = !fn_returned.load();
          return 2;
        },
        {}, info);
  });
  sftest::must([&] { return g.stats().calls == 4; }, "newcomer arrived");
  CHECK(g.stats().joins == 2);    // it did not join the timed-out flight
  CHECK(g.stats().flights == 1);  // nor start a second fn beside it
  release.open();
  sftest::finish(t_3, r3, "newcomer returns");
  REQUIRE(r3.value);
  CHECK(*r3.value == 2);
  CHECK(info.role == sf::role::leader);
  CHECK(info.flight == 2);
  CHECK(fn_calls == 2);
  CHECK_FALSE(fn2_overlapped.load());
}

TEST_CASE(
    "a hanging inline origin never holds a follower past the deadline; the leader gets "
    "timeout_error once fn returns",
    "[deadline][inline]") {
  group_t g{timed()};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};

  const auto t0 = clock_t_::now();
  sftest::result<int> leader, follower;
  // fn takes no token: it cannot be stopped and hangs until the test opens the gate.
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      fn_started = true;
      release.wait("release the hanging origin");
      fn_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  sf::call_info info;
  auto tf = sftest::spawn(follower, [&] {
    return g.do_(
        "k", [] { return -1; }, {}, info);
  });
  sftest::must([&] { return g.stats().joins == 1; }, "follower joined");

  // Bounded well below sftest::bound: the follower must come back at the
  // deadline, not when the (never released) origin does.
  sftest::must([&] { return follower.done.load(); }, "follower released at the deadline", 10s);
  const auto follower_elapsed = clock_t_::now() - t0;
  CHECK(follower.threw<sf::timeout_error>());
  CHECK(info.role == sf::role::follower);
  CHECK(follower_elapsed >= kTimeout);
  CHECK_FALSE(fn_returned.load());
  CHECK_FALSE(leader.done.load());  // the inline leader is the thread running fn

  release.open();
  sftest::finish(tl, leader, "leader returns once fn does");
  sftest::finish(tf, follower, "follower joined");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(g.in_flight() == 0);
  const auto s = g.stats();
  CHECK(s.timeouts == 1);
  CHECK(s.flights == 1);
}

TEST_CASE(
    "a newcomer after the timeout waits for the timed-out fn instead of starting a "
    "second one",
    "[deadline][inline]") {
  group_t g{sftest::numbered(timed())};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<int> running{0};
  std::atomic<int> max_running{0};
  auto enter = [&] {
    const int now = ++running;
    int seen = max_running.load();
    while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
    }
  };

  sftest::result<int> leader, newcomer;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      enter();
      fn_started = true;
      release.wait("release the timed-out fn");
      fn_returned = true;
      --running;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  sftest::must([&] { return g.stats().timeouts == 1; }, "flight timed out", 10s);

  sf::call_info info;
  auto tn = sftest::spawn(newcomer, [&] {
    return g.do_(
        "k",
        [&] {
          enter();
          --running;
          return 2;
        },
        {}, info);
  });
  sftest::must([&] { return g.stats().calls == 2; }, "newcomer arrived");
  CHECK(g.stats().flights == 1);
  CHECK(g.stats().joins == 0);
  CHECK_FALSE(newcomer.done.load());
  release.open();

  sftest::finish(tl, leader, "leader returns");
  sftest::finish(tn, newcomer, "newcomer returns");
  CHECK(leader.threw<sf::timeout_error>());
  REQUIRE(newcomer.value);
  CHECK(*newcomer.value == 2);
  CHECK(info.role == sf::role::leader);
  CHECK(info.flight == 2);
  CHECK(max_running == 1);
}

TEST_CASE(
    "a newcomer waiting for a timed-out fn that does not return gets timeout_error at "
    "its own deadline",
    "[deadline][inline]") {
  group_t g{timed()};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<int> fn_calls{0};

  sftest::result<int> leader, newcomer;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      ++fn_calls;
      fn_started = true;
      release.wait("release the timed-out fn");
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  sftest::must([&] { return g.stats().timeouts == 1; }, "flight timed out", 10s);

  sf::call_info info;
  const auto arrival = clock_t_::now();
  auto tn = sftest::spawn(newcomer, [&] {
    return g.do_(
        "k",
        [&] {
          ++fn_calls;
          return 2;
        },
        {}, info);
  });
  sftest::must([&] { return newcomer.done.load(); }, "newcomer gives up at its deadline", 10s);
  const auto waited = clock_t_::now() - arrival;
  CHECK(newcomer.threw<sf::timeout_error>());
  CHECK(waited >= kTimeout);
  CHECK(info.role == sf::role::none);
  CHECK(fn_calls == 1);
  const auto s = g.stats();
  CHECK(s.flights == 1);
  CHECK(s.rejections == 1);
  CHECK(s.timeouts == 1);  // flights settled by their deadline, not callers

  release.open();
  sftest::finish(tl, leader, "leader returns");
  sftest::finish(tn, newcomer, "newcomer joined");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(g.in_flight() == 0);
}

// The blocked newcomer of the test below, parked where it looks again after
// its first wait, until A has led (and left) the flight it must find there.
namespace {
std::atomic<std::thread::id> relook_thread{};
std::atomic<bool> relook_may_go{false};
void park_relooking_newcomer(sf::detail::hook_point p, const void*) {
  if (p != sf::detail::hook_point::observer_relooking) return;
  if (std::this_thread::get_id() != relook_thread.load()) return;
  sftest::must([] { return relook_may_go.load(); }, "A led and left E2");
}
}  // namespace

TEST_CASE("newcomer_wait_bound_counts_from_arrival_across_rounds_of_waiting", "[deadline][g1]") {
  // Guarantee 1: a newcomer that finds a stopped fn winding down waits for
  // it, "bounded by ... options.timeout, counted from its arrival". Here the
  // newcomer has to wait twice: the stopped fn it found ends, but when it
  // looks again another stopped flight holds the key (an async caller
  // notified just before it led a new flight and left it at once). Its
  // second wait must end at arrival + timeout, not a timeout after the
  // second wait began.
  // Catches: a bound re-armed on every round of waiting (group.hpp, route:
  // the wait's deadline is taken once per call); for an async newcomer, a
  // bound re-armed when it attaches again (link_wait_deadline keeps the
  // first).
  // Schedule: a manual executor holds every task, so a stopped flight keeps
  // its key until the test runs its task (which then skips fn). E1's end
  // wakes A and a blocked newcomer together; the newcomer is parked (test
  // hook) where it looks again until A has led and left E2, else it could
  // win the key and lead a flight of its own. Time is what
  // is measured: the newcomer arrives, half its bound passes (a wait for the
  // clock, which orders nothing), its second round begins, and it must give
  // up before any bound counted from the second round could end.
  constexpr auto limit = 800ms;
  std::mutex m;
  std::deque<sf::task> tasks;
  std::atomic<bool> stop_on_submit{false};
  sf::stop_source sa;
  sf::options o;
  o.timeout = limit;
  o.executor = [&](sf::task t) {
    {
      std::lock_guard<std::mutex> lk(m);
      tasks.push_back(std::move(t));
    }
    if (stop_on_submit.exchange(false)) sa.request_stop();  // the new flight's only waiter leaves
  };
  const auto take_task = [&] {
    sftest::must(
        [&] {
          std::lock_guard<std::mutex> lk(m);
          return !tasks.empty();
        },
        "a task queued");
    std::lock_guard<std::mutex> lk(m);
    sf::task t = std::move(tasks.front());
    tasks.pop_front();
    return t;
  };
  std::atomic<int> fn_calls{0};
  const auto fn = [&](sf::stop_token) { return fn_calls.fetch_add(1), 1; };
  sftest::callback_log<int> x, a, c;
  std::atomic<clock_t_::time_point> c_delivered{};
  c.probe = [&] { c_delivered = clock_t_::now(); };
  group_t g{o};
  sf::stop_source sx;
  g.async_do("k", fn, x.on_done(), sx.get_token());  // E1: its task waits in the queue
  sx.request_stop();  // its only waiter leaves: E1 is stopped, its task still holds the key
  REQUIRE(x.threw<sf::cancelled_error>());
  REQUIRE(g.in_flight() == 1);
  relook_may_go = false;
  a.probe = [&] { relook_may_go = true; };           // A left E2: E2 is stopped and holds the key
  g.async_do("k", fn, a.on_done(), sa.get_token());  // waits for E1; notified first, leads E2
  REQUIRE_FALSE(a.is_done());

  const auto before = clock_t_::now();
  sftest::result<int> n;
  std::atomic<clock_t_::time_point> n_returned{};
  sftest::jthread tn;
  const bool blocked_newcomer = GENERATE(true, false);
  CAPTURE(blocked_newcomer);
  struct unhook {
    ~unhook() { sf::detail::test_hook.store(nullptr, std::memory_order_release); }
  } unhook_at_exit;
  if (blocked_newcomer) {
    sf::detail::test_hook.store(&park_relooking_newcomer, std::memory_order_release);
    tn = sftest::spawn(n, [&] {
      relook_thread = std::this_thread::get_id();
      try {
        return g.do_("k", fn);
      } catch (...) {
        n_returned = clock_t_::now();
        throw;
      }
    });
  } else {
    g.async_do("k", fn, c.on_done());
  }
  sftest::must([&] { return g.stats().calls == 3; }, "the newcomer waits for E1's fn");
  const auto arrived_by = clock_t_::now();
  std::this_thread::sleep_until(arrived_by + limit / 2);  // the time under test passes
  const auto second_round = clock_t_::now();
  REQUIRE_FALSE((blocked_newcomer ? n.done.load() : c.is_done()));

  // E1's task: it skips fn (stopped) and frees the key. A, notified first,
  // leads E2 (queued) and leaves it at once (the executor stops it), so E2
  // is stopped and holds the key when the newcomer looks again.
  stop_on_submit = true;
  take_task()();
  CHECK(a.threw<sf::cancelled_error>());
  CHECK(g.stats().flights == 2);

  clock_t_::time_point gave_up;
  if (blocked_newcomer) {
    sftest::finish(tn, n, "the newcomer gave up");
    CHECK(n.threw<sf::timeout_error>());
    gave_up = n_returned.load();
  } else {
    c.wait("the newcomer gave up");
    CHECK(c.threw<sf::timeout_error>());
    gave_up = c_delivered.load();
  }
  const auto ms = [](clock_t_::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  INFO("gave up " << ms(gave_up - arrived_by) << " ms after it had arrived, "
                  << ms(gave_up - second_round) << " ms after its second wait began; bound "
                  << ms(limit) << " ms");
  CHECK(gave_up >= before + limit);       // not before its bound
  CHECK(gave_up < second_round + limit);  // counted from its arrival, not from its second wait
  take_task()();                          // E2's task: skips fn, frees the key
  CHECK(fn_calls == 0);
  CHECK(g.in_flight() == 0);
  const auto s = g.stats();
  CHECK(s.rejections == 1);  // the newcomer's bound
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

// Go article seed: "the leader times out first". Under ownership::leader the
// leader's stop cancels the flight for everyone, and its token is stopped.
TEST_CASE("leader_times_out_first: under ownership::leader everyone gets cancelled_error",
          "[deadline][seed][ownership]") {
  const bool with_executor = GENERATE(false, true);
  CAPTURE(with_executor);
  sf::options o;
  o.owner = sf::ownership::leader;
  if (with_executor) o.executor = sf::thread_executor{};
  group_t g{o};
  sf::stop_source leader_stop;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_saw_stop{false};

  auto fn = [&](sf::stop_token st) {
    fn_started = true;
    sftest::must([&] { return st.stop_requested(); }, "leader's stop stops the flight");
    fn_saw_stop = true;
    return 1;
  };
  sftest::result<int> leader, f1, f2;
  auto tl = sftest::spawn(leader, [&] { return g.do_("k", fn, leader_stop.get_token()); });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto t1 = sftest::spawn(f1, [&] { return g.do_("k", fn); });
  auto t2 = sftest::spawn(f2, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");

  leader_stop.request_stop();
  sftest::finish(t1, f1, "follower 1 cancelled");
  sftest::finish(t2, f2, "follower 2 cancelled");
  sftest::finish(tl, leader, "leader returns");
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(f1.threw<sf::cancelled_error>());
  CHECK(f2.threw<sf::cancelled_error>());
  // With an executor the callers leave before fn sees the stop.
  sftest::must([&] { return fn_saw_stop.load(); }, "the flight's token was stopped");
  sftest::must([&] { return g.in_flight() == 0; }, "entry gone once fn returns");
  CHECK(g.stats().cancellations == 3);
}

// The same schedule under the default policy (ownership::waiters), with an
// executor so that the leader can leave: the leader's stop only ends the
// leader's wait; the follower still waiting keeps the work alive and gets the value.
TEST_CASE(
    "leader_times_out_first: under the default policy a waiting follower still gets "
    "the value",
    "[deadline][seed][ownership]") {
  group_t g{sf::options{.executor = sf::thread_executor{}}};
  sftest::gate release;
  sf::stop_source leader_stop;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> token_stopped_at_return{true};

  auto fn = [&](sf::stop_token st) {
    fn_started = true;
    release.wait("release fn");
    token_stopped_at_return = st.stop_requested();
    return 1;
  };
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] { return g.do_("k", fn, leader_stop.get_token()); });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().joins == 1; }, "follower joined");

  leader_stop.request_stop();
  sftest::finish(tl, leader, "leader leaves at once");
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK_FALSE(follower.done.load());
  release.open();
  sftest::finish(tf, follower, "follower gets the value");
  REQUIRE(follower.value);
  CHECK(*follower.value == 1);
  CHECK_FALSE(token_stopped_at_return.load());
  CHECK(g.stats().cancellations == 1);
}

// Go article seed: "a follower times out first". Its own stop ends only its
// own wait: it leaves at once, and the inline leader still gets the value.
TEST_CASE(
    "follower_times_out_first: the follower leaves at once and the leader still gets the "
    "value",
    "[deadline][seed][ownership]") {
  group_t g;
  sftest::gate release;
  sf::stop_source follower_stop;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<bool> token_stopped_at_return{true};

  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      fn_started = true;
      release.wait("release fn");
      token_stopped_at_return = st.stop_requested();
      fn_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] {
    return g.do_(
        "k", [] { return -1; }, follower_stop.get_token());
  });
  sftest::must([&] { return g.stats().joins == 1; }, "follower joined");

  follower_stop.request_stop();
  sftest::finish(tf, follower, "follower leaves at once");
  CHECK(follower.threw<sf::cancelled_error>());
  CHECK_FALSE(fn_returned.load());
  release.open();
  sftest::finish(tl, leader, "leader returns");
  REQUIRE(leader.value);
  CHECK(*leader.value == 1);
  CHECK_FALSE(token_stopped_at_return.load());
  CHECK(g.stats().cancellations == 1);
}

// Regression (found by ASan): timer_loop() waits with
//   timer_cv_.wait_until(lk, dl_head_->deadline);
// passing a reference into the head flight. libstdc++'s wait_until reads that
// time_point again after the wait returns (to tell timeout from no_timeout).
// If, while the timer slept, the flight settled before its deadline and its
// last reference was dropped, that read is a heap-use-after-free. Schedule:
// a flight becomes the deadline head; the timer starts waiting until its
// deadline; fn returns, finish() unlinks it, the caller frees it; close()
// (here: the destructor) wakes the timer, which reads the freed deadline.
// Only a sanitizer build sees it; the loop makes the timer's wait likely to
// begin before fn returns in at least one round.
TEST_CASE("timer_does_not_read_a_freed_flights_deadline", "[deadline][regression][bug]") {
  sf::options o;
  o.timeout = std::chrono::hours(1);  // never reached: every flight ends first
  for (int round = 0; round < 50; ++round) {
    group_t g{o};
    CHECK(g.do_("k", [] {
      for (int i = 0; i < 100; ++i) std::this_thread::yield();  // let the timer start waiting
      return 1;
    }) == 1);
    CHECK(g.in_flight() == 0);
  }  // ~group: close() wakes the timer
}
