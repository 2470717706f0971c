// Guarantee 8: close() rejects new calls, settles in-flight waiters with
// closed_error, stops every flight's token, and returns only once every fn has
// returned and the group's own threads are joined. It is idempotent, may be
// called concurrently, and may be called from inside fn. close_for() gives up
// waiting after a bound. The destructor closes and drains.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
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

sf::options threads() {
  sf::options o;
  o.executor = sf::thread_executor{};
  return o;
}

// Touched by a worker thread; runs its destructor when that thread exits. With
// `hold` set, the exit blocks on that gate: the thread is finished with the
// group but not joinable yet.
struct exit_probe {
  std::atomic<bool>* exiting = nullptr;
  std::atomic<bool>* exited = nullptr;
  sftest::gate* hold = nullptr;
  ~exit_probe() {
    if (exiting != nullptr) exiting->store(true);
    if (hold != nullptr) hold->wait("worker thread exit held");
    if (exited != nullptr) exited->store(true);
  }
};
thread_local exit_probe tls_exit_probe;

}  // namespace

TEST_CASE("close() is idempotent", "[close]") {
  group_t g;
  g.close();
  g.close();
  CHECK(g.close_for(0ms));
  CHECK_THROWS_AS(g.do_("k", [] { return 1; }), sf::closed_error);
  g.close();
}  // and the destructor closes once more

TEST_CASE(
    "close() from two threads at once: neither returns before the running fn has "
    "returned",
    "[close]") {
  group_t g{threads()};
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_saw_stop{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<int> closes_returned{0};
  std::atomic<int> closes_returned_after_fn{0};

  sftest::result<int> caller;
  auto tc = sftest::spawn(caller, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      fn_started = true;
      sftest::must([&] { return st.stop_requested(); }, "close() stops the token");
      fn_saw_stop = true;
      release.wait("release fn");
      fn_returned = true;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");

  auto closer = [&] {
    g.close();
    if (fn_returned.load()) ++closes_returned_after_fn;
    ++closes_returned;
  };
  sftest::thread a(closer);
  sftest::thread b(closer);
  sftest::must([&] { return fn_saw_stop.load(); }, "fn saw the stop");
  sftest::must([&] { return caller.done.load(); }, "caller got closed_error");
  const bool early = sftest::becomes([&] { return closes_returned.load() > 0; }, 100ms);
  release.open();
  a.join("first close() returned");
  b.join("second close() returned");
  sftest::finish(tc, caller, "caller");

  CHECK_FALSE(early);
  CHECK(closes_returned == 2);
  CHECK(closes_returned_after_fn == 2);
  CHECK(caller.threw<sf::closed_error>());
}

TEST_CASE("calls after close() throw closed_error and start nothing", "[close]") {
  group_t g;
  CHECK(g.do_("k", [] { return 1; }) == 1);
  g.close();
  std::atomic<int> fn_calls{0};
  auto fn = [&] {
    ++fn_calls;
    return 2;
  };
  sf::call_info info{sf::role::leader, 99};
  CHECK_THROWS_AS(g.do_("k", fn, {}, info), sf::closed_error);
  CHECK(info.role == sf::role::none);
  CHECK_THROWS_AS(g.do_("other", fn), sf::closed_error);
  CHECK_THROWS_AS(g.do_fresh("k", fn), sf::closed_error);
  CHECK(fn_calls == 0);
  const auto s = g.stats();
  CHECK(s.calls == 4);
  CHECK(s.flights == 1);
  CHECK(s.rejections == 3);
  CHECK(s.in_flight == 0);
}

TEST_CASE(
    "close() settles waiters with closed_error, stops the token, and returns only after "
    "every fn has returned",
    "[close][inline]") {
  group_t g;
  sftest::gate release_a, release_b;
  std::atomic<int> fns_started{0};
  std::atomic<int> fns_saw_stop{0};
  std::atomic<bool> a_returned{false}, b_returned{false};
  std::atomic<bool> close_returned{false};
  std::atomic<bool> close_returned_early{false};
  std::atomic<bool> followers_done_while_fns_blocked{false};

  auto blocking = [&](sftest::gate& rel, std::atomic<bool>& returned) {
    return [&](sf::stop_token st) {
      ++fns_started;
      sftest::must([&] { return st.stop_requested(); }, "close() stops each flight's token");
      ++fns_saw_stop;
      rel.wait("release fn after its stop");
      returned = true;
      return 1;
    };
  };
  sftest::result<int> la, lb, fa1, fa2;
  auto tla = sftest::spawn(la, [&] { return g.do_("a", blocking(release_a, a_returned)); });
  auto tlb = sftest::spawn(lb, [&] { return g.do_("b", blocking(release_b, b_returned)); });
  sftest::must([&] { return fns_started == 2; }, "both fns started");
  auto tfa1 = sftest::spawn(fa1, [&] { return g.do_("a", [] { return -1; }); });
  auto tfa2 = sftest::spawn(fa2, [&] { return g.do_("a", [] { return -1; }); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");

  sftest::jthread opener([&] {
    sftest::must([&] { return fns_saw_stop == 2; }, "both fns saw their stop");
    // The followers are released by close() at once, not when fn returns.
    sftest::must([&] { return fa1.done.load() && fa2.done.load(); }, "followers released");
    followers_done_while_fns_blocked = !a_returned.load() && !b_returned.load();
    close_returned_early = sftest::becomes([&] { return close_returned.load(); }, 50ms);
    release_a.open();
    release_b.open();
  });
  g.close();
  const bool fns_done_at_close = a_returned.load() && b_returned.load();
  close_returned = true;
  opener.join();
  sftest::finish(tla, la, "leader a");
  sftest::finish(tlb, lb, "leader b");
  sftest::finish(tfa1, fa1, "follower a1");
  sftest::finish(tfa2, fa2, "follower a2");

  CHECK_FALSE(close_returned_early.load());
  CHECK(fns_done_at_close);
  CHECK(followers_done_while_fns_blocked.load());
  CHECK(fa1.threw<sf::closed_error>());
  CHECK(fa2.threw<sf::closed_error>());
  // The inline leaders are waiters too: their flights settled with closed_error.
  CHECK(la.threw<sf::closed_error>());
  CHECK(lb.threw<sf::closed_error>());
  CHECK(g.in_flight() == 0);
}

TEST_CASE("close() from inside fn does not deadlock", "[close][reentrant]") {
  const bool with_executor = GENERATE(false, true);
  CAPTURE(with_executor);
  auto g = std::make_unique<group_t>(with_executor ? threads() : sf::options{});
  std::atomic<bool> close_returned_in_fn{false};
  std::atomic<bool> fn_may_close{false};
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_rejected_after_close{false};
  std::atomic<bool> fn_finished{false};

  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g->do_("k", [&] {
      fn_started = true;
      sftest::must([&] { return fn_may_close.load(); }, "follower joined first");
      g->close();
      close_returned_in_fn = true;
      try {
        (void)g->do_("other", [] { return 3; });
      } catch (const sf::closed_error&) {
        fn_rejected_after_close = true;
      }
      fn_finished = true;
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] { return g->do_("k", [] { return -1; }); });
  sftest::must([&] { return g->stats().joins == 1; }, "follower joined");
  fn_may_close = true;

  // With an executor the callers are released by close() itself, before fn
  // goes on; wait (bounded) for fn to get past its close() call.
  sftest::must([&] { return fn_finished.load(); }, "close() inside fn returned");
  sftest::finish(tl, leader, "leader returns");
  sftest::finish(tf, follower, "follower returns");
  CHECK(close_returned_in_fn.load());
  CHECK(fn_rejected_after_close.load());
  CHECK(leader.threw<sf::closed_error>());
  CHECK(follower.threw<sf::closed_error>());
  CHECK_THROWS_AS(g->do_("k", [] { return 2; }), sf::closed_error);
  g.reset();  // the destructor finishes the drain (and joins the worker)
}

TEST_CASE("close_for() returns false while a fn ignores its token, true once it is released",
          "[close]") {
  group_t g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  sftest::result<int> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {  // takes no token: ignores the stop
      fn_started = true;
      release.wait("release the fn that ignores its token");
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");

  CHECK_FALSE(g.close_for(50ms));
  CHECK_THROWS_AS(g.do_("other", [] { return 2; }), sf::closed_error);  // closed anyway
  CHECK_FALSE(g.close_for(1ms));
  CHECK(g.in_flight() == 1);
  release.open();
  CHECK(g.close_for(sftest::bound));
  sftest::finish(tl, leader, "leader returns");
  CHECK(leader.threw<sf::closed_error>());
  g.close();
  CHECK(g.in_flight() == 0);
}

TEST_CASE("destroying the group while a flight runs stops and drains it", "[close][destroy]") {
  sf::options o = threads();
  o.owner = sf::ownership::group;  // the caller may leave; the work keeps running
  auto g = std::make_unique<group_t>(o);
  sf::stop_source caller_stop;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_returned{false};
  std::atomic<bool> worker_exited{false};
  auto result = std::make_shared<std::vector<int>>();

  sftest::result<int> caller;
  auto tc = sftest::spawn(caller, [&] {
    return g->do_(
        "k",
        [&, result](sf::stop_token st) {
          tls_exit_probe.exited = &worker_exited;
          fn_started = true;
          sftest::must([&] { return st.stop_requested(); }, "destructor stops the token");
          result->push_back(1);  // touches state the test reads after the destructor
          fn_returned = true;
          return 1;
        },
        caller_stop.get_token());
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  caller_stop.request_stop();
  sftest::finish(tc, caller, "caller leaves");
  CHECK(caller.threw<sf::cancelled_error>());
  CHECK(g->in_flight() == 1);  // ownership::group: the work runs on

  g.reset();
  CHECK(fn_returned.load());
  CHECK(worker_exited.load());
  CHECK(result->size() == 1);
}

// Seed: close() draining a slow-to-stop worker. The fn sees its stop but needs
// a while to wind down (it writes its last state after the stop); close() must
// wait for that write, which the test then reads without a race (TSan).
TEST_CASE("close() draining a slow-to-stop worker", "[close][seed]") {
  group_t g{threads()};
  sftest::gate wound_down;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> fn_saw_stop{false};
  std::atomic<bool> close_returned{false};
  std::atomic<bool> close_returned_early{false};
  std::vector<int> journal;  // written by fn after its stop, read after close()

  sftest::result<int> caller;
  auto tc = sftest::spawn(caller, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      fn_started = true;
      sftest::must([&] { return st.stop_requested(); }, "close() stops the worker");
      fn_saw_stop = true;
      wound_down.wait("worker winding down");
      journal.push_back(42);
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "worker started");
  sftest::jthread opener([&] {
    sftest::must([&] { return fn_saw_stop.load(); }, "worker saw the stop");
    close_returned_early = sftest::becomes([&] { return close_returned.load(); }, 50ms);
    wound_down.open();
  });
  g.close();
  close_returned = true;
  opener.join();
  sftest::finish(tc, caller, "caller");

  CHECK_FALSE(close_returned_early.load());
  REQUIRE(journal.size() == 1);  // a plain read: ordered after the fn by close()
  CHECK(journal[0] == 42);
  CHECK(caller.threw<sf::closed_error>());
}

// Schedule: a thread_executor worker's fn returns (the group's user count drops
// to zero) but the thread has not exited yet (its thread_local destructors are
// still running). Two threads call close(). Both see the group drained; the
// first to reach join_threads() takes the thread list and joins; the second
// finds the list empty and returns at once, although the group's thread is
// still running. close() promises to return only once "the group's own
// threads are joined".
TEST_CASE("concurrent_close_returns_only_after_the_groups_threads_are_joined", "[close][bug]") {
  group_t g{threads()};
  sftest::gate hold_exit;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> worker_exiting{false};
  std::atomic<bool> worker_exited{false};
  std::atomic<int> closes_returned{0};
  std::atomic<int> closes_returned_after_exit{0};

  sftest::result<int> caller;
  auto tc = sftest::spawn(caller, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      tls_exit_probe.exiting = &worker_exiting;
      tls_exit_probe.exited = &worker_exited;
      tls_exit_probe.hold = &hold_exit;
      fn_started = true;
      sftest::must([&] { return st.stop_requested(); }, "close() stops the token");
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");

  auto closer = [&] {
    g.close();
    if (worker_exited.load()) ++closes_returned_after_exit;
    ++closes_returned;
  };
  sftest::thread a(closer);
  sftest::thread b(closer);
  sftest::must([&] { return worker_exiting.load(); }, "worker thread exiting");
  const bool early = sftest::becomes([&] { return closes_returned.load() > 0; }, 200ms);
  hold_exit.open();
  a.join("first close() returned");
  b.join("second close() returned");
  sftest::finish(tc, caller, "caller");

  CHECK_FALSE(early);
  CHECK(closes_returned == 2);
  CHECK(closes_returned_after_exit == 2);
  CHECK(caller.threw<sf::closed_error>());
}

// Schedule: fn registers nothing; the test registers a stop_callback on the
// flight's token that calls close(). At the deadline the group's timer thread
// stops the token and so runs close() itself. close() cannot join the thread
// it runs on; it detaches the timer instead, so the destructor has nothing to
// join and returns while the timer thread is still inside the group (after
// the callback returns, timer_loop locks the destroyed group's mutex: a
// use-after-free under ASan). Expected: the destructor waits for the timer.
TEST_CASE("close_called_on_the_timer_thread_still_lets_the_destructor_join_it",
          "[close][deadline][bug]") {
  sf::options o;
  o.timeout = 300ms;
  auto* g = new group_t{o};
  std::mutex m;
  std::optional<sf::stop_token> flight_token;
  std::atomic<bool> token_published{false};
  std::atomic<bool> close_returned_in_callback{false};
  std::atomic<bool> timer_exited{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> destroyed_early{false};
  sftest::gate callback_may_return;

  sftest::result<int> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g->do_("k", [&](sf::stop_token st) {
      {
        std::lock_guard<std::mutex> lk(m);
        flight_token = st;
      }
      token_published = true;
      sftest::must([&] { return st.stop_requested(); }, "deadline stops the token");
      return 1;
    });
  });
  sftest::must([&] { return token_published.load(); }, "flight token published");
  sf::stop_token tok;
  {
    std::lock_guard<std::mutex> lk(m);
    tok = *flight_token;
  }
  auto on_stop = [&] {
    tls_exit_probe.exited = &timer_exited;  // this runs on the timer thread
    g->close();
    close_returned_in_callback = true;
    callback_may_return.wait("timer's stop callback held");
  };
  std::optional<sf::stop_callback<decltype(on_stop)>> cb;
  cb.emplace(tok, on_stop);

  sftest::must([&] { return close_returned_in_callback.load(); }, "close() on the timer returned");
  sftest::finish(tl, leader, "leader");
  CHECK(leader.threw<sf::timeout_error>());

  sftest::jthread opener([&] {
    destroyed_early = sftest::becomes([&] { return destroyed.load(); }, 200ms);
    callback_may_return.open();
  });
  delete g;
  const bool timer_joined = timer_exited.load();
  destroyed = true;
  opener.join();
  cb.reset();  // waits for the callback if it still runs

  CHECK_FALSE(destroyed_early.load());
  CHECK(timer_joined);
}

// Two fns on thread_executor workers (threads the group owns) that both call close(): each
// close() runs on a library thread, so it must not wait for the other's fn nor join the other's
// thread (that one may be waiting for it): both return, the destructors join both. The same
// with two groups whose fns close each other's group.
TEST_CASE("two thread_executor fns that both call close() both return", "[close][reentrant]") {
  const bool each_other = GENERATE(false, true);
  CAPTURE(each_other);
  auto g1 = std::make_unique<group_t>(threads());
  auto g2 = std::make_unique<group_t>(threads());
  std::atomic<int> in{0};
  std::atomic<int> returned{0};
  sftest::result<int> a, b;
  const auto closing = [&](group_t& target) {
    return [&] {
      in.fetch_add(1);
      sftest::must([&] { return in.load() == 2; }, "both fns run");
      target.close();
      returned.fetch_add(1);
      // Both groups closed before either fn returns: both callers get closed_error.
      sftest::must([&] { return returned.load() == 2; }, "both close() calls return");
      return 1;
    };
  };
  group_t& other = each_other ? *g2 : *g1;
  auto ta = sftest::spawn(a, [&] { return g1->do_("a", closing(other)); });
  auto tb = sftest::spawn(b, [&] { return other.do_("b", closing(*g1)); });
  sftest::must([&] { return returned.load() == 2; }, "both close() calls return");
  sftest::finish(ta, a, "caller a returns");
  sftest::finish(tb, b, "caller b returns");
  CHECK(a.threw<sf::closed_error>());
  CHECK(b.threw<sf::closed_error>());
  g1.reset();  // the destructors join the workers
  g2.reset();
}
