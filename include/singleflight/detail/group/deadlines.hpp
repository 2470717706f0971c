// singleflight/detail/group/deadlines.hpp -- internal; do not include directly.
//
// deadlines: the group's timer and delivery threads. Not a template: nothing
// here depends on the group's Key or T (it reaches flights and waiters through
// flight_base and the shard set), so it is compiled once whatever the number
// of group types. The timer is started by flight_table's constructor (once the
// user's Hash and KeyEqual exist) or by ensure_timer().
//   * The timer (started when options.timeout > 0) settles flights whose
//     deadline passed, and times out async observers whose bound ran out, one
//     shard at a time. It runs no callback and no resumption (one that
//     blocked there would hold back every other deadline): it stops the
//     settled flights' tokens (fn's stop callbacks run here, as on any
//     thread that requests a stop), then wakes blocked waiters, then hands
//     async waiters, and the settles to report to options.tracer, to the
//     delivery thread.
//   * The delivery thread (started the first time it is needed) runs those
//     callbacks and resumptions, one batch after another; also those of an
//     inline leader's stop (see blocking_calls.hpp). A callback that blocks
//     there delays the next deliveries, never a deadline.
// Both are owned threads (owned_thread.hpp): never joined by themselves, and
// orphaned if the group is destroyed by code they run.
//
// Locking: the delivery queue and the threads' handles are guarded by
// service_mu_ (taken after a shard's lock, never before one); the deadline
// lists by their shard's lock; the timer's sleep by the timer gate.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

#include "../chrono.hpp"
#include "../config.hpp"
#include "blocking_waiters.hpp"
#include "hooks.hpp"
#include "notification.hpp"
#include "observers.hpp"
#include "owned_thread.hpp"

namespace singleflight::detail {

class deadlines : public notifier {
  using base = notifier;

 public:
  using kind = outcome_kind;

  // Starts no thread: the timer is started by ensure_timer() (flight_table's constructor, once
  // the user's Hash and KeyEqual are constructed, when options.timeout > 0).
  SINGLEFLIGHT_DECL explicit deadlines(options opts);
  SINGLEFLIGHT_DECL ~deadlines();

 protected:
  // Hands a batch of async waiters of shard s to the delivery thread,
  // starting it the first time. False when it cannot (the group's threads
  // are stopping, or no thread could be started): the caller then delivers
  // them itself.
  SINGLEFLIGHT_DECL bool queue_delivery(shard& s, wake_batch& batch) noexcept;

  // Ends (under s's lock) a wait whose bound ran out; `now` passed it. A
  // leaving waiter has unlinked itself; a claimed one has its outcome.
  //   * an async observer: claimed, delivered timeout_error (a rejection);
  //   * an async follower or leader (its own wait_bound): it leaves the flight
  //     as on its stop (ownership accounting), delivered timeout_error;
  //   * a blocked inline leader (its own wait_bound): it is running fn, so it
  //     leaves the flight here, as its stop callback would; it returns
  //     timeout_error once fn returns.
  // Returns the flight to stop, if leaving stopped it.
  SINGLEFLIGHT_DECL flight_base* bound_expired(shard& s, bounded_wait& n, wake_batch& wake,
                                               steady::time_point now) noexcept;

  // Links n's bound (the one that applies as an observer or not, see
  // bounded_wait::bound) in shard s, if it has one. Under s's lock.
  SINGLEFLIGHT_DECL void link_bound(shard& s, bounded_wait& n, bool as_observer) noexcept;

  // Starts the timer if it is not running yet (a call with a wait_bound in a
  // group without options.timeout). Throws std::system_error when no thread
  // can be started; does nothing once the group's threads are stopping.
  SINGLEFLIGHT_DECL void ensure_timer();

  // ---- for lifecycle (join) -----------------------------------------------

  std::mutex service_mu_;       // guards what follows
  owned_thread timer_;          // started in the constructor or by ensure_timer()
  bool timer_stopped_ = false;  // join_threads() took the timer: no new one
  owned_thread delivery_;       // started under service_mu_
  bool delivery_stop_ = false;  // no more batches: finish the queue and exit
  std::deque<std::pair<shard*, wake_batch>> delivery_q_;
  std::condition_variable delivery_cv_;

  // Delivers what is queued, here (the destructor on the delivery thread).
  SINGLEFLIGHT_DECL void deliver_queue_here() noexcept;

 private:
  // The threads' entries (owned_thread::loop_fn): the one piece of each thread's start that
  // depends on the group's type.
  SINGLEFLIGHT_DECL static void timer_entry(void* self, owned_thread::home& h);
  SINGLEFLIGHT_DECL static void delivery_entry(void* self, owned_thread::home& h);

  SINGLEFLIGHT_DECL void timer_loop(owned_thread::home& self);

  // Settles shard s's flights whose deadline passed and times out its async
  // observers whose bound ran out; lowers `next` to the shard's next
  // deadline. False when the group was destroyed meanwhile (by a stop
  // callback run here): the thread must touch nothing of it any more.
  SINGLEFLIGHT_DECL bool expire(shard& s, owned_thread::home& self, steady::time_point& next);

  SINGLEFLIGHT_DECL void delivery_loop(owned_thread::home& self);

 public:
  // Stops every collected flight, then releases it; call without any lock.
  SINGLEFLIGHT_DECL static void stop_all(flight_base* head) noexcept;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/deadlines.ipp"
#endif
