// bench/support/crew.hpp: the benchmarks' thread crew.
//
// Owns: a pool of parked threads (small stacks, 256 KiB) that run one job per round. Created
// once per binary and reused, so thread creation never lands in a measurement; each worker has
// its own semaphore, so a round wakes only its own workers. Lock: mu_ guards remaining_; job_
// is written by the starting thread before the round's semaphore releases (which order it
// before every worker's read) and is not touched again until the round is over.
//
// Used by bench_group (bursts of blocked callers, joins) and bench_async (do_ waiters). One
// round at a time: start() and run() must not be called while a round is still running.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <semaphore>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sfbench {

class crew {
 public:
  // Starts n parked threads; aborts the process when one cannot be created.
  explicit crew(int n) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<worker>());
      worker& w = *workers_.back();
      w.c = this;
      w.index = i;
      if (pthread_create(&w.thread, &attr, &crew::entry, &w) != 0) {
        std::fprintf(stderr, "crew: pthread_create failed at %d\n", i);
        std::abort();
      }
    }
    pthread_attr_destroy(&attr);
  }

  // Starts job(i) on workers 0..n-1; returns at once. Throws std::invalid_argument when the
  // crew has fewer than n workers.
  void start(int n, std::function<void(int)> job) {
    if (n > static_cast<int>(workers_.size())) throw std::invalid_argument("crew too small");
    job_ = std::move(job);
    {
      std::lock_guard<std::mutex> lk(mu_);
      remaining_ = n;
    }
    for (int i = 0; i < n; ++i) workers_[static_cast<std::size_t>(i)]->go.release();
  }
  // Waits until every job of the current round has returned.
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return remaining_ == 0; });
  }
  // Waits (bounded) until every job of the current round has returned; false on time-out.
  bool wait_for(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lk(mu_);
    return done_cv_.wait_for(lk, limit, [&] { return remaining_ == 0; });
  }
  // start(n, job), then wait().
  void run(int n, std::function<void(int)> job) {
    start(n, std::move(job));
    wait();
  }

  crew(const crew&) = delete;
  crew& operator=(const crew&) = delete;
  // Releases and joins every worker (after the last round has finished).
  ~crew() {
    quit_ = true;
    for (auto& w : workers_) w->go.release();
    for (auto& w : workers_) pthread_join(w->thread, nullptr);
  }

 private:
  struct worker {
    crew* c = nullptr;
    int index = 0;
    pthread_t thread{};
    std::binary_semaphore go{0};
  };
  static void* entry(void* p) {
    auto* w = static_cast<worker*>(p);
    w->c->loop(*w);
    return nullptr;
  }
  void loop(worker& w) {
    for (;;) {
      w.go.acquire();
      if (quit_) return;
      job_(w.index);
      std::lock_guard<std::mutex> lk(mu_);
      if (--remaining_ == 0) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::function<void(int)> job_;  // written before the round's releases
  int remaining_ = 0;             // guarded by mu_
  std::atomic<bool> quit_{false};
  std::vector<std::unique_ptr<worker>> workers_;
};

}  // namespace sfbench
