// singleflight/detail/group/async_waiters.hpp -- internal; do not include directly.
//
// async_calls<Key, T, Hash, KeyEqual>: callers that wait without a thread.
// An async caller is an async_node linked into the flight's list like a
// blocked thread. The differences:
//   * it registers its stop callback before it attaches, so nothing touches
//     it after the lock that attaches it is released;
//   * its stop callback leaves the flight itself (async_stopped), taking the
//     shard's lock: the node is a user until its outcome is decided, so the
//     group is alive;
//   * being notified means running its callback (callback_node, here) or
//     resuming its coroutine (coroutine.hpp);
//   * as an observer (waiting for a winding-down fn) it goes round again on
//     the notifying thread (go_again), bounded by options.timeout from its
//     first arrival (bounded_wait; the timer claims it when that runs out).
//
// Locking: the key's shard lock around every state change; none while a
// callback, a resumption, fn or a stop runs.
#pragma once

#include <atomic>
#include <cassert>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "../../errors.hpp"
#include "../../outcome.hpp"
#include "../../stats.hpp"
#include "../../stop_token.hpp"
#include "../fn_shapes.hpp"
#include "../functional.hpp"
#include "../kept.hpp"
#include "../unwind.hpp"
#include "blocking_calls.hpp"
#include "hooks.hpp"
#include "observers.hpp"
#include "outcomes.hpp"

namespace singleflight::detail {

// An async waiter as its stop callback sees it: `stopped` is its group's
// async_calls::async_stopped. Not a template, so the callback
// (std::stop_callback<async_on_stop> and its optional, a member of every
// async node) is compiled once in a translation unit, not once per (Key, T).
struct async_stop_target : bounded_wait {
  void (*stopped)(async_stop_target*) noexcept = nullptr;
};

// An async caller's stop callback: runs on the thread that requested stop.
struct async_on_stop {
  async_stop_target* n;
  void operator()() const noexcept { n->stopped(n); }
};

template <class Key, class T, class Hash, class KeyEqual>
class async_calls : public blocking_calls<Key, T, Hash, KeyEqual> {
  using base = blocking_calls<Key, T, Hash, KeyEqual>;

 public:
  using typename base::flight_t;
  using typename base::kind;
  using typename base::ref_t;

  using key_type = Key;
  using value_type = T;

  explicit async_calls(options opts) : base(std::move(opts)) {}

  // The user's Hash on a key (coroutine awaiters hash before attaching).
  template <class P>
  std::size_t hash_key(const P& key) const {
    return this->hash_(key);
  }

  struct async_node : async_stop_target {
    async_node(async_calls* grp, stop_token tok) noexcept : g(grp), caller(std::move(tok)) {
      this->notify = &on_notify;
      this->stopped = &on_stop;
      this->async = true;
    }
    async_node(const async_node&) = delete;
    async_node& operator=(const async_node&) = delete;
    ~async_node() = default;

    async_calls* g;
    stop_token caller;
    std::uint64_t mixed = 0;   // the key's mixed hash
    ref_t f;                   // the flight joined, led or observed
    std::exception_ptr error;  // a failure of this caller's own (going round again)
    call_info info{};          // its role and the flight's number, once attached
    bool has_key = true;       // false: must copy the key before it can go round again
    // Set by the stop callback before it tries to leave. Memory ordering:
    // seq_cst, see waiter::state.
    std::atomic<bool> stop_flag{false};
    std::optional<stop_callback<async_on_stop>> cb;
    void (*complete)(async_node*) noexcept = nullptr;  // deliver `result`; may destroy the node
    void (*again)(async_node*) noexcept = nullptr;     // an observer's wait is over

    static void on_stop(async_stop_target* t) noexcept {
      async_stopped(static_cast<async_node*>(t));
    }
    static void on_notify(waiter* w) noexcept {
      auto* n = static_cast<async_node*>(w);
      if (n->observer) {
        n->again(n);
        return;
      }
      // Published by the settle that claimed us (same thread); whoever else
      // decided (the timer, a leave) set `result` itself.
      if (n->result == kind::pending) n->result = n->f->kind;
      deliver(n);
    }
  };

  // Hands an async caller its outcome. Without any lock; the node no longer
  // counts as a user. Unregisters the stop callback first (waiting for it if
  // it is running elsewhere: it lost the race and returns at once).
  static void deliver(async_node* n) noexcept {
    n->cb.reset();
    n->complete(n);
  }

  // The exception an async caller receives, for every outcome but a value.
  static std::exception_ptr failure_of(const async_node& n) noexcept {
    if (n.error) return n.error;
    if (n.result == kind::fn_error || n.result == kind::dropped) return n.f->error;
    std::exception_ptr e = shared_error(n.result);
    assert(e && "singleflight: no failure to deliver");
    return e;
  }

  // This caller's outcome: its own copy of the value (a throwing copy is its
  // error), or the failure. A prvalue, so that it initialises on_done's
  // parameter directly and T is never moved.
  static outcome<T> make_outcome(const async_node& n) noexcept {
    if (!n.error && n.result == kind::value) {
      try {
        return outcome<T>(from_flight, n.info, std::in_place,
                          *static_cast<flight_t*>(n.f.get())->value);
      } catch (...) {
        return outcome<T>(from_flight, n.info, status::failed, std::current_exception());
      }
    }
    return outcome<T>(from_flight, n.info, n.error ? status::failed : status_of(n.result),
                      failure_of(n));
  }

  // A callback waiter: owns the callback and, only once it has to wait for
  // a winding-down fn (and may lead after going round again), copies of fn
  // and of the key. Heap-allocated by async_do, deleted after on_done
  // returns.
  template <class Fn, class Cb>
  struct callback_node final : async_node {
    template <class C>
    callback_node(async_calls* grp, C&& cb_in, stop_token tok)
        : async_node(grp, std::move(tok)), on_done(std::forward<C>(cb_in)) {
      this->complete = &complete_fn;
      this->again = &again_fn;
    }
    Cb on_done;
    kept<Fn> fn;
    kept<Key> key;

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
  };

  template <class P, class F, class C>
  void start_callback(const P& key, F&& fn, C&& on_done, stop_token caller,
                      const steady::time_point* bound = nullptr) {
    using node_t = callback_node<std::decay_t<F>, std::decay_t<C>>;
    const std::uint64_t mixed = base::mix(this->hash_(key));  // user code: outside the lock
    auto* n = new node_t(this, std::forward<C>(on_done), std::move(caller));
    if (bound != nullptr) n->caller_until = *bound;
    n->mixed = mixed;
    n->has_key = false;
    try {
      start(n, key, std::forward<F>(fn), [n](const P& k, auto&& f) {
        n->key.emplace(k);
        n->fn.emplace(std::forward<decltype(f)>(f));
        return std::addressof(*n->fn);
      });
    }
    // fn ended this thread inside async_do: the node was delivered (and freed).
    catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      delete n;
      throw;
    }
  }

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
  //
  // A caller with a wait_bound makes sure the timer runs first (it ends the
  // wait): std::system_error when no thread can be started.
  template <class P, class F, class KeepKey>
  void start(async_node* n, const P& key, F&& fn, KeepKey keep) {
    if (n->caller_until && *n->caller_until > steady::now()) this->ensure_timer();
    // If `caller` is already stopped, the callback runs right here; it finds
    // nothing attached and attach() answers cancelled.
    if (n->caller.stop_possible()) n->cb.emplace(n->caller, async_on_stop{n});
    try {
      attach(n, key, std::forward<F>(fn), /*first=*/true, keep);
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();  // the node was delivered: untouchable
      n->cb.reset();
      throw;
    }
  }

  // An observer's wait is over (its predecessor's fn returned, forget() or
  // close()): attach again. Runs on the notifying thread; the node is still a
  // user. A failure (allocation, Hash, KeyEqual) becomes its outcome. It
  // never runs fn itself: a flight it starts without an executor is deferred
  // to the end of the notification loop (hand_off).
  template <class P, class F>
  void go_again(async_node* n, const P& key, F&& fn) noexcept {
    SINGLEFLIGHT_HOOK(observer_returning);
    try {
      attach(n, key, std::forward<F>(fn), /*first=*/false, no_keep<P>{});
    } catch (...) {
      n->error = std::current_exception();
      n->cb.reset();  // outside the lock: a stop callback in flight takes it
      shard& s = this->shard_of(n->mixed);
      {
        std::lock_guard<std::mutex> lk(s.mu);
        this->exit_user(s);
      }
      deliver(n);
    }
  }

 private:
  // Joins, observes or leads the flight for `key`, or decides an immediate
  // outcome and delivers it. `first`: from async_do / co_await (the node is
  // not a user yet); otherwise an observer going round again (it is one).
  // Throws only before attaching, and never touches the node after the lock
  // that attached it is released.
  template <class P, class F, class KeepKey>
  void attach(async_node* n, const P& key, F&& fn, bool first, KeepKey keep) {
    shard& s = this->shard_of(n->mixed);
    ref_t previous;  // an observer's old flight: released after the lock
    std::remove_reference_t<F>* fnp = std::addressof(fn);  // moves into the node if it must wait
    std::unique_lock<std::mutex> lk(s.mu);
    kind immediate = kind::pending;
    try {
      if (first) {
        ++s.calls;
      } else {
        n->rearm();  // then read the stop flag: see waiter::state
      }
      for (;;) {
        if (s.closed) {
          immediate = kind::closed;
          break;
        }
        if (n->stop_flag.load(std::memory_order_seq_cst)) {
          immediate = kind::cancelled;
          break;
        }
        if (first && n->caller_until && *n->caller_until <= steady::now()) {
          immediate = kind::timeout;  // its wait_bound passed before it began
          ++s.st.wait_timeouts;
          break;
        }
        flight_t* f = this->find(s, key, n->mixed);
        if (f == nullptr) {
          if (!this->reserve_entry()) {
            ++s.st.overloaded;
            immediate = kind::overloaded;
            break;
          }
          lead_async(lk, s, n, key, std::forward<F>(*fnp), first,
                     /*fn_is_callers=*/first && fnp == std::addressof(fn), previous);
          return;
        }
        if (f->kind == kind::pending) {
          ++f->waiters;
          ++f->joins;
          ++s.st.joins;
          if (first) this->enter_user(s);
          previous = std::exchange(n->f, ref_t::share(f));
          n->observer = false;
          n->is_leader = false;
          n->info = call_info{role::follower, this->number(*f)};
          n->waiting_on = f;
          f->list.push(*n);
          this->link_bound(s, *n, /*as_observer=*/false);
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
        if (first) this->enter_user(s);
        previous = std::exchange(n->f, ref_t::share(f));
        n->observer = true;
        n->is_leader = false;
        n->waiting_on = f;
        f->list.push(*n);
        this->link_bound(s, *n, /*as_observer=*/true);
        return;
      }
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();  // fn ended this thread: lead_async cleaned up
      if (!lk.owns_lock()) lk.lock();
      ++s.st.rejections;
      throw;
    }
    // Immediate outcome. If the claim fails, the stop callback is leaving:
    // it found nothing linked and leaves the answer (cancelled) to us.
    if (!n->try_claim()) immediate = kind::cancelled;
    ++s.st.rejections;
    if (immediate == kind::cancelled) ++s.st.cancellations;
    n->result = immediate;
    n->info = call_info{};
    lk.unlock();
    if (!first) {
      n->cb.reset();  // outside the lock: a stop callback in flight takes it
      lk.lock();
      this->exit_user(s);
      lk.unlock();
    }
    deliver(n);
  }

  // Starts a flight with an async caller as its leader (an entry was
  // reserved). Called with `lk` held, returns with it released.
  template <class P, class F>
  void lead_async(std::unique_lock<std::mutex>& lk, shard& s, async_node* n, const P& key, F&& fn,
                  bool first, bool fn_is_callers, ref_t& previous) {
    using Fn = std::decay_t<F>;
    // fn kept in the node (or in a suspended coroutine's frame) dies with
    // the node once it is delivered, which its stop, the deadline or close()
    // may do while fn runs: take it out while nothing can deliver the node
    // (found by the spin model). Fn's move (or copy) runs under the lock
    // here, only on this rare path (a caller that waited for a stopped fn).
    kept<Fn> owned;
    flight_t* f = nullptr;
    try {
      if (!fn_is_callers) owned.emplace(std::forward<F>(fn));  // nothing changed yet
      f = this->acquire(s, base::template needs_stop<Fn, T>);
      this->insert(s, key, n->mixed, f);
    } catch (...) {
      this->unreserve_entry();
      if (f != nullptr) f->release();
      throw;
    }
    // Committed: nothing below throws.
    this->started(s, f);
    if (first) this->enter_user(s);
    previous = std::exchange(n->f, ref_t::share(f));
    n->observer = false;
    n->is_leader = true;
    n->info = call_info{role::leader, this->number(*f)};
    n->waiting_on = f;
    f->list.push(*n);  // unlike a blocked leader, the node is a user of its own
    this->link_bound(s, *n, /*as_observer=*/false);
    this->enter_user(s);  // this thread, until the hand-off is over
    frame fr;             // ... and close() from code it runs meanwhile does not wait for it
    s.frames.push(fr);
    ref_t mine = ref_t::share(f);
    std::exception_ptr discarded;  // released after the notification (hand_off)
    wake_batch wake;
    // fn (run right here without an executor) may end this thread: run_task
    // fails the flight; this thread's own count goes here.
    on_unwind unwind([&] {
      if (!lk.owns_lock()) lk.lock();
      s.frames.erase(fr);
      this->exit_user(s);
      lk.unlock();
    });
    // Going round again happens inside a settler's notification loop: an fn
    // run right here would hold back the waiters notified after this one
    // (they could not even leave on their stop; found by the spin model).
    // Without an executor it is queued and run once the loop is over.
    const bool defer = !first;
    // fn, or the node's copy (moved into the task).
    void* fnp =
        owned ? base::fn_ptr(__builtin_addressof(*owned)) : base::fn_ptr(__builtin_addressof(fn));
    const typename base::body b{
        fnp, owned ? &base::template body_ops_of<Fn, T> : &base::template body_ops_of<F, T>};
    const bool stop = this->hand_off(lk, f, b, wake, discarded, defer);
    unwind.disarm();
    s.frames.erase(fr);
    this->exit_user(s);
    lk.unlock();
    if (stop) mine->stop.request_stop();  // stop first, then notify
    base::notify(this, s, wake);
  }

  // An async caller's stop callback: runs on the thread that requested stop.
  static void async_stopped(async_node* n) noexcept {
    n->stop_flag.store(true, std::memory_order_seq_cst);
    if (!n->try_leave())
      return;  // claimed: its outcome is on the way, or its next round sees the flag
    async_calls* g = n->g;
    shard& s = g->shard_of(n->mixed);
    bool stop = false;
    wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      // Not attached (yet, or between two rounds): the attaching thread
      // sees `leaving` and answers cancelled itself.
      if (!n->linked) return;
      flight_base* f = n->f.get();
      f->list.erase(*n);
      s.bounds.unlink(*n);
      if (n->observer) {
        ++s.st.rejections;
      } else {
        stop = g->leave(s, *f, n->is_leader, wake);
      }
      ++s.st.cancellations;
      g->exit_user(s);
    }
    // No longer a user: only the node and its flight reference are touched,
    // and the group, through the waiters in `wake` (users while unnotified
    // observers are in it; see notify).
    if (stop) n->f->stop.request_stop();  // stop first, then notify
    if (!wake.empty()) base::notify(g, s, wake);
    n->result = kind::cancelled;
    deliver(n);
  }
};

}  // namespace singleflight::detail
