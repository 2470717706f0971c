// singleflight/detail/group/ownership.hpp -- internal; do not include directly.
//
// Ownership accounting: whether a caller leaving a flight stops its work.
// The caller's own wait always ends at once (cancelled_error); this decides
// only what happens to the shared work (options::owner, see options.hpp).
// Evaluated under the lock of the shard that holds the flight, after the
// leaving caller was counted out of the flight's `waiters`.
#pragma once

#include <cstddef>

#include "../../options.hpp"

namespace singleflight::detail {

// True when a caller that just left a still-pending flight stops it:
//   waiters  the last waiter (a leader included) left: nobody wants the work;
//   leader   the first caller left: its stop is everyone's;
//   group    never: the work runs to completion, its deadline or close().
constexpr bool leaving_stops(ownership policy, std::size_t waiters_left, bool is_leader) noexcept {
  switch (policy) {
    case ownership::waiters:
      return waiters_left == 0;
    case ownership::leader:
      return is_leader;
    case ownership::group:
      return false;
  }
  return false;
}

}  // namespace singleflight::detail
