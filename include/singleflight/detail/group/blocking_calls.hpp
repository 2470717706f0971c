// singleflight/detail/group/blocking_calls.hpp -- internal; do not include directly.
//
// blocking_calls<Key, T, Hash, KeyEqual>: do_ and do_fresh. A call finds,
// joins, observes or leads the flight for its key (route), then:
//   * as the inline leader (no executor, a sync fn) runs fn on its own thread
//     and finishes the flight (lead_inline); its stop leaves the flight from
//     its stop callback (leave_on_stop), since it cannot stop waiting;
//   * as a follower (or an executor leader) sleeps on the flight's signal
//     until it is claimed or its stop fires (wait_outcome);
//   * as an observer (the entry is a stopped fn winding down, or, for
//     do_fresh, a flight that started before it arrived) waits for that fn to
//     return, bounded by options.timeout from its arrival, and goes round
//     again (observe).
// The call's outcome is decided under the shard's lock and delivered after
// it (result_of: a copy of T or a rethrow; to_outcome: the same as a value).
//
// Locking: the key's shard lock around every state change; released before
// fn runs, before sleeping, and before any stop or notification.
#pragma once

#include <cassert>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <utility>

#include "../../errors.hpp"
#include "../../outcome.hpp"
#include "../../stats.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "../fn_shapes.hpp"
#include "../functional.hpp"
#include "../unwind.hpp"
#include "blocking_waiters.hpp"
#include "execution.hpp"
#include "flight_table.hpp"
#include "hooks.hpp"
#include "outcomes.hpp"
#include "placement.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash, class KeyEqual>
class blocking_calls : public flight_table<Key, T, Hash, KeyEqual> {
  using base = flight_table<Key, T, Hash, KeyEqual>;

 public:
  using typename base::flight_t;
  using typename base::kind;
  using typename base::ref_t;

  explicit blocking_calls(options opts) : base(std::move(opts)) {}

 protected:
  // What one call ends with, decided under the lock and delivered after it.
  struct ticket {
    ref_t f;
    kind outcome = kind::pending;
    bool stop = false;       // request_stop on f once the lock is released
    bool rejected = false;   // neither started nor joined
    bool accounted = false;  // claimed by a settler, who did the bookkeeping
    bool early = false;      // rejected before entering the group (call_with)
    wake_batch wake;         // waiters this call claimed, to notify after unlocking
    // What an inline leader's fn, or the executor, threw when no caller
    // takes it (the flight settled first): released only after `wake` is
    // notified (call_with).
    std::exception_ptr discarded;
  };

  // An inline leader's stop callback (leader_stop.hpp: not a template).
  using typename base::leave_on_stop;

  // Whether F is a body erased by call_with (execution::body).
  template <class Fn>
  static constexpr bool erased = std::is_same_v<Fn, typename base::body>;
  // Whether a body of type Fn may run on its leader's thread (lead_inline):
  // a sync fn that is not task_only.
  template <class Fn>
  static constexpr bool has_inline_path = !async_fn<Fn, T> && !is_task_only<Fn>;
  // Whether call_with erases a body passed as F (it has no inline path).
  template <class F>
  static constexpr bool erases = !erased<std::decay_t<F>> && !has_inline_path<std::decay_t<F>>;
  template <class F>
  static constexpr bool keeps = !erases<F>;

  // call_with(key, fn, caller, fresh, info, local)
  //
  // The whole blocking call but the delivery: returns the ticket once the
  // call no longer counts as a user of the group (only the flight, held by
  // the ticket, may be touched afterwards). Immediate outcomes (closed, an
  // already stopped caller, max_in_flight) are tickets too. Throws, with
  // nothing attached, only what Hash, KeyEqual, Key's copy or allocation
  // throw, and std::logic_error (self-deadlock).
  //
  // `bound`: the caller's wait_bound (null: none). A bound already passed is
  // an immediate timeout; otherwise the timer is made sure to run (an inline
  // leader's bound needs it), which may throw std::system_error first.
  template <class P, class F>
  requires keeps<F> ticket call_with(const P& key, F&& fn, const stop_token& caller, bool fresh,
                                     call_info* info, std::optional<T>& local,
                                     const steady::time_point* bound = nullptr) {
    if (info != nullptr) *info = call_info{};
    const bool expired = bound != nullptr && *bound <= steady::now();
    if (bound != nullptr && !expired) this->ensure_timer();
    const std::uint64_t mixed = base::mix(this->hash_(key));  // user code: outside the lock
    shard& s = this->shard_of(mixed);
    blocking_waiter w;
    SINGLEFLIGHT_HOOK(caller_entering);
    // Built in place through every layer below (each returns a prvalue or
    // its one named ticket): no ticket is moved on the leader path.
    ticket t = locked_call(s, key, mixed, std::forward<F>(fn), caller, fresh, w, local, info, bound,
                           expired);
    if (t.early) return t;  // rejected before entering: nothing claimed, nothing to stop
    // No longer a user: only the flight (t.f) and the waiters in t.wake.
    SINGLEFLIGHT_HOOK(caller_exiting);
    if (t.stop) {  // stop first, then notify: a notified waiter may wait for this fn
      SINGLEFLIGHT_HOOK(stop_requesting);
      t.f->stop.request_stop();
    }
    if (!t.wake.empty()) base::notify(this, s, t.wake);
    // An exception fn (or the executor) threw, or a value fn returned (left
    // in `local`), when the flight had settled otherwise goes to no one. Their
    // destructors are user code: they run outside the lock, and only once
    // this call's waiters are notified, so that one that re-enters the group
    // (close() included) waits for no one this call still had to wake. The
    // exception is released here, the value with `local` in the caller's
    // frame (do_, try_do), which never reads it then: the outcome is not a
    // value. Tested first: assigning null to a null exception_ptr still
    // calls its out-of-line destructor (7 instructions a call of the leader
    // path, bench/profile/leader_path.cpp).
    if (t.discarded) t.discarded = nullptr;
    return t;
  }

  // A body that always runs as a task (an async fn, task_only) reaches fn
  // only through hand_off: erased here, so that the route below (locked_call
  // down to lead) is compiled once for all such bodies of this group type
  // rather than once for each.
  template <class P, class F>
  requires erases<F> ticket call_with(const P& key, F&& fn, const stop_token& caller, bool fresh,
                                      call_info* info, std::optional<T>& local,
                                      const steady::time_point* bound = nullptr) {
    return call_with(key,
                     typename base::body{base::fn_ptr(__builtin_addressof(fn)),
                                         &base::template body_ops_of<F, T>},
                     caller, fresh, info, local, bound);
  }

  // to_outcome(t, local, info): the same as an outcome, without a throw.
  // g++ 12 at -O1 (the tsan preset) reports `local`'s payload as maybe
  // uninitialized once this is inlined into try_do, though it is read only
  // when engaged (GCC's -Wmaybe-uninitialized false positives on
  // std::optional, e.g. PR 80635).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  static outcome<T> to_outcome(ticket& t, std::optional<T>& local, const call_info& info) noexcept {
    switch (t.outcome) {
      case kind::value:
        try {
          if (local) return outcome<T>(from_flight, info, std::in_place, std::move(*local));
          return outcome<T>(from_flight, info, std::in_place,
                            *static_cast<flight_t*>(t.f.get())->value);  // our own copy
        } catch (...) {
          return outcome<T>(from_flight, info, status::failed, std::current_exception());
        }
      case kind::fn_error:
      case kind::dropped:
        return outcome<T>(from_flight, info, status::failed, t.f->error);
      default:
        return outcome<T>(from_flight, info, status_of(t.outcome), shared_error(t.outcome));
    }
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

  // result_of(t, local): this caller's copy of the value, or the rethrow.
  static T result_of(ticket& t, std::optional<T>& local) {
    switch (t.outcome) {
      case kind::value:
        // With a value, `local` is engaged exactly when the leader ran fn
        // inline and no one else reads the flight (lead_inline); testing the optional itself
        // lets GCC see that its payload is initialized here (-O3
        // -Wmaybe-uninitialized otherwise, in the caller's code).
        if (local) return std::move(*local);
        // Each caller's own copy, made outside the lock.
        return *static_cast<flight_t*>(t.f.get())->value;
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
    throw error("singleflight: internal error (pending outcome)");
  }

 private:
  // call_with's part under s's lock: the early rejections (closed, an already
  // stopped caller, a bound already passed), or entering as a user, routing
  // and the bookkeeping of a call nobody claimed. Returns with the lock
  // released.
  template <class P, class F>
  ticket locked_call(shard& s, const P& key, std::uint64_t mixed, F&& fn, const stop_token& caller,
                     bool fresh, blocking_waiter& w, std::optional<T>& local, call_info* info,
                     const steady::time_point* bound, bool expired) {
    std::unique_lock<std::mutex> lk(s.mu);
    ++s.calls;
    if (s.closed || caller.stop_requested() || expired) {
      const kind k = s.closed                  ? kind::closed
                     : caller.stop_requested() ? kind::cancelled
                                               : kind::timeout;
      ++s.st.rejections;
      if (k == kind::cancelled) ++s.st.cancellations;
      if (k == kind::timeout) ++s.st.wait_timeouts;
      return early_rejection(k);
    }
    this->enter_user(s);
    return counted_route(lk, s, key, mixed, std::forward<F>(fn), caller, fresh, w, local, info,
                         bound);
  }

  // route() for a call counted as a user; gives the count back unless a
  // settler claimed the call (and did it). Called with `lk` held.
  template <class P, class F>
  ticket counted_route(std::unique_lock<std::mutex>& lk, shard& s, const P& key,
                       std::uint64_t mixed, F&& fn, const stop_token& caller, bool fresh,
                       blocking_waiter& w, std::optional<T>& local, call_info* info,
                       const steady::time_point* bound) {
    ticket t = route_or_unwind(lk, s, key, mixed, std::forward<F>(fn), caller, fresh, w, local,
                               info, bound);
    if (!t.accounted) {
      if (t.rejected) ++s.st.rejections;
      if (t.outcome == kind::cancelled) ++s.st.cancellations;
      this->exit_user(s);
    }
    return t;
  }

  template <class P, class F>
  ticket route_or_unwind(std::unique_lock<std::mutex>& lk, shard& s, const P& key,
                         std::uint64_t mixed, F&& fn, const stop_token& caller, bool fresh,
                         blocking_waiter& w, std::optional<T>& local, call_info* info,
                         const steady::time_point* bound) {
    try {
      return route(lk, s, key, mixed, std::forward<F>(fn), caller, fresh, w, local, info, bound);
    }
    // fn ended this thread (an inline leader): lead_inline settled the
    // flight and gave back this call's count.
    catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      // Every throw inside route() happens under the lock and before the
      // call attached to anything: nothing to roll back but the counts.
      if (!lk.owns_lock()) lk.lock();
      ++s.st.rejections;
      this->exit_user(s);
      throw;
    }
  }

  static ticket early_rejection(kind k) {
    ticket t = rejected(k);
    t.early = true;
    return t;
  }

  // Finds, joins, waits for or starts the flight. Called with `lk` held;
  // returns with it held unless the ticket is `accounted`; throws only while
  // holding it and before attaching.
  template <class P, class F>
  ticket route(std::unique_lock<std::mutex>& lk, shard& s, const P& key, std::uint64_t mixed,
               F&& fn, const stop_token& caller, bool fresh, blocking_waiter& w,
               std::optional<T>& local, call_info* info, const steady::time_point* bound) {
    const std::uint64_t arrival = s.seq;
    std::optional<steady::time_point> wait_deadline;
    for (;;) {
      if (s.closed) return rejected(kind::closed);
      if (caller.stop_requested()) return rejected(kind::cancelled);  // after an observe
      flight_t* f = this->find(s, key, mixed);
      if (f == nullptr)
        return lead(lk, s, key, mixed, std::forward<F>(fn), caller, w, local, info, bound);
      if (f->runner == std::this_thread::get_id()) {
        throw std::logic_error(
            "singleflight: fn called do_ for its own key on the thread running it; it would "
            "wait for itself forever");
      }
      if (f->kind == kind::pending && (!fresh || f->seq > arrival)) {
        ++f->waiters;
        ++f->joins;
        ++s.st.joins;
        if (info != nullptr) *info = call_info{role::follower, this->number(*f)};
        w.reset(/*as_observer=*/false);
        f->list.push(w);
        return wait_outcome(lk, s, ref_t::share(f), caller, w, /*is_leader=*/false, bound);
      }
      // The entry is a stopped fn winding down, or (do_fresh) a flight that
      // started before we arrived: wait until its fn returns, then go again.
      if (this->opts().timeout > std::chrono::nanoseconds::zero() && !wait_deadline) {
        wait_deadline = after(steady::now(), this->opts().timeout);  // from arrival, once
      }
      std::optional<steady::time_point> until = wait_deadline;  // the earlier of the two bounds
      if (bound != nullptr && (!until || *bound < *until)) until = *bound;
      const kind k = observe(lk, s, ref_t::share(f), caller, w, until);
      if (k == kind::timeout && bound != nullptr && *bound <= steady::now()) ++s.st.wait_timeouts;
      if (k != kind::pending) return rejected(k);
      SINGLEFLIGHT_HOOK_UNLOCKED(lk, observer_relooking);
    }
  }

  static ticket rejected(kind k) {
    ticket t;
    t.outcome = k;
    t.rejected = true;
    return t;
  }

 private:
  // Waits, as an observer, until f's fn has returned. Returns pending to go
  // round again, or the reason to give up. Called and returns with `lk` held.
  kind observe(std::unique_lock<std::mutex>& lk, shard& s, ref_t f, const stop_token& caller,
               blocking_waiter& w, const std::optional<steady::time_point>& deadline) {
    w.reset(/*as_observer=*/true);
    f->list.push(w);
    lk.unlock();
    this->drain_own();  // we may be waiting for what this thread itself holds back
    bool claimed;
    {
      std::optional<stop_callback<wake_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, wake_on_stop{&w, f.get()});
      claimed = w.await(*f, deadline ? &*deadline : nullptr);
    }
    if (claimed || !w.try_leave()) {
      // Claimed: fn returned, forget() or close(). Observers still count as
      // users, so it is safe to take the lock again.
      lk.lock();
      return s.closed ? kind::closed : kind::pending;
    }
    lk.lock();
    if (w.linked) f->list.erase(w);  // a settle that lost the claim to us unlinked it already
    return w.stop_fired.load(std::memory_order_acquire) ? kind::cancelled : kind::timeout;
  }

 protected:
  // Blocks until f settles (claimed) or the caller's token fires (leaves).
  // Called with `lk` held and `w` linked; returns with `lk` held, or
  // released when the ticket is `accounted`.
  ticket wait_outcome(std::unique_lock<std::mutex>& lk, shard& s, ref_t f, const stop_token& caller,
                      blocking_waiter& w, bool is_leader, const steady::time_point* bound) {
    lk.unlock();
    this->drain_own();  // we may be waiting for what this thread itself holds back
    bool claimed;
    {
      std::optional<stop_callback<wake_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, wake_on_stop{&w, f.get()});
      claimed = w.await(*f, bound);
    }
    ticket t;
    if (!claimed && w.try_leave()) {
      // Our own stop (or wait_bound) came first, and no settler can claim us
      // now: leave, exactly as on a stop.
      lk.lock();
      if (w.linked) f->list.erase(w);  // a settle that lost the claim to us unlinked it already
      t.outcome = w.stop_fired.load(std::memory_order_acquire) ? kind::cancelled : kind::timeout;
      if (t.outcome == kind::timeout) ++s.st.wait_timeouts;
      t.stop = this->leave(s, *f, is_leader, t.wake);
      t.f = std::move(f);
      return t;  // lock held: the caller does the bookkeeping
    }
    // Claimed (perhaps at the same moment as our stop: the outcome wins).
    // The settler did our bookkeeping and no longer counts us as a user:
    // from here on the group is off limits. It published f->kind before the
    // claim, which our read of the claimed state orders before this read.
    t.outcome = f->kind;
    t.f = std::move(f);
    t.accounted = true;
    return t;
  }

 private:
  // Starts a new flight for `key` with this caller as its leader.
  template <class P, class F>
  ticket lead(std::unique_lock<std::mutex>& lk, shard& s, const P& key, std::uint64_t mixed, F&& fn,
              const stop_token& caller, blocking_waiter& w, std::optional<T>& local,
              call_info* info, const steady::time_point* bound) {
    using Fn = std::decay_t<F>;
    if (!this->reserve_entry()) {
      ++s.st.overloaded;
      return rejected(kind::overloaded);
    }
    flight_t* f = nullptr;
    try {
      if constexpr (erased<Fn>) {
        f = this->acquire(s, fn.ops->needs_stop);
      } else {
        f = this->acquire(s, base::template needs_stop<Fn, T>);
      }
      this->insert(s, key, mixed, f);
    } catch (...) {
      this->unreserve_entry();
      if (f != nullptr) f->release();
      throw;
    }
    // Committed: nothing below throws.
    this->started(s, f);
    if (info != nullptr) *info = call_info{role::leader, this->number(*f)};
    ref_t mine = ref_t::share(f);

    if constexpr (erased<Fn>) {
      // An async fn, or task_only: only ever passed to a group with an
      // executor (placement.hpp); lead_inline is never taken.
      assert((this->opts().executor || fn.ops->run->start != nullptr) &&
             "singleflight: task_only body in a group without an executor");
      return lead_task(lk, s, std::move(mine), fn, caller, w, bound);
    } else if constexpr (is_inline_only<Fn>) {
      // Only ever passed to a group without an executor (placement.hpp): the task path below,
      // and the task it would compile for fn, is never taken.
      assert(!this->opts().executor &&
             "singleflight: inline_only body in a group with an executor");
      return lead_inline(lk, s, std::move(mine), fn, caller, w, local, bound);
    } else {
      static_assert(has_inline_path<Fn>, "erased by call_with");
      if (!this->opts().executor)
        return lead_inline(lk, s, std::move(mine), fn, caller, w, local, bound);
      return lead_task(lk, s, std::move(mine),
                       {base::fn_ptr(__builtin_addressof(fn)), &base::template body_ops_of<F, T>},
                       caller, w, bound);
    }
  }

  // lead_task(lk, s, mine, fn, caller, w, bound): the leader's part when fn
  // runs as a task: an executor, or an async fn. Not a template on the body
  // (fn is erased, execution::body): compiled once per group type.
  ticket lead_task(std::unique_lock<std::mutex>& lk, shard& s, ref_t mine, typename base::body fn,
                   const stop_token& caller, blocking_waiter& w, const steady::time_point* bound) {
    flight_base* f = mine.get();
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
      frame fr;
      s.frames.push(fr);
      // A synchronous executor's fn may end this thread: run_task fails the
      // flight; this caller's count goes here (call_with rethrows untouched).
      on_unwind unwind([&] {
        if (!lk.owns_lock()) lk.lock();
        s.frames.erase(fr);
        this->exit_user(s);
        lk.unlock();
      });
      t.stop = this->hand_off(lk, f, fn, t.wake, t.discarded);
      unwind.disarm();
      s.frames.erase(fr);
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
    return wait_outcome(lk, s, std::move(mine), caller, w, /*is_leader=*/true, bound);
  }

  // Runs fn on the leader's own thread. The leader counts as a waiter and
  // leaves through its stop callback, since it cannot stop waiting.
  template <class F>
  ticket lead_inline(std::unique_lock<std::mutex>& lk, shard& s, ref_t mine, F& fn,
                     const stop_token& caller, blocking_waiter& w, std::optional<T>& local,
                     const steady::time_point* bound) {
    auto* f = static_cast<flight_t*>(mine.get());
    w.reset(/*as_observer=*/false);
    if (bound != nullptr) {  // the timer leaves the flight on our behalf when it passes
      w.caller_until = *bound;
      w.waiting_on = f;
      w.is_leader = true;
      this->link_bound(s, w, /*as_observer=*/false);
    }
    ++s.fn_starts;
    f->fn_started = true;
    // While fn runs: this thread runs f (self-deadlock check) and holds this
    // call's count (close() from inside fn does not wait for it).
    f->runner = std::this_thread::get_id();
    frame fr;
    s.frames.push(fr);
    // fn may end this thread (pthread_exit): fail the flight for the others,
    // free the key, give back this call's count, then let the unwind go on.
    on_unwind unwind([&] {
      wake_batch wake;
      {
        std::lock_guard<std::mutex> relock(s.mu);
        s.bounds.unlink(w);
        this->abandon(s, f, fr, wake);
        this->exit_user(s);  // this call's (call_with rethrows without touching it)
      }
      base::notify(this, s, wake);
    });
    lk.unlock();
    if (f->trace.tracer) f->trace.report_start(f->error);  // before fn; close() skips our count
    kind k;
    std::exception_ptr err;
    {
      std::optional<stop_callback<leave_on_stop>> cb;
      if (caller.stop_possible()) cb.emplace(caller, leave_on_stop{this, f, &w});
      k = base::template invoke_fn<F, T>(f, err, base::fn_ptr(__builtin_addressof(fn)), &local);
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
    s.frames.erase(fr);
    s.bounds.unlink(w);
    if (k == kind::fn_error && f->kind == kind::pending) f->error = std::move(err);
    // Not released under the lock: its destructor is user code (tested first, as in call_with).
    if (err) t.discarded = std::move(err);
    const bool sole = k == kind::value && f->kind == kind::pending;  // nobody else reads it
    this->finish(s, f, k, t.wake);
    t.outcome = w.stop_fired.load(std::memory_order_relaxed) ? kind::cancelled
                : w.bound_fired                              ? kind::timeout
                                                             : f->kind;
    if (sole && local) {
      this->recycle(mine);  // no one else can reach it: keep it for this thread's next start
    }
    // Otherwise an engaged `local` holds a value no caller receives (the flight
    // settled first: close(), the deadline, the ownership policy). It is not
    // destroyed here, under the lock: T's destructor is user code (see
    // call_with).
    t.f = std::move(mine);
    return t;
  }
};

}  // namespace singleflight::detail
