// Callback waiters: group::async_do(key, fn, on_done, caller), with synchronous
// fns (inline or on an executor) and asynchronous fns
// (`void(singleflight::stop_token, completion<T>)`), and do_ with an async fn. One
// test case per contract point of the async API; each says which bug it
// catches. Interleavings are forced with gates, held completions and
// observable state; every wait is bounded; workers record into logs that
// the test's own thread checks.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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
using sftest::fire_task;
using sftest::gate;
using sftest::must;
using group_t = sf::group<std::string, int>;

using sftest::address_of;
using sftest::not_an_exception;
using sftest::with;

sf::options with_threads() {
  sf::options o;
  o.executor = sf::thread_executor{};
  return o;
}

}  // namespace

// ---- values, copies, shared errors -----------------------------------------

TEST_CASE(
    "on_done runs exactly once per waiter with the value, on the thread resolving the "
    "completion",
    "[async]") {
  // Catches: a callback called twice or never, a joiner that misses the value,
  // a callback run early or on another thread than the one that settled.
  constexpr int n = 8;
  std::vector<callback_log<int>> logs(n);
  std::atomic<int> fn_calls{0};
  group_t g;
  completion_box<int> box;
  auto fn = [&](singleflight::stop_token st, sf::completion<int> c) {
    fn_calls.fetch_add(1);
    box.put(std::move(st), std::move(c));
  };
  for (auto& log : logs) g.async_do("k", fn, log.on_done());
  auto s = g.stats();
  CHECK(s.calls == n);
  CHECK(s.flights == 1);
  CHECK(s.joins == n - 1);
  auto item = box.take("fn parked its completion");
  sf::completion<int>& c = item.second;
  CHECK(static_cast<bool>(c));
  for (auto& log : logs) CHECK_FALSE(log.is_done());  // nobody answered before the work did
  const std::thread::id resolver = sftest::on_new_thread([&] { c.set_value(42); }, "set_value");
  CHECK_FALSE(static_cast<bool>(c));  // resolved: empty now
  for (auto& log : logs) {
    log.wait("on_done called");
    CHECK(log.calls == 1);
    REQUIRE(log.value);
    CHECK(*log.value == 42);
    CHECK(log.thread == resolver);
  }
  CHECK(fn_calls == 1);
  s = g.stats();
  CHECK(s.failures == 0);
  CHECK(s.in_flight == 0);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

TEST_CASE("each callback waiter receives its own copy of the value", "[async]") {
  // Catches: outcomes that share one T (a mutation through one callback's
  // outcome shows up in the next) or a value moved out for the first waiter
  // and handed to the others moved-from (empty).
  constexpr int n = 5;
  const std::string payload = "a value long enough to live on the heap, not in SSO";
  std::vector<std::string> seen(n);  // written by the settling thread, read after it joined
  std::atomic<int> called{0};
  sf::group<std::string, std::string> g;
  completion_box<std::string> box;
  for (int i = 0; i < n; ++i) {
    g.async_do("k", box.fn(), [&, i](sf::outcome<std::string> o) {
      seen[i] = o.value();
      o.value() = "mutated by waiter " + std::to_string(i);
      called.fetch_add(1);
    });
  }
  CHECK(g.stats().joins == n - 1);
  auto item = box.take("fn parked its completion");
  sftest::on_new_thread([&] { item.second.set_value(payload); }, "set_value");
  must([&] { return called.load() == n; }, "every on_done ran");
  for (const auto& v : seen) CHECK(v == payload);
}

TEST_CASE("an exception from fn reaches every callback waiter as the same object", "[async]") {
  // Catches: an error copied per waiter (different addresses), sliced to
  // std::exception, or delivered before the entry is gone (in_flight() inside
  // on_done would still count it).
  constexpr int n = 4;
  std::vector<callback_log<int>> logs(n);
  std::atomic<int> in_flight_seen_nonzero{0};
  group_t g;
  for (auto& log : logs) {
    log.probe = [&] {
      if (g.in_flight() != 0) in_flight_seen_nonzero.fetch_add(1);
    };
  }
  SECTION("set_exception on an async fn's completion, from another thread") {
    completion_box<int> box;
    for (auto& log : logs) g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("fn parked its completion");
    sftest::on_new_thread(
        [&] { item.second.set_exception(std::make_exception_ptr(not_an_exception{77})); },
        "set_exception");
  }
  SECTION("a sync fn throwing on an executor thread") {
    sf::group<std::string, int> ge(with_threads());
    gate throw_now;
    for (auto& log : logs) {
      log.probe = [&] {
        if (ge.in_flight() != 0) in_flight_seen_nonzero.fetch_add(1);
      };
    }
    for (auto& log : logs) {
      ge.async_do(
          "k",
          [&]() -> int {
            throw_now.wait("fn throws");
            throw not_an_exception{77};
          },
          log.on_done());
    }
    CHECK(ge.stats().joins == n - 1);
    throw_now.open();
    for (auto& log : logs) log.wait("on_done called");
    CHECK(ge.stats().failures == 1);
  }
  for (auto& log : logs) log.wait("on_done called");
  const void* first = address_of<not_an_exception>(logs[0].error);
  REQUIRE(first != nullptr);
  for (auto& log : logs) {
    CHECK(log.calls == 1);
    CHECK(log.error == logs[0].error);
    CHECK(address_of<not_an_exception>(log.error) == first);
  }
  CHECK(in_flight_seen_nonzero == 0);
}

namespace {
// A coroutine waiter that reports what the group looked like when it was
// resumed: in_flight() as its first step after the co_await.
template <class F>
fire_task<std::size_t> in_flight_on_resume(group_t& g, F fn) {
  try {
    (void)co_await g.co_do(std::string("k"), fn);
  } catch (...) {  // value or failure: only the moment of resumption matters
  }
  co_return g.in_flight();
}
}  // namespace

TEST_CASE("inline_leader_wakes_no_waiter_before_its_entry_is_gone", "[async][coro][g4]") {
  // Guarantee 4: "the entry is gone before any of them wakes", for a fn run
  // inline by its leader. Its callback and coroutine waiters are notified on
  // the leader's thread right after the settle, so they see the group
  // exactly as the leader left it: no entry (in_flight() == 0), and the same
  // key starts a new flight at once. Blocked waiters re-lock too late to
  // tell (see the g4 test in test_group_core.cpp); these cannot miss it.
  // Catches: a leader that wakes its waiters before erasing its entry (a
  // mutation that survived the blocked-waiter tests): in_flight() == 1
  // inside on_done, and an async_do for the key waits for the old fn instead
  // of starting.
  const bool throws = GENERATE(false, true);
  const bool async_leader = GENERATE(false, true);  // async_do running a sync fn inline, or do_
  CAPTURE(throws, async_leader);
  callback_log<int> follower, again;
  std::atomic<std::size_t> in_flight_in_on_done{99};
  std::atomic<bool> again_done_at_once{false};
  group_t g;
  follower.probe = [&] {
    in_flight_in_on_done = g.in_flight();
    g.async_do(
        "k", [] { return 2; }, again.on_done());  // a new flight, run right here
    again_done_at_once = again.is_done();
  };
  gate release;
  std::atomic<bool> fn_running{false};
  auto fn = [&]() -> int {
    fn_running = true;
    release.wait("inline fn released");
    if (throws) throw not_an_exception{5};
    return 1;
  };
  callback_log<int> leader_log;
  sftest::thread leader([&] {
    if (async_leader) {
      g.async_do("k", fn, leader_log.on_done());  // fn runs inside, on this thread
    } else {
      try {
        (void)g.do_("k", fn);
      } catch (...) {
      }
    }
  });
  const std::thread::id leader_id = leader.get_id();
  must([&] { return fn_running.load(); }, "the leader runs fn");
  g.async_do(
      "k", [] { return -1; }, follower.on_done());
  auto co = in_flight_on_resume(g, [] { return -1; });
  CHECK(g.stats().joins == 2);
  CHECK_FALSE(follower.is_done());
  CHECK_FALSE(co.done());
  release.open();
  leader.join("leader returned");
  REQUIRE(follower.is_done());
  REQUIRE(co.done());
  REQUIRE(follower.thread == leader_id);  // notified by the leader, on its thread
  REQUIRE(co.get().finished_on == leader_id);
  CHECK(in_flight_in_on_done == 0);
  CHECK(again_done_at_once);
  CHECK(again.value == 2);
  REQUIRE(co.get().value);
  CHECK(*co.get().value == 0);
  CHECK((throws ? follower.threw<not_an_exception>() : follower.value == 1));
  CHECK(g.stats().flights == 2);
  CHECK(g.in_flight() == 0);
}

// ---- immediate outcomes ------------------------------------------------------

TEST_CASE(
    "immediate outcomes call on_done before async_do returns, on the calling thread, and "
    "start nothing",
    "[async]") {
  // Catches: an immediate outcome deferred to another thread or after return,
  // a rejected caller that still starts or joins a flight, wrong counters.
  callback_log<int> log;
  std::atomic<int> fn_calls{0};
  auto counting_fn = [&] { return fn_calls.fetch_add(1), 1; };
  const auto me = std::this_thread::get_id();

  SECTION("closed group: closed_error") {
    group_t g;
    g.close();
    g.async_do("k", counting_fn, log.on_done());
    CHECK(log.is_done());
    CHECK(log.thread == me);
    CHECK(log.threw<sf::closed_error>());
    CHECK(g.stats().rejections == 1);
  }
  SECTION("already-stopped token: cancelled_error, neither starts nor joins") {
    group_t g;
    completion_box<int> box;
    callback_log<int> holder;
    g.async_do("k", box.fn(), holder.on_done());  // a flight it could have joined
    singleflight::stop_source s;
    s.request_stop();
    g.async_do("k", counting_fn, log.on_done(), s.get_token());
    CHECK(log.is_done());
    CHECK(log.thread == me);
    CHECK(log.threw<sf::cancelled_error>());
    g.async_do("fresh", counting_fn, log.on_done(), s.get_token());  // nor starts one
    CHECK(log.calls == 2);
    const auto st = g.stats();
    CHECK(st.flights == 1);
    CHECK(st.joins == 0);
    CHECK(st.rejections == 2);
    CHECK(st.cancellations == 2);
    box.take("holder's completion").second.set_value(1);
    holder.wait("holder served");
  }
  SECTION("max_in_flight reached: overloaded_error; joining still works") {
    sf::options o;
    o.max_in_flight = 1;
    group_t g(o);
    completion_box<int> box;
    callback_log<int> holder, joiner;
    g.async_do("a", box.fn(), holder.on_done());
    g.async_do("b", counting_fn, log.on_done());
    CHECK(log.is_done());
    CHECK(log.thread == me);
    CHECK(log.threw<sf::overloaded_error>());
    g.async_do("a", counting_fn, joiner.on_done());  // joining is never capped
    CHECK_FALSE(joiner.is_done());
    const auto st = g.stats();
    CHECK(st.overloaded == 1);
    CHECK(st.rejections == 1);
    CHECK(st.joins == 1);
    box.take("holder's completion").second.set_value(5);
    joiner.wait("joiner served");
    CHECK(*joiner.value == 5);
  }
  CHECK(fn_calls == 0);
}

// ---- where fn runs and where on_done runs ------------------------------------

TEST_CASE(
    "a sync fn without an executor runs inside async_do on the caller's thread; joiners "
    "never block",
    "[async]") {
  // Catches: fn run on some other thread, the leader's on_done deferred past
  // async_do's return, or an async joiner that blocks until the flight ends.
  callback_log<int> leader_log, joiner_log;
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<bool> fn_entered{false}, leader_returned{false}, done_at_return{false};
  gate release;
  group_t g;
  sftest::jthread leader([&] {
    g.async_do(
        "k",
        [&] {
          fn_thread = std::this_thread::get_id();
          fn_entered = true;
          release.wait("fn released");
          return 7;
        },
        leader_log.on_done());
    done_at_return = leader_log.is_done();
    leader_returned = true;
  });
  const std::thread::id leader_id = leader.get_id();
  must([&] { return fn_entered.load(); }, "fn running");
  g.async_do(
      "k", [] { return -1; }, joiner_log.on_done());  // returns at once
  CHECK(g.stats().joins == 1);
  CHECK_FALSE(joiner_log.is_done());
  CHECK_FALSE(leader_returned.load());  // the leader is inside async_do, running fn
  release.open();
  must([&] { return leader_returned.load(); }, "leader's async_do returned");
  leader.join();
  CHECK(fn_thread.load() == leader_id);
  CHECK(done_at_return);
  CHECK(*leader_log.value == 7);
  CHECK(leader_log.thread == leader_id);
  joiner_log.wait("joiner served");
  CHECK(*joiner_log.value == 7);
  CHECK(joiner_log.thread == leader_id);  // the thread whose fn returned
}

TEST_CASE("with an executor async_do returns at once and on_done runs on the executor's thread",
          "[async][executor]") {
  // Catches: async_do blocking on the work, fn run on the caller's thread
  // despite the executor, on_done delivered anywhere but where fn returned.
  callback_log<int> a, b;
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<int> fn_calls{0};
  auto fn_body = [&] {
    fn_calls.fetch_add(1);
    fn_thread = std::this_thread::get_id();
    return 3;
  };
  SECTION("thread_executor") {
    gate release;
    group_t g(with_threads());
    g.async_do(
        "k",
        [&] {
          release.wait("fn released");
          return fn_body();
        },
        a.on_done());
    g.async_do("k", fn_body, b.on_done());
    CHECK_FALSE(a.is_done());
    CHECK_FALSE(b.is_done());
    release.open();
    a.wait("a served");
    b.wait("b served");
    CHECK(fn_thread.load() != std::this_thread::get_id());
  }
  SECTION("a queueing executor; the test runs the task on a thread of its own") {
    sftest::manual_executor ex;
    sf::options o;
    o.executor = ex.executor();
    group_t g(o);
    g.async_do("k", fn_body, a.on_done());
    g.async_do("k", fn_body, b.on_done());
    CHECK(ex.queued() == 1);
    CHECK(fn_calls == 0);
    CHECK_FALSE(a.is_done());
    sf::task t = ex.take("task queued");
    const std::thread::id runner = sftest::on_new_thread([&] { t(); }, "task ran");
    CHECK(fn_thread.load() == runner);
    a.wait("a served");
    b.wait("b served");
  }
  CHECK(fn_calls == 1);
  CHECK(*a.value == 3);
  CHECK(*b.value == 3);
  CHECK(a.thread == fn_thread.load());
  CHECK(b.thread == fn_thread.load());
}

// ---- async fns ---------------------------------------------------------------

TEST_CASE("an async fn may resolve its completion before it returns", "[async][async-fn]") {
  // Catches: a completion resolved inside fn deadlocking, lost, or delivered
  // twice (once by fn, once when fn returns), or on another thread than fn's.
  callback_log<int> log;
  std::atomic<std::thread::id> fn_thread{};
  group_t g;
  SECTION("set_value") {
    g.async_do(
        "k",
        [&](singleflight::stop_token, sf::completion<int> c) {
          fn_thread = std::this_thread::get_id();
          c.set_value(11);
        },
        log.on_done());
    log.wait("on_done called");
    CHECK(*log.value == 11);
    CHECK(log.calls == 1);
    CHECK(log.thread == fn_thread.load());
  }
  SECTION("set_exception") {
    g.async_do(
        "k",
        [&](singleflight::stop_token, sf::completion<int> c) {
          fn_thread = std::this_thread::get_id();
          c.set_exception(std::make_exception_ptr(not_an_exception{3}));
        },
        log.on_done());
    log.wait("on_done called");
    CHECK(log.threw<not_an_exception>());
    CHECK(log.calls == 1);
    CHECK(log.thread == fn_thread.load());
    CHECK(g.stats().failures == 1);
  }
  SECTION("through do_") {
    const int v =
        g.do_("k", [&](singleflight::stop_token, sf::completion<int> c) { c.set_value(12); });
    CHECK(v == 12);
  }
  CHECK(g.in_flight() == 0);
  CHECK(g.stats().flights == 1);
}

TEST_CASE(
    "an async fn with an executor starts on the executor's thread; on_done runs where the "
    "completion resolves",
    "[async][async-fn][executor]") {
  // Catches: an async fn started on the caller's thread despite the
  // executor, or on_done delivered on the executor's thread instead of the
  // resolver's.
  callback_log<int> a, b;
  std::atomic<std::thread::id> fn_thread{};
  sftest::manual_executor ex;
  sf::options o;
  o.executor = ex.executor();
  group_t g(o);
  completion_box<int> box;
  auto fn = [&](singleflight::stop_token st, sf::completion<int> c) {
    fn_thread = std::this_thread::get_id();
    box.put(std::move(st), std::move(c));
  };
  g.async_do("k", fn, a.on_done());
  g.async_do("k", fn, b.on_done());
  CHECK(box.size() == 0);  // not started on this thread
  sf::task t = ex.take("task queued");
  const std::thread::id runner = sftest::on_new_thread([&] { t(); }, "task ran");
  CHECK(fn_thread.load() == runner);
  CHECK_FALSE(a.is_done());
  auto item = box.take("fn parked its completion");
  item.second.set_value(4);  // on this thread
  CHECK(a.is_done());
  CHECK(b.is_done());
  CHECK(a.thread == std::this_thread::get_id());
  CHECK(b.thread == std::this_thread::get_id());
  CHECK(*a.value == 4);
  CHECK(*b.value == 4);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("a completion resolved or dropped on another thread while fn is still running",
          "[async][async-fn]") {
  // Catches: the start-up window mishandled: a value resolved before fn
  // returned lost or delivered twice, a completion dropped before fn returned
  // masking fn's own later exception, or the flight failed before fn decided.
  callback_log<int> log;
  group_t g;
  SECTION("set_value before fn returns: the value, once, on the resolver's thread") {
    std::atomic<std::thread::id> resolver{};
    g.async_do(
        "k",
        [&](singleflight::stop_token, sf::completion<int> c) {
          sftest::jthread r([&] {
            resolver = std::this_thread::get_id();
            c.set_value(5);
          });
          r.join();
          must([&] { return log.is_done(); }, "on_done ran while fn is still running");
        },
        log.on_done());
    REQUIRE(log.value);
    CHECK(*log.value == 5);
    CHECK(log.thread == resolver.load());
  }
  SECTION("dropped before fn returns, then fn returns: broken_promise_error") {
    g.async_do(
        "k",
        [&](singleflight::stop_token, sf::completion<int> c) {
          sftest::jthread r(
              [moved = std::move(c)]() mutable { sf::completion<int> dying = std::move(moved); });
          r.join();
          CHECK_FALSE(log.is_done());  // not before fn has returned (fn may still throw)
        },
        log.on_done());
    log.wait("on_done called");
    CHECK(log.threw<sf::broken_promise_error>());
  }
  SECTION("dropped before fn returns, then fn throws: fn's exception") {
    g.async_do(
        "k",
        [&](singleflight::stop_token, sf::completion<int> c) {
          sftest::jthread r(
              [moved = std::move(c)]() mutable { sf::completion<int> dying = std::move(moved); });
          r.join();
          throw not_an_exception{6};
        },
        log.on_done());
    log.wait("on_done called");
    CHECK(log.threw<not_an_exception>());
  }
  CHECK(log.calls == 1);
  CHECK(g.in_flight() == 0);
  CHECK(g.do_("k", [] { return 1; }) == 1);  // the key is free
}

TEST_CASE("an async fn that throws before returning fails the flight with that exception",
          "[async][async-fn]") {
  // Catches: the thrown exception replaced by broken_promise_error (the
  // completion is destroyed while fn unwinds), swallowed, or leaking the entry.
  callback_log<int> log;
  group_t g;
  auto thrower = [](singleflight::stop_token, sf::completion<int>) { throw not_an_exception{9}; };
  SECTION("async_do") {
    g.async_do("k", thrower, log.on_done());
    log.wait("on_done called");
    CHECK(log.calls == 1);
    CHECK(log.threw<not_an_exception>());
    CHECK_FALSE(log.threw<sf::broken_promise_error>());
  }
  SECTION("do_") { CHECK_THROWS_AS(g.do_("k", thrower), not_an_exception); }
  CHECK(g.stats().failures == 1);
  CHECK(g.in_flight() == 0);
  CHECK(g.do_("k", [] { return 1; }) == 1);  // no poisoned key
}

TEST_CASE(
    "a completion dropped unresolved fails every waiter with broken_promise_error; the key "
    "is free afterwards",
    "[async][async-fn]") {
  // Catches: waiters stranded forever by a dropped completion, a generic or
  // missing error, the entry surviving the drop (the next caller would join a
  // dead flight), or a failure not counted.
  constexpr int n = 3;
  std::vector<callback_log<int>> logs(n);
  std::atomic<int> in_flight_seen_nonzero{0};
  sftest::result<int> blocked;
  group_t g;
  for (auto& log : logs) {
    log.probe = [&] {
      if (g.in_flight() != 0) in_flight_seen_nonzero.fetch_add(1);
    };
  }
  completion_box<int> box;
  for (auto& log : logs) g.async_do("k", box.fn(), log.on_done());
  auto tb = sftest::spawn(blocked, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == n; }, "blocking caller joined");
  auto item = box.take("fn parked its completion");
  const std::thread::id dropper = sftest::on_new_thread(
      [&] { sf::completion<int> dying = std::move(item.second); }, "completion dropped");
  sftest::finish(tb, blocked, "blocking caller released");
  CHECK(blocked.threw<sf::broken_promise_error>());
  for (auto& log : logs) {
    log.wait("on_done called");
    CHECK(log.calls == 1);
    CHECK(log.threw<sf::broken_promise_error>());
    CHECK(log.thread == dropper);
  }
  CHECK(in_flight_seen_nonzero == 0);
  CHECK(g.stats().failures == 1);
  CHECK(g.in_flight() == 0);
  // The next caller starts a new flight.
  callback_log<int> next;
  g.async_do("k", box.fn(), next.on_done());
  CHECK(g.stats().flights == 2);
  box.take("second flight's completion").second.set_value(2);
  next.wait("next served");
  CHECK(*next.value == 2);
}

TEST_CASE("completion_assigned_over_unresolved_fails_its_flight_with_broken_promise",
          "[async][async-fn]") {
  // completion.hpp: "Destroyed (or assigned over) without being resolved, it
  // fails the flight with broken_promise_error." Assigning over an
  // unresolved completion ends its flight there and then, on the assigning
  // thread, and frees the key; the completion then resolves the other flight.
  // Catches: a move-assignment that simply overwrites (a mutation no test
  // killed): the first flight never settles, its waiters wait forever, its
  // key stays taken, and close() never returns.
  const bool from_empty = GENERATE(false, true);  // `c = {}` or `c = std::move(other)`
  CAPTURE(from_empty);
  callback_log<int> a, b, late;
  auto owner = std::make_unique<group_t>();
  group_t& g = *owner;
  completion_box<int> box;
  g.async_do("a", box.fn(), a.on_done());
  g.async_do("b", box.fn(), b.on_done());
  sf::completion<int> ca = box.take("a's fn parked its completion").second;
  sf::completion<int> cb = box.take("b's fn parked its completion").second;
  REQUIRE(ca);
  REQUIRE(cb);
  if (from_empty) {
    ca = sf::completion<int>{};
    CHECK_FALSE(ca);
  } else {
    ca = std::move(cb);
    CHECK(ca);  // now b's
    CHECK_FALSE(cb);
  }
  CHECK(a.is_done());  // before the assignment returned
  CHECK(a.threw<sf::broken_promise_error>());
  CHECK(a.thread == std::this_thread::get_id());
  CHECK_FALSE(b.is_done());
  CHECK(g.in_flight() == 1);  // a's key is free
  CHECK(g.stats().failures == 1);
  g.async_do("a", box.fn(), late.on_done());  // so a newcomer starts a new flight
  const bool restarted = box.size() == 1;     // (no REQUIRE: unwinding would run ~group())
  CHECK(restarted);
  if (restarted) {
    box.take("the newcomer's fn parked its completion").second.set_value(3);
    CHECK(late.value == 3);
  }
  (from_empty ? cb : ca).set_value(2);  // b's flight
  CHECK(b.value == 2);
  CHECK(a.calls == 1);
  CHECK(g.in_flight() == 0);
  const bool drained = g.close_for(sftest::bound);  // waits for every unresolved completion
  CHECK(drained);
  if (!drained) {
    // A completion was lost unresolved and ~group() would wait for it
    // forever: leak the group, so the test fails instead of hanging.
    (void)owner.release();
  }
}

TEST_CASE("do_ with an async fn: the blocked caller gets the value and can leave on its token",
          "[async][async-fn]") {
  // Catches: do_ rejecting an async fn, a blocking caller that cannot leave
  // until the completion resolves (it runs nothing itself), a stopped flight
  // whose entry vanishes before its completion resolved.
  sftest::result<int> r;
  group_t g;
  completion_box<int> box;
  SECTION("value resolved on another thread") {
    auto t = sftest::spawn(r, [&] { return g.do_("k", box.fn()); });
    auto item = box.take("fn parked its completion");
    item.second.set_value(8);
    sftest::finish(t, r, "do_ returned");
    REQUIRE(r.value);
    CHECK(*r.value == 8);
  }
  SECTION("caller leaves on its token while the completion is held") {
    singleflight::stop_source s;
    auto t = sftest::spawn(r, [&] { return g.do_("k", box.fn(), s.get_token()); });
    auto item = box.take("fn parked its completion");
    s.request_stop();
    sftest::finish(t, r, "do_ left");
    CHECK(r.threw<sf::cancelled_error>());
    CHECK(static_cast<bool>(item.second));  // the work is still unresolved
    CHECK(item.first.stop_requested());     // the last waiter left: work stopped
    CHECK(g.in_flight() == 1);              // the key stays taken until it resolves
    item.second.set_value(1);
    CHECK(g.in_flight() == 0);
    CHECK(g.stats().cancellations == 1);
  }
}

TEST_CASE("an async caller joining its own key from inside fn gets the value, not logic_error",
          "[async][reentrant]") {
  // Catches: the self-deadlock check applied to a waiter that does not block.
  callback_log<int> inner;
  group_t g;
  const int v = g.do_("k", [&] {
    g.async_do(
        "k", [] { return -1; }, inner.on_done());
    return 4;
  });
  CHECK(v == 4);
  inner.wait("inner served");
  CHECK(*inner.value == 4);
  CHECK(g.stats().joins == 1);
}

// ---- cancellation and ownership ----------------------------------------------

TEST_CASE(
    "a caller's stop calls its on_done with cancelled_error inside request_stop; the others "
    "keep waiting",
    "[async][cancel]") {
  // Catches: a stopped callback waiter left until the flight ends, delivered
  // on another thread than the stopper, waking the other waiters, or stopping
  // the work while waiters remain.
  callback_log<int> a, b, c;
  sftest::result<int> d;
  singleflight::stop_source sa, sb;
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done(), sa.get_token());
  g.async_do("k", box.fn(), b.on_done(), sb.get_token());
  g.async_do("k", box.fn(), c.on_done());
  auto td = sftest::spawn(d, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 3; }, "all joined");
  auto item = box.take("fn parked its completion");

  sa.request_stop();
  CHECK(a.is_done());  // before request_stop returned
  CHECK(a.thread == std::this_thread::get_id());
  CHECK(a.threw<sf::cancelled_error>());
  const std::thread::id stopper = sftest::on_new_thread([&] { sb.request_stop(); }, "stop b");
  CHECK(b.is_done());
  CHECK(b.thread == stopper);
  CHECK(b.threw<sf::cancelled_error>());
  CHECK_FALSE(c.is_done());
  CHECK_FALSE(d.done.load());
  CHECK_FALSE(item.first.stop_requested());  // c and d still want the work

  item.second.set_value(6);
  c.wait("c served");
  sftest::finish(td, d, "d served");
  CHECK(*c.value == 6);
  CHECK(*d.value == 6);
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  CHECK(g.stats().cancellations == 2);
}

TEST_CASE(
    "an inline async_do leader's stop calls on_done inside request_stop while its fn still "
    "runs",
    "[async][cancel]") {
  // Catches: the leader's cancelled_error held back until its fn returns
  // (as a blocking inline leader must), though its caller is not blocked.
  callback_log<int> log;
  std::atomic<bool> fn_entered{false}, fn_saw_stop{false}, returned{false};
  singleflight::stop_source s;
  group_t g;
  sftest::jthread leader([&] {
    g.async_do(
        "k",
        [&](singleflight::stop_token st) {
          fn_entered = true;
          must([&] { return st.stop_requested(); }, "the last waiter leaving stops fn's token");
          fn_saw_stop = true;
          return 1;
        },
        log.on_done(), s.get_token());
    returned = true;
  });
  must([&] { return fn_entered.load(); }, "fn running");
  s.request_stop();
  CHECK(log.is_done());
  CHECK(log.thread == std::this_thread::get_id());
  CHECK(log.threw<sf::cancelled_error>());
  must([&] { return returned.load(); }, "async_do returned");
  leader.join();
  CHECK(fn_saw_stop);
  CHECK(log.calls == 1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE(
    "ownership::waiters: the last async waiter leaving stops the flight's token; the stopped "
    "flight is not joinable",
    "[async][cancel][ownership]") {
  // Catches: the work stopped while a waiter remains, never stopped once all
  // left (a leak of work nobody wants), or a newcomer joining a dead flight.
  callback_log<int> a, b, late;
  singleflight::stop_source sa, sb;
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done(), sa.get_token());
  g.async_do("k", box.fn(), b.on_done(), sb.get_token());
  auto item = box.take("fn parked its completion");
  sa.request_stop();
  CHECK_FALSE(sftest::becomes([&] { return item.first.stop_requested(); }, 50ms));
  sb.request_stop();
  must([&] { return item.first.stop_requested(); }, "flight token stopped by the last leaver");
  CHECK(a.threw<sf::cancelled_error>());
  CHECK(b.threw<sf::cancelled_error>());
  g.async_do("k", box.fn(), late.on_done());
  CHECK(g.stats().joins == 1);  // only b's join: the newcomer did not join
  CHECK_FALSE(late.is_done());
  item.second.set_value(1);  // the stopped work ends; the newcomer starts afresh
  auto second = box.take("newcomer's flight started");
  second.second.set_value(2);
  late.wait("newcomer served");
  CHECK(*late.value == 2);
  CHECK(g.stats().flights == 2);
}

TEST_CASE("ownership::group: async waiters leaving do not stop the work; a newcomer joins it",
          "[async][cancel][ownership]") {
  // Catches: group-owned work stopped when its waiters leave, or made
  // unjoinable.
  callback_log<int> a, c;
  singleflight::stop_source sa;
  group_t g(with(sf::ownership::group));
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done(), sa.get_token());
  auto item = box.take("fn parked its completion");
  sa.request_stop();
  CHECK(a.threw<sf::cancelled_error>());
  g.async_do("k", box.fn(), c.on_done());
  CHECK(g.stats().joins == 1);
  CHECK(box.size() == 0);  // no second fn
  CHECK_FALSE(item.first.stop_requested());
  item.second.set_value(5);
  c.wait("c served");
  CHECK(*c.value == 5);
  CHECK(a.calls == 1);
}

TEST_CASE("ownership::leader: the async leader's stop cancels every waiter on the stopping thread",
          "[async][cancel][ownership]") {
  // Catches: a follower's stop cancelling the work, or the leader's stop
  // cancelling only the leader (followers stranded until the completion).
  callback_log<int> leader, f1, f2;
  sftest::result<int> blocked;
  singleflight::stop_source s_leader, s_f1;
  group_t g(with(sf::ownership::leader));
  completion_box<int> box;
  g.async_do("k", box.fn(), leader.on_done(), s_leader.get_token());
  g.async_do("k", box.fn(), f1.on_done(), s_f1.get_token());
  g.async_do("k", box.fn(), f2.on_done());
  auto tb = sftest::spawn(blocked, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 3; }, "followers joined");
  auto item = box.take("fn parked its completion");
  s_f1.request_stop();  // a follower leaving only stops waiting
  CHECK(f1.threw<sf::cancelled_error>());
  CHECK_FALSE(f2.is_done());
  CHECK_FALSE(item.first.stop_requested());
  const std::thread::id stopper =
      sftest::on_new_thread([&] { s_leader.request_stop(); }, "leader stops");
  CHECK(leader.is_done());
  CHECK(f2.is_done());
  CHECK(leader.thread == stopper);
  CHECK(f2.thread == stopper);
  CHECK(leader.threw<sf::cancelled_error>());
  CHECK(f2.threw<sf::cancelled_error>());
  sftest::finish(tb, blocked, "blocking follower cancelled");
  CHECK(blocked.threw<sf::cancelled_error>());
  must([&] { return item.first.stop_requested(); }, "work stopped");
  item.second.set_value(1);  // too late: nobody is told twice
  CHECK(leader.calls == 1);
  CHECK(f1.calls == 1);
  CHECK(f2.calls == 1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("cancellation racing the settle: each callback waiter gets exactly one outcome",
          "[async][cancel][race]") {
  // Catches: a waiter both cancelled and served (on_done twice) or neither
  // (a lost wake-up) when its stop and the settle meet. Three schedules, in
  // turn; the first two are forced, so both outcomes happen on every run:
  //  * claimed, then stopped: the settle has claimed the racer and is
  //    notifying an earlier waiter of the same batch, whose on_done requests
  //    the racer's stop. The stop callback must lose the claim: the racer is
  //    served, once, on the settling thread.
  //  * left, then settled: the racer's stop makes it leave (the last waiter:
  //    the flight is stopped), and a stop callback on the flight's token
  //    resolves the completion on the stopping thread before the racer is
  //    delivered. The racer is cancelled, once; the late value only frees
  //    the key.
  //  * together: a resolver and a stopper thread released at once (their
  //    starts moved apart by sftest::race_sweep, which seeks the boundary
  //    between the outcomes), alternately with and without a bystander (so
  //    the stop is sometimes the last waiter leaving and sometimes not).
  //    Either outcome; what each machine produces is counted, not required.
  constexpr int iterations = 2000;
  enum schedule { claimed_then_stopped, left_then_settled, together };
  const auto schedule_of = [](int i) {
    return i % 4 == 0 ? claimed_then_stopped : i % 4 == 1 ? left_then_settled : together;
  };
  std::vector<std::unique_ptr<callback_log<int>>> racers, others;
  std::optional<sf::completion<int>> cur_c;
  std::optional<singleflight::stop_source> cur_s;
  std::atomic<int> go{0}, acted{0};
  group_t g;
  completion_box<int> box;
  // The workers act once per `together` round i (go = i), and return when
  // go passes the last round.
  const auto worker = [&](auto act) {
    return [&go, &acted, act] {
      for (int seen = 0;;) {
        must([&] { return go.load() > seen; }, "worker released");
        seen = go.load();
        if (seen > iterations) return;
        act(seen);
        acted.fetch_add(1);
      }
    };
  };
  // In `together` rounds a sweep moves the start of the two sides apart,
  // towards the boundary between the outcomes, where the stop meets the
  // settle (see sftest::race_sweep).
  sftest::race_sweep sweep;
  sftest::thread resolver(worker([&](int i) {
    sweep.hold_a();
    cur_c->set_value(i);
  }));
  sftest::thread stopper(worker([&](int) {
    sweep.hold_b();
    cur_s->request_stop();
  }));
  int served = 0, cancelled = 0, wrong = 0, others_wrong = 0, joins = 0;
  int raced_served = 0, raced_cancelled = 0;
  for (int i = 1; i <= iterations; ++i) {
    racers.push_back(std::make_unique<callback_log<int>>());
    callback_log<int>& r = *racers.back();
    cur_s.emplace();
    switch (schedule_of(i)) {
      case claimed_then_stopped: {
        others.push_back(std::make_unique<callback_log<int>>());
        callback_log<int>& first = *others.back();
        first.probe = [&] { cur_s->request_stop(); };  // the racer is claimed, not yet notified
        g.async_do("k", box.fn(), first.on_done());
        g.async_do("k", box.fn(), r.on_done(), cur_s->get_token());
        ++joins;
        box.take("fn parked its completion").second.set_value(i);  // both notified here
        REQUIRE(first.is_done());
        REQUIRE(r.is_done());
        CHECK(cur_s->stop_requested());
        if (!first.value || *first.value != i) ++others_wrong;
        break;
      }
      case left_then_settled: {
        g.async_do("k", box.fn(), r.on_done(), cur_s->get_token());
        auto item = box.take("fn parked its completion");
        sf::completion<int> c = std::move(item.second);
        bool racer_delivered_first = true;
        singleflight::stop_callback resolve_now(item.first, [&] {
          racer_delivered_first = r.is_done();
          c.set_value(i);  // the flight was stopped: this only frees the key
        });
        cur_s->request_stop();  // the racer leaves, the flight stops, the value comes, then on_done
        REQUIRE(r.is_done());
        CHECK_FALSE(racer_delivered_first);
        CHECK_FALSE(c);
        CHECK(g.in_flight() == 0);  // freed by the late value, before request_stop returned
        break;
      }
      case together: {
        g.async_do("k", box.fn(), r.on_done(), cur_s->get_token());
        const bool bystander = i % 2 == 0;
        if (bystander) {
          others.push_back(std::make_unique<callback_log<int>>());
          g.async_do("k", box.fn(), others.back()->on_done());
          ++joins;
        }
        cur_c.emplace(std::move(box.take("fn parked its completion").second));
        const int before = acted.load();
        go.store(i);  // both workers start at once
        must([&] { return acted.load() == before + 2; }, "resolver and stopper both returned");
        must([&] { return r.is_done(); }, "racer got an outcome");
        if (bystander) {
          callback_log<int>& b = *others.back();
          must([&] { return b.is_done(); }, "bystander got an outcome");
          if (!b.value || *b.value != i) ++others_wrong;
        }
        if (r.value && *r.value == i) ++raced_served;
        if (r.threw<sf::cancelled_error>()) ++raced_cancelled;
        sweep.record(/*a_won=*/r.value == i);
        break;
      }
    }
    if (r.value && *r.value == i) {
      ++served;
    } else if (r.threw<sf::cancelled_error>()) {
      ++cancelled;
    } else {
      ++wrong;
    }
    if (schedule_of(i) == claimed_then_stopped) CHECK(r.value == i);
    if (schedule_of(i) == left_then_settled) CHECK(r.threw<sf::cancelled_error>());
    must([&] { return g.in_flight() == 0; }, "entry gone once the completion resolved");
  }
  go.store(iterations + 1);
  resolver.join("resolver returned");
  stopper.join("stopper returned");
  CHECK(wrong == 0);
  CHECK(others_wrong == 0);
  CHECK(served + cancelled == iterations);
  CHECK(served > 0);     // forced: claimed_then_stopped rounds
  CHECK(cancelled > 0);  // forced: left_then_settled rounds
  int twice = 0;
  for (auto& r : racers) twice += r->calls.load() != 1;
  for (auto& b : others) twice += b->calls.load() != 1;
  CHECK(twice == 0);
  const auto s = g.stats();
  CHECK(s.flights == iterations);
  CHECK(s.joins == static_cast<std::uint64_t>(joins));
  CHECK(s.cancellations == static_cast<std::uint64_t>(cancelled));
  CHECK(s.calls == s.flights + s.joins + s.rejections);
  UNSCOPED_INFO("served " << served << ", cancelled " << cancelled << "; raced rounds: served "
                          << raced_served << ", cancelled " << raced_cancelled << "; final offset "
                          << sweep.offset_ns() << " ns");
  SUCCEED();
}

// ---- deadline and close ------------------------------------------------------

TEST_CASE(
    "a deadline gives async waiters timeout_error on the delivery thread, not the timer; the "
    "key stays taken until the completion resolves",
    "[async][deadline]") {
  // Catches: async waiters outliving the deadline, delivered on a caller's
  // thread or on the timer thread (a callback that blocks there would stall
  // every other deadline), a late completion delivering a second outcome, or
  // the entry erased while the stopped work is still unresolved.
  callback_log<int> a, b;
  std::atomic<std::thread::id> stop_thread{};
  sf::options o;
  o.timeout = 200ms;
  group_t g(o);
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done());
  auto item = box.take("fn parked its completion");
  singleflight::stop_callback on_stop(item.first,
                                      [&] { stop_thread = std::this_thread::get_id(); });
  g.async_do("k", box.fn(), b.on_done());
  a.wait("deadline reached a");
  b.wait("deadline reached b");
  CHECK(a.threw<sf::timeout_error>());
  CHECK(b.threw<sf::timeout_error>());
  must([&] { return item.first.stop_requested(); }, "flight token stopped");
  CHECK(stop_thread.load() != std::this_thread::get_id());  // else the deadline beat on_stop
  // The timer stops the token (on_stop ran there); the group's delivery
  // thread runs the callbacks.
  CHECK(a.thread != stop_thread.load());
  CHECK(a.thread != std::this_thread::get_id());
  CHECK(b.thread == a.thread);
  CHECK(g.stats().timeouts == 1);
  CHECK(g.in_flight() == 1);
  item.second.set_value(1);
  CHECK(g.in_flight() == 0);
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
}

TEST_CASE(
    "close() gives async waiters closed_error on the closing thread and waits for pending "
    "completions",
    "[async][close]") {
  // Catches: close() returning while a completion it stopped is still held
  // (the owner could destroy the group under it), waiters not released, or
  // released on another thread.
  callback_log<int> a, b, late;
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done());
  g.async_do("k", box.fn(), b.on_done());
  auto item = box.take("fn parked its completion");
  SECTION("close_for") {
    CHECK_FALSE(g.close_for(50ms));
    CHECK(a.is_done());
    CHECK(b.is_done());
    CHECK(a.thread == std::this_thread::get_id());
    CHECK(b.thread == std::this_thread::get_id());
    CHECK(item.first.stop_requested());
    CHECK_FALSE(g.close_for(1ms));  // still held
    item.second.set_value(1);
    CHECK(g.close_for(sftest::bound));
  }
  SECTION("close") {
    std::atomic<bool> close_returned{false};
    sftest::jthread closer([&] {
      g.close();
      close_returned = true;
    });
    const std::thread::id closer_id = closer.get_id();
    a.wait("a released by close");
    b.wait("b released by close");
    CHECK(a.thread == closer_id);
    CHECK(b.thread == closer_id);
    CHECK_FALSE(sftest::becomes([&] { return close_returned.load(); }, 100ms));
    item.second.set_value(1);
    must([&] { return close_returned.load(); }, "close returned once the completion resolved");
    closer.join();
  }
  CHECK(a.threw<sf::closed_error>());
  CHECK(b.threw<sf::closed_error>());
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
  g.async_do("k", box.fn(), late.on_done());
  CHECK(late.threw<sf::closed_error>());
  CHECK(g.in_flight() == 0);
}

TEST_CASE("a deadline frees async joiners of an inline sync leader without waiting for its fn",
          "[async][deadline]") {
  // Catches: async joiners held until the inline leader's fn returns, though
  // the deadline passed (only the inline leader itself may be held).
  callback_log<int> joiner;
  std::atomic<bool> fn_entered{false};
  sftest::result<int> leader;
  gate release;
  sf::options o;
  o.timeout = 50ms;
  group_t g(o);
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      fn_entered = true;
      release.wait("inline fn released");  // ignores its token
      return 1;
    });
  });
  must([&] { return fn_entered.load(); }, "inline fn running");
  g.async_do(
      "k", [] { return -1; }, joiner.on_done());
  joiner.wait("deadline reached the async joiner");
  CHECK(joiner.threw<sf::timeout_error>());
  CHECK_FALSE(leader.done.load());  // the inline leader is still inside fn
  release.open();
  sftest::finish(tl, leader, "inline leader returned");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(joiner.calls == 1);
}

TEST_CASE("close() does not wait for an on_done already under way", "[async][close]") {
  // Catches: close() counting a delivered callback as a user of the group: an
  // on_done that waits for the closing thread would deadlock it.
  callback_log<int> log;
  std::atomic<bool> in_on_done{false}, close_returned{false};
  gate release;
  log.probe = [&] {
    in_on_done = true;
    release.wait("on_done released");
  };
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), log.on_done());
  auto item = box.take("fn parked its completion");
  sftest::thread resolver([&] { item.second.set_value(1); });
  must([&] { return in_on_done.load(); }, "on_done running");
  sftest::jthread closer([&] {
    g.close();
    close_returned = true;
  });
  must([&] { return close_returned.load(); }, "close() returned while on_done still runs");
  release.open();
  log.wait("on_done returned");
  resolver.join("the resolver returned (on_done ran on it)");
  REQUIRE(log.value);
  CHECK(*log.value == 1);
}

TEST_CASE("close() from inside on_done does not deadlock", "[async][close][reentrant]") {
  // Catches: close() waiting for the call that is running it (the resolving
  // thread inside set_value, async_do running fn inline, or close() itself
  // delivering closed_error).
  callback_log<int> log, other;
  std::atomic<bool> closing_inside{false}, closed_inside{false};
  auto g = std::make_unique<group_t>();
  log.probe = [&] {
    closing_inside = true;
    g->close();
    closed_inside = true;
  };
  SECTION("on the thread resolving the completion") {
    completion_box<int> box;
    g->async_do("k", box.fn(), log.on_done());
    g->async_do("k", box.fn(), other.on_done());
    auto item = box.take("fn parked its completion");
    sftest::on_new_thread([&] { item.second.set_value(1); }, "set_value with close inside");
    CHECK(*log.value == 1);
    other.wait("other served");
    CHECK(other.calls == 1);
  }
  SECTION("inside async_do, after an inline sync fn") {
    sftest::on_new_thread(
        [&] {
          g->async_do(
              "k", [] { return 2; }, log.on_done());
        },
        "async_do with close inside");
    CHECK(*log.value == 2);
  }
  SECTION("inside close(), delivering closed_error") {
    completion_box<int> box;
    g->async_do("k", box.fn(), log.on_done());
    auto item = box.take("fn parked its completion");
    std::atomic<bool> outer_returned{false};
    sftest::jthread closer([&] {
      g->close();
      outer_returned = true;
    });
    must([&] { return closing_inside.load(); }, "on_done entered close()");
    item.second.set_value(1);  // the pending completion both closes wait for
    must([&] { return closed_inside.load(); }, "close() inside on_done returned");
    must([&] { return outer_returned.load(); }, "outer close() returned");
    closer.join();
    CHECK(log.threw<sf::closed_error>());
  }
  CHECK(closed_inside);
  CHECK(log.calls == 1);
  callback_log<int> after;
  g->async_do(
      "k", [] { return 3; }, after.on_done());
  CHECK(after.threw<sf::closed_error>());
  g.reset();
}

// ---- re-entry and the lock ---------------------------------------------------

TEST_CASE("on_done may re-enter the group: same key starts a new flight, other keys, do_",
          "[async][reentrant]") {
  // Catches: on_done run under the group's lock (stats() would self-deadlock),
  // or the settled flight still joinable from on_done (the same key would get
  // the old outcome instead of a new flight).
  callback_log<int> outer, same_key, other_key;
  std::atomic<int> do_result{0};
  std::atomic<std::size_t> in_flight_inside{99};
  group_t g;
  completion_box<int> box;
  outer.probe = [&] {
    in_flight_inside = g.stats().in_flight;
    (void)g.in_flight();
    g.async_do(
        "k", [] { return 2; }, same_key.on_done());
    g.async_do(
        "other", [] { return 3; }, other_key.on_done());
    do_result = g.do_("third", [] { return 4; });
  };
  g.async_do("k", box.fn(), outer.on_done());
  auto item = box.take("fn parked its completion");
  sftest::on_new_thread([&] { item.second.set_value(1); }, "set_value with re-entry inside");
  CHECK(*outer.value == 1);
  CHECK(in_flight_inside == 0);
  same_key.wait("same key served");
  other_key.wait("other key served");
  CHECK(*same_key.value == 2);  // a new flight, not the settled one
  CHECK(*other_key.value == 3);
  CHECK(do_result == 4);
  CHECK(g.stats().flights == 4);
  CHECK(g.stats().joins == 0);
}

TEST_CASE("on_done never runs under the group's lock, on any path", "[async][reentrant]") {
  // Catches: any delivery path calling on_done with the group's mutex held:
  // the probe (stats, in_flight, forget) would deadlock and the bounded wait
  // names the path.
  callback_log<int> log, log2;
  std::atomic<int> probes{0};
  auto probe_for = [&](group_t& g) {
    return [&g, &probes] {
      (void)g.stats();
      (void)g.in_flight();
      (void)g.forget("unrelated");
      probes.fetch_add(1);
    };
  };
  SECTION("completion resolved") {
    group_t g;
    log.probe = probe_for(g);
    completion_box<int> box;
    g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("completion");
    sftest::on_new_thread([&] { item.second.set_value(1); }, "set_value");
  }
  SECTION("completion dropped") {
    group_t g;
    log.probe = probe_for(g);
    completion_box<int> box;
    g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("completion");
    sftest::on_new_thread([&] { sf::completion<int> dying = std::move(item.second); }, "drop");
  }
  SECTION("async fn throws") {
    group_t g;
    log.probe = probe_for(g);
    sftest::on_new_thread(
        [&] {
          g.async_do(
              "k", [](singleflight::stop_token, sf::completion<int>) { throw not_an_exception{1}; },
              log.on_done());
        },
        "async_do");
  }
  SECTION("sync fn inline") {
    group_t g;
    log.probe = probe_for(g);
    sftest::on_new_thread(
        [&] {
          g.async_do(
              "k", [] { return 1; }, log.on_done());
        },
        "async_do");
  }
  SECTION("executor thread") {
    group_t g(with_threads());
    log.probe = probe_for(g);
    g.async_do(
        "k", [] { return 1; }, log.on_done());
    log.wait("executor delivered");
  }
  SECTION("caller's stop") {
    group_t g;
    log.probe = probe_for(g);
    completion_box<int> box;
    singleflight::stop_source s;
    g.async_do("k", box.fn(), log.on_done(), s.get_token());
    auto item = box.take("completion");
    sftest::on_new_thread([&] { s.request_stop(); }, "request_stop");
    item.second.set_value(1);
  }
  SECTION("ownership::leader cancels a follower") {
    group_t g(with(sf::ownership::leader));
    log.probe = probe_for(g);
    log2.probe = probe_for(g);
    completion_box<int> box;
    singleflight::stop_source s;
    g.async_do("k", box.fn(), log2.on_done(), s.get_token());
    g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("completion");
    sftest::on_new_thread([&] { s.request_stop(); }, "leader's request_stop");
    item.second.set_value(1);
    log2.wait("leader cancelled");
  }
  SECTION("deadline") {
    sf::options o;
    o.timeout = 10ms;
    group_t g(o);
    log.probe = probe_for(g);
    completion_box<int> box;
    g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("completion");
    log.wait("deadline delivered");
    item.second.set_value(1);
  }
  SECTION("close") {
    group_t g;
    log.probe = probe_for(g);
    completion_box<int> box;
    g.async_do("k", box.fn(), log.on_done());
    auto item = box.take("completion");
    sftest::on_new_thread([&] { (void)g.close_for(1ms); }, "close_for");
    item.second.set_value(1);
  }
  SECTION("immediate: closed") {
    group_t g;
    log.probe = probe_for(g);
    g.close();
    sftest::on_new_thread(
        [&] {
          g.async_do(
              "k", [] { return 1; }, log.on_done());
        },
        "async_do");
  }
  SECTION("immediate: already stopped") {
    group_t g;
    log.probe = probe_for(g);
    singleflight::stop_source s;
    s.request_stop();
    sftest::on_new_thread(
        [&] {
          g.async_do(
              "k", [] { return 1; }, log.on_done(), s.get_token());
        },
        "async_do");
  }
  SECTION("immediate: overloaded") {
    sf::options o;
    o.max_in_flight = 1;
    group_t g(o);
    log.probe = probe_for(g);
    completion_box<int> box;
    g.async_do("a", box.fn(), log2.on_done());
    auto item = box.take("completion");
    sftest::on_new_thread(
        [&] {
          g.async_do(
              "b", [] { return 1; }, log.on_done());
        },
        "async_do");
    CHECK(log.threw<sf::overloaded_error>());
    item.second.set_value(1);
  }
  log.wait("on_done called");
  CHECK(log.calls == 1);
  CHECK(probes >= 1);
}

// ---- forget, no-overlap ----------------------------------------------------

TEST_CASE(
    "forget(key) with async waiters: they keep the old flight; a newcomer starts a new one "
    "that the old completion does not evict",
    "[async][forget]") {
  // Catches: forget() failing the old waiters, a newcomer joining the
  // forgotten flight, or the old completion erasing the new entry by key.
  callback_log<int> a, b, newcomer, joiner;
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done());
  g.async_do("k", box.fn(), b.on_done());
  auto first = box.take("first flight's completion");
  CHECK(g.forget("k"));
  CHECK_FALSE(a.is_done());
  g.async_do("k", box.fn(), newcomer.on_done());
  auto second = box.take("second flight's completion");
  CHECK(g.stats().flights == 2);
  first.second.set_value(1);
  a.wait("a served");
  b.wait("b served");
  CHECK(*a.value == 1);
  CHECK(*b.value == 1);
  CHECK_FALSE(newcomer.is_done());
  CHECK(g.in_flight() == 1);  // the second flight's entry survived
  g.async_do("k", box.fn(), joiner.on_done());
  CHECK(g.stats().joins == 2);  // b, and the joiner joined the second flight
  second.second.set_value(2);
  newcomer.wait("newcomer served");
  joiner.wait("joiner served");
  CHECK(*newcomer.value == 2);
  CHECK(*joiner.value == 2);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("a stopped async flight keeps its key until its completion resolves: fns never overlap",
          "[async][overlap]") {
  // Catches: a newcomer starting a second fn while the stopped one's work is
  // unresolved (overlap), joining the stopped flight, or receiving its outcome.
  callback_log<int> a;
  sftest::overlap_meter meter;
  singleflight::stop_source sa;
  group_t g;
  completion_box<int> box;
  auto metered = [&](singleflight::stop_token st, sf::completion<int> c) {
    meter.enter();
    box.put(std::move(st), std::move(c));
  };
  auto resolve = [&](std::pair<singleflight::stop_token, sf::completion<int>>& item, int v) {
    meter.leave();
    item.second.set_value(v);
  };
  g.async_do("k", metered, a.on_done(), sa.get_token());
  auto first = box.take("first completion");
  sa.request_stop();  // the only waiter leaves: the flight is stopped, its work unresolved
  CHECK(first.first.stop_requested());
  CHECK(a.threw<sf::cancelled_error>());

  SECTION("newcomers wait, then share one new flight") {
    callback_log<int> n1, n2;
    g.async_do("k", metered, n1.on_done());
    g.async_do("k", metered, n2.on_done());
    CHECK_FALSE(sftest::becomes([&] { return meter.calls.load() == 2; }, 100ms));
    CHECK(g.stats().joins == 0);
    CHECK(g.in_flight() == 1);
    CHECK_FALSE(n1.is_done());
    resolve(first, 1);
    auto second = box.take("newcomers' flight started");
    CHECK(g.stats().joins == 1);  // the two newcomers coalesced
    resolve(second, 2);
    n1.wait("n1 served");
    n2.wait("n2 served");
    CHECK(*n1.value == 2);  // not the stopped flight's value
    CHECK(*n2.value == 2);
    CHECK(meter.calls == 2);
    CHECK(meter.peak == 1);
    CHECK(g.stats().flights == 2);
  }
  SECTION("a waiting newcomer can leave on its token") {
    callback_log<int> n1;
    singleflight::stop_source s1;
    g.async_do("k", metered, n1.on_done(), s1.get_token());
    CHECK_FALSE(n1.is_done());
    s1.request_stop();
    CHECK(n1.is_done());
    CHECK(n1.thread == std::this_thread::get_id());
    CHECK(n1.threw<sf::cancelled_error>());
    resolve(first, 1);
    CHECK(g.in_flight() == 0);
    CHECK(meter.calls == 1);  // nobody left to start a new flight
    CHECK(n1.calls == 1);
  }
}

TEST_CASE(
    "an async newcomer waiting for a stopped predecessor gives up at options.timeout with "
    "timeout_error",
    "[async][overlap][deadline]") {
  // Catches: an async caller waiting for a hung predecessor without bound
  // (the deadline must cover the wait too, counted from its arrival).
  callback_log<int> a, b;
  singleflight::stop_source sa;
  sf::options o;
  o.timeout = 50ms;
  group_t g(o);
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done(), sa.get_token());
  auto first = box.take("first completion");
  sa.request_stop();  // stopped; its work stays unresolved (a hung origin)
  g.async_do("k", box.fn(), b.on_done());
  b.wait("newcomer gave up");
  CHECK(b.threw<sf::timeout_error>());
  CHECK(b.thread != std::this_thread::get_id());  // the delivery thread
  CHECK(box.size() == 0);                         // it never started a second fn
  CHECK(g.in_flight() == 1);
  first.second.set_value(1);
  CHECK(g.in_flight() == 0);
  CHECK(b.calls == 1);
}

TEST_CASE("an async caller waiting for a winding-down fn keeps its own copy of the key",
          "[async][overlap][keys]") {
  // Catches: a waiting async caller that keeps a reference to the caller's
  // key (a string_view into a buffer freed after async_do returned) and reads
  // it when it goes round again: a use-after-free (ASan) or a flight for the
  // wrong key.
  callback_log<int> a, b, c;
  singleflight::stop_source sa;
  group_t g;
  completion_box<int> box;
  g.async_do("k", box.fn(), a.on_done(), sa.get_token());
  auto first = box.take("first completion");
  sa.request_stop();
  {
    auto buffer = std::make_unique<std::string>("k");
    g.async_do(std::string_view(*buffer), box.fn(), b.on_done());
    *buffer = "x";
    buffer.reset();  // the caller's key is gone
  }
  CHECK_FALSE(b.is_done());
  first.second.set_value(1);
  auto second = box.take("b's flight started");
  g.async_do("k", box.fn(), c.on_done());
  CHECK(g.stats().joins == 1);  // c joined b's flight: it is for "k"
  second.second.set_value(2);
  b.wait("b served");
  c.wait("c served");
  CHECK(*b.value == 2);
  CHECK(*c.value == 2);
}

TEST_CASE("a stopped async flight whose completion is unresolved counts toward max_in_flight",
          "[async][bounds]") {
  // Catches: a stopped but unresolved flight dropped from the cap (the map
  // would grow past max_in_flight with hung origins).
  callback_log<int> a, b;
  singleflight::stop_source sa;
  sf::options o;
  o.max_in_flight = 1;
  group_t g(o);
  completion_box<int> box;
  g.async_do("a", box.fn(), a.on_done(), sa.get_token());
  auto first = box.take("first completion");
  sa.request_stop();
  CHECK(g.in_flight() == 1);
  g.async_do("b", box.fn(), b.on_done());
  CHECK(b.threw<sf::overloaded_error>());
  first.second.set_value(1);
  CHECK(g.in_flight() == 0);
}

// ---- exception safety ------------------------------------------------------

namespace {
struct throwing_hash {
  std::size_t operator()(int k) const {
    if (k < 0) throw std::runtime_error("hash failed");
    return static_cast<std::size_t>(k);
  }
};
}  // namespace

TEST_CASE("async_do that throws itself (Hash) never calls on_done", "[async]") {
  // Catches: on_done called as well as the throw (a caller would handle the
  // failure twice), or a half-inserted entry.
  callback_log<int> log;
  sf::group<int, int, throwing_hash> g;
  CHECK_THROWS_AS(g.async_do(
                      -1, [] { return 1; }, log.on_done()),
                  std::runtime_error);
  CHECK(log.calls == 0);
  CHECK(g.in_flight() == 0);
  g.async_do(
      1, [] { return 1; }, log.on_done());
  CHECK(*log.value == 1);
}
