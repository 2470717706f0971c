// singleflight/detail/group/impl/wake_batch.ipp -- internal; do not include directly.
//
// wake_batch's definitions (detail/group/wake_batch.hpp, which describes them) but for split (a
// template), the constructor, the destructor's debug check and the two queries: included by that
// header in header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include <atomic>
#include <utility>

#include "../wake_batch.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL wake_batch::wake_batch(wake_batch&& o) noexcept
    : head_(std::exchange(o.head_, nullptr)),
      tail_(std::exchange(o.tail_, nullptr)),
      observers_(std::exchange(o.observers_, 0)),
      flights_(std::exchange(o.flights_, nullptr)),
      traces_(std::exchange(o.traces_, nullptr)),
      traces_tail_(std::exchange(o.traces_tail_, nullptr)) {}

SINGLEFLIGHT_DECL wake_batch& wake_batch::operator=(wake_batch&& o) noexcept {
  std::swap(head_, o.head_);
  std::swap(tail_, o.tail_);
  std::swap(observers_, o.observers_);
  std::swap(flights_, o.flights_);
  std::swap(traces_, o.traces_);
  std::swap(traces_tail_, o.traces_tail_);
  return *this;
}

SINGLEFLIGHT_DECL void wake_batch::add(waiter& w) noexcept {
  w.signal_next = nullptr;
  if (tail_ != nullptr) {
    tail_->signal_next = &w;
  } else {
    head_ = &w;
  }
  tail_ = &w;
  if (w.observer) ++observers_;
}

SINGLEFLIGHT_DECL void wake_batch::add_blocked(flight_base& f) noexcept {
  f.signal.bump();
  if (f.wake_pending.exchange(true, std::memory_order_seq_cst)) return;
  f.retain();
  f.wake_next = flights_;
  flights_ = &f;
}

SINGLEFLIGHT_DECL void wake_batch::add_trace(flight_base& f) noexcept {
  f.retain();
  f.trace.next = nullptr;
  if (traces_tail_ != nullptr) {
    traces_tail_->trace.next = &f;
  } else {
    traces_ = &f;
  }
  traces_tail_ = &f;
}

SINGLEFLIGHT_DECL void wake_batch::wake_blocked() noexcept {
  while (flights_ != nullptr) {
    flight_base* f = flights_;
    flights_ = f->wake_next;  // read before giving the link up
    f->wake_pending.store(false, std::memory_order_seq_cst);
    f->signal.wake_all();
    f->release();
  }
}

SINGLEFLIGHT_DECL void wake_batch::signal_all() noexcept {
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

// No SINGLEFLIGHT_DECL here: the declaration carries it (g++ warns on an `inline` definition of a
// function declared noinline).
void wake_batch::report_settles() noexcept {
  while (traces_ != nullptr) {
    flight_base* f = traces_;
    traces_ = f->trace.next;  // read before the report
    if (traces_ == nullptr) traces_tail_ = nullptr;
    f->trace.report_settled(f->error);
    f->release();
  }
}

}  // namespace singleflight::detail
