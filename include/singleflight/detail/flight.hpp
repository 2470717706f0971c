// singleflight/detail/flight.hpp -- internal; do not include directly.
//
// The call state shared by everyone interested in one execution of fn.
// Everything except `refs`, `value` and `error` is guarded by the owning
// group's mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <stop_token>
#include <utility>

namespace singleflight::detail {

// How a flight settled. `pending` until it does; set exactly once, under the
// group's mutex.
enum class outcome_kind : unsigned char {
  pending,
  value,      // fn returned; `value` holds it
  fn_error,   // fn (or handing it to the executor) threw; `error` holds it
  dropped,    // the executor destroyed the task unrun; `error` holds it
  cancelled,  // stopped by the ownership policy
  closed,     // stopped by close()
  timeout,    // stopped by the deadline
};

// waiter
//
// One interested party, linked into its flight's list. Today a waiter is a
// blocked thread with its own condition variable (so settling wakes exactly
// the waiters of that flight, and a caller's stop wakes only that caller).
// The list is intrusive and the waiter lives in the caller's frame, so a join
// allocates nothing. An asynchronous waiter (callback, coroutine) is another
// kind of node in the same list whose wake-up is collected under the lock
// and run after it is released.
struct waiter {
  waiter* prev = nullptr;
  waiter* next = nullptr;
  std::condition_variable cv;
  bool linked = false;
  bool woken = false;       // the thing waited for happened (settle, or fn_done for observers)
  bool stop_fired = false;  // the caller's own stop_token fired
  bool observer = false;    // waits for the fn to return, not for the outcome

  void reset(bool as_observer) noexcept {
    woken = false;
    stop_fired = false;
    observer = as_observer;
  }
};

class waiter_list {
 public:
  void push(waiter& w) noexcept {
    w.prev = tail_;
    w.next = nullptr;
    if (tail_ != nullptr) {
      tail_->next = &w;
    } else {
      head_ = &w;
    }
    tail_ = &w;
    w.linked = true;
  }
  void erase(waiter& w) noexcept {
    if (w.prev != nullptr) {
      w.prev->next = w.next;
    } else {
      head_ = w.next;
    }
    if (w.next != nullptr) {
      w.next->prev = w.prev;
    } else {
      tail_ = w.prev;
    }
    w.prev = w.next = nullptr;
    w.linked = false;
  }
  // Wakes and unlinks every waiter for which pred(w) holds; returns how many.
  // Notifies under the caller's lock (the waiters' mutex): no lost wake-up.
  template <class Pred>
  std::size_t wake_if(Pred pred) noexcept {
    std::size_t n = 0;
    for (waiter* w = head_; w != nullptr;) {
      waiter* next = w->next;
      if (pred(*w)) {
        erase(*w);
        w->woken = true;
        w->cv.notify_one();
        ++n;
      }
      w = next;
    }
    return n;
  }

 private:
  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
};

template <class T>
class flight {
 public:
  flight(bool stoppable, std::uint64_t seq)
      : stop(stoppable ? std::stop_source() : std::stop_source(std::nostopstate)), seq(seq) {}

  // Memory ordering: a new reference is always taken from an existing one, so
  // the increment needs no ordering (relaxed). The decrement is acq_rel: the
  // release half orders this owner's last reads of `value`/`error` before the
  // delete, the acquire half makes the deleting thread see every other
  // owner's accesses.
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Written by the thread that ran fn before the settle that publishes it,
  // read by waiters only after they observed kind == value / fn_error under
  // the group's mutex: the mutex orders the write before every read.
  std::optional<T> value;
  std::exception_ptr error;
  std::stop_source stop;  // the flight's own; nostopstate when fn takes no token

  // Guarded by the group's mutex.
  std::uint64_t seq;
  std::size_t waiters = 0;  // callers counting towards the ownership policy
  waiter_list list;         // blocked waiters and observers
  outcome_kind kind = outcome_kind::pending;
  bool fn_done = false;            // fn returned, or will never run
  bool submitting = false;         // the executor call is in progress
  bool dropped_in_submit = false;  // the task died inside the executor call
  const void* home = nullptr;      // our map node's key, while the map holds us
  std::size_t home_hash = 0;
  flight* live_prev = nullptr;  // every flight whose fn has not returned
  flight* live_next = nullptr;
  flight* dl_prev = nullptr;  // flights with a pending deadline, earliest first
  flight* dl_next = nullptr;
  bool dl_linked = false;
  std::chrono::steady_clock::time_point deadline{};
  flight* stop_next = nullptr;  // scratch: flights to stop once the lock is released

 private:
  ~flight() = default;
  std::atomic<std::size_t> refs_{1};
};

// flight_ref: an owning reference (intrusive count).
template <class T>
class flight_ref {
 public:
  flight_ref() noexcept = default;
  explicit flight_ref(flight<T>* f) noexcept : f_(f) {}  // adopts one reference
  static flight_ref share(flight<T>* f) noexcept {
    f->retain();
    return flight_ref(f);
  }
  flight_ref(flight_ref&& o) noexcept : f_(std::exchange(o.f_, nullptr)) {}
  flight_ref& operator=(flight_ref&& o) noexcept {
    if (this != &o) {
      reset();
      f_ = std::exchange(o.f_, nullptr);
    }
    return *this;
  }
  flight_ref(const flight_ref&) = delete;
  flight_ref& operator=(const flight_ref&) = delete;
  ~flight_ref() { reset(); }
  void reset() noexcept {
    if (f_ != nullptr) std::exchange(f_, nullptr)->release();
  }
  flight<T>* get() const noexcept { return f_; }
  flight<T>* operator->() const noexcept { return f_; }
  explicit operator bool() const noexcept { return f_ != nullptr; }

 private:
  flight<T>* f_ = nullptr;
};

}  // namespace singleflight::detail
