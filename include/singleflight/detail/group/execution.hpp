// singleflight/detail/group/execution.hpp -- internal; do not include directly.
//
// execution<Key, T, Hash, KeyEqual>: how a flight's fn gets run.
//   * hand_off(): package fn as a task for the executor, or run it right
//     here (no executor), or defer it to the end of the notification loop
//     this thread is running (a flight started by an async observer going
//     round again must not hold back the rest of that loop);
//   * run_task(): the task's body: skip fn if the flight was stopped while
//     queued, else call it (a sync fn, or an async fn with its completion)
//     and finish the flight;
//   * resolve(): a completion<T> was resolved or destroyed;
//   * task_dropped(): an executor destroyed a task unrun;
//   * abandon(): fn ended its thread (a forced unwind).
// Each of task, completion and the thread running fn holds a user count of
// the flight's shard until it is done (the drain count close() waits for).
//
// hand_off() also reports the flight's start to options::tracer, once the
// lock is released and before fn can run.
//
// Locking: the flight's shard lock around every state change; none while fn,
// the executor, the tracer or the notification runs.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "../../completion.hpp"
#include "../../errors.hpp"
#include "../../stop_token.hpp"
#include "../../task.hpp"
#include "../fn_shapes.hpp"
#include "../task_base.hpp"
#include "../unwind.hpp"
#include "flight_table.hpp"
#include "hooks.hpp"
#include "lifecycle.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash, class KeyEqual>
class execution : public flight_table<Key, T, Hash, KeyEqual> {
  using base = flight_table<Key, T, Hash, KeyEqual>;

 public:
  using typename base::flight_t;
  using typename base::kind;

  explicit execution(options opts) : base(std::move(opts)) {}

 protected:
  // Whether a flight running Fn needs a stop state of its own.
  template <class Fn>
  static constexpr bool needs_stop = takes_token<Fn> || async_fn<Fn, T>;

  // The task handed to an executor: one flight's fn.
  template <class Fn>
  class task_impl final : public task_base {
   public:
    template <class G>
    task_impl(execution* g, flight_t* f, G&& fn) : g_(g), f_(f), fn_(std::forward<G>(fn)) {
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
    execution* g_;
    flight_t* f_;
    Fn fn_;
    bool ran_ = false;
  };

  // hand_off(lk, f, fn, wake, defer)
  //
  // Hands f's fn, packaged as a task, to the executor (or, without one, runs
  // it right here: it starts an async fn, or runs a sync fn for an async
  // caller; or, `defer`, queues it to this thread's notification loop).
  // Called with `lk` (f's shard lock) held by a thread that counts as a user;
  // returns with it held. Returns whether f's token must be stopped once the
  // lock is released. A failure to hand off fails the flight.
  template <class F>
  bool hand_off(std::unique_lock<std::mutex>& lk, flight_t* f, F&& fn, wake_batch& wake,
                bool defer = false) {
    using Fn = std::decay_t<F>;
    shard& s = this->shard_of(*f);
    this->enter_user(s);  // the task is a user until it finishes or is dropped
    loop_record* later = defer && !this->opts().executor ? base::current_loop(s) : nullptr;
    if (!this->opts().executor && later == nullptr) {
      lk.unlock();  // no executor: run the body right here, without packaging it
      if (f->trace.tracer) f->trace.report_start(f->error);
      run_task(f, fn);
      lk.lock();
      return false;
    }
    f->submitting = true;
    lk.unlock();
    if (f->trace.tracer) f->trace.report_start(f->error);  // before fn can run anywhere
    std::exception_ptr submit_error;
    bool handed_off = false;
    try {
      // Owned as a task_base from the start: no unique_ptr<task_impl<Fn>> (its
      // tuple, deleter and conversion) is instantiated for each body type.
      task tk(std::unique_ptr<task_base>(new task_impl<Fn>(this, f, std::forward<F>(fn))));
      handed_off = true;
      if (later != nullptr) {
        // Run when the loop is over (or by this thread before it blocks
        // inside the group: drain_own). Only this thread touches the queue.
        later->deferred.push_back(std::move(tk));
      } else {
        this->submit(std::move(tk));
      }
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();  // a synchronous executor's fn ended this thread
      submit_error = std::current_exception();
    }
    lk.lock();
    f->submitting = false;
    bool stop = false;
    if ((submit_error || f->dropped_in_submit) && !f->fn_done) {
      if (f->kind == kind::pending) {  // the flight fails with the reason
        f->error = submit_error ? submit_error : dropped_error();
        this->settle(s, *f, submit_error ? kind::fn_error : kind::dropped, wake);
        // A task the executor kept may be running fn right now: stop it, or
        // the key stays taken for as long as fn cares to run.
        stop = f->stop.stop_possible();
      }
      if (!handed_off || f->dropped_in_submit) {
        this->finish(s, f, f->kind, wake);  // no task exists any more: the key is free
        this->exit_user(s);                 // the task's
      }
      // Otherwise the executor threw but kept the task: it may still run,
      // so it stays a user and keeps its (unjoinable) entry until it runs
      // (and, seeing the flight settled, skips fn) or is destroyed.
    }
    return stop;
  }

  // run_task(f, fn): the body of f's task, on whatever thread runs it. Not
  // noexcept only so that a forced unwind (fn ending its thread) passes: the
  // flight fails for the others and the task's count is given back first.
  template <class Fn>
  void run_task(flight_t* f, Fn& fn) {
    shard& s = this->shard_of(*f);
    wake_batch wake;
    frame fr;  // the task's count (held since submission) while fn runs
    {
      std::lock_guard<std::mutex> lk(s.mu);
      if (f->fn_done) return;  // failed at submission; the submitter accounted for it
      if (f->kind != kind::pending) {
        // Stopped while queued (no waiters left, deadline, close): the work
        // is no longer wanted, so it is not started at all.
        this->finish(s, f, f->kind, wake);
        this->exit_user(s);
      } else {
        ++s.fn_starts;
        f->fn_started = true;
        f->runner = std::this_thread::get_id();
        s.frames.push(fr);
        if constexpr (async_fn<Fn, T>) {
          // The completion is a user of its own until it is resolved, so a
          // completion resolved on another thread while fn is still being
          // called cannot let close() return under this thread.
          this->enter_user(s);
          f->starting = true;
        }
      }
    }
    if (!fr.linked) {
      base::notify(this, s, wake);  // observers of the stopped flight: users, the group is alive
      return;
    }
    on_unwind unwind([&] {
      wake_batch lost;
      {
        std::lock_guard<std::mutex> lk(s.mu);
        abandon(s, f, fr, lost);
        this->exit_user(s);  // the task's
      }
      base::notify(this, s, lost);
    });
    if constexpr (async_fn<Fn, T>) {
      std::exception_ptr thrown;
      try {
        f->retain();  // the completion's reference
        std::invoke(fn, f->stop.get_token(),
                    completion_access::make<T>(static_cast<void*>(this), &execution::resolve, f));
      } catch (...) {
        SINGLEFLIGHT_RETHROW_FOREIGN();
        thrown = std::current_exception();
      }
      unwind.disarm();
      std::lock_guard<std::mutex> lk(s.mu);
      f->runner = std::thread::id{};
      s.frames.erase(fr);
      f->starting = false;
      if (!f->fn_done && f->kind == kind::pending && (thrown || f->broken_in_start)) {
        // fn threw, or let its completion die, before returning. A thrown
        // exception says more than the broken promise it caused.
        f->error = thrown ? thrown : broken_promise();
        this->finish(s, f, thrown ? kind::fn_error : kind::dropped, wake);
      } else if (!f->fn_done && f->broken_in_start) {
        this->finish(s, f, f->kind, wake);  // settled meanwhile: free the key
      }
      // A completion still held elsewhere after a throw resolves later and
      // only gives back its own count.
      this->exit_user(s);  // the task's
    } else {
      std::exception_ptr err;
      const kind k = invoke_fn(f->value, err, f, fn);
      unwind.disarm();
      SINGLEFLIGHT_HOOK(leader_fn_returned);
      std::lock_guard<std::mutex> lk(s.mu);
      f->runner = std::thread::id{};
      s.frames.erase(fr);
      if (k == kind::fn_error && f->kind == kind::pending) f->error = std::move(err);
      this->finish(s, f, k, wake);
      this->exit_user(s);
    }
    // No longer a user: the group may be gone unless `wake` holds observers
    // (users until they go round; see notify).
    base::notify(this, s, wake);
  }

  // invoke_fn(out, err, f, fn): runs a sync fn with the flight's token (or
  // none). The value goes to `out`, an exception to `err`, not to f->error:
  // the flight may have settled meanwhile (deadline, close, an executor's
  // error) and its error been handed out; the caller publishes `err` under
  // the lock only if it is still pending. A forced unwind passes through.
  template <class Fn>
  static kind invoke_fn(std::optional<T>& out, std::exception_ptr& err, flight_t* f, Fn& fn) {
    try {
      if constexpr (takes_token<Fn>) {
        out.emplace(std::invoke(fn, f->stop.get_token()));
      } else {
        out.emplace(std::invoke(fn));
      }
      return kind::value;
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      err = std::current_exception();
      return kind::fn_error;
    }
  }

  // fn ended its thread before returning (forced unwind): the flight fails
  // with abandoned_error for the others and its key is freed. Under s's lock.
  void abandon(shard& s, flight_t* f, frame& fr, wake_batch& wake) noexcept {
    f->runner = std::thread::id{};
    f->starting = false;
    s.frames.erase(fr);
    if (f->fn_done) return;
    if (f->kind == kind::pending) {
      f->error = std::make_exception_ptr(abandoned_error());
      this->finish(s, f, kind::fn_error, wake);
    } else {
      this->finish(s, f, f->kind, wake);  // settled meanwhile: only free the key
    }
  }

  // A completion<T> was resolved (or destroyed unresolved). Any thread,
  // without any lock; the completion counts as a user until here.
  static void resolve(void* self, flight_value<T>* fv, resolution r,
                      std::exception_ptr e) noexcept {
    auto* g = static_cast<execution*>(self);
    auto* f = static_cast<flight_t*>(fv);
    shard& s = g->shard_of(*f);
    wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      if (!f->fn_done) {
        if (r == resolution::broken && f->starting) {
          f->broken_in_start = true;  // fn may still throw: the starter decides
        } else if (f->kind != kind::pending) {
          g->finish(s, f, f->kind, wake);  // settled early: only free the key
        } else if (r == resolution::value) {
          g->finish(s, f, kind::value, wake);
        } else {
          f->error = r == resolution::error ? std::move(e) : broken_promise();
          g->finish(s, f, r == resolution::error ? kind::fn_error : kind::dropped, wake);
        }
      }
      g->exit_user(s);  // the completion's
    }
    base::notify(g, s, wake);  // touches g only while `wake` holds observers (users)
  }

  // An executor destroyed f's task without running it.
  void task_dropped(flight_t* f) noexcept {
    std::exception_ptr e = dropped_error();
    shard& s = this->shard_of(*f);
    wake_batch wake;
    {
      std::lock_guard<std::mutex> lk(s.mu);
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
      this->finish(s, f, kind::dropped, wake);
      this->exit_user(s);
    }
    base::notify(this, s, wake);
  }

  static std::exception_ptr broken_promise() noexcept {
    return std::make_exception_ptr(broken_promise_error());
  }
  static std::exception_ptr dropped_error() noexcept {
    return std::make_exception_ptr(
        error("singleflight: the executor dropped the task without running it"));
  }
};

}  // namespace singleflight::detail
