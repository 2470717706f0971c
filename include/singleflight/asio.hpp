// singleflight/asio.hpp
//
// `singleflight::async_do(group, key, fn, token)`: `group::async_do` as an
// Asio asynchronous operation, for any completion token.
//
//   #include <singleflight/asio.hpp>
//
//   singleflight::group<std::string, std::string> profiles;
//   asio::awaitable<void> handle(std::string key) {
//     std::string p = co_await singleflight::async_do(
//         profiles, key,
//         [](singleflight::stop_token st, singleflight::completion<std::string> done) {
//           origin.start_fetch(st, std::move(done));  // returns at once
//         },
//         asio::use_awaitable);
//   }
//
// This is the only singleflight header that includes Asio; nothing else
// depends on it. It needs Asio 1.19 or later (per-operation cancellation):
// standalone Asio (<asio.hpp>) by default, Boost.Asio (Boost 1.77 or later)
// when SINGLEFLIGHT_ASIO_USE_BOOST is defined or when only <boost/asio.hpp>
// is available. One code path serves both: in this header the library is
// `singleflight::detail::asio_net`.
//
// Completion signature: void(std::exception_ptr, T). On success the error is
// null and the second argument is the caller's copy of the value; on failure
// the error is set and the second argument is a value-initialised T, which is
// why T must be default-constructible (for a T that is not, make the group's T
// a std::optional<X> or std::shared_ptr<const X>). So, for instance:
//   * asio::use_awaitable: `co_await` yields T or throws the error;
//   * asio::use_future: a std::future<T> whose get() throws the error;
//   * asio::deferred (asio::experimental::deferred in Asio 1.22): a
//     deferred operation, started when it is invoked with a token; key and fn
//     are decay-copied into it, so a key that is a view (std::string_view,
//     const char*) must outlive that later start;
//   * a plain callable invocable as void(std::exception_ptr, T), passed as
//     an rvalue (moved into the operation) or an lvalue (copied, as Asio's
//     own operations do).
//
// fn is anything `group::async_do` accepts. In an Asio program it should be
// asynchronous, `void fn(stop_token, singleflight::completion<T>)`:
// start the work (a timer, a socket read) and return; resolve the completion
// later from any thread. A synchronous fn runs on the thread that starts the
// flight (inside the initiating function, blocking that thread's executor)
// unless the group has an executor.
//
// GCC 12: name fn before the co_await rather than writing a lambda with
// captures that are not trivially copyable (a std::string, a shared_ptr)
// inside the co_await expression. GCC 12 bitwise-copies such a closure
// temporary in a co_await full-expression and destroys both copies (a double
// free; Asio issue #1007), whatever the called function does with it; the
// same holds for any braced aggregate temporary there (a key struct written
// `key{a, b}`). `auto fetch = [key](...) {...};` then
// `co_await singleflight::async_do(g, key, std::move(fetch), use_awaitable)`
// is fine. See tests/test_gcc12_coawait.cpp.
//
// Errors (the exception_ptr): whatever fn threw or set_exception() passed, the
// same object for every waiter; cancelled_error (this operation was cancelled,
// or the flight was under ownership::leader); closed_error; timeout_error;
// overloaded_error; broken_promise_error (fn's completion was destroyed
// unresolved). See errors.hpp.
//
// Where the handler runs: always through the handler's associated executor
// (asio::get_associated_executor, defaulting to asio::system_executor, so a
// plain handler or asio::use_future runs on whichever thread settles the
// flight). The operation is complete when the flight settles (on the thread
// that resolves the completion, the deadline's timer thread, the caller of
// close()...); the handler is then dispatched to its executor: it runs right
// there when that thread is already running in that executor (an io_context
// thread, a strand's current holder), and is queued to the executor otherwise.
// It is never invoked from inside the initiating function (an immediate
// outcome, such as closed_error or a synchronous fn that ran inline, is
// posted; for the default system_executor that means a thread of Asio's
// system_context) nor from inside the cancellation signal's emit() (posted as
// well).
// Until the handler has run, the operation counts as outstanding work on its
// executor (an io_context's run() does not return while it is pending).
//
// Memory: the handler's associated allocator (asio::get_associated_allocator)
// allocates exactly two things: this operation's own state (the handler, its
// work guard, its outcome; one allocation per call) and, when the handler is
// queued to its executor rather than run inline, the queued function. Both
// are freed before the handler is invoked (Asio's rule). It does not allocate
// what the group allocates with operator new for the same call: the group's
// callback node for this waiter (a few hundred bytes), the caller's stop state when
// the cancellation slot is connected (a stop_source), and the flight
// (shared by its waiters; see group::async_do). The cancellation handler
// lives in the slot's own storage. When the handler runs inline on the
// settling thread, the callback node and the stop state are still allocated
// while it runs and are freed as soon as it returns; when it is queued, they
// are freed before it runs.
//
// Cancellation: when the handler's associated cancellation slot
// (asio::get_associated_cancellation_slot) is connected, the operation owns a
// stop_source, installs a cancellation handler in the slot and passes the
// source's token to group::async_do as the caller's token. Supported types:
// terminal and partial. Either means "this waiter leaves": it completes with
// cancelled_error at once (unless its outcome was already decided), while the
// other waiters of the flight carry on; what happens to the shared work is the
// group's ownership policy (under ownership::waiters the last waiter leaving
// stops fn's token; fn may have run already, so side effects are possible:
// partial, not total). A request for total cancellation alone is ignored (the
// operation continues); a request that includes terminal or partial is
// honoured. The slot is cleared, on the handler's executor, before the
// handler is invoked. Without a connected slot the operation cannot be
// cancelled (group::close() still settles it with closed_error).
//
// close() and ~group() on an io thread: group::close() (and the destructor,
// which calls it) returns only when every fn the group started has returned
// and every completion has been resolved. Do not call it on a thread that
// runs an io_context your origins need: an async fn whose completion (or
// whose stop callback's cancellation) is delivered by a handler on that
// io_context cannot finish while close() blocks that thread, and close()
// then waits forever (close_for(d) gives up after d). Close the group from a
// thread that is not running those io_contexts, or from the io thread only
// once the origins' handlers can run elsewhere.
//
// Coroutines: inside asio::awaitable, co_await singleflight::async_do(g,
// key, fn, asio::use_awaitable), which resumes the coroutine on its own
// executor. group::co_do cannot be awaited there (asio::awaitable's promise
// accepts only Asio's own awaitables in its await_transform), and where it
// can be awaited (another coroutine type) it resumes the coroutine on the
// thread that settles the flight, not on any executor: the resolving thread,
// the timer thread, the thread calling close()...
//
// Thread safety: async_do may be called concurrently from any number of
// threads, on the same group or not, like group::async_do. As everywhere in
// Asio, the cancellation signal must be emitted in the handler's executor
// (its thread or strand), never concurrently with the completion.
//
// Exceptions: the initiating function throws what group::async_do throws
// (Hash, KeyEqual, Key's copy, allocation) plus allocation failures of the
// operation, its stop state and its cancellation handler; the handler is then
// never invoked. Once the operation has started, nothing throws towards the
// initiator: every outcome reaches the handler. A handler that throws while it
// runs from its executor's queue propagates out of that executor's run() as
// usual; one that throws while it runs inline on the settling thread ends in
// std::terminate (group::async_do's callback rule), as does a failure to
// allocate the dispatched function there.
//
// Undefined behaviour: destroying the group before the handler has run;
// destroying the handler's execution context before the operation completes
// (a completed operation whose handler is still queued is destroyed with the
// queue, unrun, as Asio does with its own); destroying the cancellation
// signal bound to the handler before the handler has run, or emitting it
// concurrently with the completion (see Thread safety); and everything
// group::async_do makes undefined.
#pragma once

// SINGLEFLIGHT_ASIO_IS_BOOST: 1 when this header uses Boost.Asio, 0 for standalone Asio.
#if defined(SINGLEFLIGHT_ASIO_USE_BOOST)
#define SINGLEFLIGHT_ASIO_IS_BOOST 1
#elif __has_include(<asio.hpp>) || !__has_include(<boost/asio.hpp>)
#define SINGLEFLIGHT_ASIO_IS_BOOST 0
#else
#define SINGLEFLIGHT_ASIO_IS_BOOST 1
#endif

// Per-operation cancellation (cancellation slots) arrived in Asio 1.19, Boost 1.77.
#if SINGLEFLIGHT_ASIO_IS_BOOST
#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/version.hpp>
#if BOOST_ASIO_VERSION < 101900
#error "singleflight/asio.hpp needs Boost.Asio 1.19 (Boost 1.77) or later"
#endif
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/cancellation_type.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/system_executor.hpp>
#else
#include <asio/associated_allocator.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/version.hpp>
#if ASIO_VERSION < 101900
#error "singleflight/asio.hpp needs Asio 1.19 or later"
#endif
#include <asio/associated_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/system_executor.hpp>
#endif

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "group.hpp"
#include "outcome.hpp"
#include "stop_token.hpp"

namespace singleflight {

namespace detail {

#if SINGLEFLIGHT_ASIO_IS_BOOST
namespace asio_net = ::boost::asio;
#else
namespace asio_net = ::asio;
#endif

// How many async_do initiations and cancellation requests this thread is
// inside of. A completion that arrives meanwhile (an immediate outcome, a
// synchronous fn that ran inline, a waiter leaving inside request_stop) is
// posted rather than dispatched, so that no handler runs inside its own
// initiating function or inside the emit() that cancelled it. Kept per thread
// rather than in the operation: the operation may be gone by the time the
// initiating thread leaves the scope.
inline thread_local int asio_post_only_depth = 0;

class asio_post_only_scope {
 public:
  asio_post_only_scope() noexcept { ++asio_post_only_depth; }
  ~asio_post_only_scope() { --asio_post_only_depth; }
  asio_post_only_scope(const asio_post_only_scope&) = delete;
  asio_post_only_scope& operator=(const asio_post_only_scope&) = delete;
};

// One async_do operation: the handler, the work it keeps on its executor, its
// cancellation wiring and, once the flight settled, the outcome. Allocated with
// the handler's associated allocator; freed before the handler is invoked.
template <class T, class Handler>
class asio_op {
 public:
  using executor_type = asio_net::associated_executor_t<Handler, asio_net::system_executor>;
  using allocator_type = asio_net::associated_allocator_t<Handler>;
  using slot_type = asio_net::associated_cancellation_slot_t<Handler>;

  // Allocates and constructs the operation with a decay-copy of the handler
  // (moved from an rvalue, copied from an lvalue, as Asio's own operations
  // do).
  template <class H>
  static asio_op* create(H&& handler) {
    op_alloc a(asio_net::get_associated_allocator(handler));
    asio_op* p = op_traits::allocate(a, 1);
    try {
      op_traits::construct(a, p, std::forward<H>(handler));
    } catch (...) {
      op_traits::deallocate(a, p, 1);
      throw;
    }
    return p;
  }

  // Destroys the operation without invoking the handler (the initiation
  // failed, or the dispatched function was destroyed unrun: the executor
  // shut down).
  static void discard(asio_op* p) noexcept {
    p->disconnect();
    op_alloc a(asio_net::get_associated_allocator(p->handler_));
    op_traits::destroy(a, p);
    op_traits::deallocate(a, p, 1);
  }

  template <class H>
  requires std::constructible_from<Handler, H&&>
  explicit asio_op(H&& handler)
      : handler_(std::forward<H>(handler)),
        work_(asio_net::get_associated_executor(handler_, asio_net::system_executor())) {}
  asio_op(const asio_op&) = delete;
  asio_op& operator=(const asio_op&) = delete;
  ~asio_op() = default;

  // The caller's token for group::async_do: a stop_source of our own wired to
  // the handler's cancellation slot, or none when the slot is not connected.
  stop_token connect() {
    slot_ = asio_net::get_associated_cancellation_slot(handler_);
    if (!slot_.is_connected()) return {};
    stop_.emplace();
    slot_.template emplace<cancel_handler>(&*stop_);
    return stop_->get_token();
  }

  // group::async_do's on_done: the flight settled (or this waiter left).
  struct on_done {
    asio_op* op;
    void operator()(outcome<T> o) const { op->complete(std::move(o)); }
  };

 private:
  using op_alloc = typename std::allocator_traits<allocator_type>::template rebind_alloc<asio_op>;
  using op_traits = std::allocator_traits<op_alloc>;

  // The function dispatched to the handler's executor. It owns the operation:
  // destroyed unrun (the executor shut down), it frees it without invoking the
  // handler.
  class invoker {
   public:
    using allocator_type = typename asio_op::allocator_type;
    explicit invoker(asio_op* op) noexcept : op_(op) {}
    invoker(invoker&& o) noexcept : op_(std::exchange(o.op_, nullptr)) {}
    invoker(const invoker&) = delete;
    invoker& operator=(const invoker&) = delete;
    invoker& operator=(invoker&&) = delete;
    ~invoker() {
      if (op_ != nullptr) discard(op_);
    }
    allocator_type get_allocator() const noexcept {
      return asio_net::get_associated_allocator(op_->handler_);
    }
    void operator()() { std::exchange(op_, nullptr)->finish(); }

   private:
    asio_op* op_;
  };

  // Installed in the handler's cancellation slot. Runs inside emit(), in the
  // handler's executor; request_stop may complete this operation right here
  // (cancelled_error), which is then posted. Only terminal and partial
  // cancellation are supported: a request for total cancellation alone
  // ("only if the operation has had no side effects") is ignored, since this
  // waiter's fn may already have run, and its leaving may stop the shared work.
  struct cancel_handler {
    explicit cancel_handler(stop_source* s) noexcept : source(s) {}
    stop_source* source;
    void operator()(asio_net::cancellation_type_t type) const noexcept {
      constexpr auto supported =
          asio_net::cancellation_type::terminal | asio_net::cancellation_type::partial;
      if ((type & supported) == asio_net::cancellation_type::none) return;
      const asio_post_only_scope post_only;
      source->request_stop();
    }
  };

  void complete(outcome<T> o) {
    result_.emplace(std::move(o));
    const executor_type ex = work_.get_executor();
    if (asio_post_only_depth > 0) {
      asio_net::post(ex, invoker(this));
    } else {
      asio_net::dispatch(ex, invoker(this));
    }
  }

  // Runs in the handler's executor: clears the slot, frees the operation and
  // invokes the handler, keeping the work until it returns.
  void finish() {
    disconnect();
    Handler handler(std::move(handler_));
    outcome<T> o(std::move(*result_));
    auto work = std::move(work_);
    {
      op_alloc a(asio_net::get_associated_allocator(handler));
      op_traits::destroy(a, this);
      op_traits::deallocate(a, this, 1);
    }
    if (o.has_value()) {
      std::move(handler)(std::exception_ptr(), std::move(o).value());
    } else {
      std::move(handler)(o.error(), T());
    }
  }

  // Removes our cancellation handler from the slot, if we installed one.
  void disconnect() noexcept {
    if (stop_) slot_.clear();
  }

  Handler handler_;
  asio_net::executor_work_guard<executor_type> work_;
  slot_type slot_;
  std::optional<stop_source> stop_;
  std::optional<outcome<T>> result_;
};

template <class Group>
struct asio_initiate_do {
  Group* g;

  template <class Handler, class K, class F>
  void operator()(Handler&& handler, const K& key, F&& fn) const {
    using op_t = asio_op<typename Group::value_type, std::decay_t<Handler>>;
    op_t* op = op_t::create(std::forward<Handler>(handler));
    try {
      stop_token caller = op->connect();
      const asio_post_only_scope post_only;
      g->async_do(key, std::forward<F>(fn), typename op_t::on_done{op}, std::move(caller));
    } catch (...) {
      // group::async_do threw, so it will never call on_done: the operation
      // is ours to discard, and the initiator sees the exception.
      op_t::discard(op);
      throw;
    }
  }
};

}  // namespace detail

// async_do(g, key, fn, token)
//
// Starts or joins the flight for `key` in `g` (`g.async_do(key, fn, ...)`)
// as an Asio asynchronous operation with completion signature
// void(std::exception_ptr, T); see the top of this file for where the handler
// runs, cancellation, exceptions and undefined behaviour. The operation
// starts when the token says so (at once for a handler, use_future and
// use_awaitable's co_await; when invoked for deferred). Thread-safe.
template <class Key, class T, class H, class E, class K, class F, class CompletionToken>
auto async_do(group<Key, T, H, E>& g, const K& key, F&& fn, CompletionToken&& token) {
  static_assert(std::is_default_constructible_v<T>,
                "singleflight::async_do (asio.hpp): the completion signature is "
                "void(std::exception_ptr, T) and an error completes with a value-initialised T, "
                "so T must be default-constructible; use a group of std::optional<X> or "
                "std::shared_ptr<const X>");
  return detail::asio_net::async_initiate<CompletionToken, void(std::exception_ptr, T)>(
      detail::asio_initiate_do<group<Key, T, H, E>>{&g}, token, key, std::forward<F>(fn));
}

}  // namespace singleflight
