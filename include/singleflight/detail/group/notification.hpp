// singleflight/detail/group/notification.hpp -- internal; do not include directly.
//
// notifier: the layer that hands claimed waiters
// their outcome once the shard's lock is released, and the part of "where
// user code runs" that concerns notification loops:
//   * notify() wakes a batch's blocked waiters (one broadcast per flight) and
//     runs its async waiters' callbacks and resumptions, in arrival order;
//   * a batch with async observers (which go round again, still counting as
//     users) is a loop the group must know about: it is registered in its
//     shard (loop_record) while it runs, so that a callback later in the
//     batch that blocks inside the group (do_, close()) first runs the rest
//     of it and the flights it deferred (drain_own) instead of waiting for
//     them forever.
//
// Locking: loop records are linked under their shard's lock; their contents
// belong to the thread running the loop. No lock is held while user code
// runs.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <utility>

#include "../../options.hpp"
#include "../../task.hpp"
#include "../config.hpp"
#include "frames.hpp"
#include "shard_set.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

class notifier : public shard_set {
 public:
  SINGLEFLIGHT_DECL explicit notifier(options opts);
  SINGLEFLIGHT_DECL ~notifier();

  // notify(g, s, wake)
  //
  // Notifies a batch claimed under s's lock; called without any lock.
  // Static: a batch without async observers is notified without touching
  // the group, which may be gone by then (the caller no longer counts as a
  // user). A batch with them registers a loop record (with a user count of
  // its own, so that it can unregister: the group stays alive meanwhile).
  SINGLEFLIGHT_DECL static void notify(notifier* g, shard& s, wake_batch& wake) noexcept;

 protected:
  // Notifies what is left of a loop's batch, then runs the flights started
  // inside it (deferred by hand_off), including any started meanwhile. On
  // the loop's own thread, without any lock. A forced unwind out of a
  // deferred fn meets this noexcept frame: std::terminate (documented).
  SINGLEFLIGHT_DECL void run_loop(loop_record& rec) noexcept;

  // A thread about to block inside the group first runs what it itself holds
  // back: the rest of its notification loops and the flights started in
  // them. Called without any lock. Costs one relaxed load when no loop is
  // registered: a thread that registered one did the increment itself, so
  // it sees it (memory ordering: relaxed suffices for that).
  void drain_own() {
    if (loops_registered_.load(std::memory_order_relaxed) == 0) return;
    drain_own_loops();
  }

  // drain_own()'s work once some loop is registered.
  SINGLEFLIGHT_DECL void drain_own_loops();

  // The user counts `me` holds in shard s (its frames and loops): close()
  // from code this thread runs does not wait for them. Under s's lock.
  static std::size_t held_in(const shard& s, std::thread::id me) noexcept {
    return held_by(s.frames, s.loops, me);
  }

  // The innermost loop this thread runs in shard s, if any (a flight started
  // by an observer going round again is deferred to it). Under s's lock.
  static loop_record* current_loop(const shard& s) noexcept {
    return innermost_loop(s.loops, std::this_thread::get_id());
  }

  // Marks every loop of this thread orphaned and unlinks it (the destructor,
  // run by code one of them called). Takes each shard's lock.
  SINGLEFLIGHT_DECL void orphan_own_loops() noexcept;

 private:
  std::atomic<std::size_t> loops_registered_{0};
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/notification.ipp"
#endif
