// singleflight/detail/flight.hpp -- internal; do not include directly.
//
// The call state shared by everyone interested in one execution of fn.
// Everything except `refs`, `value` and `error` is guarded by the owning
// group's mutex.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include "../task.hpp"

namespace singleflight::detail {

// How a flight settled. `pending` until it does; set exactly once, under the
// group's mutex.
enum class outcome_kind : unsigned char {
  pending,
  value,       // fn returned; `value` holds it
  fn_error,    // fn (or handing it to the executor) threw; `error` holds it
  dropped,     // the executor destroyed the task unrun, or an async fn's
               // completion was destroyed unresolved; `error` holds it
  cancelled,   // stopped by the ownership policy
  closed,      // stopped by close()
  timeout,     // stopped by the deadline
  overloaded,  // (a caller's immediate outcome only) max_in_flight reached
};

// How a completion<T> was resolved.
enum class resolution : unsigned char { value, error, broken };

// waiter
//
// One caller waiting for a flight, linked into the flight's list: a blocked
// thread (blocking_waiter, in the caller's frame), a callback or a suspended
// coroutine (the group's async waiters). The list is intrusive, so a join
// allocates nothing.
//
// Wake-up protocol: whoever settles a flight *claims* its waiters under the
// group's mutex (unlinks them, sets `claimed`, and settles their
// accounting), and *notifies* them only after releasing it (`notify`: signal
// a blocked thread, run a callback, resume a coroutine). A notified waiter
// therefore never takes the group's mutex again: a burst of N waiters does not
// queue up on it. A caller whose own stop fires takes the group's mutex to
// leave; if it finds itself claimed, the notification is on its way.
struct waiter {
  waiter* prev = nullptr;
  waiter* next = nullptr;
  waiter* signal_next = nullptr;  // the settler's batch, once claimed

  // Called once per claim, after the group's mutex is released, by the
  // thread that claimed the waiter. May destroy the waiter.
  void (*notify)(waiter*) noexcept = nullptr;

  // Guarded by the group's mutex.
  bool linked = false;
  bool observer = false;  // waits for the fn to return, not for the outcome
  bool async = false;     // one of the group's async waiters (set once, at construction)

  // Who decides this wait: a settler claiming it (under the group's mutex)
  // or the caller leaving on its own stop (without it). Exactly one CAS from
  // `waiting` wins. A claimed caller has been accounted for by the settler
  // and, if it is not an observer, no longer counts as a user of the group,
  // so it must not touch the group again; a leaving caller still counts and
  // unlinks itself under the group's mutex.
  // Memory ordering: seq_cst. acq_rel would order the winner's prior writes
  // (the settler's outcome and bookkeeping) for whoever reads the state after
  // it; seq_cst also makes "store `waiting`, then read the caller's stop
  // flag" (an async observer going round again, see group::attach) and
  // "set the stop flag, then CAS" (its stop callback) a Dekker pair: at least
  // one side sees the other, so a stop is never lost between two waits.
  enum : unsigned char { waiting, claimed, leaving };
  std::atomic<unsigned char> state{waiting};
  bool try_claim() noexcept { return transition(claimed); }
  bool try_leave() noexcept { return transition(leaving); }
  // Re-opens a claimed waiter for another wait (async observers). Under the
  // group's mutex, before reading the caller's stop flag.
  void rearm() noexcept { state.store(waiting, std::memory_order_seq_cst); }

 private:
  bool transition(unsigned char to) noexcept {
    unsigned char expected = waiting;
    return state.compare_exchange_strong(expected, to, std::memory_order_seq_cst,
                                         std::memory_order_seq_cst);
  }
};

// blocking_waiter
//
// A blocked thread. It has its own mutex so that the settler signals it
// without the group's mutex; a caller whose own stop fires is woken through
// the same mutex and then leaves (or, if it was claimed meanwhile, waits for
// the signal, because the settler still holds a pointer to it).
struct blocking_waiter : waiter {
  blocking_waiter() noexcept {
    notify = [](waiter* w) noexcept { static_cast<blocking_waiter*>(w)->signal(); };
  }

  // Guarded by `m`.
  std::mutex m;
  std::condition_variable cv;
  bool signaled = false;
  bool stop_fired = false;  // the caller's own stop_token fired

  // Prepares the waiter for a new wait; only while it is not linked and no
  // stop callback refers to it.
  void reset(bool as_observer) noexcept {
    state.store(waiting, std::memory_order_relaxed);  // published by the lock that links it
    observer = as_observer;
    signaled = false;
    stop_fired = false;
  }

  // Called by the settler after releasing the group's mutex. After the
  // unlock below the waiter may return and destroy itself: touch nothing
  // after it.
  void signal() noexcept {
    std::lock_guard<std::mutex> lk(m);
    signaled = true;
    cv.notify_one();
  }

  // The stop callback's side: touches only this waiter, never the group, so
  // it can neither deadlock on the group's mutex nor outlive the group.
  void stop() noexcept {
    std::lock_guard<std::mutex> lk(m);
    stop_fired = true;
    cv.notify_one();
  }
};

// wake_batch: waiters claimed under the group's mutex, to notify after it is
// released (group::notify). Re-entrant: signal_all() pops one waiter at a
// time, so a nested call on the same thread (a callback that blocks inside the
// group, see detail::loop_record) can notify the rest first.
class wake_batch {
 public:
  wake_batch() noexcept = default;
  wake_batch(wake_batch&& o) noexcept
      : head_(std::exchange(o.head_, nullptr)),
        tail_(std::exchange(o.tail_, nullptr)),
        observers_(std::exchange(o.observers_, 0)) {}
  wake_batch& operator=(wake_batch&& o) noexcept {
    std::swap(head_, o.head_);
    std::swap(tail_, o.tail_);
    std::swap(observers_, o.observers_);
    return *this;
  }
  wake_batch(const wake_batch&) = delete;
  wake_batch& operator=(const wake_batch&) = delete;
  ~wake_batch() { assert(head_ == nullptr && "singleflight: claimed waiters never signalled"); }

  // Appends: waiters are claimed oldest first, so they are notified in the
  // order they arrived (the longest wait ends first).
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
  bool empty() const noexcept { return head_ == nullptr; }
  // Async observers in the batch: they go round again when notified, still
  // counting as users of the group (see group::notify).
  bool has_observers() const noexcept { return observers_ != 0; }

  // Moves the waiters that satisfy `pred` into `out`, keeping the order.
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

  // Notifies every waiter, one at a time; call with no lock held. Async
  // waiters run user code here (callbacks, coroutines), which may re-enter
  // the group, including this very batch (nested, on this thread).
  void signal_all() noexcept {
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
  // Claims every waiter for which pred(w) holds and which is not already
  // leaving: unlinks it, calls on_claim(w) (accounting, under the group's
  // mutex) and adds it to `batch`. A leaving waiter stays linked; it unlinks
  // itself. Returns how many were claimed.
  template <class Pred, class OnClaim>
  std::size_t claim_if(Pred pred, OnClaim on_claim, wake_batch& batch) noexcept {
    std::size_t n = 0;
    for (waiter* w = head_; w != nullptr;) {
      waiter* next = w->next;
      if (pred(*w) && w->try_claim()) {
        erase(*w);
        on_claim(*w);
        batch.add(*w);
        ++n;
      }
      w = next;
    }
    return n;
  }
  // True when some waiter wants the outcome (not only observers).
  bool has_followers() const noexcept {
    for (const waiter* w = head_; w != nullptr; w = w->next) {
      if (!w->observer) return true;
    }
    return false;
  }

 private:
  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
};

template <class T>
class flight {
 public:
  flight(bool stoppable, std::uint64_t number)
      : stop(stoppable ? std::stop_source() : std::stop_source(std::nostopstate)), seq(number) {}

  // Readies a recycled flight (see group's pool) for a new start. Only for a
  // flight nobody else references, under the group's mutex; `value` and
  // `error` are already empty (the recycler checks).
  void reuse(bool stoppable, std::uint64_t number) {
    if (stoppable) stop = std::stop_source();  // a fresh source: never reuse a token's state
    seq = number;
    waiters = 0;
    kind = outcome_kind::pending;
    fn_done = false;
    submitting = false;
    dropped_in_submit = false;
    starting = false;
    broken_in_start = false;
    runner = std::thread::id{};
    home = nullptr;
  }

  // Readies a finished flight for the pool; drops its stop state, since a
  // token handed to the previous fn may still be referenced.
  void retire() noexcept { stop = std::stop_source(std::nostopstate); }

  // True when the caller holds the only reference. Memory ordering: acquire,
  // pairing with the release half of every other owner's decrement, so their
  // last accesses happen before this flight is reused.
  bool unique() const noexcept { return refs_.load(std::memory_order_acquire) == 1; }

  // Memory ordering: a new reference is always taken from an existing one, so
  // the increment needs no ordering (relaxed). The decrement is acq_rel: the
  // release half orders this owner's last reads of `value`/`error` before the
  // delete, the acquire half makes the deleting thread see every other
  // owner's accesses.
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // `value` is written by the thread that ran fn (or resolved an async fn's
  // completion) before the settle that publishes it, and read by waiters
  // only after they observed kind == value under the group's mutex (or were
  // claimed by that settle): the mutex orders the write before every read.
  // `error` is written before the settle too, under the mutex when a
  // completion or the group writes it.
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
  bool starting = false;           // an async fn is being called (not yet returned)
  bool broken_in_start = false;    // ... and its completion died unresolved meanwhile
  std::thread::id runner{};        // the thread running fn (or starting an async fn) now
  const void* home = nullptr;      // our map node's key, while the map holds us
  std::size_t home_hash = 0;
  flight* live_prev = nullptr;  // every flight whose fn has not returned
  flight* live_next = nullptr;
  flight* dl_prev = nullptr;  // flights with a pending deadline, earliest first
  flight* dl_next = nullptr;
  bool dl_linked = false;
  std::chrono::steady_clock::time_point deadline{};
  flight* stop_next = nullptr;  // scratch: flights to stop once the lock is released; pool link

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
  // Gives up ownership without releasing the reference.
  flight<T>* detach() noexcept { return std::exchange(f_, nullptr); }
  flight<T>* operator->() const noexcept { return f_; }
  explicit operator bool() const noexcept { return f_ != nullptr; }

 private:
  flight<T>* f_ = nullptr;
};

}  // namespace singleflight::detail
