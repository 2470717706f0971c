// singleflight/detail/group/impl/execution.ipp -- internal; do not include directly.
//
// execution's non-template definitions (detail/group/execution.hpp, which describes them):
// hand_off, run_task, async_started, abandon, resolved, task_dropped and the two errors; the
// templates on a body's type stay in the header. Included by that header in header-only mode,
// by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "../execution.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL execution::execution(options opts) : base(std::move(opts)) {}

SINGLEFLIGHT_DECL bool execution::hand_off(std::unique_lock<std::mutex>& lk, flight_base* f,
                                           body fn, wake_batch& wake, std::exception_ptr& discarded,
                                           bool defer) {
  shard& s = this->shard_of(*f);
  this->enter_user(s);  // the task is a user until it finishes or is dropped
  loop_record* later = defer && !this->opts().executor ? current_loop(s) : nullptr;
  if (!this->opts().executor && later == nullptr) {
    lk.unlock();  // no executor: run the body right here, without packaging it
    if (f->trace.tracer) f->trace.report_start(f->error);
    run_task(f, fn.fn, *fn.ops->run);
    lk.lock();
    return false;
  }
  f->submitting = true;
  lk.unlock();
  if (f->trace.tracer) f->trace.report_start(f->error);  // before fn can run anywhere
  std::exception_ptr submit_error;
  bool handed_off = false;
  try {
    task tk(std::unique_ptr<task_base>(fn.ops->package(this, f, fn.fn)));
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
  // Not released under the lock: when the flight had settled meanwhile, no
  // one else holds the executor's exception, and its destructor is user code.
  discarded = std::move(submit_error);
  return stop;
}

SINGLEFLIGHT_DECL void execution::run_task(flight_base* f, void* fn, const run_ops& ops) {
  shard& s = this->shard_of(*f);
  // What fn threw. Released only after `wake` is notified (the end of this
  // function), so that when no caller takes it (its flight settled first) its
  // destructor, user code, runs outside the lock and re-enters a group with
  // no waiter this thread still has to wake (close() from it would wait for
  // them).
  std::exception_ptr err;
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
      if (ops.start != nullptr) {
        // The completion is a user of its own until it is resolved, so a
        // completion resolved on another thread while fn is still being
        // called cannot let close() return under this thread.
        this->enter_user(s);
        f->starting = true;
      }
    }
  }
  if (!fr.linked) {
    notify(this, s, wake);  // observers of the stopped flight: users, the group is alive
    return;
  }
  on_unwind unwind([&] {
    wake_batch lost;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      abandon(s, f, fr, lost);
      this->exit_user(s);  // the task's
    }
    notify(this, s, lost);
  });
  if (ops.start != nullptr) {
    err = ops.start(this, f, fn);
    unwind.disarm();
    ops.started(this, s, f, fr, err, wake);
  } else {
    const kind k = ops.invoke(f, err, fn, nullptr);
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
  notify(this, s, wake);
}

SINGLEFLIGHT_DECL void execution::async_started(execution* g, shard& s, flight_base* f, frame& fr,
                                                const std::exception_ptr& thrown,
                                                wake_batch& wake) noexcept {
  std::lock_guard<std::mutex> lk(s.mu);
  f->runner = std::thread::id{};
  s.frames.erase(fr);
  f->starting = false;
  if (!f->fn_done && f->kind == kind::pending && (thrown || f->broken_in_start)) {
    // fn threw, or let its completion die, before returning. A thrown
    // exception says more than the broken promise it caused.
    f->error = thrown ? thrown : broken_promise();
    g->finish(s, f, thrown ? kind::fn_error : kind::dropped, wake);
  } else if (!f->fn_done && f->broken_in_start) {
    g->finish(s, f, f->kind, wake);  // settled meanwhile: free the key
  }
  // A completion still held elsewhere after a throw resolves later and
  // only gives back its own count.
  g->exit_user(s);  // the task's
}

SINGLEFLIGHT_DECL void execution::abandon(shard& s, flight_base* f, frame& fr,
                                          wake_batch& wake) noexcept {
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

SINGLEFLIGHT_DECL void execution::resolved(flight_base* f, resolution r,
                                           std::exception_ptr e) noexcept {
  shard& s = this->shard_of(*f);
  wake_batch wake;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (!f->fn_done) {
      if (r == resolution::broken && f->starting) {
        f->broken_in_start = true;  // fn may still throw: the starter decides
      } else if (f->kind != kind::pending) {
        this->finish(s, f, f->kind, wake);  // settled early: only free the key
      } else if (r == resolution::value) {
        this->finish(s, f, kind::value, wake);
      } else {
        f->error = r == resolution::error ? std::move(e) : broken_promise();
        this->finish(s, f, r == resolution::error ? kind::fn_error : kind::dropped, wake);
      }
    }
    this->exit_user(s);  // the completion's
  }
  notify(this, s, wake);  // touches the group only while `wake` holds observers (users)
}

SINGLEFLIGHT_DECL void execution::task_dropped(flight_base* f) noexcept {
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
  notify(this, s, wake);
}

SINGLEFLIGHT_DECL std::exception_ptr execution::broken_promise() noexcept {
  return std::make_exception_ptr(broken_promise_error());
}

SINGLEFLIGHT_DECL std::exception_ptr execution::dropped_error() noexcept {
  return std::make_exception_ptr(
      error("singleflight: the executor dropped the task without running it"));
}

}  // namespace singleflight::detail
