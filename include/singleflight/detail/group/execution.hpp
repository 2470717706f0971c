// singleflight/detail/group/execution.hpp -- internal; do not include directly.
//
// execution: how a flight's fn gets run. The rung between leader_stop and
// flight_table, not a template: a flight's body is erased (body: the fn
// object and two constant tables for its type, run_ops and body_ops), so
// hand_off, run_task and the rest are compiled once in a translation unit,
// not once per (Key, T) and body. What depends on the body's type is a few
// small templates: the task (task_impl), its packaging (package) and the
// call of fn (invoke_fn, start_async). An indirect call or two per flight on
// the task path; none on an inline leader's (blocking_calls::lead_inline
// calls invoke_fn directly). It adds no member, so the group's layout and
// the order of construction are unchanged.
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
#include "../config.hpp"
#include "../fn_shapes.hpp"
#include "../functional.hpp"
#include "../task_base.hpp"
#include "../unwind.hpp"
#include "flight.hpp"
#include "frames.hpp"
#include "hooks.hpp"
#include "leader_stop.hpp"
#include "lifecycle.hpp"
#include "shard_set.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

class execution : public leader_stop {
  using base = leader_stop;

 public:
  using kind = outcome_kind;

  SINGLEFLIGHT_DECL explicit execution(options opts);

 protected:
  // Whether a flight running Fn (for a T) needs a stop state of its own.
  template <class Fn, class T>
  static constexpr bool needs_stop = takes_token<Fn> || async_fn<Fn, T>;

  // A flight body, erased: what depends on its type is reached through two
  // constant tables, one per body type (blocking_calls::lead_inline, the
  // inline leader's path, stays a template on the body and calls it
  // directly).
  //
  // run_ops: how run_task calls a body of type Fn (Fn may be const).
  struct run_ops {
    // A sync fn (invoke_fn; `out` null: its value into the flight's). Null
    // for an async fn.
    kind (*invoke)(flight_base* f, std::exception_ptr& err, void* fn, void* out);
    // An async fn: its call (start_async), then the bookkeeping once it
    // returned (async_started, not a template: referenced only from here, so
    // a translation unit whose bodies are all sync does not compile it).
    // Null for a sync fn.
    std::exception_ptr (*start)(execution* g, flight_base* f, void* fn);
    void (*started)(execution* g, shard& s, flight_base* f, frame& fr,
                    const std::exception_ptr& thrown, wake_batch& wake);
  };
  template <class Fn, class T>
  static constexpr run_ops make_run_ops() noexcept {
    if constexpr (async_fn<Fn, T>) {
      return {nullptr, &execution::template start_async<Fn, T>, &execution::async_started};
    } else {
      return {&execution::template invoke_fn<Fn, T>, nullptr, nullptr};
    }
  }
  template <class Fn, class T>
  static constexpr run_ops run_ops_of = make_run_ops<Fn, T>();

  // body_ops: what hand_off needs of a body passed as F&& (one per F and T):
  // how to package it as a task (moved from an rvalue, copied from an
  // lvalue) and how to run it.
  struct body_ops {
    const run_ops* run;
    task_base* (*package)(execution* g, flight_base* f, void* fn);
    bool needs_stop;  // needs_stop<Fn, T>
  };
  // package<F, T>(g, f, fn): a new task running f's fn, which it moves (F
  // an rvalue) or copies (an lvalue) from *fn. Owned as a task_base from the
  // start: no unique_ptr<task_impl> (its tuple, deleter and conversion) is
  // instantiated for each body type.
  template <class F, class T>
  static task_base* package(execution* g, flight_base* f, void* fn) {
    return new task_impl<std::decay_t<F>, T>(
        g, f, std::forward<F>(*static_cast<std::remove_reference_t<F>*>(fn)));
  }

  template <class F, class T>
  static constexpr body_ops body_ops_of = {&run_ops_of<std::remove_reference_t<F>, T>,
                                           &execution::template package<F, T>,
                                           needs_stop<std::decay_t<F>, T>};

  // body: the caller's fn object (alive until hand_off returns) and its ops.
  struct body {
    void* fn;
    const body_ops* ops;
  };
  // fn_ptr(&fn): a body's fn object as body::fn (pass __builtin_addressof(fn),
  // what std::addressof is made of in GCC, Clang and MSVC alike: no
  // std::addressof<F> is instantiated for each body type).
  static void* fn_ptr(const volatile void* fn) noexcept { return const_cast<void*>(fn); }

  // The task handed to an executor: one flight's fn.
  template <class Fn, class T>
  class task_impl final : public task_base {
   public:
    template <class G>
    task_impl(execution* g, flight_base* f, G&& fn) : g_(g), f_(f), fn_(std::forward<G>(fn)) {
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
      g_->run_task(f_, fn_ptr(__builtin_addressof(fn_)), run_ops_of<Fn, T>);
    }

   private:
    execution* g_;
    flight_base* f_;
    Fn fn_;
    bool ran_ = false;
  };

  // hand_off(lk, f, fn, wake, discarded, defer)
  //
  // Hands f's fn, packaged as a task, to the executor (or, without one, runs
  // it right here: it starts an async fn, or runs a sync fn for an async
  // caller; or, `defer`, queues it to this thread's notification loop).
  // Called with `lk` (f's shard lock) held by a thread that counts as a user;
  // returns with it held. Returns whether f's token must be stopped once the
  // lock is released. A failure to hand off fails the flight; what the
  // executor threw lands in `discarded` (the caller's: it may be the last
  // reference, whose release runs user code, so the caller drops it only
  // once the lock is released and `wake` is notified).
  SINGLEFLIGHT_DECL bool hand_off(std::unique_lock<std::mutex>& lk, flight_base* f, body fn,
                                  wake_batch& wake, std::exception_ptr& discarded,
                                  bool defer = false);

  // run_task(f, fn, ops): the body of f's task, on whatever thread runs it.
  // Not noexcept only so that a forced unwind (fn ending its thread) passes:
  // the flight fails for the others and the task's count is given back first.
  SINGLEFLIGHT_DECL void run_task(flight_base* f, void* fn, const run_ops& ops);

  // start_async<Fn, T>(g, f, fn): calls an async fn (*fn, an Fn) with f's
  // token and a completion; returns what it threw. A forced unwind passes.
  template <class Fn, class T>
  static std::exception_ptr start_async(execution* g, flight_base* f, void* fn) {
    try {
      f->retain();  // the completion's reference
      ::singleflight::detail::invoke(
          *static_cast<Fn*>(fn), f->stop.get_token(),
          completion_access::make<T>(static_cast<void*>(g), &execution::resolve<T>,
                                     static_cast<flight_value<T>*>(f)));
      return nullptr;
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      return std::current_exception();
    }
  }

  // An async fn returned (`thrown`: what it threw): the flight fails if fn
  // threw or let its completion die meanwhile, and the task's count is
  // given back.
  SINGLEFLIGHT_DECL static void async_started(execution* g, shard& s, flight_base* f, frame& fr,
                                              const std::exception_ptr& thrown,
                                              wake_batch& wake) noexcept;

  // invoke_fn<Fn, T>(f, err, fn, out): runs a sync fn (*fn, an Fn) with f's
  // token (or none). The value goes to *out (a std::optional<T>; null: f's
  // own value), an exception to `err`, not to f->error: the flight may have
  // settled meanwhile (deadline, close, an executor's error) and its error
  // been handed out; the caller publishes `err` under the lock only if it is
  // still pending. A forced unwind passes through.
  template <class Fn, class T>
  static kind invoke_fn(flight_base* f, std::exception_ptr& err, void* fn, void* out) {
    Fn& call = *static_cast<Fn*>(fn);
    std::optional<T>& v = out != nullptr ? *static_cast<std::optional<T>*>(out)
                                         : static_cast<flight_value<T>*>(f)->value;
    try {
      if constexpr (takes_token<Fn>) {
        v.emplace(::singleflight::detail::invoke(call, f->stop.get_token()));
      } else {
        v.emplace(::singleflight::detail::invoke(call));
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
  SINGLEFLIGHT_DECL void abandon(shard& s, flight_base* f, frame& fr, wake_batch& wake) noexcept;

  // A completion<T> was resolved (or destroyed unresolved): its resolve
  // function, handed to completion_access::make. `self` is the group (an
  // execution).
  template <class T>
  static void resolve(void* self, flight_value<T>* fv, resolution r,
                      std::exception_ptr e) noexcept {
    static_cast<execution*>(self)->resolved(fv, r, std::move(e));
  }

  // A completion was resolved (or destroyed unresolved). Any thread,
  // without any lock; the completion counts as a user until here.
  SINGLEFLIGHT_DECL void resolved(flight_base* f, resolution r, std::exception_ptr e) noexcept;

  // An executor destroyed f's task without running it.
  SINGLEFLIGHT_DECL void task_dropped(flight_base* f) noexcept;

  SINGLEFLIGHT_DECL static std::exception_ptr broken_promise() noexcept;
  SINGLEFLIGHT_DECL static std::exception_ptr dropped_error() noexcept;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/execution.ipp"
#endif
