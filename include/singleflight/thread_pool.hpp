// singleflight/thread_pool.hpp
//
// `singleflight::thread_pool`: a fixed number of threads with an optionally
// bounded queue, as an executor for one group or many.
//
//   singleflight::thread_pool pool(4);
//   singleflight::options o;
//   o.executor = pool.executor();
//   singleflight::group<std::string, profile> profiles(o);
//
// Locking: one std::mutex per pool guards its queue; tasks run without it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "detail/algorithm.hpp"
#include "errors.hpp"
#include "executor.hpp"
#include "task.hpp"

namespace singleflight {

// thread_pool
//
// `threads` threads (at least one) take tasks from one FIFO queue. With
// `max_queued` > 0 a task submitted while that many are waiting is refused:
// the executor throws overloaded_error, which fails that flight for its
// waiters (see options::executor); 0 means unbounded.
//
// The pool belongs to you, not to the groups using it: a group's close()
// never joins pool threads, so close() or ~group() may run on a pool thread
// (from fn, on_done or a resumption). Destroy the pool after the groups that
// use it (or at least after they are closed); a task submitted to a pool
// that has shut down is refused with closed_error.
//
// A pool thread that blocks (an fn waiting for its origin, an on_done calling
// a blocking do_) holds one of the `threads`: with every thread blocked on
// flights queued behind them, nothing progresses. Size the pool for the
// blocking you allow, or keep fns and callbacks non-blocking.
//
// Thread safety: executor(), queued() and shutdown() may be called from any
// thread; the destructor must not race other members.
class thread_pool {
 public:
  explicit thread_pool(std::size_t threads, std::size_t max_queued = 0)
      : state_(std::make_shared<state>(max_queued)) {
    threads = std::max<std::size_t>(threads, 1);
    workers_.reserve(threads);
    try {
      for (std::size_t i = 0; i < threads; ++i) {
        workers_.emplace_back([s = state_] { s->work(); });
      }
    } catch (...) {
      shutdown();
      throw;
    }
  }

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  // ~thread_pool(): shutdown(). On one of the pool's own threads, that
  // thread is detached instead of joined (it finishes the queue and exits).
  ~thread_pool() { shutdown(); }

  // executor(): hands each task to this pool. Copies share the pool; they
  // keep its queue (not its threads) alive, so a task submitted after
  // shutdown is refused rather than lost.
  singleflight::executor executor() const {
    return singleflight::executor([s = state_](task t) { s->submit(std::move(t)); });
  }

  // shutdown(): refuses new tasks, lets the threads run every queued task,
  // then joins them (except the calling thread, if it is one of them).
  // Idempotent.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(state_->m);
      state_->stopping = true;
    }
    state_->cv.notify_all();
    const auto me = std::this_thread::get_id();
    for (std::thread& t : workers_) {
      if (!t.joinable()) continue;
      if (t.get_id() == me) {
        t.detach();
      } else {
        t.join();
      }
    }
  }

  // queued(): tasks waiting for a thread now.
  std::size_t queued() const {
    std::lock_guard<std::mutex> lk(state_->m);
    return state_->q.size();
  }

  std::size_t size() const noexcept { return workers_.size(); }

 private:
  struct state {
    explicit state(std::size_t limit) : max_queued(limit) {}
    std::mutex m;
    std::condition_variable cv;
    std::deque<task> q;  // guarded by m
    bool stopping = false;
    std::size_t max_queued;

    void submit(task t) {
      {
        std::lock_guard<std::mutex> lk(m);
        if (stopping) throw closed_error("singleflight::thread_pool: the pool has shut down");
        if (max_queued != 0 && q.size() >= max_queued)
          throw overloaded_error("singleflight::thread_pool: the queue is full");
        q.push_back(std::move(t));
      }
      cv.notify_one();
    }

    void work() {
      for (;;) {
        task t;
        {
          std::unique_lock<std::mutex> lk(m);
          cv.wait(lk, [this] { return stopping || !q.empty(); });
          if (q.empty()) return;  // stopping, and nothing left to run
          t = std::move(q.front());
          q.pop_front();
        }
        t();
      }
    }
  };

  std::shared_ptr<state> state_;
  std::vector<std::thread> workers_;
};

}  // namespace singleflight
