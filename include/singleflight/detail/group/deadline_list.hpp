// singleflight/detail/group/deadline_list.hpp -- internal; do not include directly.
//
// Time and the timer's bookkeeping:
//   deadline_list   a shard's flights with a pending deadline, earliest first
//                   (guarded by that shard's lock);
//   timer_gate      how a new deadline reaches the timer thread without a
//                   lock shared by every call (its own small mutex).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "../after.hpp"
#include "../chrono.hpp"
#include "flight.hpp"

namespace singleflight::detail {

// A shard's flights with a deadline. Every flight of a group gets the same
// timeout and deadlines are taken from a steady clock, so appending keeps
// the list sorted. Guarded by the shard's lock.
class deadline_list {
 public:
  void push(flight_base& f) noexcept {
    f.dl_prev = tail_;
    f.dl_next = nullptr;
    (tail_ != nullptr ? tail_->dl_next : head_) = &f;
    tail_ = &f;
    f.dl_linked = true;
  }
  void erase(flight_base& f) noexcept {
    if (!f.dl_linked) return;
    (f.dl_prev != nullptr ? f.dl_prev->dl_next : head_) = f.dl_next;
    (f.dl_next != nullptr ? f.dl_next->dl_prev : tail_) = f.dl_prev;
    f.dl_prev = f.dl_next = nullptr;
    f.dl_linked = false;
  }
  flight_base* head() const noexcept { return head_; }

 private:
  flight_base* head_ = nullptr;
  flight_base* tail_ = nullptr;
};

// timer_gate
//
// The timer sleeps until the earliest deadline of all shards, which it reads
// one shard at a time. A thread that links a deadline earlier than the one
// the timer sleeps for (or while it sleeps with none) must wake it; every
// other call pays one atomic load.
//
// The protocol: before scanning the shards the timer sets `target_` to max
// ("I may miss anything"); after the scan it publishes the earliest deadline
// it found and sleeps until then unless kicked. A linker, after linking under
// its shard's lock, compares its deadline with `target_` and kicks if it is
// earlier. Either the timer's scan saw the new deadline (the shard's lock
// orders them), or the linker's load comes after the timer's store of max (or
// of a later target) and it kicks.
// Memory ordering: seq_cst on target_, so the store-then-scan and
// link-then-load pairs cannot both miss.
class timer_gate {
 public:
  // A thread linked a deadline `d` (after releasing its shard's lock or
  // while holding it; the gate's mutex is always taken last).
  void linked(steady::time_point d) noexcept {
    if (d.time_since_epoch().count() >= target_.load(std::memory_order_seq_cst)) return;
    {
      std::lock_guard<std::mutex> lk(m_);
      kicked_ = true;
    }
    cv_.notify_one();
  }

  // The timer, before scanning.
  void scanning() noexcept { target_.store(never, std::memory_order_seq_cst); }

  // The timer, after scanning: sleeps until `next` (max: no deadline), a
  // kick or stop(). Returns false once stopped.
  bool sleep_until(steady::time_point next) {
    std::unique_lock<std::mutex> lk(m_);
    if (stopped_) return false;
    if (!kicked_) {
      target_.store(next.time_since_epoch().count(), std::memory_order_seq_cst);
      const auto woken = [this] { return kicked_ || stopped_; };
      if (next == steady::time_point::max()) {
        cv_.wait(lk, woken);
      } else {
        (void)cv_.wait_until(lk, next, woken);
      }
    }
    kicked_ = false;
    return !stopped_;
  }

  void stop() noexcept {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopped_ = true;
    }
    cv_.notify_all();
  }
  bool stopped() const {
    std::lock_guard<std::mutex> lk(m_);
    return stopped_;
  }

 private:
  static constexpr std::int64_t never = INT64_MAX;
  std::atomic<std::int64_t> target_{never};
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool kicked_ = false;   // guarded by m_
  bool stopped_ = false;  // guarded by m_
};

}  // namespace singleflight::detail
