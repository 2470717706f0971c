// singleflight/coarse_clock.hpp
//
// `singleflight::coarse_clock`: a steady clock that is cheap to read, for a
// cache whose hit path should not pay for a precise clock.
//
//   singleflight::cache<std::string, profile, singleflight::default_hash,
//                       std::equal_to<>, singleflight::coarse_clock> profiles(...);
//
// A cache reads its Clock once per call to decide whether a value is fresh.
// std::chrono::steady_clock::now() costs 20-50 ns on many virtual machines,
// as much as the rest of a hit; on Linux this clock reads
// CLOCK_MONOTONIC_COARSE instead (a few ns), whose value advances once per
// kernel tick: resolution() says how coarse (typically 1 to 4 ms). Every window
// of the cache is then measured in ticks: a value may be served up to one tick
// past its ttl (or its stale windows), never more. Elsewhere it is
// steady_clock.
//
// Meets the standard Clock requirements; is_steady. Thread-safe (stateless).
#pragma once

#include <cstdint>

#if defined(__linux__)
#include <time.h>
#endif

#include "detail/chrono.hpp"

namespace singleflight {

struct coarse_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<coarse_clock>;
  static constexpr bool is_steady = true;

  // now(): the time at the last kernel tick (Linux), else steady_clock's.
  static time_point now() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec));
#else
    return time_point(
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch()));
#endif
  }

  // resolution(): how far now() may lag the true time.
  static duration resolution() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
    timespec ts{};
    ::clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
    return duration(static_cast<rep>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
#else
    return std::chrono::duration_cast<duration>(std::chrono::steady_clock::duration(1));
#endif
  }
};

}  // namespace singleflight
