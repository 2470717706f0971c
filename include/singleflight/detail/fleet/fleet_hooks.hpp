// singleflight/detail/fleet/fleet_hooks.hpp -- internal; do not include directly.
//
// detail::fleet_point and detail::fleet_hook: the points of the fleet protocol
// where a test may act (tests reach the hook through detail::fleet_test_access
// and set it before the fleet's first call). Empty in normal use: one branch on
// a miss path, nothing on the hit path. No state, no lock.
#pragma once

#include <string_view>

#include "../functional.hpp"

namespace singleflight::detail {

enum class fleet_point {
  lost_race,     // a follower lost the lease race, before it subscribes
  subscribed,    // its subscription is confirmed, before it re-reads
  waiting,       // it is about to wait for a message
  leading,       // a leader won the lease, before its loader runs
  loaded,        // the loader returned a value, before the store
  stored,        // the store script ran (or failed)
  written,       // fleet_cache's put, invalidate or expire applied in Redis, before its local step
  resubscribing  // the subscriber thread reconnected after losing its connection, before it
                 // subscribes again (key text: empty)
};

using fleet_hook = std::function<void(fleet_point, std::string_view key_text)>;

}  // namespace singleflight::detail
