// singleflight/group.hpp
//
// `singleflight::group<Key, T>` runs a piece of work once for all the callers
// that ask for the same key at the same time, and hands each of them the
// outcome.
//
//   singleflight::group<std::string, profile> profiles;
//   profile p = profiles.do_(tenant + '|' + user + '|' + locale,
//                            [&](std::stop_token st) { return origin.fetch(st, ...); },
//                            request_stop_token);
//
// Overview
//
// A group holds a mutex-guarded map from key to the flight in progress for
// that key. `do_` either starts a flight (this caller is the *leader*) or
// joins the one in progress (a *follower*). When the flight settles, every
// caller attached to it receives the same outcome: its own copy of the value,
// or the same exception object. Settled flights are forgotten at once: a
// group is not a cache, and it never hands out a value or an error that had
// settled before the caller arrived.
//
// Guarantees (README.md, "Guarantees", has the full list and the tests):
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
// (`void fn(std::stop_token, completion<T>)`). Blocking, callback and
// coroutine waiters share flights and every guarantee above; callbacks and
// resumptions run on the thread that settles the flight, never under the
// group's lock (see async_do).
//
// Scope: one process. Twenty processes running a group each make twenty
// flights for one key, not one.
//
// Thread safety: every member function may be called concurrently from any
// number of threads, except the destructor, which must not run concurrently
// with any other call and must not be called from inside fn.
//
// Where user code runs (the one rule; README "Re-entrancy" has the table):
//  * No lock of the group is held while user code runs (fn, on_done, a
//    resumption, an executor, Hash, T's copy or move, a stop callback), and
//    user code may re-enter the group: do_, async_do, forget, close(), even
//    ~group() from a callback.
//  * A step that settles flights requests stop on every one of them before it
//    notifies any waiter, so a notified waiter that blocks on such a flight
//    (a retry with a blocking do_, close()) finds its fn already asked to stop.
//  * Callbacks and resumptions never run on the group's timer thread (one
//    that blocked would hold back every other deadline): async waiters a
//    deadline settles are handed to the group's delivery thread, as are those
//    an inline leader's stop cancels (that stop runs inside a stop callback
//    the leader's thread waits for).
//  * A thread about to block inside the group (a blocking do_, close()) first
//    runs what it itself holds back: the rest of the notification loop it is
//    in, and the flights that loop deferred.
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
// Locking: one std::mutex per group, held only for map operations and
// bookkeeping. It is never held while user code runs (fn, T's copy or move,
// a stop_callback, the executor, Hash, a callback, a coroutine), with three
// exceptions: KeyEqual runs under it during lookup and insertion, Key's
// assignment when a spare map node is reused, and fn's move (a copy for an
// lvalue) when an async caller that had to wait for a stopped fn starts the
// next flight. Stop requests are always made after the mutex is
// released, because stop callbacks run synchronously in the requesting
// thread; waiters are signalled after it is released too (see
// detail::waiter for the claim/leave protocol).
//
// Allocation: a join allocates nothing. A leader without followers whose fn
// takes no stop_token allocates nothing in steady state (up to 16 finished
// flight objects and 16 map nodes, the old key object included, are kept per
// group for reuse); a fn taking a stop_token costs
// one allocation (the stop state: a token handed to one fn is never reused).
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "completion.hpp"
#include "detail/deadline.hpp"
#include "detail/flight.hpp"
#include "detail/frames.hpp"
#include "detail/hooks.hpp"
#include "detail/key.hpp"
#include "detail/owned_thread.hpp"
#include "detail/task_base.hpp"
#include "detail/unwind.hpp"
#include "errors.hpp"
#include "executor.hpp"
#include "hash.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "task.hpp"
#include "thread_executor.hpp"

namespace singleflight {

namespace detail {

// An asynchronous fn: starts the work, returns at once, and finishes it later
// through the completion.
template <class F, class T>
concept async_fn = std::invocable<F&, std::stop_token, completion<T>> &&
    std::is_void_v<std::invoke_result_t<F&, std::stop_token, completion<T>>>;

template <class F>
concept takes_token = std::invocable<F&, std::stop_token>;

template <class F, class T>
concept flight_fn = async_fn<F, T> || takes_token<F> || std::invocable<F&>;

// What a synchronous fn returns (an async fn "returns" T through its completion).
template <class F, class T>
struct fn_result {
  using type = std::invoke_result_t<F&>;
};
template <class F, class T>
requires(takes_token<F> && !async_fn<F, T>) struct fn_result<F, T> {
  using type = std::invoke_result_t<F&, std::stop_token>;
};
template <class F, class T>
requires async_fn<F, T>
struct fn_result<F, T> {
  using type = T;
};

}  // namespace detail

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
class group {
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
  explicit group(options opts) : opts_(std::move(opts)) {
    spare_nodes_.reserve(spare_limit);
    if (opts_.timeout < std::chrono::nanoseconds::zero())
      opts_.timeout = std::chrono::nanoseconds::zero();
    if (opts_.timeout > std::chrono::nanoseconds::zero()) {
      timer_ = detail::owned_thread([this](detail::owned_thread::home& h) { timer_loop(h); });
    }
  }

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
    (void)close_until(std::nullopt, /*destroying=*/true);
    {
      // Notification loops of this thread that ran this destructor (it drained
      // them): their epilogues must not touch the group any more.
      std::lock_guard<std::mutex> lk(mu_);
      const auto me = std::this_thread::get_id();
      for (detail::loop_record* l = loops_.head(); l != nullptr;) {
        detail::loop_record* next = l->next;
        if (l->thread == me) {
          l->orphaned = true;
          loops_.erase(*l);
        }
        l = next;
      }
    }
    while (spare_flights_ != nullptr) {
      flight_t* f = spare_flights_;
      spare_flights_ = f->stop_next;
      f->release();
    }
  }

  // do_(key, fn, caller)
  //
  // Returns the value of the flight for `key`, starting one if none is in
  // progress. `fn` is invocable as `fn(std::stop_token)` or `fn()` and its
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
  T do_(const K& key, F&& fn, std::stop_token caller = {}) {
    return call(key, std::forward<F>(fn), std::move(caller), false, nullptr);
  }

  // do_(key, fn, caller, info): as above, and fills `info` with this caller's
  // role (leader / follower / none) and the flight's number, on every exit.
  template <class K, class F>
  T do_(const K& key, F&& fn, std::stop_token caller, call_info& info) {
    return call(key, std::forward<F>(fn), std::move(caller), false, &info);
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
  T do_fresh(const K& key, F&& fn, std::stop_token caller = {}) {
    return call(key, std::forward<F>(fn), std::move(caller), true, nullptr);
  }

  template <class K, class F>
  T do_fresh(const K& key, F&& fn, std::stop_token caller, call_info& info) {
    return call(key, std::forward<F>(fn), std::move(caller), true, &info);
  }

  // async_do(key, fn, on_done, caller)
  //
  // Like do_, without blocking: `on_done(singleflight::outcome<T>)` receives
  // this caller's outcome (its own copy of the value, or the exception that
  // do_ would have thrown). `fn` is what do_ accepts, or asynchronous:
  // `void fn(std::stop_token, singleflight::completion<T>)`, which starts the
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
  void async_do(const K& key, F&& fn, Callback&& on_done, std::stop_token caller = {}) {
    using Fn = std::decay_t<F>;
    using Cb = std::decay_t<Callback>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::async_do: fn must be invocable as T fn(std::stop_token), "
                  "T fn(), or (asynchronous) void fn(std::stop_token, "
                  "singleflight::completion<T>)");
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
        start_callback(key, std::forward<F>(fn), std::forward<Callback>(on_done),
                       std::move(caller));
      } else if constexpr (std::constructible_from<Key, const K&>) {
        const Key converted(key);
        start_callback(converted, std::forward<F>(fn), std::forward<Callback>(on_done),
                       std::move(caller));
      }
    }
  }

  // co_do(key, fn, caller)
  //
  //   auto fetch = [key](std::stop_token st, completion<T> done) { ... };
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
  [[nodiscard]] auto co_do(const K& key, F&& fn, std::stop_token caller = {}) {
    using Fn = std::decay_t<F>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::co_do: fn must be invocable as T fn(std::stop_token), "
                  "T fn(), or (asynchronous) void fn(std::stop_token, "
                  "singleflight::completion<T>)");
    static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                  "singleflight::group::co_do: the key argument must be a Key or something a "
                  "Key can be constructed from");
    if constexpr (detail::flight_fn<Fn, T>) {
      static_assert(std::convertible_to<typename detail::fn_result<Fn, T>::type, T>,
                    "singleflight::group::co_do: fn's result must convert to the group's T");
    }
    return co_operation<K, F>(this, key, fn, std::move(caller));
  }

  // forget(key)
  //
  // Removes the entry for `key`, if any, and returns whether there was one.
  // The next caller starts a new flight even while the old fn still runs
  // (this is the one way to lift the no-overlap guarantee); callers already
  // waiting keep the old flight, and its completion never evicts the new
  // entry. Thread-safe. Throws whatever Hash or KeyEqual throws.
  bool forget(const Key& key) {
    const std::size_t h = hash_(key);
    detail::wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = map_.find(detail::probe<Key>{key, h});
      if (it == map_.end()) return false;
      flight_t* f = it->second;
      map_.erase(it);
      f->home = nullptr;
      // Observers waited for this fn only because of the no-overlap rule,
      // which forget() just lifted: let them go round again.
      claim_observers(f, wake);
      f->release();  // the map's reference; the runner still holds one
    }
    notify(this, wake);
    return true;
  }

  // close()
  //
  // Idempotent. New calls throw closed_error from now on; every unsettled
  // flight settles with closed_error for its waiters and has its token
  // stopped; callers waiting for a predecessor get closed_error. Returns once
  // every fn the group started has returned (or its task was dropped), every
  // caller has left, and the group's own threads are joined.
  //
  // Called from inside fn (any flight of this group, on this thread) it does
  // all of the above except waiting for this thread's own calls; the
  // destructor then finishes the drain. Called from on_done or a resumption
  // it first notifies the rest of that thread's batch and starts what it
  // deferred, then waits for everyone else. On a thread the group owns (a
  // thread_executor worker, the delivery or timer thread) it joins every
  // thread but that one, which the destructor joins (or, on that very thread,
  // detaches). A fn that ignores its stop token makes close() wait for it:
  // see close_for().
  // Thread-safe.
  void close() { (void)close_until(std::nullopt, /*destroying=*/false); }

  // close_for(timeout)
  //
  // close() that gives up waiting after `timeout` and returns false if fns
  // were still running then (the group stays closed; a later close() or the
  // destructor waits for the rest). Returns true when drained. Thread-safe.
  // `timeout` may be any duration, up to duration::max() (which never gives
  // up).
  template <class Rep, class Period>
  bool close_for(std::chrono::duration<Rep, Period> timeout) {
    return close_until(detail::after(clock::now(), timeout), /*destroying=*/false);
  }

  // in_flight()
  //
  // The number of map entries: keys whose fn has not returned (joinable
  // flights, and stopped flights still winding down). Returns to 0 between
  // bursts. Thread-safe; takes the group's lock.
  std::size_t in_flight() const {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.size();
  }

  // stats()
  //
  // A consistent snapshot of the counters; see singleflight::stats.
  // Thread-safe; takes the group's lock.
  singleflight::stats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    singleflight::stats s = st_;
    s.in_flight = map_.size();
    return s;
  }

 private:
  using flight_t = detail::flight<T>;
  using ref_t = detail::flight_ref<T>;
  using kind = detail::outcome_kind;
  using map_t = std::unordered_map<detail::stored_key<Key>, flight_t*, detail::key_hasher,
                                   detail::key_equal<KeyEqual>>;
  using clock = std::chrono::steady_clock;

  // What one call ends with, decided under the lock and delivered after it.
  struct ticket {
    ref_t f;
    kind outcome = kind::pending;
    bool sole = false;        // the value is in the leader's own `local`, not in f
    bool stop = false;        // request_stop on f once the lock is released
    bool rejected = false;    // neither started nor joined
    bool accounted = false;   // claimed by a settler, who did the bookkeeping; lock not held
    detail::wake_batch wake;  // waiters this call claimed, to signal after unlocking
  };

  // K may be used to probe the map directly only when hashing and comparing
  // it is known to agree with Key: the same type, or strings under the
  // default (transparent) hash and equality. Anything else is converted to
  // Key once, before the lock is taken.
  template <class K>
  static constexpr bool direct_probe = std::same_as<std::remove_cvref_t<K>, Key> ||
                                       (std::same_as<Hash, default_hash> &&
                                        std::same_as<KeyEqual, std::equal_to<>> &&
                                        detail::string_like<K> && detail::string_like<Key>);

  // Recycling bounds: a few finished flights and map nodes are kept for the
  // next start, so a steady uncontended leader path allocates nothing.
  static constexpr std::size_t spare_limit = 16;

  // Whether a flight running Fn needs a stop state of its own.
  template <class Fn>
  static constexpr bool needs_stop = detail::takes_token<Fn> || detail::async_fn<Fn, T>;

  // ---- stop callbacks -----------------------------------------------------

  // A blocked caller's stop: wake it. Runs in the thread that requested stop
  // and touches only the waiter (see detail::waiter).
  struct wake_on_stop {
    detail::blocking_waiter* w;
    void operator()() const noexcept { w->stop(); }
  };

  // An inline leader's stop: it cannot stop waiting (it is running fn), so it
  // leaves right here, which may stop the flight under the ownership policy.
  // Takes the group's mutex: the leader destroys this callback before it
  // stops counting as a user, so the group outlives every run of it.
  //
  // It runs no callback or resumption itself: the leader's thread, once fn
  // returns, waits in ~stop_callback for this to finish, and an on_done run
  // here that waited for that fn (a retry with a blocking do_ after
  // cancelled_error) would never let it. Blocked followers are only
  // signalled; async ones go to the group's delivery thread.
  struct leave_on_stop {
    group* g;
    flight_t* f;
    detail::blocking_waiter* w;
    void operator()() const noexcept {
      bool stop = false;
      detail::wake_batch wake;
      {
        std::lock_guard<std::mutex> lk(g->mu_);
        // A flight that already settled keeps its outcome for the leader.
        if (w->stop_fired || f->kind != kind::pending) return;
        w->stop_fired = true;  // guarded by the group's mutex for an inline leader
        stop = g->leave(f, /*is_leader=*/true, wake);
      }
      // Stop first, then notify: a notified waiter may block on this fn.
      if (stop) {
#if defined(SINGLEFLIGHT_TEST_HOOKS)
        ::singleflight::detail::hook(::singleflight::detail::hook_point::stop_requesting, g);
#endif
        f->stop.request_stop();
      }
      // The leader is still inside fn on its own thread, so the group is alive.
      detail::wake_batch async;
      wake.split([](const detail::waiter& x) { return x.async; }, async);
      wake.signal_all();  // blocked threads: no user code
      if (!async.empty() && !g->queue_delivery(async)) notify(g, async);  // closing: here
    }
  };

  // ---- the task handed to an executor -------------------------------------

  template <class Fn>
  class task_impl final : public detail::task_base {
   public:
    template <class G>
    task_impl(group* g, flight_t* f, G&& fn) : g_(g), f_(f), fn_(std::forward<G>(fn)) {
      f_->retain();
    }
    task_impl(const task_impl&) = delete;
    task_impl& operator=(const task_impl&) = delete;
    ~task_impl() override {
      if (!ran_) g_->task_dropped(f_);
      f_->release();
    }
    // Not noexcept only so that a forced unwind (fn ending its thread) can
    // pass; nothing else escapes.
    void run() override {
      ran_ = true;
      g_->run_task(f_, fn_);
    }

   private:
    group* g_;
    flight_t* f_;
    Fn fn_;
    bool ran_ = false;
  };

  // ---- asynchronous waiters -----------------------------------------------
  //
  // An async caller is an async_node linked into the flight's list like a
  // blocked thread. The differences: it registers its stop callback before
  // it attaches (so nothing touches it after the lock that attaches it is
  // released), its stop callback leaves the flight itself (taking the
  // group's mutex: the node is a user until its outcome is decided, so the
  // group is alive), and being notified means running its callback or
  // resuming its coroutine. An async observer (waiting for a stopped fn to
  // return) goes round again when notified, on the notifying thread.

  struct async_node;
  struct async_on_stop {
    async_node* n;
    void operator()() const noexcept { async_stopped(n); }
  };

  struct async_node : detail::waiter {
    async_node(group* grp, std::stop_token tok) noexcept : g(grp), caller(std::move(tok)) {
      notify = &on_notify;
      async = true;
    }
    async_node(const async_node&) = delete;
    async_node& operator=(const async_node&) = delete;
    ~async_node() = default;

    group* g;
    std::stop_token caller;
    std::size_t h = 0;
    ref_t f;                      // the flight joined, led or observed
    kind result = kind::pending;  // the outcome, once decided
    std::exception_ptr error;     // a failure of this caller's own (going round again)
    bool is_leader = false;       // guarded by the group's mutex
    bool has_key = true;          // false: must copy the key before it can go round again
    // An observer's bound (options.timeout from its first wait for a
    // predecessor), and its place in the group's list of such bounds.
    // Guarded by the group's mutex.
    std::optional<clock::time_point> wait_deadline;
    async_node* ob_prev = nullptr;
    async_node* ob_next = nullptr;
    bool ob_linked = false;
    // Set by the stop callback before it tries to leave. Memory ordering:
    // seq_cst, see detail::waiter::state.
    std::atomic<bool> stop_flag{false};
    std::optional<std::stop_callback<async_on_stop>> cb;
    void (*complete)(async_node*) noexcept = nullptr;  // deliver `result`; may destroy the node
    void (*again)(async_node*) noexcept = nullptr;     // an observer's wait is over

    static void on_notify(detail::waiter* w) noexcept {
      auto* n = static_cast<async_node*>(w);
      if (n->observer) {
        n->again(n);
        return;
      }
      // Published by the settle that claimed us (same thread); the timer sets
      // `result` itself when an observer's wait runs out.
      if (n->result == kind::pending) n->result = n->f->kind;
      deliver(n);
    }
  };

  // Hands an async caller its outcome. Without the group's lock; the node
  // no longer counts as a user. Unregisters the stop callback first (waiting
  // for it if it is running elsewhere: it lost the race and returns at once).
  static void deliver(async_node* n) noexcept {
    n->cb.reset();
    n->complete(n);
  }

  // The exception an async caller receives, for every outcome but a value.
  static std::exception_ptr failure_of(const async_node& n) noexcept {
    if (n.error) return n.error;
    switch (n.result) {
      case kind::fn_error:
      case kind::dropped:
        return n.f->error;
      case kind::cancelled:
        return std::make_exception_ptr(cancelled_error());
      case kind::closed:
        return std::make_exception_ptr(closed_error());
      case kind::timeout:
        return std::make_exception_ptr(timeout_error());
      case kind::overloaded:
        return std::make_exception_ptr(overloaded_error());
      case kind::value:
      case kind::pending:
        break;
    }
    assert(false && "singleflight: no failure to deliver");
    return std::make_exception_ptr(error("singleflight: internal error (no outcome)"));
  }

  // A callback waiter: owns the callback and, only once it has to wait for
  // a winding-down fn (and may lead after going round again), copies of fn
  // and of the key. Heap-allocated by async_do, deleted after on_done
  // returns.
  template <class Fn, class Cb>
  struct callback_node final : async_node {
    template <class C>
    callback_node(group* grp, C&& cb_in, std::stop_token tok)
        : async_node(grp, std::move(tok)), on_done(std::forward<C>(cb_in)) {
      this->complete = &complete_fn;
      this->again = &again_fn;
    }
    Cb on_done;
    std::optional<Fn> fn;
    std::optional<Key> key;

    static void complete_fn(async_node* b) noexcept {
      auto* n = static_cast<callback_node*>(b);
      // The outcome is a prvalue argument: it initialises on_done's
      // parameter directly, so T is copied once (inside make_outcome, where a
      // throwing copy becomes this caller's error) and never moved. A throw
      // from on_done itself terminates (noexcept).
      n->on_done(make_outcome(*n));
      delete n;
    }
    static void again_fn(async_node* b) noexcept {
      auto* n = static_cast<callback_node*>(b);
      n->g->go_again(n, *n->key, std::move(*n->fn));
    }
    static outcome<T> make_outcome(const async_node& n) noexcept {
      if (!n.error && n.result == kind::value) {
        try {
          return outcome<T>(std::in_place, *n.f->value);  // this caller's own copy
        } catch (...) {
          return outcome<T>(std::current_exception());
        }
      }
      return outcome<T>(failure_of(n));
    }
  };

  template <class P, class F, class C>
  void start_callback(const P& key, F&& fn, C&& on_done, std::stop_token caller) {
    using node_t = callback_node<std::decay_t<F>, std::decay_t<C>>;
    const std::size_t h = hash_(key);  // user code: outside the lock
    auto* n = new node_t(this, std::forward<C>(on_done), std::move(caller));
    n->h = h;
    n->has_key = false;
    try {
      start(n, key, std::forward<F>(fn), [n](const P& k, auto&& f) {
        n->key.emplace(k);
        n->fn.emplace(std::forward<decltype(f)>(f));
        return std::addressof(*n->fn);
      });
    }
    // fn ended this thread inside async_do: the node was delivered (and freed).
    SINGLEFLIGHT_RETHROW_FORCED_UNWIND
    catch (...) {
      delete n;
      throw;
    }
  }

  // A coroutine waiter: lives in the awaiter, in the coroutine's frame.
  // `phase` decides who resumes the coroutine: the thread delivering the
  // outcome, if await_suspend has finished (`suspended`); otherwise
  // await_suspend itself, by not suspending. Memory ordering: acq_rel on both
  // exchanges, so the outcome written before one side's exchange is visible
  // to whoever resumes the coroutine after the other's.
  template <class P, class F>
  struct coroutine_node final : async_node {
    enum : unsigned char { starting, suspended, ready };
    coroutine_node(group* grp, const P& k, std::remove_reference_t<F>& f_in,
                   std::stop_token tok) noexcept
        : async_node(grp, std::move(tok)), key(&k), fn(&f_in) {
      this->complete = &complete_fn;
      this->again = &again_fn;
    }
    const P* key;
    std::remove_reference_t<F>* fn;
    std::coroutine_handle<> handle;
    std::atomic<unsigned char> phase{starting};

    static void complete_fn(async_node* b) noexcept {
      auto* n = static_cast<coroutine_node*>(b);
      if (n->phase.exchange(ready, std::memory_order_acq_rel) == suspended) n->handle.resume();
    }
    static void again_fn(async_node* b) noexcept {
      auto* n = static_cast<coroutine_node*>(b);
      n->g->go_again(n, *n->key, std::forward<F>(*n->fn));
    }
  };

  // What co_await runs. Not movable: the waiter inside is linked by address.
  template <class P, class F>
  class co_awaiter {
   public:
    co_awaiter(group* g, const P& key, std::remove_reference_t<F>& fn, std::stop_token caller)
        : node_(g, key, fn, std::move(caller)) {}
    co_awaiter(const co_awaiter&) = delete;
    co_awaiter& operator=(const co_awaiter&) = delete;
    ~co_awaiter() = default;

    bool await_ready() const noexcept { return false; }

    // Attaches the waiter; returns false (do not suspend) when the outcome
    // is already there. Throws, with nothing attached, what Hash, KeyEqual,
    // Key's copy or allocation throw.
    bool await_suspend(std::coroutine_handle<> h) {
      node_.handle = h;
      node_.h = node_.g->hash_(*node_.key);
      node_.g->start(&node_, *node_.key, std::forward<F>(*node_.fn), no_keep<P>{});
      // The last touch of this awaiter by this thread when it suspends.
      return node_.phase.exchange(node_t::suspended, std::memory_order_acq_rel) != node_t::ready;
    }

    T await_resume() {
      if (!node_.error && node_.result == kind::value) return *node_.f->value;  // our own copy
      std::rethrow_exception(failure_of(node_));
    }

   private:
    using node_t = coroutine_node<P, F>;
    node_t node_;
  };

  template <class>
  static constexpr bool dependent_false = false;

  // What co_do returns: refers to the key and fn until co_awaited.
  template <class K, class F>
  class co_operation {
   public:
    co_operation(group* g, const K& key, std::remove_reference_t<F>& fn,
                 std::stop_token caller) noexcept
        : g_(g), key_(&key), fn_(&fn), caller_(std::move(caller)) {}
    co_operation(const co_operation&) = delete;
    co_operation& operator=(const co_operation&) = delete;
    ~co_operation() = default;

    auto operator co_await() && {
      if constexpr (direct_probe<K>) {
        return co_awaiter<K, F>(g_, *key_, *fn_, std::move(caller_));
      } else {
        return converting_awaiter(g_, *key_, *fn_, std::move(caller_));
      }
    }
    template <class Self = co_operation>
    void operator co_await() & {
      static_assert(dependent_false<Self>,
                    "singleflight::group::co_do: co_await the result in the same expression "
                    "(co_await g.co_do(key, fn)); it refers to key and fn");
    }

   private:
    // A key that is not probed directly is converted to Key first.
    class converting_awaiter {
     public:
      converting_awaiter(group* g, const K& key, std::remove_reference_t<F>& fn,
                         std::stop_token caller)
          : key_(key), inner_(g, key_, fn, std::move(caller)) {}
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) { return inner_.await_suspend(h); }
      T await_resume() { return inner_.await_resume(); }

     private:
      const Key key_;
      co_awaiter<Key, F> inner_;
    };

    group* g_;
    const K* key_;
    std::remove_reference_t<F>* fn_;
    std::stop_token caller_;
  };

  // The key (and fn) of a waiter that cannot go away before it is delivered
  // (a coroutine's, or one going round again) need no copies.
  template <class P>
  struct no_keep {
    template <class G>
    auto operator()(const P&, G&& fn) const noexcept {
      return std::addressof(fn);
    }
  };

  // Registers the stop callback, then attaches. Throws only before
  // attaching, with the callback unregistered again.
  template <class P, class F, class KeepKey>
  void start(async_node* n, const P& key, F&& fn, KeepKey keep) {
    // If `caller` is already stopped, the callback runs right here; it finds
    // nothing attached and attach() answers cancelled.
    if (n->caller.stop_possible()) n->cb.emplace(n->caller, async_on_stop{n});
    try {
      attach(n, key, std::forward<F>(fn), /*first=*/true, keep);
    }
    SINGLEFLIGHT_RETHROW_FORCED_UNWIND  // the node was delivered: untouchable
        catch (...) {
      n->cb.reset();
      throw;
    }
  }

  // An observer's wait is over (its predecessor's fn returned, forget() or
  // close()): attach again. Runs on the notifying thread; the node is still a
  // user. A failure (allocation, Hash, KeyEqual) becomes its outcome.
  template <class P, class F>
  void go_again(async_node* n, const P& key, F&& fn) noexcept {
    SINGLEFLIGHT_HOOK(observer_returning);
    try {
      attach(n, key, std::forward<F>(fn), /*first=*/false, no_keep<P>{});
    } catch (...) {
      n->error = std::current_exception();
      n->cb.reset();  // outside the lock: a stop callback in flight takes it
      {
        std::lock_guard<std::mutex> lk(mu_);
        exit_user();
      }
      deliver(n);
    }
  }
  // (go_again never runs fn itself: a flight it starts without an executor
  // is deferred to the end of the notification loop, see hand_off.)

  // Joins, observes or leads the flight for `key`, or decides an immediate
  // outcome and delivers it. `first`: from async_do / co_await (the node is
  // not a user yet); otherwise an observer going round again (it is one).
  // Throws only before attaching, and never touches the node after the lock
  // that attached it is released.
  template <class P, class F, class KeepKey>
  void attach(async_node* n, const P& key, F&& fn, bool first, KeepKey keep) {
    ref_t previous;  // an observer's old flight: released after the lock
    std::remove_reference_t<F>* fnp = std::addressof(fn);  // moves into the node if it must wait
    std::unique_lock<std::mutex> lk(mu_);
    kind immediate = kind::pending;
    try {
      if (first) {
        ++st_.calls;
      } else {
        n->rearm();  // then read the stop flag: see detail::waiter::state
      }
      for (;;) {
        if (closed_) {
          immediate = kind::closed;
          break;
        }
        if (n->stop_flag.load(std::memory_order_seq_cst)) {
          immediate = kind::cancelled;
          break;
        }
        auto it = map_.find(detail::probe<P>{key, n->h});
        if (it == map_.end()) {
          if (opts_.max_in_flight != 0 && map_.size() >= opts_.max_in_flight) {
            ++st_.overloaded;
            immediate = kind::overloaded;
            break;
          }
          lead_async(lk, n, key, std::forward<F>(*fnp), first,
                     /*fn_is_callers=*/first && fnp == std::addressof(fn), previous);
          return;
        }
        flight_t* f = it->second;
        if (f->kind == kind::pending) {
          ++f->waiters;
          ++st_.joins;
          if (first) ++users_;
          previous = std::exchange(n->f, ref_t::share(f));
          n->observer = false;
          n->is_leader = false;
          f->list.push(*n);
          return;  // unlocks; the node may be delivered from here on
        }
        // A stopped fn still winding down: wait for it to return, then go
        // round again (on the thread where it returns).
        if (!n->has_key) {
          lk.unlock();
          fnp = keep(key, std::forward<F>(*fnp));  // the caller's key and fn will be gone by then
          n->has_key = true;
          lk.lock();
          continue;
        }
        if (first) ++users_;
        previous = std::exchange(n->f, ref_t::share(f));
        n->observer = true;
        n->is_leader = false;
        f->list.push(*n);
        if (opts_.timeout > std::chrono::nanoseconds::zero()) link_wait_deadline(n);
        return;
      }
    }
    SINGLEFLIGHT_RETHROW_FORCED_UNWIND  // fn ended this thread: lead_async cleaned up
        catch (...) {
      if (!lk.owns_lock()) lk.lock();
      ++st_.rejections;
      throw;
    }
    // Immediate outcome. If the claim fails, the stop callback is leaving:
    // it found nothing linked and leaves the answer (cancelled) to us.
    if (!n->try_claim()) immediate = kind::cancelled;
    ++st_.rejections;
    if (immediate == kind::cancelled) ++st_.cancellations;
    n->result = immediate;
    lk.unlock();
    if (!first) {
      n->cb.reset();  // outside the lock: a stop callback in flight takes it
      lk.lock();
      exit_user();
      lk.unlock();
    }
    deliver(n);
  }

  // Starts a flight with an async caller as its leader. Called with `lk`
  // held, returns with it released.
  template <class P, class F>
  void lead_async(std::unique_lock<std::mutex>& lk, async_node* n, const P& key, F&& fn, bool first,
                  bool fn_is_callers, ref_t& previous) {
    using Fn = std::decay_t<F>;
    // fn kept in the node (or in a suspended coroutine's frame) dies with
    // the node once it is delivered, which its stop, the deadline or close()
    // may do while fn runs: take it out while nothing can deliver the node
    // (found by the spin model). Fn's move (or copy) runs under the lock
    // here, only on this rare path (a caller that waited for a stopped fn).
    std::optional<Fn> owned;
    if (!fn_is_callers) owned.emplace(std::forward<F>(fn));  // may throw: nothing changed yet
    flight_t* f = acquire_flight(needs_stop<Fn>);            // may throw: nothing changed yet
    try {
      insert_entry(key, n->h, f);
    } catch (...) {
      f->release();
      throw;
    }
    // Committed: nothing below throws.
    ++seq_;
    f->seq = seq_;
    ++st_.flights;
    f->waiters = 1;
    link_live(f);
    if (opts_.timeout > std::chrono::nanoseconds::zero()) link_deadline(f);
    if (first) ++users_;
    previous = std::exchange(n->f, ref_t::share(f));
    n->observer = false;
    n->is_leader = true;
    f->list.push(*n);  // unlike a blocked leader, the node is a user of its own
    ++users_;          // this thread, until the hand-off is over
    detail::frame fr;  // ... and close() from code it runs meanwhile does not wait for it
    frames_.push(fr);
    ref_t mine = ref_t::share(f);
    detail::wake_batch wake;
    // fn (run right here without an executor) may end this thread: run_task
    // fails the flight; this thread's own count goes here.
    detail::on_unwind unwind([&] {
      if (!lk.owns_lock()) lk.lock();
      frames_.erase(fr);
      exit_user();
      lk.unlock();
    });
    // Going round again happens inside a settler's notification loop: an fn
    // run right here would hold back the waiters notified after this one
    // (they could not even leave on their stop; found by the spin model).
    // Without an executor it is queued and run once the loop is over.
    const bool defer = !first;
    const bool stop = owned ? hand_off(lk, f, std::move(*owned), wake, defer)
                            : hand_off(lk, f, std::forward<F>(fn), wake, defer);
    unwind.disarm();
    frames_.erase(fr);
    exit_user();
    lk.unlock();
    if (stop) mine->stop.request_stop();  // stop first, then notify
    notify(this, wake);
  }

  // An async caller's stop callback: runs on the thread that requested stop.
  static void async_stopped(async_node* n) noexcept {
    n->stop_flag.store(true, std::memory_order_seq_cst);
    if (!n->try_leave())
      return;  // claimed: its outcome is on the way, or its next round sees the flag
    group* g = n->g;
    bool stop = false;
    detail::wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(g->mu_);
      // Not attached (yet, or between two rounds): the attaching thread
      // sees `leaving` and answers cancelled itself.
      if (!n->linked) return;
      flight_t* f = n->f.get();
      f->list.erase(*n);
      if (n->observer) {
        g->unlink_wait_deadline(n);
        ++g->st_.rejections;
      } else {
        stop = g->leave(f, n->is_leader, wake);
      }
      ++g->st_.cancellations;
      g->exit_user();
    }
    // No longer a user: only the node and its flight reference are touched,
    // and the group, through the waiters in `wake` (users while unnotified
    // observers are in it; see notify).
    if (stop) n->f->stop.request_stop();  // stop first, then notify
    if (!wake.empty()) notify(g, wake);
    n->result = kind::cancelled;
    deliver(n);
  }

  // ---- the call -----------------------------------------------------------

  template <class K, class F>
  T call(const K& key, F&& fn, std::stop_token caller, bool fresh, call_info* info) {
    using Fn = std::decay_t<F>;
    static_assert(detail::flight_fn<Fn, T>,
                  "singleflight::group::do_: fn must be invocable as T fn(std::stop_token), "
                  "T fn(), or (asynchronous) void fn(std::stop_token, "
                  "singleflight::completion<T>)");
    if constexpr (detail::flight_fn<Fn, T>) {
      using R = typename detail::fn_result<Fn, T>::type;
      static_assert(std::convertible_to<R, T>,
                    "singleflight::group::do_: fn's result must convert to the group's T");
      static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                    "singleflight::group::do_: the key argument must be a Key or something "
                    "a Key can be constructed from");
      if constexpr (direct_probe<K>) {
        return call_with(key, std::forward<F>(fn), caller, fresh, info);
      } else {
        const Key converted(key);
        return call_with(converted, std::forward<F>(fn), caller, fresh, info);
      }
    }
  }

// GCC 12 at -O2 reports the leader's std::optional<T> `local` as maybe
// uninitialized where deliver() moves from it, on paths where t.sole (set
// only after `local` was engaged) is false: a known false positive for
// std::optional (GCC PR 80635). Silenced for this function only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  template <class P, class F>
  T call_with(const P& key, F&& fn, const std::stop_token& caller, bool fresh, call_info* info) {
    if (info != nullptr) *info = call_info{};
    const std::size_t h = hash_(key);  // user code: outside the lock
    detail::blocking_waiter w;
    std::optional<T> local;  // an inline leader's value, when nobody else needs it
    ticket t;
    SINGLEFLIGHT_HOOK(caller_entering);
    {
      std::unique_lock<std::mutex> lk(mu_);
      ++st_.calls;
      if (closed_) {
        ++st_.rejections;
        lk.unlock();
        throw closed_error();
      }
      if (caller.stop_requested()) {
        ++st_.rejections;
        ++st_.cancellations;
        lk.unlock();
        throw cancelled_error();
      }
      ++users_;
      try {
        t = route(lk, key, h, std::forward<F>(fn), caller, fresh, w, local, info);
      }
      // fn ended this thread (an inline leader): lead_inline settled the
      // flight and gave back this call's count.
      SINGLEFLIGHT_RETHROW_FORCED_UNWIND
      catch (...) {
        // Every throw inside route() happens under the lock and before the
        // call attached to anything: nothing to roll back but the counts.
        ++st_.rejections;
        exit_user();
        throw;
      }
      if (!t.accounted) {
        if (t.rejected) ++st_.rejections;
        if (t.outcome == kind::cancelled) ++st_.cancellations;
        exit_user();
      }
    }
    // From here on this call no longer counts as a user of the group (close()
    // may be returning): only the flight (owned through t.f) and the waiters
    // in t.wake are touched.
    SINGLEFLIGHT_HOOK(caller_exiting);
    if (t.stop) {  // stop first, then notify: a notified waiter may wait for this fn
      SINGLEFLIGHT_HOOK(stop_requesting);
      t.f->stop.request_stop();
    }
    notify(this, t.wake);
    return deliver(t, local);
  }

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

  // Finds, joins, waits for or starts the flight. Called with `lk` held;
  // returns with it held unless the ticket is `accounted`; throws only while
  // holding it and before attaching.
  template <class P, class F>
  ticket route(std::unique_lock<std::mutex>& lk, const P& key, std::size_t h, F&& fn,
               const std::stop_token& caller, bool fresh, detail::blocking_waiter& w,
               std::optional<T>& local, call_info* info) {
    const std::uint64_t arrival = seq_;
    std::optional<clock::time_point> wait_deadline;
    for (;;) {
      if (closed_) return rejected(kind::closed);
      if (caller.stop_requested()) return rejected(kind::cancelled);  // after an observe
      auto it = map_.find(detail::probe<P>{key, h});
      if (it == map_.end()) {
        return lead(lk, key, h, std::forward<F>(fn), caller, w, local, info);
      }
      flight_t* f = it->second;
      if (f->runner == std::this_thread::get_id()) {
        throw std::logic_error(
            "singleflight: fn called do_ for its own key on the thread running it; it would "
            "wait for itself forever");
      }
      if (f->kind == kind::pending && (!fresh || f->seq > arrival)) {
        ++f->waiters;
        ++st_.joins;
        if (info != nullptr) *info = call_info{role::follower, f->seq};
        w.reset(/*as_observer=*/false);
        f->list.push(w);
        return wait_outcome(lk, ref_t::share(f), caller, w, /*is_leader=*/false);
      }
      // The entry is a stopped fn winding down, or (do_fresh) a flight that
      // started before we arrived: wait until its fn returns, then go again.
      if (opts_.timeout > std::chrono::nanoseconds::zero() && !wait_deadline) {
        wait_deadline = detail::after(clock::now(), opts_.timeout);  // from arrival, once
      }
      const kind k = observe(lk, ref_t::share(f), caller, w, wait_deadline);
      if (k != kind::pending) return rejected(k);
    }
  }

  static ticket rejected(kind k) {
    ticket t;
    t.outcome = k;
    t.rejected = true;
    return t;
  }

  // Blocks on the waiter's own mutex until signalled or stopped (or, with a
  // deadline, until it passes). Called and returns without the group's lock.
  static void block(detail::blocking_waiter& w, const std::optional<clock::time_point>& deadline) {
    std::unique_lock<std::mutex> wl(w.m);
    const auto ready = [&w] { return w.signaled || w.stop_fired; };
    if (deadline) {
      (void)w.cv.wait_until(wl, *deadline, ready);
    } else {
      w.cv.wait(wl, ready);
    }
  }

  // A claimed waiter's signal is on its way; wait for it before the waiter
  // can be reused or destroyed. Without the group's lock.
  static void await_signal(detail::blocking_waiter& w) {
    std::unique_lock<std::mutex> wl(w.m);
    w.cv.wait(wl, [&w] { return w.signaled; });
  }

  // Waits, as an observer, until f's fn has returned. Returns pending to go
  // round again, or the reason to give up. Called and returns with `lk` held.
  kind observe(std::unique_lock<std::mutex>& lk, ref_t f, const std::stop_token& caller,
               detail::blocking_waiter& w, const std::optional<clock::time_point>& deadline) {
    w.reset(/*as_observer=*/true);
    f->list.push(w);
    drain_own(lk);  // we may be waiting for what this thread itself holds back
    lk.unlock();
    {
      std::optional<std::stop_callback<wake_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, wake_on_stop{&w});
      block(w, deadline);
    }
    if (!w.try_leave()) {
      // Claimed: fn returned, forget() or close(). Observers still count as
      // users, so after the signal it is safe to take the lock again.
      await_signal(w);
      lk.lock();
      return closed_ ? kind::closed : kind::pending;
    }
    lk.lock();
    f->list.erase(w);
    std::lock_guard<std::mutex> wl(w.m);
    return w.stop_fired ? kind::cancelled : kind::timeout;
  }

  // Blocks until f settles (claimed and signalled) or the caller's token
  // fires (leaves). Called with `lk` held and `w` linked; returns with `lk`
  // held, or released when the ticket is `accounted`.
  ticket wait_outcome(std::unique_lock<std::mutex>& lk, ref_t f, const std::stop_token& caller,
                      detail::blocking_waiter& w, bool is_leader) {
    drain_own(lk);  // we may be waiting for what this thread itself holds back
    lk.unlock();
    {
      std::optional<std::stop_callback<wake_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, wake_on_stop{&w});
      block(w, std::nullopt);
    }
    ticket t;
    if (w.try_leave()) {
      // Our own stop came first, and no settler can claim us now: leave.
      lk.lock();
      f->list.erase(w);
      t.outcome = kind::cancelled;
      t.stop = leave(f.get(), is_leader, t.wake);
      t.f = std::move(f);
      return t;  // lock held: the caller does the bookkeeping
    }
    // Claimed (perhaps at the same moment as our stop: the outcome wins).
    // The settler did our bookkeeping and no longer counts us as a user:
    // from here on the group's mutex is off limits. It published f->kind
    // before signalling us through w.m, which orders that write before
    // this read.
    await_signal(w);
    t.outcome = f->kind;
    t.f = std::move(f);
    t.accounted = true;
    return t;
  }

  // Starts a new flight for `key` with this caller as its leader.
  template <class P, class F>
  ticket lead(std::unique_lock<std::mutex>& lk, const P& key, std::size_t h, F&& fn,
              const std::stop_token& caller, detail::blocking_waiter& w, std::optional<T>& local,
              call_info* info) {
    using Fn = std::decay_t<F>;
    if (opts_.max_in_flight != 0 && map_.size() >= opts_.max_in_flight) {
      ++st_.overloaded;
      throw overloaded_error();
    }
    flight_t* f = acquire_flight(needs_stop<Fn>);  // may throw: nothing changed yet
    try {
      insert_entry(key, h, f);
    } catch (...) {
      f->release();
      throw;
    }
    // Committed: nothing below throws.
    ++seq_;
    f->seq = seq_;
    ++st_.flights;
    f->waiters = 1;
    link_live(f);
    if (opts_.timeout > std::chrono::nanoseconds::zero()) link_deadline(f);
    if (info != nullptr) *info = call_info{role::leader, f->seq};
    ref_t mine = ref_t::share(f);

    if constexpr (!detail::async_fn<Fn, T>) {
      if (!opts_.executor) return lead_inline(lk, std::move(mine), fn, caller, w, local);
    }

    // Executor, or an async fn: package fn into a task, hand it off (to the
    // executor; an async fn without one is started right here) and wait like
    // everyone else. The leader counts in f->waiters from the start, but
    // links its waiter only once the hand-off is over: a waiter claimed while
    // this thread still had to come back for the lock would be counted out
    // too early (found by the spin model: close() could return while the
    // leader was in here).
    ticket t;
    {
      // The executor (or an async fn started here) is user code run while
      // this caller's count is held: close() from it must not wait for it.
      detail::frame fr;
      frames_.push(fr);
      // A synchronous executor's fn may end this thread: run_task fails the
      // flight; this caller's count goes here (call_with rethrows untouched).
      detail::on_unwind unwind([&] {
        if (!lk.owns_lock()) lk.lock();
        frames_.erase(fr);
        exit_user();
        lk.unlock();
      });
      t.stop = hand_off(lk, f, std::forward<F>(fn), t.wake);
      unwind.disarm();
      frames_.erase(fr);
    }
    if (f->kind != kind::pending) {
      // Settled while we were submitting (the task ran, the deadline, close,
      // or the failure above): take the outcome directly.
      t.outcome = f->kind;
      t.f = std::move(mine);
      return t;  // lock held: the caller does the bookkeeping
    }
    w.reset(/*as_observer=*/false);
    f->list.push(w);
    return wait_outcome(lk, std::move(mine), caller, w, /*is_leader=*/true);
  }

  // Hands f's fn, packaged as a task, to the executor (or, without one, runs
  // it right here: it starts an async fn, or runs a sync fn for an async
  // caller). Called with `lk` held by a thread that counts as a user;
  // returns with it held. Returns whether f's token must be stopped once the
  // lock is released. A failure to hand off fails the flight (below).
  template <class F>
  bool hand_off(std::unique_lock<std::mutex>& lk, flight_t* f, F&& fn, detail::wake_batch& wake,
                bool defer = false) {
    using Fn = std::decay_t<F>;
    ++users_;  // the task is a user until it finishes or is dropped
    // The notification loop this thread is running (group::notify), if any.
    detail::loop_record* later = defer && !opts_.executor
                                     ? detail::innermost_loop(loops_, std::this_thread::get_id())
                                     : nullptr;
    if (!opts_.executor && later == nullptr) {
      // No executor: run the body right here, without packaging it.
      lk.unlock();
      run_task(f, fn);
      lk.lock();
      return false;
    }
    f->submitting = true;
    lk.unlock();
    std::exception_ptr submit_error;
    bool handed_off = false;
    try {
      task tk(std::make_unique<task_impl<Fn>>(this, f, std::forward<F>(fn)));
      handed_off = true;
      if (later != nullptr) {
        // Run when the notification loop is over (or by this thread before
        // it blocks inside the group: drain_own). Only this thread touches
        // the record's queue.
        later->deferred.push_back(std::move(tk));
      } else {
        submit(std::move(tk));
      }
    }
    SINGLEFLIGHT_RETHROW_FORCED_UNWIND  // a synchronous executor's fn ended this thread
        catch (...) {
      submit_error = std::current_exception();
    }
    lk.lock();
    f->submitting = false;
    bool stop = false;
    if ((submit_error || f->dropped_in_submit) && !f->fn_done) {
      // The flight fails with the reason.
      if (f->kind == kind::pending) {
        f->error = submit_error ? submit_error : dropped_error();
        settle(f, submit_error ? kind::fn_error : kind::dropped, wake);
        // A task the executor kept may be running fn right now: stop it, or
        // the key stays taken for as long as fn cares to run.
        stop = f->stop.stop_possible();
      }
      if (!handed_off || f->dropped_in_submit) {
        // No task exists any more: the key is free.
        finish(f, f->kind, wake);
        exit_user();  // the task's
      }
      // Otherwise the executor threw but kept the task: it may still run,
      // so it stays a user and keeps its (unjoinable) entry until it runs
      // (and, seeing the flight settled, skips fn) or is destroyed.
    }
    return stop;
  }

  // Runs fn on the leader's own thread. The leader counts as a waiter and
  // leaves through its stop callback, since it cannot stop waiting.
  template <class F>
  ticket lead_inline(std::unique_lock<std::mutex>& lk, ref_t mine, F& fn,
                     const std::stop_token& caller, detail::blocking_waiter& w,
                     std::optional<T>& local) {
    flight_t* f = mine.get();
    w.reset(/*as_observer=*/false);  // stop_fired: guarded by mu_ for an inline leader
    ++st_.fn_starts;
    // While fn runs: this thread runs f (self-deadlock check) and holds this
    // call's count (close() from inside fn does not wait for it).
    f->runner = std::this_thread::get_id();
    detail::frame fr;
    frames_.push(fr);
    // fn may end this thread (pthread_exit): fail the flight for the others,
    // free the key, give back this call's count, then let the unwind go on.
    detail::on_unwind unwind([&] {
      detail::wake_batch wake;
      {
        std::lock_guard<std::mutex> relock(mu_);
        abandon(f, fr, wake);
        exit_user();  // this call's (call_with rethrows without touching it)
      }
      notify(this, wake);
    });
    lk.unlock();
    kind k;
    std::exception_ptr err;
    {
      std::optional<std::stop_callback<leave_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, leave_on_stop{this, f, &w});
      k = invoke_fn(local, err, f, fn);
    }
    unwind.disarm();
    SINGLEFLIGHT_HOOK(leader_fn_returned);
    lk.lock();
    ticket t;
    if (k == kind::value && f->kind == kind::pending && f->list.has_followers()) {
      // Followers need the value in the flight. Move it there outside the
      // lock (T's move is user code); nobody reads it before the settle.
      lk.unlock();
      try {
        f->value.emplace(std::move(*local));
      } catch (...) {
        err = std::current_exception();
        k = kind::fn_error;
      }
      local.reset();
      lk.lock();
    }
    f->runner = std::thread::id{};
    frames_.erase(fr);
    if (k == kind::fn_error && f->kind == kind::pending) f->error = std::move(err);
    const bool sole = k == kind::value && f->kind == kind::pending;  // nobody else reads it
    (void)finish(f, k, t.wake);
    t.outcome = w.stop_fired ? kind::cancelled : f->kind;
    if (sole && local) {
      t.sole = true;
      if (f->unique()) {
        recycle_flight(mine);  // no one else can reach it: keep it for the next start
      }
    }
    if (!t.sole) local.reset();
    t.f = std::move(mine);
    return t;
  }

  // Runs fn with the flight's token (or none). The value goes to `out`; an
  // exception to f->error. Called without the lock.
  template <class Fn>
  //
  // The exception goes to `err`, not to f->error: the flight may have settled
  // meanwhile (deadline, close, an executor's error) and its error been
  // handed out; the caller publishes `err` under the lock only if it is still
  // pending. A forced unwind (fn ended this thread) passes through.
  static kind invoke_fn(std::optional<T>& out, std::exception_ptr& err, flight_t* f, Fn& fn) {
    try {
      if constexpr (detail::takes_token<Fn>) {
        out.emplace(std::invoke(fn, f->stop.get_token()));
      } else {
        out.emplace(std::invoke(fn));
      }
      return kind::value;
    }
    SINGLEFLIGHT_RETHROW_FORCED_UNWIND
    catch (...) {
      err = std::current_exception();
      return kind::fn_error;
    }
  }

  // fn ended its thread before returning (forced unwind): the flight fails
  // with abandoned_error for the others and its key is freed. Under mu_.
  void abandon(flight_t* f, detail::frame& fr, detail::wake_batch& wake) noexcept {
    f->runner = std::thread::id{};
    f->starting = false;
    frames_.erase(fr);
    if (f->fn_done) return;
    if (f->kind == kind::pending) {
      f->error = std::make_exception_ptr(abandoned_error());
      finish(f, kind::fn_error, wake);
    } else {
      finish(f, f->kind, wake);  // settled meanwhile: only free the key
    }
  }

  // A flight object for a new start: recycled when one is spare.
  flight_t* acquire_flight(bool stoppable) {
    if (spare_flights_ == nullptr) return new flight_t(stoppable, 0);
    flight_t* f = spare_flights_;
    f->reuse(stoppable, 0);  // may throw (allocates the stop state): f stays spare
    spare_flights_ = f->stop_next;
    f->stop_next = nullptr;
    --spare_flight_count_;
    return f;
  }

  // Takes the sole reference of a settled, unlinked flight and keeps the
  // object for the next start. Under mu_.
  void recycle_flight(ref_t& mine) noexcept {
    if (spare_flight_count_ >= spare_limit) return;  // released normally
    flight_t* f = mine.detach();
    f->retire();
    f->stop_next = spare_flights_;
    spare_flights_ = f;
    ++spare_flight_count_;
  }

  // Inserts the map entry for a new flight, reusing a spare node (and the
  // key object in it, whose storage an assignment can reuse) when there is
  // one. Throws (allocation, Key's copy, KeyEqual) leave the map unchanged.
  template <class P>
  void insert_entry(const P& key, std::size_t h, flight_t* f) {
    if (!spare_nodes_.empty()) {
      typename map_t::node_type nh = std::move(spare_nodes_.back());
      spare_nodes_.pop_back();
      if constexpr (std::is_assignable_v<Key&, const P&>) {
// GCC 12 at -O3 reports a bogus -Wrestrict overlap inside std::string's
// assignment from a C string once it is inlined here (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
        nh.key().key = key;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
      } else {
        nh.key().key = Key(key);
      }
      nh.key().hash = h;
      nh.mapped() = f;
      auto r = map_.insert(std::move(nh));
      assert(r.inserted);
      f->home = &r.position->first;
    } else {
      auto [it, inserted] = map_.emplace(detail::stored_key<Key>{Key(key), h}, f);
      assert(inserted);
      (void)inserted;
      f->home = &it->first;
    }
    f->home_hash = h;
  }

  // Hands a task to the executor (user code: no lock of the group held), or
  // starts a thread_executor worker: a thread the group owns, which touches
  // nothing of the group once its task has returned.
  void submit(task tk) {
    if (!opts_.executor.owns_threads()) {
      detail::executor_access::submit(opts_.executor, std::move(tk));
      return;
    }
    std::lock_guard<std::mutex> lk(threads_mu_);
    reap_locked();
    workers_.emplace_back([body = std::move(tk)](detail::owned_thread::home&) mutable { body(); });
  }

  // Joins the workers whose task has returned. Under threads_mu_.
  void reap_locked() {
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->finished() && it->join_unless_current()) {
        it = workers_.erase(it);  // it had finished: the join returned at once
      } else {
        ++it;
      }
    }
  }

  template <class Fn>
  //
  // Not noexcept only so that a forced unwind (fn ending its thread) passes:
  // the flight fails for the others and the task's count is given back first.
  void run_task(flight_t* f, Fn& fn) {
    detail::wake_batch wake;
    detail::frame fr;  // the task's count (held since submission) while fn runs
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (f->fn_done) return;  // failed at submission; the submitter accounted for it
      if (f->kind != kind::pending) {
        // Stopped while queued (no waiters left, deadline, close): the work
        // is no longer wanted, so it is not started at all.
        (void)finish(f, f->kind, wake);
        exit_user();
      } else {
        ++st_.fn_starts;
        f->runner = std::this_thread::get_id();
        frames_.push(fr);
        if constexpr (detail::async_fn<Fn, T>) {
          // The completion is a user of its own until it is resolved, so a
          // completion resolved on another thread while fn is still being
          // called cannot let close() return under this thread.
          ++users_;
          f->starting = true;
        }
      }
    }
    if (!fr.linked) {
      notify(this, wake);  // observers of the stopped flight: users, so the group is alive
      return;
    }
    detail::on_unwind unwind([&] {
      detail::wake_batch lost;
      {
        std::lock_guard<std::mutex> lk(mu_);
        abandon(f, fr, lost);
        exit_user();  // the task's
      }
      notify(this, lost);
    });
    if constexpr (detail::async_fn<Fn, T>) {
      std::exception_ptr thrown;
      try {
        f->retain();  // the completion's reference
        std::invoke(
            fn, f->stop.get_token(),
            detail::completion_access::make<T>(static_cast<void*>(this), &group::resolve, f));
      }
      SINGLEFLIGHT_RETHROW_FORCED_UNWIND
      catch (...) {
        thrown = std::current_exception();
      }
      unwind.disarm();
      std::lock_guard<std::mutex> lk(mu_);
      f->runner = std::thread::id{};
      frames_.erase(fr);
      f->starting = false;
      if (!f->fn_done && f->kind == kind::pending && (thrown || f->broken_in_start)) {
        // fn threw, or let its completion die, before returning. A thrown
        // exception says more than the broken promise it caused.
        f->error = thrown ? thrown : broken_promise();
        (void)finish(f, thrown ? kind::fn_error : kind::dropped, wake);
      } else if (!f->fn_done && f->broken_in_start) {
        (void)finish(f, f->kind, wake);  // settled meanwhile: free the key
      }
      // A completion still held elsewhere after a throw resolves later
      // and only gives back its own count.
      exit_user();  // the task's
    } else {
      std::exception_ptr err;
      const kind k = invoke_fn(f->value, err, f, fn);
      unwind.disarm();
      SINGLEFLIGHT_HOOK(leader_fn_returned);
      std::lock_guard<std::mutex> lk(mu_);
      f->runner = std::thread::id{};
      frames_.erase(fr);
      if (k == kind::fn_error && f->kind == kind::pending) f->error = std::move(err);
      (void)finish(f, k, wake);
      exit_user();
    }
    // No longer a user: the group may be gone unless `wake` holds observers
    // (users until they go round; see notify).
    notify(this, wake);
  }

  // A completion<T> was resolved (or destroyed unresolved). Any thread,
  // without the lock; the completion counts as a user until here.
  static void resolve(void* self, flight_t* f, detail::resolution r,
                      std::exception_ptr e) noexcept {
    group* g = static_cast<group*>(self);
    detail::wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(g->mu_);
      if (!f->fn_done) {
        if (r == detail::resolution::broken && f->starting) {
          f->broken_in_start = true;  // fn may still throw: the starter decides
        } else if (f->kind != kind::pending) {
          g->finish(f, f->kind, wake);  // settled early: only free the key
        } else if (r == detail::resolution::value) {
          g->finish(f, kind::value, wake);
        } else {
          f->error = r == detail::resolution::error ? std::move(e) : broken_promise();
          g->finish(f, r == detail::resolution::error ? kind::fn_error : kind::dropped, wake);
        }
      }
      g->exit_user();  // the completion's
    }
    notify(g, wake);  // touches g only while `wake` holds observers (users)
  }

  static std::exception_ptr broken_promise() noexcept {
    return std::make_exception_ptr(broken_promise_error());
  }

  void task_dropped(flight_t* f) noexcept {
    std::exception_ptr e = dropped_error();
    detail::wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (f->submitting) {
        f->dropped_in_submit = true;  // the submitter fails the flight
        return;
      }
      if (f->fn_done) return;
      // A flight that already settled (the executor threw after keeping the
      // task, a deadline, close) keeps the outcome its waiters were handed:
      // writing f->error now would change it for the rest of them, and race
      // their unlocked reads. Only the key is freed.
      if (f->kind == kind::pending) f->error = std::move(e);
      (void)finish(f, kind::dropped, wake);
      exit_user();
    }
    notify(this, wake);
  }

  static std::exception_ptr dropped_error() noexcept {
    try {
      throw error("singleflight: the executor dropped the task without running it");
    } catch (...) {
      return std::current_exception();
    }
  }

  // ---- state transitions (all under mu_) ----------------------------------

  // A counted caller leaves f. Returns whether f's token must be stopped.
  bool leave(flight_t* f, bool is_leader, detail::wake_batch& wake) noexcept {
    --f->waiters;
    if (f->kind != kind::pending) return false;
    const bool stop = (opts_.owner == ownership::waiters && f->waiters == 0) ||
                      (opts_.owner == ownership::leader && is_leader);
    if (!stop) return false;
    settle(f, kind::cancelled, wake);
    return f->stop.stop_possible();
  }

  // Publishes f's outcome and claims its waiters (not its observers) into
  // `wake`, doing their bookkeeping: from here on they no longer count as
  // users. After this nobody can join f; if its fn still runs, the entry
  // stays, settled, so that no second fn for the key starts until it returns.
  void settle(flight_t* f, kind k, detail::wake_batch& wake) noexcept {
    assert(f->kind == kind::pending);
    f->kind = k;
    unlink_deadline(f);
    if (k == kind::timeout) ++st_.timeouts;
    if (k == kind::fn_error || k == kind::dropped) ++st_.failures;
    const bool cancelled = k == kind::cancelled;
    (void)f->list.claim_if([](const detail::waiter& w) { return !w.observer; },
                           [&](const detail::waiter&) {
                             if (cancelled) ++st_.cancellations;
                             exit_user();
                           },
                           wake);
  }

  // f's fn has returned (or will never run): settle if still pending, erase
  // the entry if the map still holds this very flight, claim the observers.
  void finish(flight_t* f, kind k, detail::wake_batch& wake) noexcept {
    f->fn_done = true;
    if (f->kind == kind::pending) settle(f, k, wake);
    if (f->home != nullptr) {
      // Identity-checked: found by node address, never by key, so a flight
      // that forget() detached cannot erase its successor.
      auto it = map_.find(detail::node_probe{f->home, f->home_hash});
      assert(it != map_.end() && it->second == f);
      if (it != map_.end() && it->second == f) {
        typename map_t::node_type nh = map_.extract(it);
        if (spare_nodes_.size() < spare_nodes_.capacity()) spare_nodes_.push_back(std::move(nh));
        f->release();  // the map's reference
      }
      f->home = nullptr;
    }
    unlink_live(f);
    claim_observers(f, wake);
  }

  // Observers stay users after being claimed (they come back for the lock).
  void claim_observers(flight_t* f, detail::wake_batch& wake) noexcept {
    (void)f->list.claim_if([](const detail::waiter& w) { return w.observer; },
                           [this](detail::waiter& w) {
                             if (w.async) unlink_wait_deadline(static_cast<async_node*>(&w));
                           },
                           wake);
  }

  // An async observer's bound (a blocked one waits with its own deadline).
  // Kept sorted: bounds are taken under the lock from a steady clock with
  // one timeout, but a node going round again keeps its first bound, so it
  // is inserted from the back.
  void link_wait_deadline(async_node* n) noexcept {
    if (!n->wait_deadline) n->wait_deadline = detail::after(clock::now(), opts_.timeout);
    async_node* after = ob_tail_;
    while (after != nullptr && *n->wait_deadline < *after->wait_deadline) after = after->ob_prev;
    n->ob_prev = after;
    n->ob_next = after != nullptr ? after->ob_next : ob_head_;
    if (n->ob_next != nullptr) {
      n->ob_next->ob_prev = n;
    } else {
      ob_tail_ = n;
    }
    if (after != nullptr) {
      after->ob_next = n;
    } else {
      ob_head_ = n;
      timer_cv_.notify_one();  // under mu_: the timer waits on it
    }
    n->ob_linked = true;
  }
  void unlink_wait_deadline(async_node* n) noexcept {
    if (!n->ob_linked) return;
    (n->ob_prev != nullptr ? n->ob_prev->ob_next : ob_head_) = n->ob_next;
    (n->ob_next != nullptr ? n->ob_next->ob_prev : ob_tail_) = n->ob_prev;
    n->ob_prev = n->ob_next = nullptr;
    n->ob_linked = false;
  }

  void exit_user() noexcept {
    --users_;
    if (closed_) drain_cv_.notify_all();
  }

  void link_live(flight_t* f) noexcept {
    f->live_prev = nullptr;
    f->live_next = live_;
    if (live_ != nullptr) live_->live_prev = f;
    live_ = f;
  }
  void unlink_live(flight_t* f) noexcept {
    if (f->live_prev != nullptr) {
      f->live_prev->live_next = f->live_next;
    } else if (live_ == f) {
      live_ = f->live_next;
    }
    if (f->live_next != nullptr) f->live_next->live_prev = f->live_prev;
    f->live_prev = f->live_next = nullptr;
  }

  // Every flight gets the same timeout and deadlines are taken under the
  // lock from a steady clock, so appending keeps the list sorted.
  void link_deadline(flight_t* f) noexcept {
    f->deadline = detail::after(clock::now(), opts_.timeout);
    f->dl_prev = dl_tail_;
    f->dl_next = nullptr;
    if (dl_tail_ != nullptr) {
      dl_tail_->dl_next = f;
    } else {
      dl_head_ = f;
      timer_cv_.notify_one();  // under mu_: the timer waits on it
    }
    dl_tail_ = f;
    f->dl_linked = true;
  }
  void unlink_deadline(flight_t* f) noexcept {
    if (!f->dl_linked) return;
    if (f->dl_prev != nullptr) {
      f->dl_prev->dl_next = f->dl_next;
    } else {
      dl_head_ = f->dl_next;
    }
    if (f->dl_next != nullptr) {
      f->dl_next->dl_prev = f->dl_prev;
    } else {
      dl_tail_ = f->dl_prev;
    }
    f->dl_prev = f->dl_next = nullptr;
    f->dl_linked = false;
  }

  // Adds f (with a reference) to an intrusive list of flights to stop once
  // mu_ is released.
  static void collect_stop(flight_t* f, flight_t*& head) noexcept {
    if (!f->stop.stop_possible()) return;
    f->retain();
    f->stop_next = head;
    head = f;
  }

  // Stops every collected flight; call without mu_.
  static void stop_all(flight_t* head) noexcept {
    while (head != nullptr) {
      flight_t* f = head;
      head = f->stop_next;
      f->stop_next = nullptr;
      f->stop.request_stop();
      f->release();
    }
  }

  // ---- the group's own threads ---------------------------------------------

  // The timer: settles flights whose deadline passed and times out async
  // observers. It runs no callback and no resumption (one that blocked would
  // hold back every other deadline): it stops the settled flights' tokens
  // (fn's stop callbacks run here, as on any thread that requests stop), then
  // signals blocked threads, then hands async waiters to the delivery thread.
  void timer_loop(detail::owned_thread::home& self) {
    std::unique_lock<std::mutex> lk(mu_);
    while (!timer_stop_) {
      if (dl_head_ == nullptr && ob_head_ == nullptr) {
        timer_cv_.wait(lk);
        continue;
      }
      const auto now = clock::now();
      // A copy: the flight may settle and be freed while we wait.
      auto next = clock::time_point::max();
      if (dl_head_ != nullptr) next = dl_head_->deadline;
      if (ob_head_ != nullptr && *ob_head_->wait_deadline < next) next = *ob_head_->wait_deadline;
      if (now < next) {
        timer_cv_.wait_until(lk, next);
        continue;
      }
      SINGLEFLIGHT_HOOK_UNLOCKED(lk, timer_due);
      flight_t* to_stop = nullptr;
      detail::wake_batch wake;
      while (dl_head_ != nullptr && dl_head_->deadline <= now) {
        flight_t* f = dl_head_;
        settle(f, kind::timeout, wake);  // unlinks f from the deadline list
        collect_stop(f, to_stop);
      }
      // Async observers whose wait for a winding-down fn ran out: claimed
      // like settled waiters, with timeout_error (a leaving one unlinks
      // itself).
      while (ob_head_ != nullptr && *ob_head_->wait_deadline <= now) {
        async_node* n = ob_head_;
        unlink_wait_deadline(n);
        if (!n->try_claim()) continue;
        n->f->list.erase(*n);
        n->observer = false;
        n->result = kind::timeout;
        ++st_.rejections;
        exit_user();
        wake.add(*n);
      }
      detail::wake_batch async;
      wake.split([](const detail::waiter& w) { return w.async; }, async);
      lk.unlock();
      if (to_stop != nullptr) SINGLEFLIGHT_HOOK(stop_requesting);
      stop_all(to_stop);  // stop first, then notify
      wake.signal_all();  // blocked threads only: no user code
      // A stop callback may have destroyed the group (on this thread): the
      // async waiters are then delivered here, touching nothing of it.
      if (self.orphaned || (!async.empty() && !queue_delivery(async))) {
        notify(this, async);  // no observers in it: the group is not touched
      }
      if (self.orphaned) return;
      lk.lock();
    }
  }

  // Hands a batch of async waiters to the delivery thread, starting it the
  // first time. False when it cannot (the group's threads are stopping, or
  // no thread could be started): the caller then delivers them itself.
  bool queue_delivery(detail::wake_batch& batch) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    if (delivery_stop_) return false;
    try {
      if (!delivery_.started()) {
        delivery_ =
            detail::owned_thread([this](detail::owned_thread::home& h) { delivery_loop(h); });
      }
      delivery_q_.push_back(std::move(batch));
    } catch (...) {
      return false;  // std::system_error or bad_alloc: deliver on the timer
    }
    delivery_cv_.notify_one();
    return true;
  }

  // The delivery thread: runs the callbacks and resumptions of async waiters
  // settled by a deadline, one batch after another. A callback that blocks
  // delays the next deliveries of this thread, never a deadline.
  void delivery_loop(detail::owned_thread::home& self) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      delivery_cv_.wait(lk, [this] { return delivery_stop_ || !delivery_q_.empty(); });
      if (delivery_q_.empty()) return;  // asked to stop, and everything delivered
      detail::wake_batch batch = std::move(delivery_q_.front());
      delivery_q_.pop_front();
      lk.unlock();
      notify(this, batch);  // may re-enter the group, close it or destroy it
      if (self.orphaned) return;
      lk.lock();
    }
  }

  // ---- notification ---------------------------------------------------------

  // notify(g, wake)
  //
  // Notifies a batch of waiters claimed under g's mutex; called without it.
  // Static: a batch without observers is notified without touching the
  // group, which may be gone by then (the caller no longer counts as a user).
  //
  // A batch with observers (which go round again when notified, still counting
  // as users, so the group is alive) is a notification loop the group must
  // know about: a callback later in the batch that blocks inside the group
  // (do_, close()) would otherwise wait for observers and flights this very
  // loop has not processed yet. The loop is registered (with a user count of
  // its own, so it can unregister) and such a callback first runs the rest of
  // it (drain_own).
  static void notify(group* g, detail::wake_batch& wake) noexcept {
    if (!wake.has_observers()) {
      wake.signal_all();
      return;
    }
    detail::loop_record rec(&wake);
    {
      std::lock_guard<std::mutex> lk(g->mu_);
      ++g->users_;
      g->loops_.push(rec);
    }
    g->run_loop(rec);
    if (rec.orphaned) return;  // code this loop ran destroyed the group
    std::lock_guard<std::mutex> lk(g->mu_);
    g->loops_.erase(rec);
    g->exit_user();
  }

  // Notifies what is left of a loop's batch, then runs the flights started
  // inside it (deferred by hand_off), including any started meanwhile. On
  // the loop's own thread, without the lock.
  void run_loop(detail::loop_record& rec) noexcept {
    for (;;) {
      rec.batch->signal_all();
      if (rec.orphaned || rec.deferred.empty()) return;
      task t = std::move(rec.deferred.front());
      rec.deferred.erase(rec.deferred.begin());
      t();
    }
  }

  // A thread about to block inside the group first runs what it itself holds
  // back: the rest of its notification loops and the flights started in
  // them, innermost first. Called and returns with `lk` held.
  void drain_own(std::unique_lock<std::mutex>& lk) {
    if (loops_.empty()) return;
    const auto me = std::this_thread::get_id();
    while (detail::loop_record* r = detail::loop_with_work(loops_, me)) {
      lk.unlock();
      run_loop(*r);
      lk.lock();
    }
  }

  // ---- close ------------------------------------------------------------------

  bool close_until(std::optional<clock::time_point> until, bool destroying) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!closed_) {
      closed_ = true;
      flight_t* to_stop = nullptr;
      detail::wake_batch wake;
      for (flight_t* f = live_; f != nullptr; f = f->live_next) {
        if (f->kind == kind::pending) {
          settle(f, kind::closed, wake);
          collect_stop(f, to_stop);
        }
        claim_observers(f, wake);
      }
      lk.unlock();
      if (to_stop != nullptr) SINGLEFLIGHT_HOOK(stop_requesting);
      stop_all(to_stop);  // stop first, then notify
      notify(this, wake);
      SINGLEFLIGHT_HOOK(close_marked);
      lk.lock();
    }
    drain_own(lk);
    // This thread's own counts (inside fn, a notification loop): not waited for.
    const std::size_t own = detail::held_by(frames_, loops_, std::this_thread::get_id());
    const auto drained = [&] { return users_ <= own; };
    if (until) {
      if (!drain_cv_.wait_until(lk, *until, drained)) return false;
    } else {
      drain_cv_.wait(lk, drained);
    }
    if (own != 0 && !destroying) return true;  // inside fn or a loop: the destructor joins
    lk.unlock();
    join_threads(destroying);
    return true;
  }

  // Joins the group's threads: the timer first (then nothing new reaches the
  // delivery thread), then the delivery thread (which delivers what is
  // queued first), then the thread_executor workers. Never the calling
  // thread: close() leaves it to the destructor; the destructor detaches it
  // (orphaned: it touches nothing of the group any more). Serialised by
  // join_mu_, so a second close() returns only once the first has joined.
  void join_threads(bool destroying) {
    std::lock_guard<std::mutex> serial(join_mu_);
    {
      std::lock_guard<std::mutex> lk(mu_);
      timer_stop_ = true;
      timer_cv_.notify_all();
    }
    bool timer_gone = true;
    if (destroying) {
      timer_.join_or_orphan();
    } else {
      timer_gone = timer_.join_unless_current();
    }
    if (timer_gone) {
      detail::owned_thread delivery;
      {
        std::lock_guard<std::mutex> lk(mu_);
        delivery_stop_ = true;
        delivery_cv_.notify_all();
        delivery = std::move(delivery_);
      }
      if (!delivery.is_current()) {
        delivery.join_unless_current();
      } else if (destroying) {
        // ~group inside a callback on the delivery thread: deliver the rest
        // here, then let the thread go.
        for (;;) {
          detail::wake_batch batch;
          {
            std::lock_guard<std::mutex> lk(mu_);
            if (delivery_q_.empty()) break;
            batch = std::move(delivery_q_.front());
            delivery_q_.pop_front();
          }
          notify(this, batch);
        }
        delivery.join_or_orphan();
      } else {
        std::lock_guard<std::mutex> lk(mu_);
        delivery_ = std::move(delivery);  // it finishes the queue; the destructor joins it
      }
    }
    std::list<detail::owned_thread> workers;
    {
      std::lock_guard<std::mutex> lk(threads_mu_);
      workers.splice(workers.end(), workers_);
    }
    for (auto it = workers.begin(); it != workers.end();) {
      if (destroying) {
        it->join_or_orphan();
      } else if (!it->join_unless_current()) {
        ++it;  // this very thread: kept for the destructor
        continue;
      }
      it = workers.erase(it);
    }
    if (!workers.empty()) {
      std::lock_guard<std::mutex> lk(threads_mu_);
      workers_.splice(workers_.end(), workers);
    }
  }

  T deliver(ticket& t, std::optional<T>& local) {
    switch (t.outcome) {
      case kind::value:
        if (t.sole) return std::move(*local);
        return *t.f->value;  // each caller's own copy, made outside the lock
      case kind::fn_error:
      case kind::dropped:
        std::rethrow_exception(t.f->error);
      case kind::cancelled:
        throw cancelled_error();
      case kind::closed:
        throw closed_error();
      case kind::timeout:
        throw timeout_error();
      case kind::overloaded:
        throw overloaded_error();
      case kind::pending:
        break;
    }
    assert(false && "singleflight: delivered a pending outcome");
    throw error("singleflight: internal error (pending outcome)");
  }

  options opts_;
  [[no_unique_address]] Hash hash_{};

  mutable std::mutex mu_;
  map_t map_;                    // guarded by mu_
  singleflight::stats st_{};     // guarded by mu_
  std::uint64_t seq_ = 0;        // guarded by mu_: number of the last flight started
  std::size_t users_ = 0;        // guarded by mu_: calls inside the group + unfinished tasks
  bool closed_ = false;          // guarded by mu_
  flight_t* live_ = nullptr;     // guarded by mu_: flights whose fn has not returned
  flight_t* dl_head_ = nullptr;  // guarded by mu_: flights with a pending deadline
  flight_t* dl_tail_ = nullptr;
  async_node* ob_head_ = nullptr;  // guarded by mu_: async observers' bounds, earliest first
  async_node* ob_tail_ = nullptr;
  detail::record_list<detail::frame> frames_;       // guarded by mu_
  detail::record_list<detail::loop_record> loops_;  // guarded by mu_
  bool timer_stop_ = false;                         // guarded by mu_
  bool delivery_stop_ = false;                      // guarded by mu_
  std::deque<detail::wake_batch> delivery_q_;       // guarded by mu_
  flight_t* spare_flights_ = nullptr;               // guarded by mu_: recycled flight objects
  std::size_t spare_flight_count_ = 0;
  std::vector<typename map_t::node_type> spare_nodes_;  // guarded by mu_: recycled map nodes
  std::condition_variable drain_cv_;
  std::condition_variable timer_cv_;
  std::condition_variable delivery_cv_;

  std::mutex join_mu_;  // serialises join_threads()
  std::mutex threads_mu_;
  detail::owned_thread timer_;     // started in the constructor, joined under join_mu_
  detail::owned_thread delivery_;  // started by the timer under mu_, joined under join_mu_
  std::list<detail::owned_thread> workers_;  // thread_executor's; guarded by threads_mu_
};

}  // namespace singleflight
