// singleflight/detail/cache/refresh_threads.hpp -- internal; do not include directly.
//
// refresh_threads: the threads singleflight::cache owns to run background
// refreshes when its flights have no executor. A refresh must never run on
// the reader that triggered it (the hit path does not wait), and a hung
// refresh must not hold back the others, so a job never waits behind
// another: post() wakes an idle thread or starts a new one. A thread idle for
// `idle_for` exits; finished threads are joined by the next post() or by
// close(). close() joins them all, except the calling thread when it is one of
// them (a loader or callback calling close()); the destructor joins that one.
//
// Locking: `mu_` guards the queue and the thread list. Jobs run without it.
// Thread safety: every member may be called from any thread, the destructor
// excepted (not concurrently with anything, and not on one of these threads).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace singleflight::detail {

class refresh_threads {
 public:
  // A unit of work. run() throws nothing but a forced unwind (pthread_exit in
  // a loader), which ends its thread; a job destroyed without running (close
  // with jobs queued, post() failing, that unwind) cleans up in its destructor.
  struct job {
    job() = default;
    job(const job&) = delete;
    job& operator=(const job&) = delete;
    virtual ~job() = default;
    virtual void run() = 0;
  };

  refresh_threads() = default;
  refresh_threads(const refresh_threads&) = delete;
  refresh_threads& operator=(const refresh_threads&) = delete;
  ~refresh_threads() {
    close();
    // close() left a thread unjoined only if called on it; we are not on it now.
    std::list<worker> rest;
    {
      std::lock_guard<std::mutex> lk(mu_);
      rest.swap(workers_);
    }
    for (worker& w : rest) {
      if (w.thread.joinable()) w.thread.join();
    }
  }

  // post(j): runs `j` soon on one of these threads. Throws std::system_error
  // when a thread is needed and cannot be started (then `j` is destroyed
  // without running), and does nothing but destroy `j` after close().
  void post(std::unique_ptr<job> j) {
    std::list<worker> done;
    {
      std::unique_lock<std::mutex> lk(mu_);
      reap(done);
      if (closing_) return;  // `j` dies here, unrun
      queue_.push_back(std::move(j));
      if (idle_ > queue_.size() - 1) {
        cv_.notify_one();
      } else {
        try {
          workers_.emplace_back();
          worker& w = workers_.back();
          w.thread = std::thread([this, &w] { loop(w); });
        } catch (...) {
          workers_.pop_back();
          std::unique_ptr<job> unrun = std::move(queue_.back());
          queue_.pop_back();
          lk.unlock();
          throw;
        }
      }
    }
    for (worker& w : done) w.thread.join();
  }

  // close(): no more jobs are accepted; waits for the queued and running
  // ones and joins the threads, except the calling thread if it is one of
  // them. Idempotent.
  void close() {
    std::list<worker> joinable;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      cv_.notify_all();
      const std::thread::id self = std::this_thread::get_id();
      for (auto it = workers_.begin(); it != workers_.end();) {
        auto next = std::next(it);
        if (it->thread.get_id() != self) joinable.splice(joinable.end(), workers_, it);
        it = next;
      }
    }
    for (worker& w : joinable) {
      if (w.thread.joinable()) w.thread.join();
    }
  }

  // on_own_thread(): whether the caller is one of these threads.
  bool on_own_thread() const {
    std::lock_guard<std::mutex> lk(mu_);
    const std::thread::id self = std::this_thread::get_id();
    for (const worker& w : workers_) {
      if (w.thread.get_id() == self) return true;
    }
    return false;
  }

  // The number of threads started and not yet joined (for tests).
  std::size_t threads() const {
    std::lock_guard<std::mutex> lk(mu_);
    return workers_.size();
  }

  // How long an idle thread waits for work before it exits.
  static constexpr std::chrono::seconds idle_for{10};

 private:
  struct worker {
    std::thread thread;
    bool finished = false;  // mu_: its loop has returned; join() will not block
  };

  void loop(worker& self) noexcept {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      while (!queue_.empty()) {
        std::unique_ptr<job> j = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        j->run();
        j.reset();
        lk.lock();
      }
      if (closing_) break;
      ++idle_;
      const bool woke = cv_.wait_for(lk, idle_for, [&] { return closing_ || !queue_.empty(); });
      --idle_;
      if (!woke) break;
    }
    self.finished = true;
  }

  // Moves finished workers to `out`, to be joined without the lock.
  void reap(std::list<worker>& out) {
    for (auto it = workers_.begin(); it != workers_.end();) {
      auto next = std::next(it);
      if (it->finished) out.splice(out.end(), workers_, it);
      it = next;
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<job>> queue_;
  std::list<worker> workers_;  // a list: a worker's address is stable for its thread
  std::size_t idle_ = 0;
  bool closing_ = false;
};

}  // namespace singleflight::detail
