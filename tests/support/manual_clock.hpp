// tests/support/manual_clock.hpp: a Clock the test moves by hand, for the
// cache tests (windows, jitter, XFetch). Meets the standard Clock
// requirements; now() is static, so every cache<..., manual_clock> in the
// process sees the same time. Each test case starts it with reset().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace sftest {

struct manual_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<manual_clock>;
  static constexpr bool is_steady = true;

  // acquire/release: a test that advances the clock and then lets another
  // thread run sees that thread read the new time.
  static time_point now() noexcept {
    return time_point(duration(ticks.load(std::memory_order_acquire)));
  }
  static void advance(duration d) noexcept {
    ticks.fetch_add(d.count(), std::memory_order_acq_rel);
  }
  // reset(): back to a fixed start (one hour after the epoch, so that no
  // window arithmetic in a test starts at zero).
  static void reset() noexcept {
    ticks.store(std::chrono::duration_cast<duration>(std::chrono::hours(1)).count(),
                std::memory_order_release);
  }

  static inline std::atomic<rep> ticks{0};
};

}  // namespace sftest
