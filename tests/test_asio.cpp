// singleflight/asio.hpp: singleflight::async_do as an Asio asynchronous operation.
//
//  * every completion token: use_awaitable (value and exception), use_future, deferred
//    (nothing starts until it is invoked), a plain handler void(std::exception_ptr, T);
//  * the handler runs on its associated executor (another io_context, a strand), never inside
//    the initiating function nor inside the cancellation signal's emit();
//  * the operation is outstanding work: io_context::run() does not return while it is pending;
//  * the handler's associated allocator allocates the operation's state;
//  * cancellation through the associated cancellation slot: the cancelled waiter gets
//    cancelled_error while the flight goes on for the others; the last one leaving stops it;
//  * many asio waiters share one flight; an initiation that throws invokes no handler.
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
#include <stop_token>
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
    return [this](std::stop_token st, sf::completion<int> done) {
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
  std::stop_token token(std::size_t i) {
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
  std::vector<std::stop_token> tokens_;
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
  group_t g;
  asio::io_context io;
  parked origin;
  handler_log log;
  sf::async_do(g, "k", origin.fn(), asio::bind_executor(io, recorder(log)));
  origin.wait_calls(1, "origin called");
  runner run(io);  // nothing else is queued on io: only the operation's work keeps run() going
  REQUIRE_FALSE(sftest::becomes([&] { return run.returned(); }, 100ms));
  origin.set_value(9);
  log.wait("handler called");
  run.finish("run() returned");
  REQUIRE(log.value == 9);
  REQUIRE(log.thread == run.id());
}

TEST_CASE("the handler's associated allocator allocates the operation", "[asio][allocator]") {
  group_t g;
  parked origin;
  handler_log log;
  alloc_counts counts;
  std::atomic<bool> freed_before_handler{false};
  sf::async_do(
      g, "k", origin.fn(),
      asio::bind_allocator(counting_allocator<void>(&counts), [&](std::exception_ptr e, int v) {
        freed_before_handler = counts.deallocations == counts.allocations;
        recorder(log)(std::move(e), v);
      }));
  origin.wait_calls(1, "origin called");
  REQUIRE(counts.allocations >= 1);
  REQUIRE(counts.deallocations == 0);  // the operation is alive while pending
  origin.set_value(4);
  log.wait("handler called");
  REQUIRE(log.value == 4);
  REQUIRE(freed_before_handler);  // Asio's rule: memory is freed before the upcall
  REQUIRE(counts.deallocations == counts.allocations);
}

TEST_CASE("a cancelled waiter gets cancelled_error; the others still get the value",
          "[asio][cancellation]") {
  const auto type = GENERATE(asio::cancellation_type::terminal, asio::cancellation_type::partial,
                             asio::cancellation_type::total);
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
  const std::stop_token fn_token = origin.token(0);
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
