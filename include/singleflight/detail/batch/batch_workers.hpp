// singleflight/detail/batch/batch_workers.hpp -- internal; do not include directly.
//
// batch_workers: the threads a batch_loader owns to run its bulk calls when
// no executor is given. Elastic: a task goes to an idle worker, or to a new
// one when none is idle, so a slow bulk call never holds back the next batch;
// idle workers wait for the next task until stop_and_join(). There are never
// more workers than bulk calls that ran at once (bounded by
// batch_options::max_in_flight_batches when it is set).
//
// Locking: `m_` guards the queue, the idle count, the thread list and the
// stop flag; tasks run without it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../../task.hpp"
#include "../group/owned_thread.hpp"

namespace singleflight::detail {

class batch_workers {
 public:
  batch_workers() = default;
  batch_workers(const batch_workers&) = delete;
  batch_workers& operator=(const batch_workers&) = delete;
  // Joins what stop_and_join() left (a worker that called it). Must not run
  // on a worker.
  ~batch_workers() {
    stop_and_join();
    for (auto& w : threads_) w.join_or_orphan();
  }

  // run(t): t runs on a worker, soon. When no worker is idle and no thread
  // can be started, t waits for a busy one; with no worker at all, t is
  // destroyed unrun (its owner fails the batch). After stop_and_join(), t is
  // destroyed unrun. Thread-safe.
  void run(task t) {
    std::unique_lock<std::mutex> lk(m_);
    if (stopping_) {
      lk.unlock();
      return;  // t destroyed unrun, without the lock
    }
    queue_.push_back(std::move(t));
    if (idle_ >= queue_.size()) {
      cv_.notify_one();
      return;
    }
    try {
      threads_.emplace_back([this](owned_thread::home&) { work(); });
    } catch (const std::system_error&) {
      if (threads_.empty()) {
        task dropped = std::move(queue_.back());
        queue_.pop_back();
        lk.unlock();
        return;  // dropped here, without the lock
      }
    }
  }

  // stop_and_join(): no more tasks; joins every worker but the calling one
  // (a worker that calls it finishes its task, then exits; the destructor
  // joins it). Tasks still queued are destroyed unrun. Idempotent.
  // Thread-safe.
  void stop_and_join() {
    std::deque<task> left;
    std::vector<owned_thread> joinable;
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
      left.swap(queue_);
      cv_.notify_all();
      for (auto& w : threads_) {
        if (!w.is_current()) joinable.push_back(std::move(w));
      }
      std::erase_if(threads_, [](const owned_thread& w) { return !w.started(); });
    }
    left.clear();
    for (auto& w : joinable) (void)w.join_unless_current();
  }

  // Whether the calling thread is one of the workers. Thread-safe.
  bool is_worker() const {
    std::lock_guard<std::mutex> lk(m_);
    for (const auto& w : threads_) {
      if (w.is_current()) return true;
    }
    return false;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping
      task t = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      t();
      lk.lock();
    }
  }

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<owned_thread> threads_;
};

}  // namespace singleflight::detail
