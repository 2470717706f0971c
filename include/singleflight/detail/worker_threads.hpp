// singleflight/detail/worker_threads.hpp -- internal; do not include directly.
//
// worker_threads: threads a layer owns to run its jobs off the caller's thread (the cache's
// background refreshes, the fleet's asynchronous flights). A job never waits behind another
// job while the pool may grow: post() wakes an idle thread or starts a new one, up to
// `max_threads` (0: no bound); at the bound a job queues until a thread is free. A thread idle
// for `idle_for` exits; finished threads are joined by the next post() or by close(). close()
// from outside joins them all; close() from one of them (a job calling close()) joins none
// and returns at once: joining another job's thread there would wait for that job (two jobs
// that both close would wait for each other forever). The destructor joins what is left.
//
// Locking: `mu_` guards the queue, the thread list and the counters. Jobs run without it.
// Thread safety: every member may be called from any thread, the destructor excepted (not
// concurrently with anything, and not on one of these threads).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

namespace singleflight::detail {

class worker_threads {
 public:
  // A unit of work. run() throws nothing but a forced unwind (pthread_exit in user code),
  // which ends its thread; a job destroyed without running (close() with jobs queued, post()
  // failing, that unwind) cleans up in its destructor.
  struct job {
    job() = default;
    job(const job&) = delete;
    job& operator=(const job&) = delete;
    virtual ~job() = default;
    virtual void run() = 0;
  };

  // make_job(f): a job that runs f() (f is moved in; whatever it owns dies with the job).
  template <class F>
  static std::unique_ptr<job> make_job(F&& f) {
    struct impl final : job {
      explicit impl(std::decay_t<F>&& fn) : f(std::move(fn)) {}
      void run() override { f(); }
      std::decay_t<F> f;
    };
    return std::make_unique<impl>(std::decay_t<F>(std::forward<F>(f)));
  }

  static constexpr std::chrono::seconds default_idle_for{10};

  explicit worker_threads(std::chrono::nanoseconds idle_for = default_idle_for,
                          std::size_t max_threads = 0) noexcept
      : idle_for_(idle_for), max_threads_(max_threads) {}
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  ~worker_threads() {
    close();
    // close() joins everything from outside; the destructor is never on one of the threads.
    std::list<worker> rest;
    {
      std::lock_guard<std::mutex> lk(mu_);
      rest.swap(workers_);
    }
    for (worker& w : rest) {
      if (w.thread.joinable()) w.thread.join();
    }
  }

  // post(j): runs `*j` soon on one of these threads and takes it (j is then null). Returns
  // false after close(), leaving `j` with the caller. Throws std::system_error when a thread
  // is needed and cannot be started, std::bad_alloc; `j` is then left with the caller too.
  bool post(std::unique_ptr<job>& j) {
    std::list<worker> done;
    {
      std::unique_lock<std::mutex> lk(mu_);
      reap(done);
      if (closing_) return false;
      queue_.push_back(std::move(j));
      if (idle_ >= queue_.size() || (max_threads_ != 0 && workers_.size() >= max_threads_)) {
        cv_.notify_one();  // an idle thread takes it, or the next thread to finish a job
      } else {
        try {
          workers_.emplace_back();
          worker& w = workers_.back();
          w.thread = std::thread([this, &w] { loop(w); });
        } catch (...) {
          workers_.pop_back();
          j = std::move(queue_.back());
          queue_.pop_back();
          throw;
        }
      }
    }
    for (worker& w : done) w.thread.join();
    return true;
  }

  // close(): no more jobs are accepted; the queued ones still run. Called from outside, it
  // joins every thread; called from one of these threads (a job), it joins none and does not
  // wait: the threads are joined by a later close() from outside or by the destructor.
  // Idempotent.
  void close() {
    std::list<worker> joinable;
    {
      std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      cv_.notify_all();
      const std::thread::id self = std::this_thread::get_id();
      for (const worker& w : workers_) {
        if (w.thread.get_id() == self) return;  // a job: joining another job's thread waits
      }
      joinable.swap(workers_);
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

  // The number of threads started and not yet joined (for tests and stats).
  std::size_t threads() const {
    std::lock_guard<std::mutex> lk(mu_);
    return workers_.size();
  }

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
        j.reset();  // whatever the job owned goes before the lock is retaken
        lk.lock();
      }
      if (closing_) break;
      ++idle_;
      const bool woke = cv_.wait_for(lk, idle_for_, [&] { return closing_ || !queue_.empty(); });
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

  const std::chrono::nanoseconds idle_for_;
  const std::size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<job>> queue_;
  std::list<worker> workers_;  // a list: a worker's address is stable for its thread
  std::size_t idle_ = 0;       // mu_: threads waiting for a job
  bool closing_ = false;       // mu_
};

}  // namespace singleflight::detail
