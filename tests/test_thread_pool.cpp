// singleflight::thread_pool and singleflight::executor: the bounded pool users
// asked for, and an executor option whose meaning is fixed by the type
// assigned (thread_executor cannot be wrapped: see
// tests/compile_fail/wrap_thread_executor.cpp).
#include <singleflight/singleflight.hpp>
#include <singleflight/thread_pool.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/keys.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::callback_log;
using sftest::gate;
using sftest::must;
using group_t = sf::group<std::string, int>;

sf::options on(const sf::thread_pool& pool) {
  sf::options o;
  o.executor = pool.executor();
  return o;
}
}  // namespace

TEST_CASE("executor: the kind is fixed by the type assigned", "[executor][pool]") {
  sf::executor none;
  CHECK_FALSE(none);
  CHECK_FALSE(sf::executor(nullptr));
  CHECK_FALSE(sf::executor(std::function<void(sf::task)>{}));  // an empty function is "none"
  const sf::executor threads = sf::thread_executor{};
  CHECK(threads);
  CHECK(threads.owns_threads());
  const sf::executor mine = [](sf::task t) { t(); };
  CHECK(mine);
  CHECK_FALSE(mine.owns_threads());
  // A copy keeps its kind.
  const sf::executor copy = threads;  // NOLINT(performance-unnecessary-copy-initialization)
  CHECK(copy.owns_threads());
  // An empty std::function runs fn inline, like no executor at all.
  sf::options o;
  o.executor = std::function<void(sf::task)>{};
  group_t g(o);
  CHECK(g.do_("k", [] { return std::this_thread::get_id() == std::thread::id{} ? 0 : 1; }) == 1);
}

TEST_CASE("thread_pool runs every flight on one of its threads", "[executor][pool]") {
  sf::thread_pool pool(2);
  CHECK(pool.size() == 2);
  group_t g(on(pool));
  std::mutex m;
  std::set<std::thread::id> seen;
  for (int i = 0; i < 20; ++i) {
    const int v = g.do_(sftest::stem_key("k", i), [&] {
      std::lock_guard<std::mutex> lk(m);
      seen.insert(std::this_thread::get_id());
      return 1;
    });
    CHECK(v == 1);
  }
  CHECK(seen.count(std::this_thread::get_id()) == 0);
  CHECK(seen.size() <= 2);
}

TEST_CASE("thread_pool with a bounded queue refuses a task when full: that flight fails",
          "[executor][pool]") {
  sf::thread_pool pool(1, /*max_queued=*/1);
  group_t g(on(pool));
  gate release;
  std::atomic<bool> busy{false};
  callback_log<int> running, queued, refused;
  g.async_do(
      "a",
      [&] {
        busy = true;
        release.wait("the pool's only thread held");
        return 1;
      },
      running.on_done());
  must([&] { return busy.load(); }, "the pool's thread is busy");
  g.async_do(
      "b", [] { return 2; }, queued.on_done());  // waits in the queue
  REQUIRE(pool.queued() == 1);
  g.async_do(
      "c", [] { return 3; }, refused.on_done());  // the queue is full
  refused.wait("refused at once");
  CHECK(refused.threw<sf::overloaded_error>());
  CHECK(g.in_flight() == 2);  // the refused flight left no entry
  release.open();
  running.wait("a served");
  queued.wait("b served");
  CHECK(*running.value == 1);
  CHECK(*queued.value == 2);
}

TEST_CASE("thread_pool: a task submitted after shutdown fails its flight with closed_error",
          "[executor][pool]") {
  sf::thread_pool pool(1);
  group_t g(on(pool));
  pool.shutdown();
  CHECK_THROWS_AS(g.do_("k", [] { return 1; }), sf::closed_error);
  CHECK(g.in_flight() == 0);  // the refused flight left nothing behind
  CHECK_THROWS_AS(g.do_("k", [] { return 2; }), sf::closed_error);
}

TEST_CASE("thread_pool::shutdown runs the queued tasks before it returns", "[executor][pool]") {
  std::atomic<int> ran{0};
  std::vector<callback_log<int>> logs(5);
  {
    sf::thread_pool pool(1);
    group_t g(on(pool));
    gate release;
    std::atomic<bool> holding{false};
    g.async_do(
        "held",
        [&] {
          holding = true;
          release.wait("held");
          return 0;
        },
        logs[0].on_done());
    must([&] { return holding.load(); }, "the pool's only thread is held");
    for (int i = 1; i < 5; ++i) {
      g.async_do(
          sftest::stem_key("k", i),
          [&, i] {
            ++ran;
            return i;
          },
          logs[static_cast<std::size_t>(i)].on_done());
    }
    CHECK(pool.queued() == 4);
    sftest::jthread opener([&] { release.open(); });
    pool.shutdown();  // the group still uses it: its queued flights run first
    CHECK(ran == 4);
  }
  for (int i = 0; i < 5; ++i) CHECK(*logs[static_cast<std::size_t>(i)].value == i);
}

TEST_CASE("close() and ~group() on a pool thread (from on_done) do not join it",
          "[executor][pool][reentrant]") {
  sf::thread_pool pool(2);
  SECTION("close()") {
    auto g = std::make_unique<group_t>(on(pool));
    callback_log<int> log;
    std::atomic<bool> closed_inside{false};
    log.probe = [&] {
      g->close();
      closed_inside = true;
    };
    g->async_do(
        "k", [] { return 1; }, log.on_done());
    log.wait("on_done on the pool thread");
    CHECK(closed_inside);
    CHECK(log.thread != std::this_thread::get_id());
  }
  SECTION("the last shared_ptr released in on_done") {
    auto g = std::make_shared<group_t>(on(pool));
    std::weak_ptr<group_t> watch = g;
    gate go;
    std::atomic<bool> destroyed_inside{false};
    g->async_do(
        "k",
        [&] {
          go.wait("fn held");
          return 1;
        },
        [&, keep = g](sf::outcome<int>) mutable {
          keep.reset();
          destroyed_inside = true;
        });
    g.reset();
    go.open();
    must([&] { return destroyed_inside.load(); }, "~group on the pool thread returned");
    CHECK(watch.expired());
  }
}

TEST_CASE("~thread_pool on one of its own threads detaches that thread", "[executor][pool]") {
  auto pool = std::make_shared<sf::thread_pool>(2);
  std::atomic<bool> destroyed_inside{false};
  std::weak_ptr<sf::thread_pool> watch = pool;
  {
    group_t g(on(*pool));
    callback_log<int> log;
    g.async_do(
        "k", [] { return 1; }, log.on_done());
    log.wait("served");
  }
  // A task that holds the last reference to the pool.
  sf::executor e = pool->executor();
  gate go;
  {
    sf::options o;
    o.executor = e;
    group_t g(o);
    callback_log<int> log;
    g.async_do(
        "k",
        [&, keep = pool]() mutable {
          go.wait("task held");
          keep.reset();  // ~thread_pool on its own thread
          destroyed_inside = true;
          return 2;
        },
        log.on_done());
    pool.reset();
    go.open();
    log.wait("served after the pool was destroyed inside its own task");
    CHECK(*log.value == 2);
  }
  CHECK(destroyed_inside);
  CHECK(watch.expired());
}
