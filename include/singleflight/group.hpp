// singleflight/group.hpp
//
// `singleflight::group<Key, T>` runs a piece of work once for all the callers
// that ask for the same key at the same time, and hands each of them the
// outcome.
//
//   singleflight::group<std::string, profile> profiles;
//   profile p = profiles.do_(tenant + '|' + user + '|' + locale,
//                            [&](singleflight::stop_token st) { return origin.fetch(st, ...); },
//                            request_stop_token);
//
// Overview
//
// A group holds a map from key to the flight in progress for that key,
// split into shards by key hash, each under its own mutex. `do_` either starts a flight (this
// caller is the *leader*) or joins the one in progress (a *follower*). When the flight settles,
// every caller attached to it receives the same outcome: its own copy of the value, or the same
// exception object. Settled flights are forgotten at once: a group is not a cache, and it never
// hands out a value or an error that had settled before the caller arrived.
//
// Guarantees (docs/group.md, "Guarantees", has the full list and the tests):
//  1. At most one fn per key runs at any moment, including a stopped fn that
//     is still winding down; only forget() lifts this.
//  2. Every caller receives the outcome of a flight that had not settled when
//     it arrived; do_fresh receives a flight that started after it arrived.
//  3. No entry outlives its fn; cleanup is identity-checked.
//  4. Values are copied per caller; exceptions of any type are shared as the
//     same object; the entry is gone before the waiters wake.
//  5. Per-caller cancellation with the ownership policy of `options::owner`.
//  6. Without an executor the leader runs fn inline and returns when fn does.
//  7. A deadline inside each flight (`options::timeout`).
//  8. close(): rejects, stops, drains; callable from inside fn.
//  9. forget(key). 10. max_in_flight. 11. Self-deadlock detection.
// 12. Exception safety of Hash, KeyEqual, allocation and T's copy.
//
// Async: async_do (a callback) and co_do (a coroutine) join or start a
// flight without blocking a thread, and fn may itself be asynchronous
// (`void fn(stop_token, completion<T>)`). Blocking, callback and
// coroutine waiters share flights and every guarantee above; callbacks and
// resumptions run on the thread that settles the flight, never under a
// lock of the group (see async_do). try_do is do_ without a throw.
//
// Scope: one process. Twenty processes running a group each make twenty
// flights for one key, not one.
//
// Thread safety: every member function may be called concurrently from any
// number of threads, except the destructor, which must not run concurrently
// with any other call and must not be called from inside fn.
//
// Where user code runs (the one rule; docs/async.md, "Re-entrancy", has the table):
//  * No lock of the group is held while user code runs (fn, on_done, a
//    resumption, an executor, Hash, T's copy, move or destructor, the
//    destructor of an exception fn or the executor threw, a stop callback),
//    and user code may re-enter the group: do_, async_do, forget, close(),
//    even ~group() from a callback.
//  * A step that settles flights requests stop on every one of them before it
//    notifies any waiter, so a notified waiter that blocks on such a flight
//    (a retry with a blocking do_, close()) finds its fn already asked to stop.
//  * options.tracer (tracer.hpp) is user code under the same rules: its
//    on_start and on_settle run outside every lock, may re-enter the group,
//    and never run on the timer thread.
//  * Callbacks and resumptions never run on the group's timer thread (one
//    that blocked would hold back every other deadline): async waiters a
//    deadline settles are handed to the group's delivery thread, as are those
//    an inline leader's stop cancels (that stop runs inside a stop callback
//    the leader's thread waits for).
//  * A thread about to block inside the group (a blocking do_, close()) first
//    runs what it holds back that its wait could depend on: when its
//    notification loop holds async callers going round again, the rest of
//    that loop and the flights it deferred. (In a loop without them the
//    waiters after a blocking callback are notified when it returns: a delay,
//    not a deadlock.)
//  * close() or ~group() on a thread the group owns (the timer, the delivery
//    thread, a thread_executor worker) never joins that thread: close()
//    leaves it to the destructor, the destructor detaches it, and the thread
//    touches nothing of the group afterwards.
//  * Which thread is inside the group (running fn, holding counts) is kept in
//    the group, not in a thread_local, so it holds across shared objects.
//
// Lifetime of fn: fn may outlive the call that passed it. With an executor,
// ownership::group, or an async caller, the flight (and fn, moved or copied
// into it) can keep running after that caller has left: capture by value
// what fn needs, never references to the caller's locals. Without an
// executor a blocking do_ leader runs fn inline and cannot leave before it
// returns, so there references are safe.
//
// Locking: one std::mutex per shard (options::shards; by default a few per
// core), held only for table operations and bookkeeping of the keys that
// hash to it; calls for different keys rarely meet. It is never held while
// user code runs (fn, T's copy or move, a stop_callback, the executor, Hash,
// a callback, a coroutine), with three exceptions: KeyEqual runs under it
// during lookup, Key's copy or assignment when a new entry is made, and fn's
// move (a copy for an lvalue) when an async caller that had to wait for a
// stopped fn starts the next flight. Stop requests are always made after the
// lock is released, because stop callbacks run synchronously in the
// requesting thread; waiters are notified after it is released too (see
// detail/group/claim.hpp for the claim/leave exchange). No thread holds two
// shards' locks at once: stats(), in_flight() and close() take each in turn.
//
// Where the parts live (include/singleflight/detail/, bottom layer first):
//   shard_set.hpp       the identity-checked table's links, settle/finish
//                       bookkeeping, the drain count, statistics (sharded);
//   notification.hpp    notifying claimed waiters; notification loops;
//   deadlines.hpp       the timer and delivery threads;
//   lifecycle.hpp       close(), the drain, joining the group's threads;
//   leader_stop.hpp     an inline leader's stop callback;
//   execution.hpp       tasks, executors, running fn, completions (a flight's
//                       body erased: compiled once, not per Key, T or body);
//   flight_table.hpp    Hash, KeyEqual, the lookup, recycling (the first layer
//                       that is a template on Key and T: those below are not);
//   blocking_calls.hpp  do_, do_fresh, try_do;
//   async_waiters.hpp   async_do (callbacks) and what co_do builds on;
//   coroutine.hpp       co_do's awaiter;
// and the protocol's parts: claim.hpp (the claim/leave exchange),
// ownership.hpp (who stops the work), observers.hpp (waiting for a stopped
// fn), flight.hpp (the shared call state).
//
// Allocation: a join allocates nothing. A leader without followers whose fn
// takes no stop_token allocates nothing in steady state (up to 8 finished
// flights per shard, each with its key's storage, are kept for reuse); a fn
// taking a stop_token costs one allocation (the stop state: a token handed
// to one fn is never reused).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "completion.hpp"
#include "detail/chrono.hpp"
#include "detail/fn_shapes.hpp"
#include "detail/functional.hpp"
#include "detail/group/async_waiters.hpp"
#include "detail/group/coroutine.hpp"
#include "detail/group/deadline_list.hpp"
#include "errors.hpp"
#include "executor.hpp"
#include "hash.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "stop_token.hpp"
#include "task.hpp"
#include "thread_executor.hpp"
#include "wait_bound.hpp"

namespace singleflight {

// group
//
// Template parameters:
//   Key       what identifies a result. Must hold every input that changes the
//             result (tenant, locale, version, authorisation scope) and
//             nothing that doesn't. Copy-constructible; hashable by Hash.
//   T         the result. Each caller receives its own copy, so T must be
//             copy-constructible; for big values use std::shared_ptr<const X>.
//   Hash      default_hash: transparent for strings, handles pair/tuple keys.
//   KeyEqual  std::equal_to<>: transparent.
template <class Key, class T, class Hash = default_hash, class KeyEqual = std::equal_to<>>
class group : private detail::async_calls<Key, T, Hash, KeyEqual> {
  static_assert(std::is_object_v<T> && !std::is_array_v<T>,
                "singleflight::group<Key, T>: T must be an object type (not a reference, "
                "array or void)");
  static_assert(std::copy_constructible<T>,
                "singleflight::group<Key, T>: every caller receives its own copy of the value, "
                "so T must be copy-constructible; for big or move-only values use "
                "std::shared_ptr<const X>");
  static_assert(std::copy_constructible<Key> && std::is_object_v<Key>,
                "singleflight::group<Key, T>: Key must be a copy-constructible object type");
  static_assert(std::is_invocable_r_v<std::size_t, const Hash&, const Key&>,
                "singleflight::group<Key, T, Hash>: Hash must be callable as "
                "std::size_t(const Key&); for your own key types specialise std::hash or "
                "pass a Hash");
  static_assert(std::is_invocable_r_v<bool, const KeyEqual&, const Key&, const Key&>,
                "singleflight::group<Key, T, Hash, KeyEqual>: KeyEqual must be callable as "
                "bool(const Key&, const Key&)");

  using core = detail::async_calls<Key, T, Hash, KeyEqual>;

 public:
  using key_type = Key;
  using value_type = T;
  using hasher = Hash;
  using key_equal = KeyEqual;

  // group()
  //
  // A group with default options: ownership::waiters, no deadline, no cap,
  // fn runs on the leader's thread.
  group() : group(options{}) {}

  // group(options)
  //
  // Throws std::system_error when options.timeout > 0 and the timer thread
  // cannot be started.
  explicit group(options opts) : core(std::move(opts)) {}

  group(const group&) = delete;
  group& operator=(const group&) = delete;

  // ~group()
  //
  // Equivalent to close(): rejects, stops and drains, then returns. Undefined
  // if called concurrently with any other member or from inside fn. It may
  // run inside on_done or a resumption (the last shared_ptr released there),
  // also on a thread the group owns (a thread_executor worker, the delivery
  // thread, the timer running a stop callback): that thread is detached
  // instead of joined, and touches nothing of the group once the callback
  // returns.
  ~group() {
    (void)this->close_until(std::nullopt, /*destroying=*/true);
    // Notification loops of this thread that ran this destructor (it drained
    // them): their epilogues must not touch the group any more.
    this->orphan_own_loops();
  }

  // do_(key, fn, caller)
  //
  // Returns the value of the flight for `key`, starting one if none is in
  // progress. `fn` is invocable as `fn(singleflight::stop_token)` or `fn()` and its
  // result converts to T; the token it receives is the flight's own, stopped
  // when the ownership policy, the deadline or close() says so.
  //
  // Without an executor the first caller runs fn on its own thread and
  // returns when fn does (it cannot leave earlier); followers block until the
  // flight settles or their `caller` token fires. With an executor every
  // caller blocks and can leave at once.
  //
  // Lifetime: with an executor or ownership::group, fn (moved or copied into
  // the flight) may run after this call has returned: capture by value, not
  // references to this caller's locals. fn may end its thread
  // (pthread_exit): the others then get abandoned_error, the key is freed,
  // and the unwind continues.
  //
  // Where waiters are resumed: a blocked caller is woken by the thread that
  // settles the flight (the one whose fn returned, the timer thread at a
  // deadline, which only signals it, the caller of close(), or the last
  // waiter leaving), after that
  // thread has released the group's lock; the woken caller then copies its
  // value on its own thread, without taking the group's lock again. A
  // caller's own stop wakes it on the thread that requested the stop, which
  // only flags the caller; the caller itself does the rest.
  //
  // Throws:
  //   * whatever fn threw (the same exception object in every waiter);
  //   * cancelled_error: `caller` fired before an outcome arrived (or was
  //     already stopped: then nothing was started or joined), or the leader
  //     cancelled the flight under ownership::leader;
  //   * timeout_error, closed_error, overloaded_error: see errors.hpp;
  //   * std::logic_error: fn called do_ for its own key on the thread running
  //     it (it would wait for itself forever);
  //   * whatever Hash, KeyEqual, Key's or T's copy, or allocation threw; the
  //     group is left unchanged by a throw before the call attached.
  // Thread-safe.
  template <class K, class F>
  T do_(const K& key, F&& fn, stop_token caller = {}) {
    std::optional<T> local;
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, nullptr, local);
    return core::result_of(t, local);
  }

  // do_(key, fn, caller, info): as above, and fills `info` with this caller's
  // role (leader / follower / none) and the flight's number, on every exit.
  template <class K, class F>
  T do_(const K& key, F&& fn, stop_token caller, call_info& info) {
    std::optional<T> local;
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, &info, local);
    return core::result_of(t, local);
  }

  // do_fresh(key, fn, caller)
  //
  // Like do_, but receives a flight that *started after this call arrived*
  // (read-your-writes: call it after a write). If the flight in progress
  // started earlier, do_fresh waits for its fn to return (bounded by
  // `caller` and options.timeout, counted from arrival) and then starts or
  // joins the next one; concurrent do_fresh callers still share one flight,
  // and two fns for one key never overlap. Thread-safe.
  template <class K, class F>
  T do_fresh(const K& key, F&& fn, stop_token caller = {}) {
    std::optional<T> local;
    auto t = enter<F>(key, std::forward<F>(fn), caller, true, nullptr, local);
    return core::result_of(t, local);
  }

  template <class K, class F>
  T do_fresh(const K& key, F&& fn, stop_token caller, call_info& info) {
    std::optional<T> local;
    auto t = enter<F>(key, std::forward<F>(fn), caller, true, &info, local);
    return core::result_of(t, local);
  }

  // do_(key, fn, caller, bound), do_fresh(key, fn, caller, bound)
  //
  // As above, and this caller waits at most until `bound` (a wait_bound: a
  // duration from now, or a time point), independent of the flight's own
  // options.timeout. When it passes the caller gets timeout_error and counts
  // as having left the flight, exactly as when `caller` fires: under
  // ownership::waiters the last caller to go stops the work, under
  // ownership::leader the leader's bound cancels it for everyone. An inline
  // leader (no executor) still returns only when its fn does. A bound
  // already passed starts and joins nothing. The first call with a bound in
  // a group without options.timeout starts the group's timer thread
  // (std::system_error if it cannot). Pass {} for no stop_token.
  template <class K, class F>
  T do_(const K& key, F&& fn, stop_token caller, wait_bound bound) {
    std::optional<T> local;
    const auto at = bound.deadline();
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, nullptr, local, &at);
    return core::result_of(t, local);
  }

  template <class K, class F>
  T do_(const K& key, F&& fn, stop_token caller, wait_bound bound, call_info& info) {
    std::optional<T> local;
    const auto at = bound.deadline();
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, &info, local, &at);
    return core::result_of(t, local);
  }

  template <class K, class F>
  T do_fresh(const K& key, F&& fn, stop_token caller, wait_bound bound) {
    std::optional<T> local;
    const auto at = bound.deadline();
    auto t = enter<F>(key, std::forward<F>(fn), caller, true, nullptr, local, &at);
    return core::result_of(t, local);
  }

  template <class K, class F>
  T do_fresh(const K& key, F&& fn, stop_token caller, wait_bound bound, call_info& info) {
    std::optional<T> local;
    const auto at = bound.deadline();
    auto t = enter<F>(key, std::forward<F>(fn), caller, true, &info, local, &at);
    return core::result_of(t, local);
  }

  // try_do(key, fn, caller)
  //
  // do_ without a throw for the call's outcome: returns this caller's
  // outcome<T> (its own copy of the value, or the exception do_ would have
  // thrown, with status() telling which kind at no cost), so a hot path that
  // expects cancellations, timeouts or rejections pays neither a throw nor an
  // allocation for them (the library's own errors are shared, immutable
  // exception objects). outcome::info() is do_'s call_info. Everything else
  // is do_: the same flights, waits, threads and guarantees.
  //
  // Throws (with nothing attached) only what Hash, KeyEqual, Key's copy or
  // allocation throw, and std::logic_error when fn calls it for its own key
  // on the thread running it. Thread-safe.
  template <class K, class F>
  outcome<T> try_do(const K& key, F&& fn, stop_token caller = {}) {
    std::optional<T> local;
    call_info info;
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, &info, local);
    return core::to_outcome(t, local, info);
  }

  // try_do(key, fn, caller, bound): try_do with a wait_bound (see do_).
  template <class K, class F>
  outcome<T> try_do(const K& key, F&& fn, stop_token caller, wait_bound bound) {
    std::optional<T> local;
    call_info info;
    const auto at = bound.deadline();
    auto t = enter<F>(key, std::forward<F>(fn), caller, false, &info, local, &at);
    return core::to_outcome(t, local, info);
  }

  // try_do_fresh(key, fn, caller): do_fresh without a throw (see try_do).
  template <class K, class F>
  outcome<T> try_do_fresh(const K& key, F&& fn, stop_token caller = {}) {
    std::optional<T> local;
    call_info info;
    auto t = enter<F>(key, std::forward<F>(fn), caller, true, &info, local);
    return core::to_outcome(t, local, info);
  }

  // async_do(key, fn, on_done, caller)
  //
  // Like do_, without blocking: `on_done(singleflight::outcome<T>)` receives
  // this caller's outcome (its own copy of the value, or the exception that
  // do_ would have thrown). `fn` is what do_ accepts, or asynchronous:
  // `void fn(stop_token, singleflight::completion<T>)`, which starts the
  // work and returns at once; the work finishes it through the completion.
  //
  // on_done is called exactly once, never while a lock of the group is held,
  // and may re-enter the group (do_, async_do, forget, close, ...). Where:
  //   * before async_do returns, on this thread, for an immediate outcome:
  //     closed_error (closed group), cancelled_error (`caller` already
  //     stopped), overloaded_error (max_in_flight reached and this call
  //     would start a flight);
  //   * on the thread that settles the flight: the one resolving the
  //     completion (or destroying it unresolved), the one whose sync fn
  //     returned, the one calling close(), the one whose stop cancelled the
  //     flight under the ownership policy (an async caller's stop).
  //     A sync fn without an executor runs inside async_do, on this thread,
  //     when this caller starts the flight: on_done then usually runs before
  //     async_do returns. A caller that finds the key's previous fn still
  //     winding down (stopped, not yet returned) goes round again, and may
  //     start the next flight, on the thread where that fn returns;
  //   * on the group's delivery thread (never the timer) when a deadline
  //     settles the flight or an inline do_ leader's stop cancels it
  //     (ownership::leader);
  //   * with cancelled_error, on the thread that requested stop on `caller`,
  //     inside request_stop(), when that came first. If the stop races with
  //     async_do itself, on_done may run on this thread before it returns.
  //
  // Lifetime: fn (moved or copied into the flight) and on_done outlive this
  // call: capture by value, never references to the caller's locals.
  //
  // An async caller counts as a waiter for the ownership policy (a leader
  // included), and joining a flight that this very thread is running is
  // fine (nothing blocks). close() waits for async callers whose outcome is
  // not decided yet, and for unresolved completions; it does not wait for
  // on_done calls already under way.
  //
  // Throws (and then never calls on_done) only what Hash, KeyEqual, Key's
  // copy or allocation throw, with the group unchanged. If on_done throws,
  // std::terminate is called. Thread-safe.
  template <class K, class F, class Callback>
  void async_do(const K& key, F&& fn, Callback&& on_done, stop_token caller = {}) {
    async_impl(key, std::forward<F>(fn), std::forward<Callback>(on_done), std::move(caller),
               nullptr);
  }

  // async_do(key, fn, on_done, caller, bound): as above, and on_done receives
  // timeout_error once `bound` passes (see do_ with a wait_bound for what
  // leaving means), on the group's delivery thread.
  template <class K, class F, class Callback>
  void async_do(const K& key, F&& fn, Callback&& on_done, stop_token caller, wait_bound bound) {
    const auto at = bound.deadline();
    async_impl(key, std::forward<F>(fn), std::forward<Callback>(on_done), std::move(caller), &at);
  }

 private:
  template <class K, class F, class Callback>
  void async_impl(const K& key, F&& fn, Callback&& on_done, stop_token caller,
                  const std::chrono::steady_clock::time_point* bound) {
    using Fn = std::decay_t<F>;
    using Cb = std::decay_t<Callback>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::async_do: fn must be invocable as T fn(stop_token), "
                  "T fn(), or (asynchronous) void fn(stop_token, singleflight::completion<T>)");
    static_assert(std::is_invocable_v<Cb&, outcome<T>&&>,
                  "singleflight::group::async_do: on_done must be invocable with "
                  "singleflight::outcome<T>");
    static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                  "singleflight::group::async_do: the key argument must be a Key or something "
                  "a Key can be constructed from");
    if constexpr (detail::flight_fn<Fn, T> && std::is_invocable_v<Cb&, outcome<T>&&>) {
      static_assert(std::convertible_to<typename detail::fn_result<Fn, T>::type, T>,
                    "singleflight::group::async_do: fn's result must convert to the group's T");
      if constexpr (direct_probe<K>) {
        this->start_callback(key, std::forward<F>(fn), std::forward<Callback>(on_done),
                             std::move(caller), bound);
      } else if constexpr (std::constructible_from<Key, const K&>) {
        const Key converted(key);
        this->start_callback(converted, std::forward<F>(fn), std::forward<Callback>(on_done),
                             std::move(caller), bound);
      }
    }
  }

 public:
  // co_do(key, fn, caller)
  //
  //   auto fetch = [key](singleflight::stop_token st, completion<T> done) { ... };
  //   T v = co_await g.co_do(key, fetch, token);
  //
  // GCC 12 (Debian 12's default compiler): name fn before the co_await, as
  // above. GCC 12 destroys twice a temporary whose members are initialised in
  // place when it is written inside a co_await expression: a lambda with
  // captures that are not trivially copyable (a std::string, a shared_ptr), or
  // a braced aggregate key; with a std::string capture that is a double free,
  // with no diagnostic, at -O0 as at -O2. The temporary belongs to the calling
  // coroutine, so nothing co_do does with fn avoids it (taking fn by value or
  // copying it into the awaitable was tried: the same double free). clang is
  // not affected. tests/test_gcc12_coawait.cpp pins the workaround and the bug.
  //
  // The coroutine form of async_do: yields this caller's copy of the value
  // or throws what do_ would throw. Works from any coroutine type whose
  // promise does not filter co_await through an await_transform that rejects
  // it (the awaiter takes a std::coroutine_handle<>): not inside
  // asio::awaitable, whose await_transform accepts only Asio's awaitables;
  // there, co_await singleflight::async_do(g, key, fn, asio::use_awaitable)
  // (<singleflight/asio.hpp>), which also resumes on the coroutine's
  // executor. Costs no allocation per join: the waiter lives in the awaiting
  // coroutine's frame.
  //
  // The coroutine resumes on the thread that settles the flight (see
  // async_do for the list), or on the thread that requested stop on
  // `caller` with cancelled_error; it does not suspend at all when the
  // outcome is immediate (closed, already cancelled, overloaded, a sync fn
  // without an executor that ran to completion inside the co_await, or a
  // flight that settled before the suspension was complete).
  //
  // The awaitable refers to `key` and `fn`: co_await it in the same full
  // expression (its operator co_await is rvalue-only). Destroying a
  // coroutine while it is suspended in co_do is undefined (leave through
  // `caller` instead). Thread-safe.
  template <class K, class F>
  [[nodiscard]] auto co_do(const K& key, F&& fn, stop_token caller = {}) {
    return co_impl<K, F>(key, fn, std::move(caller), nullptr, std::nullopt);
  }

  // co_do(key, fn, caller, bound): as above, and the coroutine resumes with
  // timeout_error once `bound` passes (see do_ with a wait_bound), on the
  // group's delivery thread.
  template <class K, class F>
  [[nodiscard]] auto co_do(const K& key, F&& fn, stop_token caller, wait_bound bound) {
    return co_impl<K, F>(key, fn, std::move(caller), nullptr, bound.deadline());
  }

  // co_do(key, fn, caller, info): as above, and fills `info` with this
  // caller's role and the flight's number when the co_await completes (on
  // every exit, as do_'s overload does).
  template <class K, class F>
  [[nodiscard]] auto co_do(const K& key, F&& fn, stop_token caller, call_info& info) {
    return co_impl<K, F>(key, fn, std::move(caller), &info, std::nullopt);
  }

  // forget(key)
  //
  // Removes the entry for `key`, if any, and returns whether there was one.
  // The next caller starts a new flight even while the old fn still runs
  // (this is the one way to lift the no-overlap guarantee); callers already
  // waiting keep the old flight, and its completion never evicts the new
  // entry. Thread-safe. Throws whatever Hash or KeyEqual throws.
  bool forget(const Key& key) {
    const std::uint64_t mixed = core::mix(this->hash_(key));
    auto& s = this->shard_of(mixed);
    detail::wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      auto* f = this->find(s, key, mixed);
      if (f == nullptr) return false;
      this->erase(s, f);
      // Observers waited for this fn only because of the no-overlap rule,
      // which forget() just lifted: let them go round again.
      detail::claim_observers(*f, s.bounds, wake);
      f->release();  // the table's reference; the runner still holds one
    }
    core::notify(this, s, wake);
    return true;
  }

  // close()
  //
  // Idempotent. New calls throw closed_error from now on; every unsettled
  // flight settles with closed_error for its waiters and has its token
  // stopped; callers waiting for a predecessor get closed_error. Returns once
  // every fn the group started has returned (or its task was dropped), every
  // caller has left, and the group's own threads are joined. The shards are
  // closed one at a time: while close() runs, a call in a shard it has not
  // reached may still start a flight, which it settles and drains like the
  // others; once any close() has returned, every call is rejected.
  //
  // Called from inside fn (any flight of this group, on this thread) it does
  // all of the above except waiting for this thread's own calls; the
  // destructor then finishes the drain. Called from on_done or a resumption
  // in a batch that holds async callers going round again, it first notifies
  // the rest of that batch and starts what it deferred, then waits for
  // everyone else (in any other batch the waiters after it are notified when
  // it returns; close() does not wait for them). On a thread the group owns (a
  // thread_executor worker, the delivery or timer thread) it joins every
  // thread but that one, which the destructor joins (or, on that very thread,
  // detaches). A fn that ignores its stop token makes close() wait for it:
  // see close_for().
  // Thread-safe.
  void close() { (void)this->close_until(std::nullopt, /*destroying=*/false); }

  // close_for(timeout)
  //
  // close() that gives up waiting after `timeout` and returns false if fns
  // were still running then (the group stays closed; a later close() or the
  // destructor waits for the rest). Returns true when drained. Thread-safe.
  // `timeout` may be any duration, up to duration::max() (which never gives
  // up).
  template <class Rep, class Period>
  bool close_for(std::chrono::duration<Rep, Period> timeout) {
    return this->close_until(detail::after(std::chrono::steady_clock::now(), timeout),
                             /*destroying=*/false);
  }

  // in_flight()
  //
  // The number of entries: keys whose fn has not returned (joinable flights,
  // and stopped flights still winding down). Returns to 0 between bursts.
  // Summed shard by shard, each under its lock in turn: exact once no call
  // is running. Thread-safe.
  std::size_t in_flight() const { return self().entries(); }

  // stats()
  //
  // The counters, summed shard by shard (each shard's lock in turn, never
  // two at once): each shard's figures are read together, the sum is not
  // one instant across shards while calls run; see singleflight::stats.
  // Thread-safe.
  singleflight::stats stats() const { return self().snapshot(); }

 private:
  // Whether K probes the table as it is (hash.hpp); otherwise it is converted
  // to Key once, before the lock is taken.
  template <class K>
  static constexpr bool direct_probe = detail::direct_probe<K, Key, Hash, KeyEqual>;

  // stats() and in_flight() are const; the locks they take are not.
  core& self() const noexcept { return const_cast<group&>(*this); }

  // The blocking call for do_, do_fresh and try_do: checks fn's shape,
  // converts the key if needed, and returns the ticket.
  template <class F, class K>
  auto enter(const K& key, F&& fn, const stop_token& caller, bool fresh, call_info* info,
             std::optional<T>& local,
             const std::chrono::steady_clock::time_point* bound = nullptr) {
    using Fn = std::decay_t<F>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::do_: fn must be invocable as T fn(stop_token), T fn(), "
                  "or (asynchronous) void fn(stop_token, singleflight::completion<T>)");
    static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                  "singleflight::group::do_: the key argument must be a Key or something a Key "
                  "can be constructed from");
    if constexpr (detail::flight_fn<Fn, T>) {
      static_assert(std::convertible_to<typename detail::fn_result<Fn, T>::type, T>,
                    "singleflight::group::do_: fn's result must convert to the group's T");
    }
    if constexpr (direct_probe<K>) {
      return this->call_with(key, std::forward<F>(fn), caller, fresh, info, local, bound);
    } else {
      const Key converted(key);
      return this->call_with(converted, std::forward<F>(fn), caller, fresh, info, local, bound);
    }
  }

  template <class K, class F>
  auto co_impl(const K& key, F& fn, stop_token caller, call_info* info,
               std::optional<std::chrono::steady_clock::time_point> bound) {
    using Fn = std::decay_t<F>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::co_do: fn must be invocable as T fn(stop_token), T fn(), "
                  "or (asynchronous) void fn(stop_token, singleflight::completion<T>)");
    static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                  "singleflight::group::co_do: the key argument must be a Key or something a "
                  "Key can be constructed from");
    if constexpr (detail::flight_fn<Fn, T>) {
      static_assert(std::convertible_to<typename detail::fn_result<Fn, T>::type, T>,
                    "singleflight::group::co_do: fn's result must convert to the group's T");
    }
    return detail::co_operation<core, K, F, direct_probe<K>>(static_cast<core*>(this), key, fn,
                                                             std::move(caller), info, bound);
  }
};

}  // namespace singleflight
