// singleflight/detail/fleet/fleet_workers.hpp -- internal; do not include directly.
//
// detail::fleet_workers: the threads on which a fleet runs the flights that
// async_get / co_get start (the Redis round trips, the waits for another
// process, the loader), so that those calls never block their caller. A job
// never waits behind another job: when no worker is idle, a new thread is
// started. Threads are kept (idle) until close(), so the pool's size is the
// peak number of concurrent async flights (at most one per key).
//
// Locking: `mu_` guards the queue, the thread list and the counters; jobs run
// without it.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace singleflight::detail {

// unique_job: a move-only `void()` (std::function needs copyable targets, and
// a job owns a completion<T>).
class unique_job {
  struct base {
    virtual ~base() = default;
    virtual void run() = 0;
  };
  template <class F>
  struct impl final : base {
    explicit impl(F&& fn) : f(std::move(fn)) {}
    void run() override { f(); }
    F f;
  };

 public:
  unique_job() noexcept = default;
  template <class F>
  requires(!std::is_same_v<std::decay_t<F>, unique_job>) explicit unique_job(F&& f)
      : p_(std::make_unique<impl<std::decay_t<F>>>(std::forward<F>(f))) {}

  void operator()() { p_->run(); }
  explicit operator bool() const noexcept { return static_cast<bool>(p_); }

 private:
  std::unique_ptr<base> p_;
};

class fleet_workers {
 public:
  fleet_workers() = default;
  fleet_workers(const fleet_workers&) = delete;
  fleet_workers& operator=(const fleet_workers&) = delete;
  ~fleet_workers() { close(); }

  // submit(job): runs `job` on a worker thread. Returns false (and drops
  // nothing: the job is left to the caller) after close(). Throws
  // std::system_error when a needed thread cannot be started, std::bad_alloc.
  // Thread-safe.
  bool submit(unique_job& job) {
    std::unique_lock<std::mutex> lk(mu_);
    if (closing_) return false;
    queue_.push_back(std::move(job));
    if (idle_ >= queue_.size()) {
      cv_.notify_one();
      return true;
    }
    try {
      threads_.emplace_back([this] { run(); });
    } catch (...) {
      job = std::move(queue_.back());
      queue_.pop_back();
      throw;
    }
    return true;
  }

  // on_worker(): is the calling thread one of this pool's? Thread-safe.
  bool on_worker() const {
    const auto me = std::this_thread::get_id();
    const std::lock_guard<std::mutex> lk(mu_);
    return std::any_of(threads_.begin(), threads_.end(),
                       [&](const std::thread& t) { return t.get_id() == me; });
  }

  // close(): no more jobs; the queued ones still run; joins every worker
  // but the calling thread (a worker closing its own pool, from a callback,
  // is joined by the next close(), the destructor). Idempotent.
  void close() noexcept {
    std::vector<std::thread> join;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      cv_.notify_all();
      const auto me = std::this_thread::get_id();
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (it->get_id() == me) {
          ++it;
        } else {
          join.push_back(std::move(*it));
          it = threads_.erase(it);
        }
      }
    }
    for (std::thread& t : join) t.join();
  }

  std::size_t threads() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return threads_.size();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      idle_ += 1;
      cv_.wait(lk, [&] { return closing_ || !queue_.empty(); });
      idle_ -= 1;
      if (queue_.empty()) return;  // closing, nothing left
      unique_job job = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      job();
      job = unique_job();  // whatever the job owned goes before the lock is retaken
      lk.lock();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<unique_job> queue_;      // guarded by mu_
  std::vector<std::thread> threads_;  // guarded by mu_
  std::size_t idle_ = 0;              // guarded by mu_: workers waiting for a job
  bool closing_ = false;              // guarded by mu_
};

}  // namespace singleflight::detail
