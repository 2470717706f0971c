// singleflight/detail/wake_batch.hpp -- internal; do not include directly.
//
// wake_batch: what a step claimed under a shard's lock, to notify once the
// lock is released (group::notify): async waiters, one by one in the order
// they were claimed, and flights whose blocked waiters were claimed, each
// woken with one broadcast. Owned by the thread that made the step; not
// guarded by any lock.
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
        flights_(std::exchange(o.flights_, nullptr)) {}
  wake_batch& operator=(wake_batch&& o) noexcept {
    std::swap(head_, o.head_);
    std::swap(tail_, o.tail_);
    std::swap(observers_, o.observers_);
    std::swap(flights_, o.flights_);
    return *this;
  }
  wake_batch(const wake_batch&) = delete;
  wake_batch& operator=(const wake_batch&) = delete;
  ~wake_batch() {
    assert(head_ == nullptr && flights_ == nullptr &&
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

  bool empty() const noexcept { return head_ == nullptr && flights_ == nullptr; }
  // Async observers in the batch: they go round again when notified, still
  // counting as users of the group (see group::notify).
  bool has_observers() const noexcept { return observers_ != 0; }

  // Moves the async waiters that satisfy `pred` into `out`, keeping order.
  template <class Pred>
  void split(Pred pred, wake_batch& out) noexcept {
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

  // Wakes the blocked waiters, then notifies the async ones, one at a time;
  // call with no lock held. Async waiters run user code here (callbacks,
  // coroutines), which may re-enter the group, including this very batch
  // (nested, on this thread): it is popped one waiter at a time.
  void signal_all() noexcept {
    wake_blocked();
    while (head_ != nullptr) {
      waiter* w = head_;
      head_ = w->signal_next;  // read before the notification frees w
      if (head_ == nullptr) tail_ = nullptr;
      if (w->observer) --observers_;
      w->notify(w);
    }
  }

 private:
  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
  std::size_t observers_ = 0;
  flight_base* flights_ = nullptr;
};

}  // namespace singleflight::detail
