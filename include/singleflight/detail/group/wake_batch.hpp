// singleflight/detail/group/wake_batch.hpp -- internal; do not include directly.
//
// wake_batch: what a step claimed under a shard's lock, to notify once the
// lock is released (group::notify): async waiters, one by one in the order
// they were claimed, and flights whose blocked waiters were claimed, each
// woken with one broadcast; and, with options::tracer, the flights the step
// settled, to report (trace_slot.hpp). Owned by the thread that made the
// step; not guarded by any lock.
#pragma once

#include <cassert>
#include <cstddef>
#include <utility>

#include "../config.hpp"
#include "claim.hpp"
#include "flight.hpp"

namespace singleflight::detail {

class wake_batch {
 public:
  wake_batch() noexcept = default;
  SINGLEFLIGHT_DECL wake_batch(wake_batch&& o) noexcept;
  SINGLEFLIGHT_DECL wake_batch& operator=(wake_batch&& o) noexcept;
  wake_batch(const wake_batch&) = delete;
  wake_batch& operator=(const wake_batch&) = delete;
  ~wake_batch() {
    assert(head_ == nullptr && flights_ == nullptr && traces_ == nullptr &&
           "singleflight: claimed waiters never notified");
  }

  // A claimed async waiter (under the shard's lock). Appends: waiters are
  // claimed oldest first, so they are notified in the order they arrived.
  SINGLEFLIGHT_DECL void add(waiter& w) noexcept;

  // A blocked waiter of `f` was claimed (under the shard's lock): bump f's
  // word now (so a waiter that looks from here on sees its claim without
  // sleeping), and make sure a broadcast follows. If another batch already
  // has f queued, its wake comes after this bump (it clears wake_pending
  // before waking, and the seq_cst exchange here saw it still set): nothing
  // to add. Otherwise queue f, with a reference for the wake.
  SINGLEFLIGHT_DECL void add_blocked(flight_base& f) noexcept;

  // A traced flight settled (under the shard's lock): report it once the
  // lock is released, holding a reference until then.
  SINGLEFLIGHT_DECL void add_trace(flight_base& f) noexcept;

  bool empty() const noexcept {
    return head_ == nullptr && flights_ == nullptr && traces_ == nullptr;
  }
  // Async observers in the batch: they go round again when notified, still
  // counting as users of the group (see group::notify).
  bool has_observers() const noexcept { return observers_ != 0; }

  // Moves the async waiters that satisfy `pred` into `out`, keeping order,
  // and every settle to report (user code too: it goes where they go).
  template <class Pred>
  void split(Pred pred, wake_batch& out) noexcept {
    while (traces_ != nullptr) {
      flight_base* f = traces_;
      traces_ = f->trace.next;
      out.add_trace(*f);
      f->release();  // add_trace took its own
    }
    traces_tail_ = nullptr;
    waiter* w = std::exchange(head_, nullptr);
    tail_ = nullptr;
    observers_ = 0;
    while (w != nullptr) {
      waiter* next = w->signal_next;
      if (pred(*w)) {
        out.add(*w);
      } else {
        add(*w);
      }
      w = next;
    }
  }

  // Wakes the blocked waiters: one broadcast per flight. No user code runs.
  SINGLEFLIGHT_DECL void wake_blocked() noexcept;

  // Wakes the blocked waiters, reports the settles (options::tracer), then
  // notifies the async waiters, one at a time; call with no lock held. The
  // tracer and async waiters run user code here (on_settle, callbacks,
  // coroutines), which may re-enter the group, including this very batch
  // (nested, on this thread): it is popped one item at a time.
  SINGLEFLIGHT_DECL void signal_all() noexcept;

 private:
  // Out of line, so that signal_all stays small where no tracer is set.
#if defined(__GNUC__)
  __attribute__((noinline, cold))
#endif
  SINGLEFLIGHT_DECL void
  report_settles() noexcept;

  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
  std::size_t observers_ = 0;
  flight_base* flights_ = nullptr;
  flight_base* traces_ = nullptr;  // settles to report, through trace.next, oldest first
  flight_base* traces_tail_ = nullptr;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/wake_batch.ipp"
#endif
