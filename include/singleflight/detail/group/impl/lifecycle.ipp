// singleflight/detail/group/impl/lifecycle.ipp -- internal; do not include directly.
//
// lifecycle's definitions (detail/group/lifecycle.hpp, which describes them): included by that
// header in header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include "../lifecycle.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL lifecycle::~lifecycle() = default;

SINGLEFLIGHT_DECL lifecycle::lifecycle(options opts) : base(std::move(opts)) {}

SINGLEFLIGHT_DECL bool lifecycle::close_until(std::optional<steady::time_point> until,
                                              bool destroying) {
  // Marks the shards closed one at a time. Meanwhile a call may still
  // start a flight in a shard not marked yet: the first close() settles it
  // below like any other (marking is over before any shard is settled),
  // and the drain waits for it. Every close() marks every shard, not only
  // the first (the one that marked shard 0): a second one may pass a first
  // still on its way through the shards, and must not return, nor wait
  // for a drain, while a shard still takes new calls.
  bool first = false;
  for (std::size_t i = 0; i < this->shard_count(); ++i) {
    shard& s = this->shard_at(i);
    {
      std::lock_guard<std::mutex> lk(s.mu);
      if (i == 0) first = !s.closed;
      s.closed = true;
    }
    if (i == 0) SINGLEFLIGHT_HOOK(close_marking);
  }
  if (first) {
    for (std::size_t i = 0; i < this->shard_count(); ++i) close_shard(this->shard_at(i));
    SINGLEFLIGHT_HOOK(close_marked);
  }
  this->drain_own();
  // A library thread waits for nothing (it reports whether the drain is over).
  const bool library = !destroying && on_library_thread();
  const auto me = std::this_thread::get_id();
  bool inside = false;  // called from code this thread runs inside the group
  for (std::size_t i = 0; i < this->shard_count(); ++i) {
    shard& s = this->shard_at(i);
    std::unique_lock<std::mutex> lk(s.mu);
    const std::size_t own = base::held_in(s, me);
    inside = inside || own != 0;
    const auto drained = [&] { return s.users <= own; };
    if (library) {
      if (!drained()) return false;
    } else if (until) {
      if (!s.drain_cv.wait_until(lk, *until, drained)) return false;
    } else {
      s.drain_cv.wait(lk, drained);
    }
  }
  // Inside fn or a loop, or on a library thread: the destructor joins.
  if ((inside || library) && !destroying) return true;
  join_threads(destroying);
  return true;
}

SINGLEFLIGHT_DECL void lifecycle::submit(task tk) {
  if (!this->opts().executor.owns_threads()) {
    executor_access::submit(this->opts().executor, std::move(tk));
    return;
  }
  std::lock_guard<std::mutex> lk(workers_mu_);
  for (auto it = workers_.begin(); it != workers_.end();) {  // reap the finished ones
    if (it->finished() && it->join_unless_current()) {
      it = workers_.erase(it);  // it had finished: the join returned at once
    } else {
      ++it;
    }
  }
  workers_.emplace_back(std::move(tk));
}

SINGLEFLIGHT_DECL void lifecycle::close_shard(shard& s) {
  flight_base* to_stop = nullptr;
  wake_batch wake;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    for (flight_base* f = s.live; f != nullptr; f = f->live_next) {
      if (f->kind == kind::pending) {
        this->settle(s, *f, kind::closed, wake);
        if (f->stop.stop_possible()) {
          f->retain();
          f->stop_next = to_stop;
          to_stop = f;
        }
      }
      claim_observers(*f, s.bounds, wake);
    }
  }
  if (to_stop != nullptr) SINGLEFLIGHT_HOOK(stop_requesting);
  base::stop_all(to_stop);  // stop first, then notify
  base::notify(this, s, wake);
}

SINGLEFLIGHT_DECL void lifecycle::join_threads(bool destroying) {
  std::lock_guard<std::mutex> serial(join_mu_);
  this->gate().stop();
  owned_thread timer;
  {
    std::lock_guard<std::mutex> lk(this->service_mu_);
    this->timer_stopped_ = true;  // no new timer (ensure_timer) from here on
    timer = std::move(this->timer_);
  }
  bool timer_gone = true;
  if (destroying) {
    timer.join_or_orphan();
  } else if (!timer.join_unless_current()) {
    timer_gone = false;  // close() on the timer thread: the destructor joins it
    std::lock_guard<std::mutex> lk(this->service_mu_);
    this->timer_ = std::move(timer);
  }
  if (timer_gone) {
    owned_thread delivery;
    {
      std::lock_guard<std::mutex> lk(this->service_mu_);
      this->delivery_stop_ = true;
      this->delivery_cv_.notify_all();
      delivery = std::move(this->delivery_);
    }
    if (!delivery.is_current()) {
      delivery.join_unless_current();
    } else if (destroying) {
      // ~group inside a callback on the delivery thread: deliver the rest
      // here, then let the thread go.
      this->deliver_queue_here();
      delivery.join_or_orphan();
    } else {
      std::lock_guard<std::mutex> lk(this->service_mu_);
      this->delivery_ = std::move(delivery);  // it finishes the queue; the destructor joins it
    }
  }
  std::list<owned_thread> workers;
  {
    std::lock_guard<std::mutex> lk(workers_mu_);
    workers.splice(workers.end(), workers_);
  }
  for (auto it = workers.begin(); it != workers.end();) {
    if (destroying) {
      it->join_or_orphan();
    } else if (!it->join_unless_current()) {
      ++it;  // this very thread: kept for the destructor
      continue;
    }
    it = workers.erase(it);
  }
  if (!workers.empty()) {
    std::lock_guard<std::mutex> lk(workers_mu_);
    workers_.splice(workers_.end(), workers);
  }
}

}  // namespace singleflight::detail
