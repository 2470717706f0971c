// singleflight/detail/group/leader_stop.hpp -- internal; do not include directly.
//
// leader_stop: the rung between lifecycle and flight_table that owns an
// inline leader's stop callback (leave_on_stop), not a template: the callback
// reaches the flight only through flight_base and the group only through the
// rungs below, so std::stop_callback<leave_on_stop> and its optional are
// compiled once in a translation unit, not once per (Key, T). It adds no
// member, so the group's layout and the order of construction are unchanged.
//
// Locking: the callback takes the flight's shard lock (shard_set.hpp) and
// releases it before it stops the flight or notifies anyone.
#pragma once

#include <mutex>
#include <utility>

#include "../../options.hpp"
#include "../config.hpp"
#include "blocking_waiters.hpp"
#include "flight.hpp"
#include "hooks.hpp"
#include "lifecycle.hpp"
#include "shard_set.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

class leader_stop : public lifecycle {
  using base = lifecycle;

 public:
  using kind = outcome_kind;

  SINGLEFLIGHT_DECL explicit leader_stop(options opts);

 protected:
  // An inline leader's stop: it cannot stop waiting (it is running fn), so it
  // leaves right here, which may stop the flight under the ownership policy.
  // The leader's thread destroys this callback before it stops counting as a
  // user, so the group outlives every run of it.
  //
  // It runs no callback or resumption itself: the leader's thread, once fn
  // returns, waits in ~stop_callback for this to finish, and an on_done run
  // here that waited for that fn (a retry with a blocking do_ after
  // cancelled_error) would never let it. Blocked followers are only woken;
  // async ones, and the settle's report to options.tracer, go to the
  // group's delivery thread.
  struct leave_on_stop {
    leader_stop* g;
    flight_base* f;
    blocking_waiter* w;
    SINGLEFLIGHT_DECL void operator()() const noexcept;
  };
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/leader_stop.ipp"
#endif
