// singleflight/wait_bound.hpp
//
// `singleflight::wait_bound`: how long one caller waits for its outcome,
// independent of the flight's own deadline (options::timeout).
//
//   int v = g.do_(key, fn, request_token, std::chrono::milliseconds(150));
//   auto o = g.try_do(key, fn, {}, deadline_of_this_request);
#pragma once

#include "detail/after.hpp"
#include "detail/chrono.hpp"

namespace singleflight {

// wait_bound
//
// A point in time (on std::chrono::steady_clock) after which the caller
// stops waiting: it then receives timeout_error, and counts as having left
// the flight, exactly as when its own stop_token fires (so under
// ownership::waiters the last caller to go stops the work, under
// ownership::leader the first caller's bound cancels it for everyone, under
// ownership::group the work goes on). A bound already passed when the call
// begins makes it start and join nothing. An inline leader (no executor)
// still returns only when its fn does, with timeout_error if its bound
// passed meanwhile.
//
// Made from a duration (counted from the moment the wait_bound is made:
// make it where the call is made) or from a time point of any clock
// (converted to steady_clock once, there). Saturating: duration::max() and
// time_point::max() mean "no bound". A value type; thread-safe.
class wait_bound {
 public:
  using clock = std::chrono::steady_clock;

  template <class Rep, class Period>
  wait_bound(std::chrono::duration<Rep, Period> d) noexcept  // NOLINT(google-explicit-constructor)
      : at_(detail::after(clock::now(), d)) {}

  wait_bound(clock::time_point t) noexcept : at_(t) {}  // NOLINT(google-explicit-constructor)

  template <class Clock, class Duration>
  wait_bound(
      std::chrono::time_point<Clock, Duration> t) noexcept  // NOLINT(google-explicit-constructor)
      : at_(from(t)) {}

  // The bound on steady_clock.
  // g++ 12 at -O1 (the tsan preset) reports at_ as maybe uninitialized when this is inlined
  // through a std::optional<wait_bound> that is read only when engaged (cache::get_many with
  // no bound, whose per-key calls are inlined into it): GCC's -Wmaybe-uninitialized false
  // positives on std::optional, e.g. PR 80635. Silenced here, where it is reported.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  clock::time_point deadline() const noexcept { return at_; }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

 private:
  template <class Clock, class Duration>
  static clock::time_point from(std::chrono::time_point<Clock, Duration> t) noexcept {
    if (t == std::chrono::time_point<Clock, Duration>::max()) return clock::time_point::max();
    const auto left = t - Clock::now();
    return detail::after(clock::now(), left);  // a bound already passed gives now
  }

  clock::time_point at_;
};

}  // namespace singleflight
