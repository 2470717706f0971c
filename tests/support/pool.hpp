// tests/support/pool.hpp: starting a call cold on the test's own thread.
//
// A thread keeps the flights it finished for its next start
// (singleflight/detail/flight_pool.hpp), in any group of the same key and
// value types: a "fresh group" is no longer a cold start on a thread that
// ran flights before. Tests of the cold path (the first allocation of a
// flight and of its key, a Key copy rather than an assignment) empty this
// thread's pool first, so their assertions stay on the test's own thread.
#pragma once

#include <singleflight/group.hpp>

namespace sftest {

// Releases this thread's pooled flights of group type G: its next start on
// this thread allocates a flight and copy-constructs the key.
template <class G>
void empty_flight_pool() noexcept {
  using flight_t = singleflight::detail::flight<typename G::key_type, typename G::value_type>;
  singleflight::detail::flight_pool<flight_t>::clear();
}

}  // namespace sftest
