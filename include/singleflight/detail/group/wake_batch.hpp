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

#include "claim.hpp"
#include "flight.hpp"

namespace singleflight::detail {

class wake_batch {
 public:
  wake_batch() noexcept = default;
  wake_batch(wake_batch&& o) noexcept
      : head_(std::exchange(o.head_, nullptr)),
        tail_(std::exchange(o.tail_, nullptr)),
        observers_(std::exchange(o.observers_, 0)),
        flights_(std::exchange(o.flights_, nullptr)),
        traces_(std::exchange(o.traces_, nullptr)),
        traces_tail_(std::exchange(o.traces_tail_, nullptr)) {}
  wake_batch& operator=(wake_batch&& o) noexcept {
    std::swap(head_, o.head_);
    std::swap(tail_, o.tail_);
    std::swap(observers_, o.observers_);
    std::swap(flights_, o.flights_);
    std::swap(traces_, o.traces_);
    std::swap(traces_tail_, o.traces_tail_);
    return *this;
  }
  wake_batch(const wake_batch&) = delete;
  wake_batch& operator=(const wake_batch&) = delete;
  ~wake_batch() {
    assert(head_ == nullptr && flights_ == nullptr && traces_ == nullptr &&
           "singleflight: claimed waiters never notified");
  }

  // A claimed async waiter (under the shard's lock). Appends: waiters are
  // claimed oldest first, so they are notified in the order they arrived.
  void add(waiter& w) noexcept {
    w.signal_next = nullptr;
    if (tail_ != nullptr) {
      tail_->signal_next = &w;
    } else {
      head_ = &w;
    }
    tail_ = &w;
    if (w.observer) ++observers_;
  }

  // A blocked waiter of `f` was claimed (under the shard's lock): bump f's
  // word now (so a waiter that looks from here on sees its claim without
  // sleeping), and make sure a broadcast follows. If another batch already
  // has f queued, its wake comes after this bump (it clears wake_pending
  // before waking, and the seq_cst exchange here saw it still set): nothing
  // to add. Otherwise queue f, with a reference for the wake.
  void add_blocked(flight_base& f) noexcept {
    f.signal.bump();
    if (f.wake_pending.exchange(true, std::memory_order_seq_cst)) return;
    f.retain();
    f.wake_next = flights_;
    flights_ = &f;
  }

  // A traced flight settled (under the shard's lock): report it once the
  // lock is released, holding a reference until then.
  void add_trace(flight_base& f) noexcept {
    f.retain();
    f.trace.next = nullptr;
    if (traces_tail_ != nullptr) {
      traces_tail_->trace.next = &f;
    } else {
      traces_ = &f;
    }
    traces_tail_ = &f;
  }

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
  void wake_blocked() noexcept {
    while (flights_ != nullptr) {
      flight_base* f = flights_;
      flights_ = f->wake_next;  // read before giving the link up
      f->wake_pending.store(false, std::memory_order_seq_cst);
      f->signal.wake_all();
      f->release();
    }
  }

  // Wakes the blocked waiters, reports the settles (options::tracer), then
  // notifies the async waiters, one at a time; call with no lock held. The
  // tracer and async waiters run user code here (on_settle, callbacks,
  // coroutines), which may re-enter the group, including this very batch
  // (nested, on this thread): it is popped one item at a time.
  void signal_all() noexcept {
    wake_blocked();
    if (traces_ != nullptr) report_settles();
    while (head_ != nullptr) {
      waiter* w = head_;
      head_ = w->signal_next;  // read before the notification frees w
      if (head_ == nullptr) tail_ = nullptr;
      if (w->observer) --observers_;
      w->notify(w);
    }
  }

 private:
  // Out of line, so that signal_all stays small where no tracer is set.
#if defined(__GNUC__)
  __attribute__((noinline, cold))
#endif
  void
  report_settles() noexcept {
    while (traces_ != nullptr) {
      flight_base* f = traces_;
      traces_ = f->trace.next;  // read before the report
      if (traces_ == nullptr) traces_tail_ = nullptr;
      f->trace.report_settled(f->error);
      f->release();
    }
  }

  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
  std::size_t observers_ = 0;
  flight_base* flights_ = nullptr;
  flight_base* traces_ = nullptr;  // settles to report, through trace.next, oldest first
  flight_base* traces_tail_ = nullptr;
};

}  // namespace singleflight::detail
