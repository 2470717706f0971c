// singleflight/detail/group/signal.hpp -- internal; do not include directly.
//
// flight_signal: the one word every blocked caller of a flight sleeps on. A
// settle that claims blocked waiters bumps it (under the shard's lock) and
// wakes them all with one broadcast after the lock is released: one futex
// wake per flight, not one per waiter, and the woken threads take no lock.
//
// On Linux the word is a futex; elsewhere (or with SINGLEFLIGHT_NO_FUTEX) a
// mutex and condition variable stand in. Not guarded by any lock of the group.
#pragma once

#include <atomic>
#include <cstdint>

#include "../chrono.hpp"

#if defined(__linux__) && !defined(SINGLEFLIGHT_NO_FUTEX)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#define SINGLEFLIGHT_FUTEX 1
#else
#include <condition_variable>
#include <mutex>
#define SINGLEFLIGHT_FUTEX 0
#endif

namespace singleflight::detail {

class flight_signal {
 public:
  using clock = std::chrono::steady_clock;

  flight_signal() noexcept = default;
  flight_signal(const flight_signal&) = delete;
  flight_signal& operator=(const flight_signal&) = delete;
  ~flight_signal() = default;

  // The word's value now. A waiter reads it *before* it checks its own state
  // and passes it to wait(): a bump in between makes wait() return at once.
  // Memory ordering: acquire, pairing with bump()'s release, so a waiter that
  // sees the new value also sees what the settler wrote before it (its claim).
  std::uint32_t load() const noexcept { return word_.load(std::memory_order_acquire); }

  // Bumps the word. Memory ordering: release (see load()).
  void bump() noexcept { word_.fetch_add(1, std::memory_order_release); }

  // Sleeps while the word is `seen`, at most until `deadline` (null:
  // forever). May return spuriously: callers loop on their own condition.
  void wait(std::uint32_t seen, const clock::time_point* deadline) noexcept {
#if SINGLEFLIGHT_FUTEX
    if (deadline == nullptr) {
      futex(FUTEX_WAIT_PRIVATE, seen, nullptr);
      return;
    }
    const auto left = *deadline - clock::now();
    if (left <= clock::duration::zero()) return;
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(left);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left - s);
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(s.count() > INT_MAX ? INT_MAX : s.count());
    ts.tv_nsec = static_cast<long>(ns.count());
    futex(FUTEX_WAIT_PRIVATE, seen, &ts);  // a relative timeout; FUTEX_WAIT's clock is monotonic
#else
    std::unique_lock<std::mutex> lk(m_);
    if (word_.load(std::memory_order_acquire) != seen) return;
    if (deadline == nullptr) {
      cv_.wait(lk);
    } else {
      (void)cv_.wait_until(lk, *deadline);
    }
#endif
  }

  // Wakes every thread sleeping in wait(). Call after bump(), without any
  // lock of the group.
  void wake_all() noexcept {
#if SINGLEFLIGHT_FUTEX
    futex(FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
#else
    {
      std::lock_guard<std::mutex> lk(m_);  // orders the bump before a waiter's check
    }
    cv_.notify_all();
#endif
  }

 private:
  std::atomic<std::uint32_t> word_{0};
#if SINGLEFLIGHT_FUTEX
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
                "singleflight: the futex word must be a plain 32-bit integer");
  void futex(int op, std::uint32_t val, const timespec* ts) noexcept {
    // The atomic is the futex word (standard layout, no padding). Errors
    // (EAGAIN: the word changed; EINTR; ETIMEDOUT) all mean "look again".
    (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), op, val, ts, nullptr, 0);
  }
#else
  std::mutex m_;
  std::condition_variable cv_;
#endif
};

}  // namespace singleflight::detail
