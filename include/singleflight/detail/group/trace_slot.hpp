// singleflight/detail/group/trace_slot.hpp -- internal; do not include directly.
//
// trace_slot: what a flight keeps for options::tracer (flight_base::trace),
// and the two reports made from it, outside every lock:
//   * report_start(): by the thread that started the flight, after it
//     released the lock and before fn is called or handed off;
//   * report_settled(): by the thread that notifies the batch the settle put
//     the flight in (wake_batch), never the timer (deadlines.hpp moves such
//     batches to the delivery thread).
// A settle may be reported before the start is (another thread settles the
// flight, by close() or its deadline, in between): the `state` handshake
// makes whichever of the two reporters comes second report the settle, so
// on_settle always follows on_start.
//
// Locking: `tracer` and `ev` up to the settle fields are written under the
// shard's lock by begin() (the flight is unique then: not shared with any
// reporter) and the settle fields by settled(), under the same lock; after
// that only the one settle reporter writes (`ev.error`, for its call) until
// the flight is reused, which needs every reference back (each report holds
// one). `context` is written by the start reporter and read by the settle
// reporter, ordered by `state`.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <utility>

#include "../../tracer.hpp"
#include "../chrono.hpp"
#include "../config.hpp"

namespace singleflight::detail {

class flight_base;

struct trace_slot {
  using clock = std::chrono::steady_clock;

  static constexpr unsigned char start_reported = 1;  // on_start has returned
  static constexpr unsigned char settle_due = 2;      // the flight settled and is to be reported

  std::shared_ptr<flight_tracer> tracer;  // null: not traced
  flight_settled ev;
  void* context = nullptr;  // what on_start returned
  std::atomic<unsigned char> state{0};
  flight_base* next = nullptr;  // in a wake_batch's list of settles to report

  // A traced flight starts (under the shard's lock; the flight is unique).
  // Copies the tracer only when it changes (a recycled flight keeps it).
  template <class K>
  void begin(const std::shared_ptr<flight_tracer>& t, std::uint64_t number, std::size_t shard,
             const K& key, clock::time_point now) noexcept {
    if (tracer != t) tracer = t;
    ev.flight = number;
    ev.shard = shard;
    ev.started = now;
    ev.key_ = &key;
    ev.key_type_ = flight_event::key_type_of<K>();
    ev.error = nullptr;
    context = nullptr;
    state.store(0, std::memory_order_relaxed);  // published by the shard's lock
  }

  // The flight settles (under the shard's lock).
  void settled(status s, clock::time_point now, std::size_t joins, bool fn_started) noexcept {
    ev.status = s;
    ev.settled = now;
    ev.duration = now - ev.started;
    ev.joins = joins;
    ev.fn_started = fn_started;
  }

  // On the starting thread, without any lock: on_start, then on_settle too
  // if the settle came first. `error` is the flight's (read only then).
  SINGLEFLIGHT_DECL void report_start(const std::exception_ptr& error) noexcept;

  // On the thread notifying the settle's batch, without any lock: on_settle
  // unless on_start has not been reported yet (its reporter does it then).
  SINGLEFLIGHT_DECL void report_settled(const std::exception_ptr& error) noexcept;

 private:
  SINGLEFLIGHT_DECL void report_settle(const std::exception_ptr& error) noexcept;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/trace_slot.ipp"
#endif
