// singleflight/detail/group/flight.hpp -- internal; do not include directly.
//
// A flight: the call state shared by everyone interested in one execution of
// fn, and also the node of the flight table (it carries its key). Three
// layers, so that code that does not need Key or T does not depend on them:
//   flight_base        reference count, the broadcast word, the stop source,
//                      the protocol state, the shared error and the table's
//                      links (shard.hpp: the shards hold flight_base*);
//   flight_value<T>    the value (what a completion<T> writes);
//   flight<Key, T>     the key.
// Everything marked "guarded" is guarded by the lock of the shard that holds
// the flight (flight_base::shard); `refs`, `value` and `error` are not, see
// their comments.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "claim.hpp"
#include "signal.hpp"
#include "trace_slot.hpp"

namespace singleflight::detail {

// How a flight settled. `pending` until it does; set exactly once, under the
// shard's lock.
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

class flight_base {
 public:
  flight_base(const flight_base&) = delete;
  flight_base& operator=(const flight_base&) = delete;

  // Memory ordering: a new reference is always taken from an existing one, so
  // the increment needs no ordering (relaxed). The decrement is acq_rel: the
  // release half orders this owner's last reads of `value`/`error` before the
  // delete, the acquire half makes the deleting thread see every other
  // owner's accesses.
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) destroy_(this);
  }
  // True when the caller holds the only reference. Memory ordering: acquire,
  // pairing with the release half of every other owner's decrement, so their
  // last accesses happen before this flight is reused.
  bool unique() const noexcept { return refs_.load(std::memory_order_acquire) == 1; }

  // ---- the broadcast to blocked waiters (see wake_batch) ----
  flight_signal signal;
  // Set (exchange) by the settle that queues this flight in its wake batch,
  // cleared by that batch just before it wakes the sleepers. A settle that
  // finds it set bumps the word and leaves the wake to the batch already
  // queued: that wake comes after the bump. Memory ordering: seq_cst.
  std::atomic<bool> wake_pending{false};
  flight_base* wake_next = nullptr;  // owned by the batch that set wake_pending

  // The flight's own stop source; nostopstate when fn takes no token.
  stop_source stop{nostopstate};

  // `error` is written before the settle that publishes it, under the shard's
  // lock (or by the only thread that can write it: the one resolving), and
  // read by waiters only after they saw kind == fn_error or dropped.
  std::exception_ptr error;

  // ---- guarded ----
  std::uint32_t shard = 0;  // index of the shard that holds it (fixed while in use)
  std::uint64_t seq = 0;    // the shard's flight counter at its start
  std::size_t waiters = 0;  // callers counting towards the ownership policy
  std::size_t joins = 0;    // callers that joined it (for options::tracer)
  waiter_list list;         // waiters and observers, in arrival order
  outcome_kind kind = outcome_kind::pending;
  bool fn_done = false;                // fn returned, or will never run
  bool fn_started = false;             // fn was called (counted in stats::fn_starts)
  bool submitting = false;             // the executor call is in progress
  bool dropped_in_submit = false;      // the task died inside the executor call
  bool starting = false;               // an async fn is being called (not yet returned)
  bool broken_in_start = false;        // ... and its completion died unresolved meanwhile
  bool in_table = false;               // the table holds it (an entry for its key)
  std::uint64_t hash = 0;              // its key's mixed hash (shard_set::mix), while in_table
  flight_base* bucket_prev = nullptr;  // its chain in the table (shard_set::link)
  flight_base* bucket_next = nullptr;
  std::thread::id runner{};          // the thread running fn (or starting an async fn) now
  flight_base* live_prev = nullptr;  // every flight whose fn has not returned
  flight_base* live_next = nullptr;
  flight_base* dl_prev = nullptr;  // flights with a pending deadline, earliest first
  flight_base* dl_next = nullptr;
  bool dl_linked = false;
  std::chrono::steady_clock::time_point deadline{};
  flight_base* stop_next = nullptr;  // scratch: flights to stop once the lock is released

  // options::tracer's state for this flight (see trace_slot.hpp for its
  // own rules); `trace.tracer` is null when the group has no tracer.
  trace_slot trace;

  // Readies a recycled flight for a new start. Only for a flight nobody else
  // references, under the shard's lock.
  void reuse(bool stoppable) {
    if (stoppable) stop = stop_source();  // a fresh state: a token handed out before may live on
    waiters = joins = 0;
    kind = outcome_kind::pending;
    fn_done = fn_started = submitting = dropped_in_submit = starting = broken_in_start = false;
    runner = std::thread::id{};
  }
  // Readies a finished flight for a thread's pool (flight_pool.hpp): drops
  // its stop state (a token handed to the previous fn may still be
  // referenced) and its error. (A traced flight never gets here: its report
  // holds a reference until after the recycle is decided.)
  void retire() noexcept {
    stop = stop_source(nostopstate);
    error = nullptr;
  }

 protected:
  using destroy_fn = void (*)(flight_base*) noexcept;
  explicit flight_base(destroy_fn d) noexcept : destroy_(d) {}
  ~flight_base() = default;

 private:
  std::atomic<std::size_t> refs_{1};
  destroy_fn destroy_;
};

template <class T>
class flight_value : public flight_base {
 public:
  // Written by the thread that ran fn (or resolved the completion) before the
  // settle that publishes it, and read by waiters only after they saw kind ==
  // value under the shard's lock or were claimed by that settle: the lock (or
  // the claim's CAS) orders the write before every read.
  std::optional<T> value;

 protected:
  using flight_base::flight_base;
  ~flight_value() = default;
};

template <class Key, class T>
class flight final : public flight_value<T> {
 public:
  flight() noexcept : flight_value<T>(&destroy) {}

  // ---- the table's (guarded) ----
  // The key is kept across recycling: assigning the next key reuses its
  // storage (a std::string's buffer).
  std::optional<Key> key;
  flight* spare_next = nullptr;  // a thread's pool of finished flights (flight_pool.hpp)

 private:
  ~flight() = default;
  static void destroy(flight_base* b) noexcept { delete static_cast<flight*>(b); }
};

// flight_ref: an owning reference (intrusive count) to a flight of type F.
template <class F>
class flight_ref {
 public:
  flight_ref() noexcept = default;
  explicit flight_ref(F* f) noexcept : f_(f) {}  // adopts one reference
  static flight_ref share(F* f) noexcept {
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
  F* get() const noexcept { return f_; }
  // Gives up ownership without releasing the reference.
  F* detach() noexcept { return std::exchange(f_, nullptr); }
  F* operator->() const noexcept { return f_; }
  F& operator*() const noexcept { return *f_; }
  explicit operator bool() const noexcept { return f_ != nullptr; }

 private:
  F* f_ = nullptr;
};

}  // namespace singleflight::detail
