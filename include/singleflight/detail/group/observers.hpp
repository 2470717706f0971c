// singleflight/detail/group/observers.hpp -- internal; do not include directly.
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

#include <optional>

#include "../chrono.hpp"
#include "claim.hpp"
#include "flight.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

// A waiter the timer may have to end: an async caller (as an observer, its
// bound is options.timeout from its first arrival; as any waiter, its own
// wait_bound), or a blocked inline leader with a wait_bound (it runs fn, so
// the timer leaves the flight on its behalf). Blocked followers and
// observers bound their own sleep instead. Guarded by the shard's lock.
struct bounded_wait : waiter {
  using time_point = std::chrono::steady_clock::time_point;
  std::optional<time_point> observe_until;  // an observer's bound, from its first arrival
  std::optional<time_point> caller_until;   // the caller's own wait_bound
  std::optional<time_point> wait_deadline;  // the one that applies now (the list's key)
  bounded_wait* ob_prev = nullptr;
  bounded_wait* ob_next = nullptr;
  bool ob_linked = false;
  flight_base* waiting_on = nullptr;            // the flight whose list it is linked in
  bool is_leader = false;                       // counts as the flight's leader
  outcome_kind result = outcome_kind::pending;  // set by whoever decides its outcome

  // The bound that applies while it waits as an observer (both) or not
  // (only its own); null when none.
  const time_point* bound(bool as_observer) noexcept {
    if (as_observer && observe_until && (!caller_until || *observe_until < *caller_until))
      wait_deadline = observe_until;
    else
      wait_deadline = caller_until;
    return wait_deadline ? &*wait_deadline : nullptr;
  }
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
