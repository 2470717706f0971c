// singleflight/detail/group/impl/leader_stop.ipp -- internal; do not include directly.
//
// leader_stop's definition (detail/group/leader_stop.hpp, which describes it): the inline
// leader's stop callback, leave_on_stop. Included by that header in header-only mode, by
// singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include <atomic>
#include <mutex>
#include <utility>

#include "../leader_stop.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL leader_stop::leader_stop(options opts) : base(std::move(opts)) {}

SINGLEFLIGHT_DECL void leader_stop::leave_on_stop::operator()() const noexcept {
  shard& s = g->shard_of(*f);
  bool stop = false;
  wake_batch wake;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    // A flight that already settled keeps its outcome for the leader.
    if (w->stop_fired.load(std::memory_order_relaxed) || w->bound_fired || f->kind != kind::pending)
      return;
    w->stop_fired.store(true, std::memory_order_relaxed);  // read under this lock
    stop = g->leave(s, *f, /*is_leader=*/true, wake);
  }
  if (stop) {  // stop first, then notify: a notified waiter may block on this fn
#if defined(SINGLEFLIGHT_TEST_HOOKS)
    ::singleflight::detail::hook(::singleflight::detail::hook_point::stop_requesting, g);
#endif
    f->stop.request_stop();
  }
  wake_batch async;
  wake.split([](const waiter& x) { return x.async; }, async);
  wake.signal_all();  // blocked threads: no user code
  if (!async.empty() && !g->queue_delivery(s, async)) base::notify(g, s, async);  // closing
}

}  // namespace singleflight::detail
