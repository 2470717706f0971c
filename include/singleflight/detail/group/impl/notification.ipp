// singleflight/detail/group/impl/notification.ipp -- internal; do not include directly.
//
// notifier's definitions (detail/group/notification.hpp, which describes them): included by that
// header in header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include "../notification.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL notifier::~notifier() = default;

SINGLEFLIGHT_DECL void notifier::drain_own_loops() {
  const auto me = std::this_thread::get_id();
  for (;;) {
    loop_record* r = nullptr;
    for (std::size_t i = 0; i < this->shard_count() && r == nullptr; ++i) {
      shard& s = this->shard_at(i);
      std::lock_guard<std::mutex> lk(s.mu);
      r = loop_with_work(s.loops, me);
    }
    if (r == nullptr) return;
    run_loop(*r);
  }
}

SINGLEFLIGHT_DECL notifier::notifier(options opts) : shard_set(std::move(opts)) {}

SINGLEFLIGHT_DECL void notifier::notify(notifier* g, shard& s, wake_batch& wake) noexcept {
  if (!wake.has_observers()) {
    wake.signal_all();
    return;
  }
  loop_record rec(&wake);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    g->enter_user(s);
    s.loops.push(rec);
    g->loops_registered_.fetch_add(1, std::memory_order_relaxed);
  }
  g->run_loop(rec);
  if (rec.orphaned) return;  // code this loop ran destroyed the group
  std::lock_guard<std::mutex> lk(s.mu);
  s.loops.erase(rec);
  g->loops_registered_.fetch_sub(1, std::memory_order_relaxed);
  g->exit_user(s);
}

SINGLEFLIGHT_DECL void notifier::run_loop(loop_record& rec) noexcept {
  for (;;) {
    rec.batch->signal_all();
    if (rec.orphaned || rec.deferred.empty()) return;
    task t = std::move(rec.deferred.front());
    rec.deferred.erase(rec.deferred.begin());
    t();
  }
}

SINGLEFLIGHT_DECL void notifier::orphan_own_loops() noexcept {
  const auto me = std::this_thread::get_id();
  for (std::size_t i = 0; i < this->shard_count(); ++i) {
    shard& s = this->shard_at(i);
    std::lock_guard<std::mutex> lk(s.mu);
    for (loop_record* l = s.loops.head(); l != nullptr;) {
      loop_record* next = l->next;
      if (l->thread == me) {
        l->orphaned = true;
        s.loops.erase(*l);
        loops_registered_.fetch_sub(1, std::memory_order_relaxed);
      }
      l = next;
    }
  }
}

}  // namespace singleflight::detail
