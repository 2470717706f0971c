// singleflight/detail/cache/cache_clock.hpp -- internal; do not include directly.
//
// Time arithmetic and randomness for singleflight::cache: saturating
// time_point + and - duration (an entry with a ttl of years must not overflow into
// the past), conversion of the options' nanoseconds to any Clock's duration,
// a small PRNG (splitmix64) whose state the caller keeps where its own lock
// or read section guards it (no thread_local), TTL jitter, and the XFetch
// early-refresh test, and the Clock requirements (clock_like).
//
// Owns no state and takes no lock.
#pragma once

#include <cstdint>
#include <ratio>

#include "../chrono.hpp"

#if defined(SINGLEFLIGHT_STANDARD_HEADERS) || !(defined(__GNUC__) || defined(__clang__))
#include <cmath>
#endif

namespace singleflight::detail {

// clock_like<C>: std::chrono::is_clock_v<C> (C++20's Clock requirements: rep, period,
// duration, time_point, is_steady, static now()), spelled out because libc++ 14 has no
// is_clock.
template <class C>
concept clock_like = requires {
  typename C::rep;
  typename C::period;
  typename C::duration;
  typename C::time_point;
  C::is_steady;
  C::now();
};

// to_duration<D>(ns): `ns` in the clock's duration D, rounded up, clamped to
// [0, D::max()] (a negative option means 0).
template <class D>
constexpr D to_duration(std::chrono::nanoseconds ns) noexcept {
  if (ns <= std::chrono::nanoseconds::zero()) return D::zero();
  using wide = std::chrono::duration<long double, typename D::period>;
  const wide w = std::chrono::duration_cast<wide>(ns);
  if (w >= wide(D::max())) return D::max();
  const D d = std::chrono::duration_cast<D>(w);
  return wide(d) < w ? d + D(1) : d;
}

// sat_add(tp, d): tp + d for d >= 0, or TP::max() where that would overflow.
template <class TP>
constexpr TP sat_add(TP tp, typename TP::duration d) noexcept {
  using D = typename TP::duration;
  if (d <= D::zero()) return tp;
  if (tp.time_since_epoch() > D::max() - d) return TP::max();
  return tp + d;
}

// sat_sub(tp, d): tp - d for d >= 0, or TP::min() where that would overflow.
template <class TP>
constexpr TP sat_sub(TP tp, typename TP::duration d) noexcept {
  using D = typename TP::duration;
  if (d <= D::zero()) return tp;
  if (tp.time_since_epoch() < D::min() + d) return TP::min();
  return tp - d;
}

// ln(x): std::log(x), XFetch's ln(u) and the only thing the cache takes from <cmath>. With GCC
// and clang it is __builtin_log, the same libm call, so that including the cache does not parse
// <cmath> (libstdc++ 12's brings the special functions in C++17 and later: docs/performance.md
// "Compile time"); elsewhere, or with SINGLEFLIGHT_STANDARD_HEADERS defined (for every
// translation unit), std::log from <cmath>.
inline double ln(double x) noexcept {
#if defined(SINGLEFLIGHT_STANDARD_HEADERS) || !(defined(__GNUC__) || defined(__clang__))
  return std::log(x);
#else
  return __builtin_log(x);
#endif
}

// splitmix64's output function: a strong 64-bit mixer. Also used to spread
// user hashes (std::hash<int> is the identity) over shards and buckets.
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31U);
}

// splitmix64: the state advances by the golden gamma; the output is mixed.
// Not thread-safe: its owner guards it (a shard's lock).
struct splitmix {
  std::uint64_t state = 0;
  constexpr std::uint64_t next() noexcept { return mix64(state += 0x9e3779b97f4a7c15ULL); }
};

// A uniform double in (0, 1] from 64 random bits (53 of them used).
constexpr double unit_open_closed(std::uint64_t bits) noexcept {
  return static_cast<double>((bits >> 11U) + 1U) * 0x1.0p-53;
}

// jittered(ttl, j, bits): ttl scaled by a factor uniform in [1 - j, 1 + j]
// (j clamped to [0, 1)), at least one tick. j == 0 returns ttl unchanged.
template <class D>
D jittered(D ttl, double j, std::uint64_t bits) noexcept {
  if (!(j > 0.0) || ttl <= D::zero()) return ttl;
  if (j >= 1.0) j = 0.999999;
  const double u = unit_open_closed(bits) - 0x1.0p-53;  // [0, 1)
  const long double factor = 1.0L - j + 2.0L * j * u;
  const long double ticks = static_cast<long double>(ttl.count()) * factor;
  if (ticks >= static_cast<long double>(D::max().count())) return D::max();
  const auto r = static_cast<typename D::rep>(ticks);
  return D(r > 0 ? r : 1);
}

// XFetch (Vattani, Chierichetti, Lowenstein, "Optimal probabilistic cache
// stampede prevention", VLDB 2015): a read at `now` of a value that expires
// at `expiry` and took `delta` to compute refreshes early when
//     now - delta * beta * ln(u) >= expiry,   u uniform in (0, 1].
// Equivalently: the time left, expiry - now, is at most delta * beta * -ln(u).
// -ln(u) <= 53 ln 2 < 36.8 for the u above, so when the time left exceeds
// 36.8 * delta * beta no draw can fire and none is made (`draw` is called
// only when needed). delta == 0 or beta <= 0 never fires early.
template <class D, class Draw>
bool xfetch_fires(D left, D delta, double beta, Draw&& draw) noexcept(noexcept(draw())) {
  if (!(beta > 0.0) || delta <= D::zero()) return false;
  if (left <= D::zero()) return true;
  const long double scale = static_cast<long double>(delta.count()) * beta;
  const auto l = static_cast<long double>(left.count());
  if (l > scale * 36.8L) return false;
  const double u = unit_open_closed(draw());
  return l <= scale * static_cast<long double>(-ln(u));
}

}  // namespace singleflight::detail
