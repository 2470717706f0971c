// singleflight/detail/group/deadlines.hpp -- internal; do not include directly.
//
// deadlines: the group's timer and delivery threads. Not a template: nothing
// here depends on the group's Key or T (it reaches flights and waiters through
// flight_base and the shard set), so it is compiled once whatever the number
// of group types. The timer is started by flight_table's constructor (once the
// user's Hash and KeyEqual exist) or by ensure_timer().
//   * The timer (started when options.timeout > 0) settles flights whose
//     deadline passed, and times out async observers whose bound ran out, one
//     shard at a time. It runs no callback and no resumption (one that
//     blocked there would hold back every other deadline): it stops the
//     settled flights' tokens (fn's stop callbacks run here, as on any
//     thread that requests a stop), then wakes blocked waiters, then hands
//     async waiters, and the settles to report to options.tracer, to the
//     delivery thread.
//   * The delivery thread (started the first time it is needed) runs those
//     callbacks and resumptions, one batch after another; also those of an
//     inline leader's stop (see blocking_calls.hpp). A callback that blocks
//     there delays the next deliveries, never a deadline.
// Both are owned threads (owned_thread.hpp): never joined by themselves, and
// orphaned if the group is destroyed by code they run.
//
// Locking: the delivery queue and the threads' handles are guarded by
// service_mu_ (taken after a shard's lock, never before one); the deadline
// lists by their shard's lock; the timer's sleep by the timer gate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

#include "blocking_waiters.hpp"
#include "hooks.hpp"
#include "notification.hpp"
#include "observers.hpp"
#include "owned_thread.hpp"

namespace singleflight::detail {

class deadlines : public notifier {
  using base = notifier;

 public:
  using kind = outcome_kind;

  // Starts no thread: the timer is started by ensure_timer() (flight_table's constructor, once
  // the user's Hash and KeyEqual are constructed, when options.timeout > 0).
  explicit deadlines(options opts) : base(std::move(opts)) {}

 protected:
  // Hands a batch of async waiters of shard s to the delivery thread,
  // starting it the first time. False when it cannot (the group's threads
  // are stopping, or no thread could be started): the caller then delivers
  // them itself.
  bool queue_delivery(shard& s, wake_batch& batch) noexcept {
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

  // Ends (under s's lock) a wait whose bound ran out; `now` passed it. A
  // leaving waiter has unlinked itself; a claimed one has its outcome.
  //   * an async observer: claimed, delivered timeout_error (a rejection);
  //   * an async follower or leader (its own wait_bound): it leaves the flight
  //     as on its stop (ownership accounting), delivered timeout_error;
  //   * a blocked inline leader (its own wait_bound): it is running fn, so it
  //     leaves the flight here, as its stop callback would; it returns
  //     timeout_error once fn returns.
  // Returns the flight to stop, if leaving stopped it.
  flight_base* bound_expired(shard& s, bounded_wait& n, wake_batch& wake,
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

  // Links n's bound (the one that applies as an observer or not, see
  // bounded_wait::bound) in shard s, if it has one. Under s's lock.
  void link_bound(shard& s, bounded_wait& n, bool as_observer) noexcept {
    if (as_observer && !n.observe_until && this->opts().timeout > std::chrono::nanoseconds::zero())
      n.observe_until = after(steady::now(), this->opts().timeout);
    if (const auto* d = n.bound(as_observer)) {
      s.bounds.link(n);
      this->gate().linked(*d);
    }
  }

  // Starts the timer if it is not running yet (a call with a wait_bound in a
  // group without options.timeout). Throws std::system_error when no thread
  // can be started; does nothing once the group's threads are stopping.
  void ensure_timer() {
    std::lock_guard<std::mutex> lk(service_mu_);
    if (timer_.started() || timer_stopped_) return;
    timer_ = owned_thread(&deadlines::timer_entry, this);
  }

  // ---- for lifecycle (join) -----------------------------------------------

  std::mutex service_mu_;       // guards what follows
  owned_thread timer_;          // started in the constructor or by ensure_timer()
  bool timer_stopped_ = false;  // join_threads() took the timer: no new one
  owned_thread delivery_;       // started under service_mu_
  bool delivery_stop_ = false;  // no more batches: finish the queue and exit
  std::deque<std::pair<shard*, wake_batch>> delivery_q_;
  std::condition_variable delivery_cv_;

  // Delivers what is queued, here (the destructor on the delivery thread).
  void deliver_queue_here() noexcept {
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

 private:
  // The threads' entries (owned_thread::loop_fn): the one piece of each thread's start that
  // depends on the group's type.
  static void timer_entry(void* self, owned_thread::home& h) {
    static_cast<deadlines*>(self)->timer_loop(h);
  }
  static void delivery_entry(void* self, owned_thread::home& h) {
    static_cast<deadlines*>(self)->delivery_loop(h);
  }

  void timer_loop(owned_thread::home& self) {
    for (;;) {
      this->gate().scanning();
      auto next = steady::time_point::max();
      for (std::size_t i = 0; i < this->shard_count(); ++i) {
        if (!expire(this->shard_at(i), self, next)) return;  // orphaned
      }
      if (!this->gate().sleep_until(next)) return;
    }
  }

  // Settles shard s's flights whose deadline passed and times out its async
  // observers whose bound ran out; lowers `next` to the shard's next
  // deadline. False when the group was destroyed meanwhile (by a stop
  // callback run here): the thread must touch nothing of it any more.
  bool expire(shard& s, owned_thread::home& self, steady::time_point& next) {
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

  void delivery_loop(owned_thread::home& self) {
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

 public:
  // Stops every collected flight, then releases it; call without any lock.
  static void stop_all(flight_base* head) noexcept {
    while (head != nullptr) {
      flight_base* f = head;
      head = f->stop_next;
      f->stop_next = nullptr;
      f->stop.request_stop();
      f->release();
    }
  }
};

}  // namespace singleflight::detail
