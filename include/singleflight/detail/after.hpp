// singleflight/detail/after.hpp -- internal; do not include directly.
//
// Saturating time-point arithmetic: `now + duration::max()` is signed
// overflow (undefined; in practice a deadline in the past). Every deadline
// the library computes goes through after(): a duration that would reach
// past the clock's range gives time_point::max(), which means "never".
#pragma once

#include "chrono.hpp"

namespace singleflight::detail {

using steady = std::chrono::steady_clock;

// after(now, d): now + d, rounded up to the clock's tick, saturated at
// time_point::max(). d <= 0 gives now. Works for any duration type (a
// coarse one such as hours::max(), or a floating-point one).
template <class TimePoint, class Rep, class Period>
constexpr TimePoint after(TimePoint now, std::chrono::duration<Rep, Period> d) noexcept {
  using D = typename TimePoint::duration;
  if (d <= std::chrono::duration<Rep, Period>::zero()) return now;
  // Compare in floating point first: converting d to D, or adding it, could
  // overflow. Within a second of the end of the clock's range (~292 years
  // away for nanoseconds) is "never" too, which keeps the comparison exact
  // enough where long double has only 53 bits of mantissa.
  const long double room = std::chrono::duration<long double>(TimePoint::max() - now).count();
  if (std::chrono::duration<long double>(d).count() >= room - 1.0L) return TimePoint::max();
  return now + std::chrono::ceil<D>(d);
}

}  // namespace singleflight::detail
