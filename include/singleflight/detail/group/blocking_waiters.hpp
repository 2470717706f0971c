// singleflight/detail/group/blocking_waiters.hpp -- internal; do not include directly.
//
// A blocked thread waiting for a flight: a `waiter` in the caller's frame,
// asleep on the flight's signal word (one broadcast wakes all of a flight's
// blocked waiters). It wakes when it is claimed (the settler's claim is
// visible through its state), when its own stop fires, or when its bound
// passes. A claimed waiter needs nothing more from the settler: it reads the
// outcome published before the claim and never touches the group again.
#pragma once

#include <atomic>

#include "../chrono.hpp"
#include "claim.hpp"
#include "flight.hpp"
#include "observers.hpp"

namespace singleflight::detail {

struct blocking_waiter : bounded_wait {
  using clock = std::chrono::steady_clock;

  // Set by the caller's stop callback, on any thread. Memory ordering:
  // release/acquire; the broadcast that follows it wakes the caller.
  std::atomic<bool> stop_fired{false};
  // An inline leader's wait_bound passed while it ran fn, and the timer left
  // the flight on its behalf. Guarded by the shard's lock.
  bool bound_fired = false;

  // Prepares the waiter for a new wait; only while it is not linked and no
  // stop callback refers to it (published by the lock that links it).
  void reset(bool as_observer) noexcept {
    state.store(waiting, std::memory_order_relaxed);
    observer = as_observer;
    stop_fired.store(false, std::memory_order_relaxed);
    bound_fired = false;
  }

  // Blocks until claimed (true), or until the caller's stop fired or
  // `deadline` passed (false: the caller then tries to leave, and may find
  // itself claimed after all). Without any lock.
  bool await(flight_base& f, const clock::time_point* deadline) const noexcept {
    for (;;) {
      const auto seen = f.signal.load();  // before the checks: see flight_signal
      if (is_claimed()) return true;
      if (stop_fired.load(std::memory_order_acquire)) return false;
      if (deadline != nullptr && clock::now() >= *deadline) return false;
      f.signal.wait(seen, deadline);
    }
  }

  // The caller's stop: flag it and wake it (and, spuriously, the flight's
  // other blocked waiters, which look at their own state and sleep again).
  // Touches only the waiter and the flight, never the group.
  void stop(flight_base& f) noexcept {
    stop_fired.store(true, std::memory_order_release);
    f.signal.bump();
    f.signal.wake_all();
  }
};

// wake_on_stop: a blocked caller's stop callback: wakes it. Runs on the thread
// that requested stop and touches only the waiter and its flight. Not a
// member of the group (it needs nothing of the group's type), so
// std::stop_callback<wake_on_stop> is compiled once for every group type.
struct wake_on_stop {
  blocking_waiter* w;
  flight_base* f;
  void operator()() const noexcept { w->stop(*f); }
};

}  // namespace singleflight::detail
