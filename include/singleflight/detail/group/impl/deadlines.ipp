// singleflight/detail/group/impl/deadlines.ipp -- internal; do not include directly.
//
// deadlines's definitions (detail/group/deadlines.hpp, which describes them): included by that
// header in header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include "../deadlines.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL deadlines::~deadlines() = default;

SINGLEFLIGHT_DECL deadlines::deadlines(options opts) : base(std::move(opts)) {}

SINGLEFLIGHT_DECL bool deadlines::queue_delivery(shard& s, wake_batch& batch) noexcept {
  std::lock_guard<std::mutex> lk(service_mu_);
  if (delivery_stop_) return false;
  try {
    if (!delivery_.started()) {
      delivery_ = owned_thread(&deadlines::delivery_entry, this);
    }
    delivery_q_.emplace_back(&s, std::move(batch));
  } catch (...) {
    return false;  // std::system_error or bad_alloc: deliver here
  }
  delivery_cv_.notify_one();
  return true;
}

SINGLEFLIGHT_DECL flight_base* deadlines::bound_expired(shard& s, bounded_wait& n, wake_batch& wake,
                                                        steady::time_point now) noexcept {
  s.bounds.unlink(n);
  const bool own = n.caller_until && *n.caller_until <= now;
  flight_base& f = *n.waiting_on;
  bool stop = false;
  if (!n.async) {  // a blocked inline leader
    auto& w = static_cast<blocking_waiter&>(n);
    if (w.stop_fired.load(std::memory_order_relaxed) || w.bound_fired || f.kind != kind::pending)
      return nullptr;
    w.bound_fired = true;
    ++s.st.wait_timeouts;
    stop = this->leave(s, f, /*is_leader=*/true, wake);
  } else {
    if (n.observer ? !n.try_claim() : !n.try_leave()) return nullptr;  // decided meanwhile
    f.list.erase(n);
    if (n.observer) {
      n.observer = false;
      ++s.st.rejections;
    } else {
      stop = this->leave(s, f, n.is_leader, wake);
    }
    if (own) ++s.st.wait_timeouts;
    n.result = kind::timeout;
    this->exit_user(s);
    wake.add(n);
  }
  if (!stop) return nullptr;
  f.retain();  // released by whoever stops it
  return &f;
}

SINGLEFLIGHT_DECL void deadlines::link_bound(shard& s, bounded_wait& n, bool as_observer) noexcept {
  if (as_observer && !n.observe_until && this->opts().timeout > std::chrono::nanoseconds::zero())
    n.observe_until = after(steady::now(), this->opts().timeout);
  if (const auto* d = n.bound(as_observer)) {
    s.bounds.link(n);
    this->gate().linked(*d);
  }
}

SINGLEFLIGHT_DECL void deadlines::ensure_timer() {
  std::lock_guard<std::mutex> lk(service_mu_);
  if (timer_.started() || timer_stopped_) return;
  timer_ = owned_thread(&deadlines::timer_entry, this);
}

SINGLEFLIGHT_DECL void deadlines::deliver_queue_here() noexcept {
  for (;;) {
    std::pair<shard*, wake_batch> item;
    {
      std::lock_guard<std::mutex> lk(service_mu_);
      if (delivery_q_.empty()) return;
      item = std::move(delivery_q_.front());
      delivery_q_.pop_front();
    }
    base::notify(this, *item.first, item.second);
  }
}

SINGLEFLIGHT_DECL void deadlines::timer_entry(void* self, owned_thread::home& h) {
  static_cast<deadlines*>(self)->timer_loop(h);
}

SINGLEFLIGHT_DECL void deadlines::delivery_entry(void* self, owned_thread::home& h) {
  static_cast<deadlines*>(self)->delivery_loop(h);
}

SINGLEFLIGHT_DECL void deadlines::timer_loop(owned_thread::home& self) {
  for (;;) {
    this->gate().scanning();
    auto next = steady::time_point::max();
    for (std::size_t i = 0; i < this->shard_count(); ++i) {
      if (!expire(this->shard_at(i), self, next)) return;  // orphaned
    }
    if (!this->gate().sleep_until(next)) return;
  }
}

SINGLEFLIGHT_DECL bool deadlines::expire(shard& s, owned_thread::home& self,
                                         steady::time_point& next) {
  flight_base* to_stop = nullptr;
  wake_batch wake;
  {
    std::unique_lock<std::mutex> lk(s.mu);
    const auto now = steady::now();
    const auto due = [&] {
      return (s.deadlines.head() != nullptr && s.deadlines.head()->deadline <= now) ||
             (s.bounds.head() != nullptr && *s.bounds.head()->wait_deadline <= now);
    };
    if (due()) {
      SINGLEFLIGHT_HOOK_UNLOCKED(lk, timer_due);
      while (s.deadlines.head() != nullptr && s.deadlines.head()->deadline <= now) {
        flight_base* f = s.deadlines.head();
        this->settle(s, *f, kind::timeout, wake);  // unlinks f from the list
        if (f->stop.stop_possible()) {
          f->retain();
          f->stop_next = to_stop;
          to_stop = f;
        }
      }
      while (s.bounds.head() != nullptr && *s.bounds.head()->wait_deadline <= now) {
        if (flight_base* f = bound_expired(s, *s.bounds.head(), wake, now)) {
          f->stop_next = to_stop;  // a flight is stopped at most once: it settles
          to_stop = f;
        }
      }
    }
    if (s.deadlines.head() != nullptr && s.deadlines.head()->deadline < next)
      next = s.deadlines.head()->deadline;
    if (s.bounds.head() != nullptr && *s.bounds.head()->wait_deadline < next)
      next = *s.bounds.head()->wait_deadline;
  }
  if (to_stop == nullptr && wake.empty()) return true;
  wake_batch async;  // callbacks, resumptions and tracer reports: not on this thread
  wake.split([](const waiter& w) { return w.async; }, async);
  if (to_stop != nullptr) SINGLEFLIGHT_HOOK(stop_requesting);
  stop_all(to_stop);  // stop first (fn's stop callbacks run here), then notify
  wake.signal_all();  // blocked threads only: no user code
  if (self.orphaned || (!async.empty() && !queue_delivery(s, async))) {
    // A stop callback destroyed the group (on this thread), or the
    // delivery thread is unavailable: deliver here. A batch without
    // observers touches nothing of the group.
    base::notify(this, s, async);
  }
  return !self.orphaned;
}

SINGLEFLIGHT_DECL void deadlines::delivery_loop(owned_thread::home& self) {
  std::unique_lock<std::mutex> lk(service_mu_);
  for (;;) {
    delivery_cv_.wait(lk, [this] { return delivery_stop_ || !delivery_q_.empty(); });
    if (delivery_q_.empty()) return;  // asked to stop, and everything delivered
    std::pair<shard*, wake_batch> item = std::move(delivery_q_.front());
    delivery_q_.pop_front();
    lk.unlock();
    base::notify(this, *item.first, item.second);  // may re-enter, close or destroy the group
    if (self.orphaned) return;
    lk.lock();
  }
}

SINGLEFLIGHT_DECL void deadlines::stop_all(flight_base* head) noexcept {
  while (head != nullptr) {
    flight_base* f = head;
    head = f->stop_next;
    f->stop_next = nullptr;
    f->stop.request_stop();
    f->release();
  }
}

}  // namespace singleflight::detail
