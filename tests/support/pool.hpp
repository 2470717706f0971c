// tests/support/pool.hpp: starting a call cold on the test's own thread.
//
// A thread keeps the flights it finished for its next start
// (singleflight/detail/group/flight_pool.hpp), in any group of the same key and
// value types: a "fresh group" is no longer a cold start on a thread that
// ran flights before. Tests of the cold path (the first allocation of a
// flight and of its key, a Key copy rather than an assignment) empty this
// thread's pool first, so their assertions stay on the test's own thread.
#pragma once

#include <singleflight/group.hpp>

#include <cstddef>

namespace sftest {

// Releases this thread's pooled flights of group type G: its next start on
// this thread allocates a flight and copy-constructs the key.
template <class G>
void empty_flight_pool() noexcept {
  using flight_t = singleflight::detail::flight<typename G::key_type, typename G::value_type>;
  singleflight::detail::flight_pool<flight_t>::clear();
}

// How many finished flights of group type G this thread keeps for its next
// starts (at most singleflight::detail::flight_pool<...>::limit).
template <class G>
std::size_t pooled_flights() noexcept {
  using flight_t = singleflight::detail::flight<typename G::key_type, typename G::value_type>;
  return singleflight::detail::flight_pool<flight_t>::size();
}

// The most flights of group type G a thread keeps.
template <class G>
constexpr std::size_t flight_pool_limit = singleflight::detail::flight_pool<
    singleflight::detail::flight<typename G::key_type, typename G::value_type>>::limit;

}  // namespace sftest
