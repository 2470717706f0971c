// singleflight/asio.hpp: singleflight::async_do as an Asio asynchronous operation.
//
//  * every completion token: use_awaitable (value and exception), use_future, deferred
//    (nothing starts until it is invoked), a plain handler void(std::exception_ptr, T);
//  * the handler runs on its associated executor (another io_context, a strand), never inside
//    the initiating function nor inside the cancellation signal's emit();
//  * the operation is outstanding work: io_context::run() does not return while it is pending;
//  * a handler passed as an lvalue (const or not) is copied into the operation;
//  * the handler's associated allocator allocates exactly the operation and the queued
//    function, both freed before the upcall;
//  * cancellation through the associated cancellation slot (terminal, partial): the cancelled
//    waiter gets cancelled_error while the flight goes on for the others; the last one leaving
//    stops it; a request for total cancellation alone is ignored;
//  * many asio waiters share one flight; an initiation that throws invokes no handler;
//  * close() on the only io thread an origin needs cannot finish (close_for gives up);
//  * co_do resumes on the settling thread, not the io_context; co_do is not accepted inside
//    asio::awaitable (a compile-time check of Asio's await_transform).
//
// The origin is asynchronous and resolved by the test (`parked`), on the test's own thread, so
// every interleaving is forced; io_contexts run on threads of their own (`runner`). Handlers
// and coroutines record into atomics/slots that the test reads after a bounded wait.

// Asio 1.22 turns on its coroutine support (awaitable, use_awaitable) for clang only through
// <experimental/coroutine>; clang 14 and later have C++20's <coroutine>, which later Asio
// versions use. Say so before any Asio header is included.
#if defined(__clang__) && __clang_major__ >= 14 && __cplusplus >= 202002L && \
    !defined(ASIO_HAS_CO_AWAIT)
#define ASIO_HAS_CO_AWAIT 1
#define ASIO_HAS_STD_COROUTINE 1
#endif

#include <singleflight/asio.hpp>
#include <singleflight/singleflight.hpp>

#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// asio::deferred; asio::experimental::deferred in Asio 1.22 and earlier (no <asio/deferred.hpp>).
#if __has_include(<asio/deferred.hpp>)
#define SFTEST_ASIO_DEFERRED_IN_ASIO 1
#include <asio/deferred.hpp>
#else
#include <asio/experimental/deferred.hpp>
#endif

#if !defined(ASIO_HAS_CO_AWAIT)
#error "test_asio needs Asio's C++20 coroutine support (asio::awaitable)"
#endif

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

#if defined(SFTEST_ASIO_DEFERRED_IN_ASIO)
constexpr auto deferred = asio::deferred;
#else
constexpr auto deferred = asio::experimental::deferred;
#endif

template <class E>
bool holds(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

// An asynchronous origin that parks its completions for the test to resolve. Resolving runs
// the waiters' on_done inline, so it happens outside the lock.
class parked {
 public:
  auto fn() {
    return [this](sf::stop_token st, sf::completion<int> done) {
      std::lock_guard<std::mutex> lk(m_);
      tokens_.push_back(std::move(st));
      done_.push_back(std::move(done));
      calls_.fetch_add(1);
    };
  }
  int calls() const { return calls_.load(); }
  void wait_calls(int n, const char* name) const {
    sftest::must([&] { return calls_.load() >= n; }, name);
  }
  sf::stop_token token(std::size_t i) {
    std::lock_guard<std::mutex> lk(m_);
    return tokens_.at(i);
  }
  void set_value(int v) { take().set_value(v); }
  void set_exception(std::exception_ptr e) { take().set_exception(std::move(e)); }

 private:
  sf::completion<int> take() {
    std::lock_guard<std::mutex> lk(m_);
    REQUIRE(next_ < done_.size());
    return std::move(done_[next_++]);
  }

  std::mutex m_;
  std::vector<sf::stop_token> tokens_;
  std::vector<sf::completion<int>> done_;
  std::size_t next_ = 0;
  std::atomic<int> calls_{0};
};

// Runs an io_context on a thread of its own. finish() waits (bounded) for run() to return;
// a runner destroyed unfinished (a failed REQUIRE) stops the io_context first.
class runner {
 public:
  explicit runner(asio::io_context& io)
      : io_(io), thread_([this] {
          id_.store(std::this_thread::get_id());
          io_.run();
          returned_.store(true);
        }) {}
  runner(const runner&) = delete;
  runner& operator=(const runner&) = delete;
  ~runner() {
    if (!thread_.joinable()) return;
    io_.stop();
    finish("runner destroyed");
  }
  bool returned() const { return returned_.load(); }
  std::thread::id id() const {
    sftest::must([&] { return id_.load() != std::thread::id(); }, "runner thread id");
    return id_.load();
  }
  void finish(const char* name) {
    sftest::must([&] { return returned_.load(); }, name);
    thread_.join();
  }

 private:
  asio::io_context& io_;
  std::atomic<std::thread::id> id_{};
  std::atomic<bool> returned_{false};
  std::thread thread_;
};

// What one plain handler received.
struct handler_log {
  std::atomic<int> calls{0};
  std::exception_ptr error;
  int value = -1;
  std::thread::id thread;
  bool on_executor = false;  // the executor under test was running in the handler's thread
  std::atomic<bool> done{false};

  void wait(const char* name) const {
    sftest::must([&] { return done.load(std::memory_order_acquire); }, name);
  }
};

// A plain handler recording into `log`; `probe()` says whether it runs on the expected executor.
template <class Probe>
auto recorder(handler_log& log, Probe probe) {
  return [&log, probe](std::exception_ptr e, int v) {
    log.error = std::move(e);
    log.value = v;
    log.thread = std::this_thread::get_id();
    log.on_executor = probe();
    log.calls.fetch_add(1);
    log.done.store(true, std::memory_order_release);
  };
}

auto recorder(handler_log& log) {
  return recorder(log, [] { return true; });
}

// A coroutine's record: its value or exception, and whether it resumed on its executor.
struct coro_log {
  std::optional<int> value;
  std::exception_ptr error;
  bool resumed_on_executor = false;
  std::atomic<bool> done{false};
  void wait(const char* name) const {
    sftest::must([&] { return done.load(std::memory_order_acquire); }, name);
  }
};

asio::awaitable<void> await_key(group_t& g, parked& origin, std::string key, coro_log& log,
                                asio::io_context& io) {
  try {
    log.value = co_await sf::async_do(g, key, origin.fn(), asio::use_awaitable);
  } catch (...) {
    log.error = std::current_exception();
  }
  log.resumed_on_executor = io.get_executor().running_in_this_thread();
}

// co_spawn's completion handler: marks the log done.
auto mark_done(coro_log& log) {
  return [&log](const std::exception_ptr& e) {
    if (e) log.error = e;
    log.done.store(true, std::memory_order_release);
  };
}

// Counts what goes through it; the handler's associated allocator in one test.
struct alloc_counts {
  std::atomic<int> allocations{0};
  std::atomic<int> deallocations{0};
};

template <class U>
struct counting_allocator {
  using value_type = U;
  alloc_counts* counts;
  explicit counting_allocator(alloc_counts* c) noexcept : counts(c) {}
  template <class V>
  counting_allocator(
      const counting_allocator<V>& o) noexcept  // NOLINT(google-explicit-constructor)
      : counts(o.counts) {}
  U* allocate(std::size_t n) {
    counts->allocations.fetch_add(1);
    return std::allocator<U>().allocate(n);
  }
  void deallocate(U* p, std::size_t n) noexcept {
    counts->deallocations.fetch_add(1);
    std::allocator<U>().deallocate(p, n);
  }
  template <class V>
  bool operator==(const counting_allocator<V>& o) const noexcept {
    return counts == o.counts;
  }
};

}  // namespace

TEST_CASE("use_awaitable yields the value", "[asio][token]") {
  group_t g;
  asio::io_context io;
  parked origin;
  coro_log log;
  asio::co_spawn(io, await_key(g, origin, "k", log, io), mark_done(log));
  runner run(io);
  origin.wait_calls(1, "origin called");
  origin.set_value(42);  // from the test thread: the coroutine must resume on io's thread
  log.wait("coroutine done");
  run.finish("run() returned");
  REQUIRE(log.value == 42);
  REQUIRE_FALSE(log.error);
  REQUIRE(log.resumed_on_executor);
  REQUIRE(g.stats().flights == 1);
}

TEST_CASE("use_awaitable throws fn's exception, and the library's errors", "[asio][token]") {
  group_t g;
  asio::io_context io;
  parked origin;

  SECTION("fn's exception object") {
    coro_log log;
    asio::co_spawn(io, await_key(g, origin, "k", log, io), mark_done(log));
    runner run(io);
    origin.wait_calls(1, "origin called");
    origin.set_exception(std::make_exception_ptr(std::runtime_error("backend down")));
    log.wait("coroutine done");
    run.finish("run() returned");
    REQUIRE_FALSE(log.value);
    REQUIRE(holds<std::runtime_error>(log.error));
    try {
      std::rethrow_exception(log.error);
    } catch (const std::runtime_error& e) {
      REQUIRE(std::string(e.what()) == "backend down");
    }
  }
  SECTION("closed_error from a closed group (an immediate outcome)") {
    g.close();
    coro_log log;
    asio::co_spawn(io, await_key(g, origin, "k", log, io), mark_done(log));
    runner run(io);
    log.wait("coroutine done");
    run.finish("run() returned");
    REQUIRE(holds<sf::closed_error>(log.error));
    REQUIRE(log.resumed_on_executor);
    REQUIRE(origin.calls() == 0);
  }
}

TEST_CASE("use_future gives a std::future of the value or the error", "[asio][token]") {
  group_t g;
  parked origin;
  std::future<int> a = sf::async_do(g, "a", origin.fn(), asio::use_future);
  std::future<int> b = sf::async_do(g, "b", origin.fn(), asio::use_future);
  origin.wait_calls(2, "both origins called");
  REQUIRE(a.wait_for(0s) == std::future_status::timeout);  // nothing settled yet
  origin.set_value(7);
  origin.set_exception(std::make_exception_ptr(std::runtime_error("no b")));
  REQUIRE(a.wait_for(sftest::bound) == std::future_status::ready);
  REQUIRE(b.wait_for(sftest::bound) == std::future_status::ready);
  REQUIRE(a.get() == 7);
  REQUIRE_THROWS_AS(b.get(), std::runtime_error);
}

TEST_CASE("deferred starts nothing until it is invoked with a token", "[asio][token]") {
  group_t g;
  parked origin;
  handler_log log;
  auto op = sf::async_do(g, std::string("k"), origin.fn(), deferred);
  REQUIRE(g.stats().calls == 0);
  REQUIRE(origin.calls() == 0);

  std::move(op)(recorder(log));
  REQUIRE(g.stats().calls == 1);
  origin.wait_calls(1, "origin called");
  origin.set_value(5);
  log.wait("handler called");
  REQUIRE(log.calls == 1);
  REQUIRE_FALSE(log.error);
  REQUIRE(log.value == 5);
}

TEST_CASE("a plain handler receives (null, value) or (error, T{})", "[asio][token]") {
  group_t g;
  parked origin;
  handler_log ok;
  handler_log failed;
  sf::async_do(g, "ok", origin.fn(), recorder(ok));
  sf::async_do(g, "failed", origin.fn(), recorder(failed));
  origin.wait_calls(2, "origins called");
  origin.set_value(3);
  origin.set_exception(std::make_exception_ptr(std::logic_error("bad")));
  ok.wait("ok handler");
  failed.wait("failed handler");
  REQUIRE(ok.calls == 1);
  REQUIRE_FALSE(ok.error);
  REQUIRE(ok.value == 3);
  REQUIRE(failed.calls == 1);
  REQUIRE(holds<std::logic_error>(failed.error));
  REQUIRE(failed.value == 0);  // value-initialised T
  // With no associated executor the handler runs where the flight settles: here.
  REQUIRE(ok.thread == std::this_thread::get_id());
}

namespace {
// A plain handler with state of its own, to tell a copy from a move.
struct stateful_handler {
  handler_log* log;
  std::shared_ptr<int> state = std::make_shared<int>(7);
  void operator()(std::exception_ptr e, int v) const { recorder (*log)(std::move(e), v); }
};
}  // namespace

TEST_CASE("a handler passed as an lvalue is copied into the operation, as Asio's own are",
          "[asio][token]") {
  group_t g;
  parked origin;
  handler_log log;
  handler_log const_log;
  stateful_handler named{&log};
  const stateful_handler const_named{&const_log};
  sf::async_do(g, "k", origin.fn(), named);         // compiles: decay-copied
  sf::async_do(g, "k2", origin.fn(), const_named);  // a const lvalue too
  REQUIRE(named.state);                             // copied, not moved from
  REQUIRE(named.state.use_count() == 2);            // the operation holds the copy
  REQUIRE(const_named.state.use_count() == 2);
  origin.wait_calls(2, "both origins called");
  origin.set_value(1);
  origin.set_value(2);
  log.wait("named handler called");
  const_log.wait("const handler called");
  REQUIRE(log.value == 1);
  REQUIRE(const_log.value == 2);
  REQUIRE(named.state.use_count() == 1);  // the operation's copy is gone
}

TEST_CASE("the handler runs on its associated executor, whichever thread settles the flight",
          "[asio][executor]") {
  group_t g;
  asio::io_context io;
  parked origin;

  SECTION("another io_context") {
    handler_log log;
    sf::async_do(g, "k", origin.fn(),
                 asio::bind_executor(io, recorder(log, [&io] {
                                       return io.get_executor().running_in_this_thread();
                                     })));
    runner run(io);
    origin.wait_calls(1, "origin called");
    origin.set_value(1);  // on the test thread, which is not running io
    log.wait("handler called");
    run.finish("run() returned");
    REQUIRE(log.on_executor);
    REQUIRE(log.thread == run.id());
    REQUIRE(log.value == 1);
  }
  SECTION("a strand, on an io_context run by two threads") {
    auto strand = asio::make_strand(io);
    handler_log log;
    sf::async_do(g, "k", origin.fn(), asio::bind_executor(strand, recorder(log, [strand] {
                                                            return strand.running_in_this_thread();
                                                          })));
    runner run1(io);
    runner run2(io);
    origin.wait_calls(1, "origin called");
    origin.set_value(2);
    log.wait("handler called");
    run1.finish("run() 1 returned");
    run2.finish("run() 2 returned");
    REQUIRE(log.on_executor);
    REQUIRE(log.value == 2);
  }
}

TEST_CASE("an immediate outcome is posted, never invoked inside the initiating function",
          "[asio][executor]") {
  group_t g;
  g.close();
  asio::io_context io;
  parked origin;
  handler_log log;
  std::atomic<bool> initiating{false};
  std::atomic<bool> ran_inside{false};
  // Initiate from a handler running on io, so that a dispatch to io would run inline.
  asio::post(io, [&] {
    initiating = true;
    sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, [&](std::exception_ptr e, int v) {
                   ran_inside = initiating.load();
                   recorder(log)(std::move(e), v);
                 }));
    initiating = false;
  });
  runner run(io);
  log.wait("handler called");
  run.finish("run() returned");
  REQUIRE_FALSE(ran_inside);
  REQUIRE(holds<sf::closed_error>(log.error));
}

TEST_CASE("a pending operation is outstanding work: run() does not return before it completes",
          "[asio][executor]") {
  // Catches: an operation that does not count as work on its handler's
  // executor; run() would return while it is pending (and the handler would
  // never run, or run on whichever thread calls run() next).
  group_t g;
  asio::io_context io;
  parked origin;
  handler_log log;
  sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, recorder(log)));
  origin.wait_calls(1, "origin called");
  // Nothing is queued on io: only the operation's work can keep it going.
  // poll() runs what is ready and, when the io_context has no work left,
  // stops it (what run() returning means), all before it returns here.
  CHECK(io.poll() == 0);
  REQUIRE_FALSE(io.stopped());
  // The same with run() on a thread of its own, once it is running for
  // certain: the posted marker has run on it.
  std::atomic<bool> running{false};
  asio::post(io, [&] { running = true; });
  runner run(io);
  sftest::must([&] { return running.load(); }, "run() is running");
  REQUIRE_FALSE(sftest::becomes([&] { return run.returned(); }, 100ms));
  origin.set_value(9);
  log.wait("handler called");
  run.finish("run() returned");
  REQUIRE(log.value == 9);
  REQUIRE(log.thread == run.id());
}

TEST_CASE(
    "the handler's allocator allocates the operation and the queued function, both freed before "
    "the upcall",
    "[asio][allocator]") {
  // What the allocator covers, exactly (asio.hpp's comment): the operation (one allocation) and,
  // when the handler is queued to its executor, the queued function (one more). The group's
  // callback node, the stop state and the flight come from operator new and are not counted.
  group_t g;
  parked origin;
  handler_log log;
  alloc_counts counts;
  std::atomic<int> live_at_upcall{-1};
  auto handler =
      asio::bind_allocator(counting_allocator<void>(&counts), [&](std::exception_ptr e, int v) {
        live_at_upcall = counts.allocations - counts.deallocations;
        recorder(log)(std::move(e), v);
      });

  SECTION("dispatched inline on the settling thread (no associated executor)") {
    sf::async_do(g, "k", origin.fn(), std::move(handler));
    origin.wait_calls(1, "origin called");
    REQUIRE(counts.allocations == 1);  // the operation
    REQUIRE(counts.deallocations == 0);
    origin.set_value(4);
    log.wait("handler called");
    REQUIRE(counts.allocations == 1);
  }
  SECTION("queued to an io_context") {
    asio::io_context io;
    sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, std::move(handler)));
    origin.wait_calls(1, "origin called");
    REQUIRE(counts.allocations == 1);
    origin.set_value(4);               // not on io's thread: queued
    REQUIRE(counts.allocations == 2);  // + the queued function
    runner run(io);
    log.wait("handler called");
    run.finish("run() returned");
  }
  REQUIRE(log.value == 4);
  REQUIRE(live_at_upcall == 0);  // Asio's rule: its memory is freed before the upcall
  REQUIRE(counts.deallocations == counts.allocations);
}

TEST_CASE("a cancelled waiter gets cancelled_error; the others still get the value",
          "[asio][cancellation]") {
  // Terminal and partial only: total is ignored (see the next test).
  const auto type = GENERATE(asio::cancellation_type::terminal, asio::cancellation_type::partial,
                             asio::cancellation_type::terminal | asio::cancellation_type::total);
  group_t g;
  asio::io_context io;
  parked origin;
  asio::cancellation_signal signal;
  handler_log leaver;
  handler_log stayer;
  coro_log coro;
  std::atomic<bool> emitting{false};
  std::atomic<bool> ran_inside_emit{false};
  std::atomic<bool> slot_cleared{false};

  sf::async_do(g, "k", origin.fn(),
               asio::bind_cancellation_slot(
                   signal.slot(), asio::bind_executor(io, [&](std::exception_ptr e, int v) {
                     ran_inside_emit = emitting.load();
                     slot_cleared = !signal.slot().has_handler();
                     recorder(leaver)(std::move(e), v);
                   })));
  sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, recorder(stayer)));
  asio::co_spawn(io, await_key(g, origin, "k", coro, io), mark_done(coro));
  runner run(io);
  sftest::must([&] { return g.stats().joins == 2; }, "three waiters on one flight");
  REQUIRE(signal.slot().has_handler());

  // The signal is emitted on the handler's executor, as Asio requires.
  asio::post(io, [&] {
    emitting = true;
    signal.emit(type);
    emitting = false;
  });
  leaver.wait("cancelled handler called");
  REQUIRE(holds<sf::cancelled_error>(leaver.error));
  REQUIRE_FALSE(ran_inside_emit);
  REQUIRE(slot_cleared);
  REQUIRE_FALSE(origin.token(0).stop_requested());  // two waiters remain
  REQUIRE_FALSE(stayer.done);
  REQUIRE_FALSE(coro.done);

  origin.set_value(11);
  stayer.wait("remaining handler called");
  coro.wait("coroutine done");
  run.finish("run() returned");
  REQUIRE(stayer.value == 11);
  REQUIRE_FALSE(stayer.error);
  REQUIRE(coro.value == 11);
  REQUIRE(leaver.calls == 1);
  const auto s = g.stats();
  REQUIRE(s.flights == 1);
  REQUIRE(s.cancellations == 1);
}

TEST_CASE("a request for total cancellation alone is ignored: fn may already have run",
          "[asio][cancellation]") {
  // Asio's total cancellation means "cancel only if the operation had no side effects". Leaving
  // a flight whose fn ran (or that this very leaving would stop) cannot promise that.
  group_t g;
  asio::io_context io;
  parked origin;
  asio::cancellation_signal signal;
  handler_log log;
  sf::async_do(g, "k", origin.fn(),
               asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, recorder(log))));
  runner run(io);
  origin.wait_calls(1, "origin called");
  std::atomic<bool> emitted{false};
  asio::post(io, [&] {
    signal.emit(asio::cancellation_type::total);
    emitted = true;
  });
  sftest::must([&] { return emitted.load(); }, "total cancellation emitted");
  REQUIRE_FALSE(origin.token(0).stop_requested());  // the flight was not stopped
  REQUIRE_FALSE(log.done);
  REQUIRE(signal.slot().has_handler());  // still cancellable (terminal, partial)
  origin.set_value(8);
  log.wait("handler called");
  run.finish("run() returned");
  REQUIRE_FALSE(log.error);
  REQUIRE(log.value == 8);
  REQUIRE(g.stats().cancellations == 0);
}

TEST_CASE("cancelling co_spawn cancels the awaiting coroutine; the last waiter leaving stops fn",
          "[asio][cancellation]") {
  group_t g;
  asio::io_context io;
  parked origin;
  asio::cancellation_signal signal;
  coro_log coro;
  asio::co_spawn(io, await_key(g, origin, "k", coro, io),
                 asio::bind_cancellation_slot(signal.slot(), mark_done(coro)));
  runner run(io);
  origin.wait_calls(1, "origin called");
  const sf::stop_token fn_token = origin.token(0);
  REQUIRE_FALSE(fn_token.stop_requested());
  asio::post(io, [&] { signal.emit(asio::cancellation_type::terminal); });
  coro.wait("coroutine done");
  run.finish("run() returned");
  REQUIRE(holds<sf::cancelled_error>(coro.error));
  REQUIRE(coro.resumed_on_executor);
  // ownership::waiters: the only waiter left, so the flight's token was stopped.
  REQUIRE(fn_token.stop_requested());
  origin.set_exception(std::make_exception_ptr(std::runtime_error("stopped")));
  sftest::must([&] { return g.in_flight() == 0; }, "entry gone once fn finished");
}

TEST_CASE("many asio waiters coalesce into one flight", "[asio][coalescing]") {
  constexpr int waiters = 64;
  group_t g;
  asio::io_context io;
  parked origin;
  std::vector<std::unique_ptr<coro_log>> logs;
  for (int i = 0; i < waiters; ++i) {
    logs.push_back(std::make_unique<coro_log>());
    asio::co_spawn(io, await_key(g, origin, "hot", *logs.back(), io), mark_done(*logs.back()));
  }
  std::future<int> f = sf::async_do(g, "hot", origin.fn(), asio::use_future);
  runner run1(io);
  runner run2(io);
  sftest::must([&] { return g.stats().calls == waiters + 1; }, "every waiter arrived");
  origin.set_value(77);
  for (auto& l : logs) l->wait("coroutine done");
  REQUIRE(f.wait_for(sftest::bound) == std::future_status::ready);
  run1.finish("run() 1 returned");
  run2.finish("run() 2 returned");
  for (auto& l : logs) {
    REQUIRE(l->value == 77);
    REQUIRE(l->resumed_on_executor);
  }
  REQUIRE(f.get() == 77);
  const auto s = g.stats();
  REQUIRE(s.flights == 1);
  REQUIRE(s.joins == waiters);
  REQUIRE(origin.calls() == 1);
}

namespace {
struct throwing_hash {
  std::size_t operator()(const std::string& k) const {
    if (k == "bad") throw std::runtime_error("hash");
    return std::hash<std::string>()(k);
  }
};
}  // namespace

TEST_CASE("an initiation that throws invokes no handler and leaves the slot empty",
          "[asio][exceptions]") {
  sf::group<std::string, int, throwing_hash, std::equal_to<>> g;
  parked origin;
  asio::cancellation_signal signal;
  handler_log log;
  alloc_counts counts;
  REQUIRE_THROWS_AS(
      sf::async_do(g, std::string("bad"), origin.fn(),
                   asio::bind_cancellation_slot(
                       signal.slot(),
                       asio::bind_allocator(counting_allocator<void>(&counts), recorder(log)))),
      std::runtime_error);
  REQUIRE_FALSE(signal.slot().has_handler());
  REQUIRE(counts.allocations >= 1);
  REQUIRE(counts.deallocations == counts.allocations);
  REQUIRE(origin.calls() == 0);
  REQUIRE_FALSE(sftest::becomes([&] { return log.done.load(); }, 50ms));
}

TEST_CASE("a completed operation whose executor shuts down unrun is freed, not invoked",
          "[asio][executor]") {
  group_t g;
  parked origin;
  handler_log log;
  alloc_counts counts;
  {
    asio::io_context io;
    sf::async_do(g, "k", origin.fn(),
                 asio::bind_executor(
                     io, asio::bind_allocator(counting_allocator<void>(&counts), recorder(log))));
    origin.wait_calls(1, "origin called");
    origin.set_value(1);  // queued on io, which never runs
    REQUIRE(log.calls == 0);
  }
  REQUIRE(log.calls == 0);
  REQUIRE(counts.allocations >= 1);
  REQUIRE(counts.deallocations == counts.allocations);
}

namespace {
// An origin whose cancellation is itself asynchronous: its stop callback posts the failure to an
// io_context (as an origin that cancels an Asio timer or socket does).
struct io_cancelled_origin {
  explicit io_cancelled_origin(asio::io_context& ctx) : io(ctx) {}
  asio::io_context& io;
  std::mutex m;
  std::vector<std::unique_ptr<sf::stop_callback<std::function<void()>>>> on_stop;
  std::atomic<int> calls{0};

  auto fn() {
    return [this](sf::stop_token st, sf::completion<int> done) {
      auto shared = std::make_shared<sf::completion<int>>(std::move(done));
      std::function<void()> cancel = [this, shared] {
        asio::post(io, [shared] {
          shared->set_exception(std::make_exception_ptr(std::runtime_error("cancelled on io")));
        });
      };
      const std::lock_guard<std::mutex> lk(m);
      on_stop.push_back(
          std::make_unique<sf::stop_callback<std::function<void()>>>(st, std::move(cancel)));
      calls.fetch_add(1);
    };
  }
};
}  // namespace

TEST_CASE("close() on the only io thread an origin needs cannot finish; off that thread it does",
          "[asio][close]") {
  // asio.hpp: close() / ~group() waits for every pending completion; one that can only be
  // resolved by a handler on this io_context never is while close() blocks its only thread.
  group_t g;
  asio::io_context io;
  io_cancelled_origin origin(io);
  handler_log log;
  std::atomic<int> close_on_io{-1};
  asio::post(io, [&] {
    sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, recorder(log)));
    // Stops the flight: the origin's stop callback posts its failure behind this handler.
    close_on_io = g.close_for(200ms) ? 1 : 0;
  });
  runner run(io);
  sftest::must([&] { return close_on_io.load() != -1; }, "close_for on the io thread returned");
  REQUIRE(close_on_io == 0);   // gave up: the completion it waits for is queued behind it
  log.wait("handler called");  // once the io thread was free, the origin finished
  REQUIRE(holds<sf::closed_error>(log.error));
  std::atomic<bool> closed{false};
  sftest::jthread closer([&] {
    g.close();
    closed = true;
  });
  sftest::must([&] { return closed.load(); }, "close() off the io thread returned");
  run.finish("run() returned");
  REQUIRE(origin.calls == 1);
}

namespace {
sftest::fire_task<int> co_do_from(group_t& g, parked& origin) {
  auto fetch = origin.fn();  // named before the co_await (GCC 12)
  co_return co_await g.co_do(std::string("k"), fetch);
}
}  // namespace

TEST_CASE("co_do resumes on the thread that settles the flight, not on the io_context",
          "[asio][coroutine]") {
  group_t g;
  asio::io_context io;
  parked origin;
  std::optional<sftest::fire_task<int>> task;
  std::atomic<bool> started{false};
  asio::post(io, [&] {
    task.emplace(co_do_from(g, origin));  // starts on io's thread, suspends in co_do
    started = true;
  });
  runner run(io);
  sftest::must([&] { return started.load(); }, "coroutine started on io");
  origin.wait_calls(1, "origin called");
  const std::thread::id io_thread = run.id();
  run.finish("run() returned");  // nothing is left on io: the coroutine is not its work
  origin.set_value(6);           // settles here, on the test thread
  task->wait("coroutine done");
  REQUIRE(task->get().value == 6);
  REQUIRE(task->get().finished_on == std::this_thread::get_id());
  REQUIRE(task->get().finished_on != io_thread);
}

// co_do's awaitable is not an asio::awaitable: Asio's coroutine promise only accepts its own
// awaitables (await_transform), so inside asio::awaitable use
// singleflight::async_do(g, key, fn, asio::use_awaitable) (docs/async.md says so).
template <class Promise, class Awaitable>
concept asio_accepts = requires(Promise& p, Awaitable&& a) {
  p.await_transform(std::forward<Awaitable>(a));
};
using asio_promise = std::coroutine_traits<asio::awaitable<int>>::promise_type;
using co_do_awaitable = decltype(std::declval<group_t&>().co_do(
    std::declval<const std::string&>(), std::declval<decltype(std::declval<parked&>().fn())&>()));
static_assert(!asio_accepts<asio_promise, co_do_awaitable>,
              "Asio now accepts co_do inside asio::awaitable: update docs/async.md (Asio)");
static_assert(asio_accepts<asio_promise, asio::awaitable<int>>);

namespace {
struct profile {
  std::string name;
};
}  // namespace

TEST_CASE("options.executor posting to an asio::thread_pool (the README's example)",
          "[asio][executor]") {
  // --- snippet: asio-thread-pool ---
  asio::thread_pool pool(4);  // declared before the group: ~group() waits for fns on it

  singleflight::options opts;
  opts.executor = [ex = pool.get_executor()](singleflight::task t) {
    asio::post(ex, std::move(t));  // a task is a move-only void(): Asio takes it as a handler
  };
  singleflight::group<std::string, profile> profiles(opts);
  // --- end snippet ---

  std::atomic<int> origin_calls{0};
  std::atomic<bool> fn_on_pool{false};
  sftest::gate release;
  auto fetch = [&] {
    origin_calls.fetch_add(1);
    fn_on_pool = pool.get_executor().running_in_this_thread();
    release.wait("origin released");
    return profile{"user 42"};
  };
  constexpr int callers = 8;
  std::vector<sftest::result<std::string>> results(callers);
  {
    std::vector<sftest::jthread> ts;
    for (auto& r : results) {
      ts.push_back(sftest::spawn(r, [&] { return profiles.do_("user-42", fetch).name; }));
    }
    sftest::must([&] { return profiles.stats().joins == callers - 1; }, "every caller attached");
    release.open();
    for (auto& r : results) sftest::must([&] { return r.done.load(); }, "caller done");
  }
  for (const auto& r : results) REQUIRE(r.value == "user 42");
  REQUIRE(origin_calls == 1);
  REQUIRE(fn_on_pool);  // fn ran on a pool thread, not on a caller's

  // With an executor every caller, the first included, can leave at once.
  sftest::gate hold;
  sf::stop_source leave;
  sftest::result<std::string> leaver;
  auto t = sftest::spawn(leaver, [&] {
    return profiles
        .do_(
            "user-43",
            [&] {
              hold.wait("second origin released");
              return profile{"user 43"};
            },
            leave.get_token())
        .name;
  });
  sftest::must([&] { return profiles.stats().fn_starts == 2; }, "second fn running on the pool");
  leave.request_stop();
  sftest::finish(t, leaver, "first caller left while fn runs");
  REQUIRE(leaver.threw<sf::cancelled_error>());
  hold.open();
}
