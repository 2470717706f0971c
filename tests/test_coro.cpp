// Coroutine waiters: `co_await group::co_do(key, fn, caller)`, with
// synchronous fns (inline or on an executor) and asynchronous fns
// (`void(singleflight::stop_token, completion<T>)`), mixed with blocking and callback
// waiters. The coroutines are sftest::fire_task (support/coro.hpp): eager,
// detached, recording their outcome, the thread of their last step and how
// many co_awaits really suspended. One test case per contract point; each
// says which bug it catches. Every wait is bounded.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
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
using sftest::fire_task;
using sftest::gate;
using sftest::must;
using group_t = sf::group<std::string, int>;

using sftest::address_of;
using sftest::not_an_exception;
using sftest::with;

// A coroutine waiter: co_awaits the flight for `key` and returns its value.
// Everything it uses is a parameter, so it lives in the coroutine's frame.
template <class G, class F>
fire_task<typename G::value_type> co_wait(G& g, std::string key, F fn,
                                          singleflight::stop_token st = {}) {
  co_return co_await g.co_do(key, fn, std::move(st));
}

// The same through a stored awaitable (`co_await std::move(a)`).
template <class F>
fire_task<int> co_wait_stored(group_t& g, std::string key, F fn) {
  auto awaitable = g.co_do(key, fn);
  co_return co_await std::move(awaitable);
}

// A coroutine waiter with an int key: converted to the group's Key inside co_do.
template <class G, class F>
fire_task<int> co_wait_int(G& g, int key, F fn) {
  co_return co_await g.co_do(key, fn);
}

}  // namespace

// ---- values, copies, shared errors -----------------------------------------

TEST_CASE(
    "every coroutine waiter resumes once with the value, on the thread resolving the "
    "completion",
    "[coro]") {
  // Catches: a coroutine never resumed, resumed twice (the frame is destroyed
  // at its end: ASan), resumed before the value exists, on the wrong thread,
  // or one that did not really suspend while the work was pending.
  constexpr int n = 6;
  std::atomic<int> fn_calls{0};
  group_t g;
  completion_box<int> box;
  auto fn = [&](singleflight::stop_token st, sf::completion<int> c) {
    fn_calls.fetch_add(1);
    box.put(std::move(st), std::move(c));
  };
  std::vector<fire_task<int>> tasks;
  for (int i = 0; i < n - 1; ++i) tasks.push_back(co_wait(g, "k", fn));
  tasks.push_back(co_wait_stored(g, "k", fn));
  CHECK(g.stats().flights == 1);
  CHECK(g.stats().joins == n - 1);
  for (auto& t : tasks) CHECK_FALSE(t.done());
  auto item = box.take("fn parked its completion");
  const std::thread::id resolver =
      sftest::on_new_thread([&] { item.second.set_value(42); }, "set_value");
  for (auto& t : tasks) {
    t.wait("coroutine finished");
    REQUIRE(t.get().value);
    CHECK(*t.get().value == 42);
    CHECK(t.get().finished_on == resolver);
    CHECK(t.get().suspensions == 1);
  }
  CHECK(fn_calls == 1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("each coroutine waiter receives its own copy of the value", "[coro]") {
  // Catches: the flight's value moved out for the first waiter and the others
  // handed a moved-from (empty) string.
  constexpr int n = 5;
  const std::string payload = "a value long enough to live on the heap, not in SSO";
  sf::group<std::string, std::string> g;
  completion_box<std::string> box;
  std::vector<fire_task<std::string>> tasks;
  for (int i = 0; i < n; ++i) tasks.push_back(co_wait(g, "k", box.fn()));
  auto item = box.take("fn parked its completion");
  sftest::on_new_thread([&] { item.second.set_value(payload); }, "set_value");
  for (auto& t : tasks) {
    t.wait("coroutine finished");
    REQUIRE(t.get().value);
    CHECK(*t.get().value == payload);
  }
}

TEST_CASE("an exception from fn reaches every coroutine waiter as the same object", "[coro]") {
  // Catches: the error copied or sliced per coroutine, or lost (the coroutine
  // resuming with no value and no exception).
  constexpr int n = 4;
  group_t g;
  completion_box<int> box;
  std::vector<fire_task<int>> tasks;
  for (int i = 0; i < n; ++i) tasks.push_back(co_wait(g, "k", box.fn()));
  auto item = box.take("fn parked its completion");
  sftest::on_new_thread(
      [&] { item.second.set_exception(std::make_exception_ptr(not_an_exception{77})); },
      "set_exception");
  for (auto& t : tasks) t.wait("coroutine finished");
  const void* first = address_of<not_an_exception>(tasks[0].get().error);
  REQUIRE(first != nullptr);
  for (auto& t : tasks) {
    CHECK_FALSE(t.get().value);
    CHECK(t.get().error == tasks[0].get().error);
    CHECK(address_of<not_an_exception>(t.get().error) == first);
  }
  CHECK(g.stats().failures == 1);
  CHECK(g.in_flight() == 0);
}

// ---- immediate outcomes ------------------------------------------------------

TEST_CASE("immediate outcomes complete co_await without suspending, on the calling thread",
          "[coro]") {
  // Catches: a coroutine suspended (and resumed elsewhere or later) for an
  // outcome known at once, or a rejected caller that still starts or joins.
  std::atomic<int> fn_calls{0};
  auto counting_fn = [&] { return fn_calls.fetch_add(1), 1; };
  const auto me = std::this_thread::get_id();
  std::optional<fire_task<int>> t;

  SECTION("closed group: closed_error") {
    group_t g;
    g.close();
    t.emplace(co_wait(g, "k", counting_fn));
    REQUIRE(t->done());
    CHECK(t->get().threw<sf::closed_error>());
  }
  SECTION("already-stopped token: cancelled_error, neither starts nor joins") {
    group_t g;
    completion_box<int> box;
    auto holder = co_wait(g, "k", box.fn());  // a flight it could have joined
    singleflight::stop_source s;
    s.request_stop();
    t.emplace(co_wait(g, "k", counting_fn, s.get_token()));
    REQUIRE(t->done());
    CHECK(t->get().threw<sf::cancelled_error>());
    auto fresh = co_wait(g, "fresh", counting_fn, s.get_token());
    CHECK(fresh.done());
    CHECK(g.stats().joins == 0);
    CHECK(g.stats().flights == 1);
    CHECK(g.stats().cancellations == 2);
    box.take("holder's completion").second.set_value(1);
    holder.wait("holder served");
  }
  SECTION("max_in_flight reached: overloaded_error; joining still works") {
    sf::options o;
    o.max_in_flight = 1;
    group_t g(o);
    completion_box<int> box;
    auto holder = co_wait(g, "a", box.fn());
    t.emplace(co_wait(g, "b", counting_fn));
    REQUIRE(t->done());
    CHECK(t->get().threw<sf::overloaded_error>());
    auto joiner = co_wait(g, "a", counting_fn);
    CHECK_FALSE(joiner.done());
    CHECK(g.stats().overloaded == 1);
    box.take("holder's completion").second.set_value(5);
    joiner.wait("joiner served");
    CHECK(*joiner.get().value == 5);
  }
  SECTION("a sync fn that ran inline to completion") {
    group_t g;
    std::atomic<std::thread::id> fn_thread{};
    t.emplace(co_wait(g, "k", [&] {
      fn_thread = std::this_thread::get_id();
      return 9;
    }));
    REQUIRE(t->done());
    CHECK(*t->get().value == 9);
    CHECK(fn_thread.load() == me);
  }
  CHECK(t->get().finished_on == me);
  CHECK(t->get().suspensions == 0);
  CHECK(fn_calls == 0);
}

// ---- where fn runs and where coroutines resume -------------------------------

TEST_CASE(
    "a coroutine joining an inline sync fn's flight suspends and resumes on the leader's "
    "thread",
    "[coro]") {
  // Catches: a joining coroutine that blocks its thread until the flight
  // ends, or resumes anywhere but where fn returned.
  std::atomic<bool> fn_entered{false}, leader_returned{false};
  gate release;
  group_t g;
  sftest::jthread leader([&] {
    (void)g.do_("k", [&] {
      fn_entered = true;
      release.wait("fn released");
      return 7;
    });
    leader_returned = true;
  });
  const std::thread::id leader_id = leader.get_id();
  must([&] { return fn_entered.load(); }, "fn running");
  auto joiner = co_wait(g, "k", [] { return -1; });  // returns at once, suspended
  CHECK_FALSE(joiner.done());
  CHECK(g.stats().joins == 1);
  release.open();
  joiner.wait("joiner resumed");
  must([&] { return leader_returned.load(); }, "leader returned");
  leader.join();
  CHECK(*joiner.get().value == 7);
  CHECK(joiner.get().finished_on == leader_id);
  CHECK(joiner.get().suspensions == 1);
}

TEST_CASE("with an executor the coroutine suspends and resumes on the executor's thread",
          "[coro][executor]") {
  // Catches: fn run inline on the awaiting thread despite the executor, or the
  // coroutine resumed anywhere but where fn returned.
  std::atomic<std::thread::id> fn_thread{};
  std::atomic<int> fn_calls{0};
  auto fn_body = [&] {
    fn_calls.fetch_add(1);
    fn_thread = std::this_thread::get_id();
    return 3;
  };
  std::optional<fire_task<int>> a, b;
  SECTION("thread_executor") {
    gate release;
    sf::options o;
    o.executor = sf::thread_executor{};
    group_t g(o);
    a.emplace(co_wait(g, "k", [&] {
      release.wait("fn released");
      return fn_body();
    }));
    b.emplace(co_wait(g, "k", fn_body));
    CHECK_FALSE(a->done());
    release.open();
    a->wait("a resumed");
    b->wait("b resumed");
    CHECK(fn_thread.load() != std::this_thread::get_id());
  }
  SECTION("a queueing executor; the test runs the task on a thread of its own") {
    sftest::manual_executor ex;
    sf::options o;
    o.executor = ex.executor();
    group_t g(o);
    a.emplace(co_wait(g, "k", fn_body));
    b.emplace(co_wait(g, "k", fn_body));
    CHECK(ex.queued() == 1);
    CHECK_FALSE(a->done());
    sf::task task = ex.take("task queued");
    const std::thread::id runner = sftest::on_new_thread([&] { task(); }, "task ran");
    CHECK(fn_thread.load() == runner);
    a->wait("a resumed");
    b->wait("b resumed");
  }
  CHECK(fn_calls == 1);
  for (auto* t : {&a, &b}) {
    CHECK(*(*t)->get().value == 3);
    CHECK((*t)->get().finished_on == fn_thread.load());
    CHECK((*t)->get().suspensions == 1);
  }
}

// ---- async fns ---------------------------------------------------------------

TEST_CASE("co_do with an async fn: resolved inside fn, thrown before returning, dropped",
          "[coro]") {
  // Catches: a completion resolved inside fn lost or delivered twice; fn's own
  // exception replaced by broken_promise_error; a dropped completion
  // stranding coroutines or leaving the key taken.
  group_t g;
  SECTION("resolved inside fn: the value, on fn's thread") {
    std::atomic<std::thread::id> fn_thread{};
    auto t = co_wait(g, "k", [&](singleflight::stop_token, sf::completion<int> c) {
      fn_thread = std::this_thread::get_id();
      c.set_value(11);
    });
    t.wait("coroutine finished");
    CHECK(*t.get().value == 11);
    CHECK(t.get().finished_on == fn_thread.load());
  }
  SECTION("fn throws before returning: that exception") {
    auto t = co_wait(
        g, "k", [](singleflight::stop_token, sf::completion<int>) { throw not_an_exception{9}; });
    t.wait("coroutine finished");
    CHECK(t.get().threw<not_an_exception>());
    CHECK_FALSE(t.get().threw<sf::broken_promise_error>());
    CHECK(g.stats().failures == 1);
  }
  SECTION("completion dropped: broken_promise_error for every waiter, then a new flight") {
    completion_box<int> box;
    auto a = co_wait(g, "k", box.fn());
    auto b = co_wait(g, "k", box.fn());
    auto item = box.take("fn parked its completion");
    const std::thread::id dropper = sftest::on_new_thread(
        [&] { sf::completion<int> dying = std::move(item.second); }, "completion dropped");
    for (auto* t : {&a, &b}) {
      t->wait("coroutine finished");
      CHECK(t->get().threw<sf::broken_promise_error>());
      CHECK(t->get().finished_on == dropper);
    }
    CHECK(g.stats().failures == 1);
    CHECK(g.in_flight() == 0);
    auto next = co_wait(g, "k", box.fn());
    CHECK(g.stats().flights == 2);
    box.take("second flight's completion").second.set_value(2);
    next.wait("next finished");
    CHECK(*next.get().value == 2);
  }
  CHECK(g.in_flight() == 0);
}

TEST_CASE(
    "a coroutine started inside fn for fn's own key joins and gets the value, not "
    "logic_error",
    "[coro][reentrant]") {
  // Catches: the self-deadlock check applied to a waiter that does not block.
  group_t g;
  std::optional<fire_task<int>> inner;
  const int v = g.do_("k", [&] {
    inner.emplace(co_wait(g, "k", [] { return -1; }));
    return 4;
  });
  CHECK(v == 4);
  inner->wait("inner finished");
  CHECK(*inner->get().value == 4);
  CHECK(inner->get().suspensions == 1);
  CHECK(g.stats().joins == 1);
}

// ---- cancellation and ownership ----------------------------------------------

TEST_CASE(
    "a coroutine whose token fires resumes at once on the requesting thread with "
    "cancelled_error; the others keep waiting",
    "[coro][cancel]") {
  // Catches: a stopped coroutine left suspended until the flight ends,
  // resumed on another thread, or its stop ending the work for the others.
  singleflight::stop_source sa, sb;
  group_t g;
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn(), sa.get_token());
  auto b = co_wait(g, "k", box.fn(), sb.get_token());
  auto c = co_wait(g, "k", box.fn());
  auto item = box.take("fn parked its completion");
  sa.request_stop();
  REQUIRE(a.done());  // before request_stop returned
  CHECK(a.get().finished_on == std::this_thread::get_id());
  CHECK(a.get().threw<sf::cancelled_error>());
  CHECK(a.get().suspensions == 1);
  const std::thread::id stopper = sftest::on_new_thread([&] { sb.request_stop(); }, "stop b");
  REQUIRE(b.done());
  CHECK(b.get().finished_on == stopper);
  CHECK(b.get().threw<sf::cancelled_error>());
  CHECK_FALSE(c.done());
  CHECK_FALSE(item.first.stop_requested());
  item.second.set_value(6);
  c.wait("c finished");
  CHECK(*c.get().value == 6);
  CHECK(g.stats().cancellations == 2);
}

TEST_CASE(
    "ownership::waiters: the last coroutine leaving stops the flight's token; a newcomer "
    "does not join it",
    "[coro][cancel][ownership]") {
  // Catches: coroutine waiters not counted as owners of the work (the token
  // never stopped, or stopped while one still waits).
  singleflight::stop_source sa, sb;
  group_t g;
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn(), sa.get_token());
  auto b = co_wait(g, "k", box.fn(), sb.get_token());
  auto item = box.take("fn parked its completion");
  sa.request_stop();
  CHECK_FALSE(sftest::becomes([&] { return item.first.stop_requested(); }, 50ms));
  sb.request_stop();
  must([&] { return item.first.stop_requested(); }, "flight token stopped by the last leaver");
  auto late = co_wait(g, "k", box.fn());
  CHECK(g.stats().joins == 1);
  CHECK_FALSE(late.done());
  item.second.set_value(1);
  box.take("newcomer's flight").second.set_value(2);
  late.wait("newcomer finished");
  CHECK(*late.get().value == 2);
}

TEST_CASE("ownership::group: coroutines leaving do not stop the work; a newcomer joins it",
          "[coro][cancel][ownership]") {
  // Catches: group-owned work stopped or made unjoinable by coroutine waiters.
  singleflight::stop_source sa;
  group_t g(with(sf::ownership::group));
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn(), sa.get_token());
  auto item = box.take("fn parked its completion");
  sa.request_stop();
  REQUIRE(a.done());
  CHECK(a.get().threw<sf::cancelled_error>());
  auto c = co_wait(g, "k", box.fn());
  CHECK(g.stats().joins == 1);
  CHECK_FALSE(item.first.stop_requested());
  item.second.set_value(5);
  c.wait("c finished");
  CHECK(*c.get().value == 5);
  CHECK(box.size() == 0);
}

TEST_CASE(
    "ownership::leader: a coroutine leader's stop cancels coroutine, callback and blocking "
    "followers",
    "[coro][cancel][ownership]") {
  // Catches: a coroutine leader not recognised as the leader (its stop only
  // lets it go), or followers of any kind left waiting.
  singleflight::stop_source s_leader, s_f;
  callback_log<int> cb;
  sftest::result<int> blocked;
  group_t g(with(sf::ownership::leader));
  completion_box<int> box;
  auto leader = co_wait(g, "k", box.fn(), s_leader.get_token());
  auto f1 = co_wait(g, "k", box.fn(), s_f.get_token());
  auto f2 = co_wait(g, "k", box.fn());
  g.async_do("k", box.fn(), cb.on_done());
  auto tb = sftest::spawn(blocked, [&] { return g.do_("k", [] { return -1; }); });
  must([&] { return g.stats().joins == 4; }, "followers joined");
  auto item = box.take("fn parked its completion");
  s_f.request_stop();
  CHECK(f1.done());
  CHECK_FALSE(f2.done());
  CHECK_FALSE(item.first.stop_requested());
  const std::thread::id stopper =
      sftest::on_new_thread([&] { s_leader.request_stop(); }, "leader stops");
  REQUIRE(leader.done());
  REQUIRE(f2.done());
  REQUIRE(cb.is_done());
  CHECK(leader.get().finished_on == stopper);
  CHECK(f2.get().finished_on == stopper);
  CHECK(cb.thread == stopper);
  CHECK(leader.get().threw<sf::cancelled_error>());
  CHECK(f2.get().threw<sf::cancelled_error>());
  CHECK(cb.threw<sf::cancelled_error>());
  sftest::finish(tb, blocked, "blocking follower cancelled");
  CHECK(blocked.threw<sf::cancelled_error>());
  must([&] { return item.first.stop_requested(); }, "work stopped");
  item.second.set_value(1);
  CHECK(cb.calls == 1);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("cancellation racing the settle: each coroutine resumes exactly once",
          "[coro][cancel][race]") {
  // Catches: a coroutine resumed twice (by the stop and by the settle: a
  // double resume of a destroyed frame, which ASan reports) or never (a lost
  // wake-up) when its stop and the settle meet. Three schedules, in turn; the
  // first two are forced, so both outcomes happen on every run:
  //  * claimed, then stopped: the settle has claimed the racer and is
  //    notifying an earlier (callback) waiter of the same batch, whose
  //    on_done requests the racer's stop. The stop callback must lose the
  //    claim: the racer resumes once, with the value, on the settling thread.
  //  * left, then settled: the racer's stop makes it leave (the last waiter:
  //    the flight is stopped), and a stop callback on the flight's token
  //    resolves the completion on the stopping thread before the racer is
  //    resumed. The racer resumes once, with cancelled_error.
  //  * together: a resolver and a stopper thread released at once (their
  //    starts moved apart by sftest::race_sweep, which seeks the boundary
  //    between the outcomes), alternately with and without a second
  //    coroutine keeping the flight owned. Either outcome; what each machine
  //    produces is counted, not required.
  constexpr int iterations = 2000;
  enum schedule { claimed_then_stopped, left_then_settled, together };
  const auto schedule_of = [](int i) {
    return i % 4 == 0 ? claimed_then_stopped : i % 4 == 1 ? left_then_settled : together;
  };
  std::vector<fire_task<int>> racers, bystanders;
  std::vector<std::unique_ptr<callback_log<int>>> firsts;
  racers.reserve(iterations);
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
    cur_s.emplace();
    switch (schedule_of(i)) {
      case claimed_then_stopped: {
        firsts.push_back(std::make_unique<callback_log<int>>());
        callback_log<int>& first = *firsts.back();
        first.probe = [&] { cur_s->request_stop(); };  // the racer is claimed, not yet resumed
        g.async_do("k", box.fn(), first.on_done());
        racers.push_back(co_wait(g, "k", box.fn(), cur_s->get_token()));
        ++joins;
        REQUIRE_FALSE(racers.back().done());
        box.take("fn parked its completion").second.set_value(i);  // both notified here
        REQUIRE(first.is_done());
        REQUIRE(racers.back().done());
        CHECK(cur_s->stop_requested());
        CHECK(racers.back().get().finished_on == std::this_thread::get_id());
        if (!first.value || *first.value != i) ++others_wrong;
        break;
      }
      case left_then_settled: {
        racers.push_back(co_wait(g, "k", box.fn(), cur_s->get_token()));
        const fire_task<int>& r = racers.back();
        auto item = box.take("fn parked its completion");
        sf::completion<int> c = std::move(item.second);
        bool racer_resumed_first = true;
        singleflight::stop_callback resolve_now(item.first, [&] {
          racer_resumed_first = r.done();
          c.set_value(i);  // the flight was stopped: this only frees the key
        });
        cur_s->request_stop();  // the racer leaves, the flight stops, the value comes, then resume
        REQUIRE(r.done());
        CHECK_FALSE(racer_resumed_first);
        CHECK_FALSE(c);
        CHECK(g.in_flight() == 0);  // freed by the late value, before request_stop returned
        break;
      }
      case together: {
        racers.push_back(co_wait(g, "k", box.fn(), cur_s->get_token()));
        const bool bystander = i % 2 == 0;
        if (bystander) {
          bystanders.push_back(co_wait(g, "k", box.fn()));
          ++joins;
        }
        cur_c.emplace(std::move(box.take("fn parked its completion").second));
        const int before = acted.load();
        go.store(i);  // both workers start at once
        must([&] { return acted.load() == before + 2; }, "resolver and stopper both returned");
        racers.back().wait("racer finished");
        if (bystander) {
          const fire_task<int>& b = bystanders.back();
          b.wait("bystander finished");
          if (!b.get().value || *b.get().value != i) ++others_wrong;
        }
        const auto& rec = racers.back().get();
        if (rec.value && *rec.value == i) ++raced_served;
        if (rec.threw<sf::cancelled_error>()) ++raced_cancelled;
        sweep.record(/*a_won=*/rec.value == i);
        break;
      }
    }
    const auto& rec = racers.back().get();
    if (rec.value && *rec.value == i) {
      ++served;
    } else if (rec.threw<sf::cancelled_error>()) {
      ++cancelled;
    } else {
      ++wrong;
    }
    if (schedule_of(i) == claimed_then_stopped) CHECK(rec.value == i);
    if (schedule_of(i) == left_then_settled) CHECK(rec.threw<sf::cancelled_error>());
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
  int first_twice = 0;
  for (auto& f : firsts) first_twice += f->calls.load() != 1;
  CHECK(first_twice == 0);
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
    "a deadline resumes coroutine waiters with timeout_error on the delivery thread, not the "
    "timer",
    "[coro][deadline]") {
  // Catches: coroutines left suspended past the deadline, or resumed on a
  // caller's thread or the timer thread, or again when the late completion
  // resolves.
  std::atomic<std::thread::id> stop_thread{};
  sf::options o;
  o.timeout = 200ms;
  group_t g(o);
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn());
  auto item = box.take("fn parked its completion");
  singleflight::stop_callback on_stop(item.first,
                                      [&] { stop_thread = std::this_thread::get_id(); });
  auto b = co_wait(g, "k", box.fn());
  a.wait("deadline resumed a");
  b.wait("deadline resumed b");
  CHECK(a.get().threw<sf::timeout_error>());
  CHECK(b.get().threw<sf::timeout_error>());
  must([&] { return item.first.stop_requested(); }, "flight token stopped");
  CHECK(stop_thread.load() != std::this_thread::get_id());  // else the deadline beat on_stop
  CHECK(a.get().finished_on != stop_thread.load());         // the timer only stops the token
  CHECK(a.get().finished_on != std::this_thread::get_id());
  CHECK(b.get().finished_on == a.get().finished_on);
  CHECK(g.stats().timeouts == 1);
  CHECK(g.in_flight() == 1);
  item.second.set_value(1);  // resumes nobody again (a double resume is a use-after-free)
  CHECK(g.in_flight() == 0);
}

TEST_CASE(
    "close() resumes coroutine waiters with closed_error on the closing thread and waits "
    "for pending completions",
    "[coro][close]") {
  // Catches: close() returning while a completion is unresolved, coroutines
  // left suspended, or resumed elsewhere.
  group_t g;
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn());
  auto b = co_wait(g, "k", box.fn());
  auto item = box.take("fn parked its completion");
  CHECK_FALSE(g.close_for(50ms));
  REQUIRE(a.done());
  REQUIRE(b.done());
  CHECK(a.get().threw<sf::closed_error>());
  CHECK(b.get().threw<sf::closed_error>());
  CHECK(a.get().finished_on == std::this_thread::get_id());
  CHECK(b.get().finished_on == std::this_thread::get_id());
  CHECK(item.first.stop_requested());
  item.second.set_value(1);
  CHECK(g.close_for(sftest::bound));
  auto late = co_wait(g, "k", box.fn());
  REQUIRE(late.done());
  CHECK(late.get().threw<sf::closed_error>());
  CHECK(late.get().suspensions == 0);
}

namespace {
template <class F>
fire_task<int> wait_then_block(group_t& g, F fn, std::atomic<bool>& resumed, const gate& release) {
  const int v = co_await g.co_do("k", fn);
  resumed = true;
  release.wait("resumed coroutine released");
  co_return v;
}
}  // namespace

TEST_CASE("close() does not wait for a coroutine resumption already under way", "[coro][close]") {
  // Catches: close() counting a resumed coroutine as a user of the group: a
  // coroutine that waits for the closing thread would deadlock it.
  std::atomic<bool> resumed{false}, close_returned{false};
  gate release;
  group_t g;
  completion_box<int> box;
  auto t = wait_then_block(g, box.fn(), resumed, release);
  auto item = box.take("fn parked its completion");
  sftest::thread resolver([&] { item.second.set_value(1); });
  must([&] { return resumed.load(); }, "coroutine resumed");
  sftest::jthread closer([&] {
    g.close();
    close_returned = true;
  });
  must([&] { return close_returned.load(); }, "close() returned while the coroutine still runs");
  release.open();
  t.wait("coroutine finished");
  resolver.join("the resolver returned (the coroutine ran on it)");
  REQUIRE(t.get().value);
  CHECK(*t.get().value == 1);
}

namespace {
template <class F>
fire_task<int> wait_then_close(group_t& g, F fn, std::atomic<bool>& closed) {
  const int v = co_await g.co_do("k", fn);
  g.close();
  closed = true;
  co_return v;
}
}  // namespace

TEST_CASE("close() from inside a resumed coroutine does not deadlock", "[coro][close][reentrant]") {
  // Catches: close() waiting for the resumption that is running it.
  std::atomic<bool> closed{false};
  auto g = std::make_unique<group_t>();
  completion_box<int> box;
  auto t = wait_then_close(*g, box.fn(), closed);
  auto other = co_wait(*g, "k", box.fn());
  auto item = box.take("fn parked its completion");
  sftest::on_new_thread([&] { item.second.set_value(1); }, "set_value resuming a closer");
  t.wait("closing coroutine finished");
  other.wait("other finished");
  CHECK(closed);
  CHECK(*t.get().value == 1);
  CHECK(*other.get().value == 1);
  CHECK_THROWS_AS(g->do_("k", [] { return 2; }), sf::closed_error);
  g.reset();
}

// ---- re-entry ----------------------------------------------------------------

namespace {
template <class F>
fire_task<int> wait_then_reenter(group_t& g, F fn, std::atomic<std::uint64_t>& in_flight_seen) {
  const int first = co_await g.co_do("k", fn);
  in_flight_seen = g.stats().in_flight;  // under the lock, this would deadlock
  const int second = co_await g.co_do("k", [] { return 2; });
  const int third = g.do_("other", [] { return 3; });
  co_return first * 100 + second * 10 + third;
}
}  // namespace

TEST_CASE("a resumed coroutine may re-enter the group: the same key starts a new flight",
          "[coro][reentrant]") {
  // Catches: resumption under the group's lock, or the settled flight still
  // joinable from the resumed coroutine (it would get the old value).
  std::atomic<std::uint64_t> in_flight_seen{99};
  group_t g;
  completion_box<int> box;
  auto t = wait_then_reenter(g, box.fn(), in_flight_seen);
  auto item = box.take("fn parked its completion");
  const std::thread::id resolver =
      sftest::on_new_thread([&] { item.second.set_value(1); }, "set_value");
  t.wait("coroutine finished");
  CHECK(*t.get().value == 123);
  CHECK(in_flight_seen == 0);
  CHECK(t.get().finished_on == resolver);
  CHECK(g.stats().flights == 3);
}

// ---- forget, mixed waiters, no-overlap ---------------------------------------

TEST_CASE(
    "forget(key) with coroutine waiters: they keep the old flight; a newcomer starts a new "
    "one",
    "[coro][forget]") {
  // Catches: forgotten waiters failed or moved to the new flight, or the old
  // completion evicting the new entry.
  group_t g;
  completion_box<int> box;
  auto a = co_wait(g, "k", box.fn());
  auto first = box.take("first completion");
  CHECK(g.forget("k"));
  auto b = co_wait(g, "k", box.fn());
  auto second = box.take("second completion");
  first.second.set_value(1);
  a.wait("a finished");
  CHECK(*a.get().value == 1);
  CHECK_FALSE(b.done());
  CHECK(g.in_flight() == 1);
  auto c = co_wait(g, "k", box.fn());
  CHECK(g.stats().joins == 1);
  second.second.set_value(2);
  b.wait("b finished");
  c.wait("c finished");
  CHECK(*b.get().value == 2);
  CHECK(*c.get().value == 2);
}

TEST_CASE("blocking, callback and coroutine waiters share one flight and the same value",
          "[coro][mixed]") {
  // Catches: a waiter kind left out of the settle (stranded), served a
  // different flight, or a second flight started for another kind.
  callback_log<int> cb1, cb2;
  sftest::result<int> d1, d2;
  group_t g;
  completion_box<int> box;
  auto leader = co_wait(g, "k", box.fn());
  auto td1 = sftest::spawn(d1, [&] { return g.do_("k", [] { return -1; }); });
  auto td2 = sftest::spawn(d2, [&] { return g.do_("k", [] { return -1; }); });
  g.async_do("k", box.fn(), cb1.on_done());
  g.async_do("k", box.fn(), cb2.on_done());
  auto co2 = co_wait(g, "k", box.fn());
  must([&] { return g.stats().joins == 5; }, "every kind joined");
  auto item = box.take("fn parked its completion");
  const std::thread::id resolver =
      sftest::on_new_thread([&] { item.second.set_value(9); }, "set_value");
  sftest::finish(td1, d1, "blocking 1");
  sftest::finish(td2, d2, "blocking 2");
  cb1.wait("callback 1");
  cb2.wait("callback 2");
  leader.wait("coroutine leader");
  co2.wait("coroutine 2");
  CHECK(*d1.value == 9);
  CHECK(*d2.value == 9);
  CHECK(*cb1.value == 9);
  CHECK(*cb2.value == 9);
  CHECK(*leader.get().value == 9);
  CHECK(*co2.get().value == 9);
  CHECK(cb1.thread == resolver);
  CHECK(leader.get().finished_on == resolver);
  const auto s = g.stats();
  CHECK(s.flights == 1);
  CHECK(s.calls == 6);
  CHECK(box.size() == 0);
}

TEST_CASE(
    "a stopped flight keeps its key until its completion resolves: a coroutine newcomer "
    "never overlaps it",
    "[coro][overlap]") {
  // Catches: a coroutine newcomer starting a second fn while the stopped
  // flight's work is unresolved, or receiving the stopped flight's outcome.
  sftest::overlap_meter meter;
  singleflight::stop_source sa;
  group_t g;
  completion_box<int> box;
  auto metered = [&](singleflight::stop_token st, sf::completion<int> c) {
    meter.enter();
    box.put(std::move(st), std::move(c));
  };
  auto a = co_wait(g, "k", metered, sa.get_token());
  auto first = box.take("first completion");
  sa.request_stop();
  CHECK(first.first.stop_requested());
  auto n1 = co_wait(g, "k", metered);
  auto n2 = co_wait(g, "k", metered);
  CHECK_FALSE(sftest::becomes([&] { return meter.calls.load() == 2; }, 100ms));
  CHECK(g.stats().joins == 0);
  CHECK_FALSE(n1.done());
  meter.leave();
  first.second.set_value(1);
  auto second = box.take("newcomers' flight");
  CHECK(g.stats().joins == 1);
  meter.leave();
  second.second.set_value(2);
  n1.wait("n1 finished");
  n2.wait("n2 finished");
  CHECK(*n1.get().value == 2);
  CHECK(*n2.get().value == 2);
  CHECK(meter.peak == 1);
  CHECK(meter.calls == 2);
}

TEST_CASE("co_do with a key that converts to Key (int for a long-keyed group)", "[coro][keys]") {
  // Catches: the converting awaiter's key copy dangling across the
  // suspension, or a conversion per waiter that breaks coalescing.
  sf::group<long, int> g;
  completion_box<int> box;
  auto a = co_wait_int(g, 7, box.fn());
  auto b = co_wait_int(g, 7, box.fn());
  CHECK(g.stats().joins == 1);
  box.take("fn parked its completion").second.set_value(3);
  a.wait("a finished");
  b.wait("b finished");
  CHECK(*a.get().value == 3);
  CHECK(*b.get().value == 3);
}

// ---- scale ---------------------------------------------------------------------

TEST_CASE(
    "10,000 coroutine waiters started on two threads share one flight and all resume with "
    "the value",
    "[coro][scale]") {
  // Catches: a lost or doubled resumption under load, joins that race the
  // leader's start into a second flight, or per-waiter state that breaks at
  // scale (ASan: frames destroyed once each).
  constexpr int per_thread = 5000;
  constexpr int total = 2 * per_thread;
  std::vector<fire_task<int>> tasks[2];
  std::atomic<int> starters_done{0};
  group_t g;
  completion_box<int> box;
  {
    auto starter = [&](int which) {
      tasks[which].reserve(per_thread);
      for (int i = 0; i < per_thread; ++i) tasks[which].push_back(co_wait(g, "hot", box.fn()));
      starters_done.fetch_add(1);
    };
    sftest::jthread t0(starter, 0), t1(starter, 1);
    must([&] { return starters_done.load() == 2; }, "both threads started their coroutines");
  }
  const auto joined = g.stats();
  CHECK(joined.calls == total);
  CHECK(joined.flights == 1);
  CHECK(joined.joins == total - 1);
  auto item = box.take("fn parked its completion");
  const std::thread::id resolver =
      sftest::on_new_thread([&] { item.second.set_value(7); }, "set_value for 10,000");
  int finished = 0, right_value = 0, on_resolver = 0, suspended_once = 0;
  for (auto& list : tasks) {
    for (auto& t : list) {
      t.wait("coroutine finished");
      ++finished;
      right_value += t.get().value && *t.get().value == 7;
      on_resolver += t.get().finished_on == resolver;
      suspended_once += t.get().suspensions == 1;
    }
  }
  CHECK(finished == total);
  CHECK(right_value == total);
  CHECK(on_resolver == total);
  CHECK(suspended_once == total);
  CHECK(g.stats().flights == 1);
  CHECK(g.in_flight() == 0);
}
