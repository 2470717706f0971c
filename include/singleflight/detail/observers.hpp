// singleflight/detail/observers.hpp -- internal; do not include directly.
//
// Observers: callers that found their key's entry held by a flight that
// cannot be joined (its fn was stopped and is winding down, or, for
// do_fresh, it started before they arrived). They wait for that fn to
// return, linked into its flight's list as observers, then go round again:
// at most one fn per key runs at any moment. They stay users of the group
// while they wait and while they are claimed, since they come back.
//
//   bounded_wait    an async observer's bound (options.timeout from its first
//                   arrival), kept across rounds; the timer claims it when it
//                   runs out (blocked observers bound their own sleep);
//   bound_list      a shard's bounds, earliest first (guarded by its lock);
//   claim_observers the step that ends their wait (fn returned, forget(),
//                   close()).
#pragma once

#include <chrono>
#include <optional>

#include "claim.hpp"
#include "flight.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

struct bounded_wait : waiter {
  // Guarded by the shard's lock.
  std::optional<std::chrono::steady_clock::time_point> wait_deadline;
  bounded_wait* ob_prev = nullptr;
  bounded_wait* ob_next = nullptr;
  bool ob_linked = false;
  waiter_list* observing = nullptr;             // the list it waits in, while an observer
  outcome_kind result = outcome_kind::pending;  // set by whoever decides its outcome
};

// Sorted by wait_deadline. Bounds are taken under the lock from a steady
// clock with one timeout, but a node going round again keeps its first
// bound, so it is inserted from the back.
class bound_list {
 public:
  void link(bounded_wait& n) noexcept {
    bounded_wait* after = tail_;
    while (after != nullptr && *n.wait_deadline < *after->wait_deadline) after = after->ob_prev;
    n.ob_prev = after;
    n.ob_next = after != nullptr ? after->ob_next : head_;
    (n.ob_next != nullptr ? n.ob_next->ob_prev : tail_) = &n;
    (after != nullptr ? after->ob_next : head_) = &n;
    n.ob_linked = true;
  }
  void unlink(bounded_wait& n) noexcept {
    if (!n.ob_linked) return;
    (n.ob_prev != nullptr ? n.ob_prev->ob_next : head_) = n.ob_next;
    (n.ob_next != nullptr ? n.ob_next->ob_prev : tail_) = n.ob_prev;
    n.ob_prev = n.ob_next = nullptr;
    n.ob_linked = false;
  }
  bounded_wait* head() const noexcept { return head_; }

 private:
  bounded_wait* head_ = nullptr;
  bounded_wait* tail_ = nullptr;
};

// Ends the wait of f's observers: claims them (they stay users: they come
// back for the lock) into `wake`. Under the shard's lock.
inline void claim_observers(flight_base& f, bound_list& bounds, wake_batch& wake) noexcept {
  (void)f.list.claim_if([](const waiter& w) { return w.observer; },
                        [&](waiter& w) {
                          bounds.unlink(static_cast<bounded_wait&>(w));
                          wake.add(w);
                        },
                        [&] { wake.add_blocked(f); });
}

}  // namespace singleflight::detail
