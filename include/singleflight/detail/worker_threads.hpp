// singleflight/detail/worker_threads.hpp -- internal; do not include directly.
//
// worker_threads: the threads a layer owns to run its work off the caller's thread (the
// cache's background refreshes, the batch loader's window and bulk calls, the fleet's
// asynchronous flights), and the one protocol by which they are shut down.
//
// Threads. post() wakes an idle thread or starts a new one, up to `max_threads` per object
// (default_max_threads = 64, the fleet's max_async_threads; 0: no bound); at the bound a job
// queues until a thread is free. A thread idle for `idle_for` exits; finished threads are
// joined by the next post() or by close().
//
// Submission. post() / try_post() report a refusal (closed, or no thread could be started)
// to the caller, on the caller's own path, and leave the job with it: a refused job is never
// run or failed on one of these threads.
//
// Close. close() is idempotent and thread-safe; after it no job is accepted, the queued ones
// still run.
//   * From a library thread (detail/library_thread.hpp) -- a thread of this object, of any
//     other worker_threads, or of any group (a job: a refresh loader, a bulk function, a
//     delivery callback run there; a group's fn, timer or delivery thread) -- it stops and
//     rejects, and returns at once: it joins nothing and waits for nothing. A library thread
//     may be waited on by an outside closer of its own object, so it must never wait for
//     another library thread: jobs of two objects that close each other (or each its own)
//     all return.
//   * From any other thread it returns once every thread this object started has been
//     joined. Concurrent closers all wait; each thread is joined by exactly one of them (or
//     by a post() that reaps it), the others wait until that join is done.
//   * The destructor closes and waits like an outside close(), from any thread but one of
//     this object's own (which would join itself: it aborts with a message instead).
// So no thread joins itself, and no library thread joins or waits for a thread that may be
// waiting on it. tests/model/worker_threads.pml checks this protocol (tests/model/README.md).
//
// owned_thread (detail/group/owned_thread.hpp) stays separate: the group lets its destructor
// run on its own threads (it orphans them), a protocol this one forbids. Its close follows the
// same rules: on an owned_thread or a thread of this piece the group's close() waits for nothing
// (detail/group/lifecycle.hpp). The batch loader's window thread, the fleet's subscriber and
// renewer are each one long-running job on a worker_threads instead.
//
// Locking: `mu_` guards the queue, the thread list and the counters. Jobs run without it.
// Thread safety: every member may be called from any thread, the destructor excepted (not
// concurrently with anything, and not on one of this object's threads).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "../errors.hpp"
#include "chrono.hpp"
#include "config.hpp"
#include "library_thread.hpp"

namespace singleflight::detail {

class worker_threads {
 public:
  // A unit of work. run() throws nothing but a forced unwind (pthread_exit in user code),
  // which ends its thread; a job destroyed without running (post() refusing, that unwind)
  // cleans up in its destructor.
  struct job {
    job() = default;
    job(const job&) = delete;
    job& operator=(const job&) = delete;
    SINGLEFLIGHT_DECL virtual ~job();
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
  // The default bound on threads per object (as fleet_options::max_async_threads).
  static constexpr std::size_t default_max_threads = 64;

  SINGLEFLIGHT_DECL explicit worker_threads(std::chrono::nanoseconds idle_for = default_idle_for,
                                            std::size_t max_threads = default_max_threads) noexcept;
  worker_threads(const worker_threads&) = delete;
  worker_threads& operator=(const worker_threads&) = delete;
  // Closes and waits like an outside close(); aborts with a message on one of this object's
  // own threads (it would join itself).
  SINGLEFLIGHT_DECL ~worker_threads();

  // post(j): runs `*j` soon on one of these threads and takes it (j is then null). Returns
  // false after close(), leaving `j` with the caller. Throws std::system_error when a thread
  // is needed and cannot be started, std::bad_alloc; `j` is then left with the caller too.
  SINGLEFLIGHT_DECL bool post(std::unique_ptr<job>& j);

  // try_post(j): post() that reports a refusal instead of throwing it: null when `j` was
  // taken, else why not (closed_error after close(), the std::system_error or bad_alloc of
  // a thread that could not start), `j` then left with the caller.
  SINGLEFLIGHT_DECL std::exception_ptr try_post(std::unique_ptr<job>& j) noexcept;

  // close(): see the top of this file. Idempotent.
  SINGLEFLIGHT_DECL void close();

  // stop(): close() that waits for nothing, from any thread: no job is accepted from here on,
  // the queued ones still run, and no thread is joined (a later close() or the destructor
  // joins them). For a closer that may hold up one of these threads by waiting: the cache's
  // close() from inside one of its asynchronous loads' publication (cache_calls.hpp).
  SINGLEFLIGHT_DECL void stop();

  SINGLEFLIGHT_DECL bool closed() const;

  // on_own_thread(): whether the caller is one of this object's threads.
  SINGLEFLIGHT_DECL bool on_own_thread() const noexcept;

  // The number of threads started and not yet joined (for tests and stats).
  SINGLEFLIGHT_DECL std::size_t threads() const;

  std::size_t max_threads() const noexcept { return max_threads_; }

 private:
  struct worker {
    std::thread thread;
    bool finished = false;  // mu_: its loop has returned; join() will not block
  };

  // A job may end its thread (pthread_exit in user code): the forced unwind passes through
  // here (not noexcept: that would terminate) with the lock released, and `ended` marks the
  // thread finished so that post() or close() joins it.
  SINGLEFLIGHT_DECL void loop(worker& self);

  // join_all(lk): claims every thread not yet claimed and joins it without the lock, then
  // waits until the threads other joiners claimed are joined too. Not on a library thread
  // (it would wait for one), nor before closing_ (threads could still start).
  SINGLEFLIGHT_DECL void join_all(std::unique_lock<std::mutex>& lk);

  // Moves finished workers to `out` (counted in joining_), to be joined without the lock.
  SINGLEFLIGHT_DECL void reap_locked(std::list<worker>& out);
  SINGLEFLIGHT_DECL void join_reaped(std::list<worker>& done);

  // The worker_threads whose thread this is (null on any other thread).
  static inline thread_local const worker_threads* current_ = nullptr;

  const std::chrono::nanoseconds idle_for_;
  const std::size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;         // threads wait for a job
  std::condition_variable joined_cv_;  // closers wait for joins others make
  std::deque<std::unique_ptr<job>> queue_;
  std::list<worker> workers_;  // a list: a worker's address is stable for its thread
  std::size_t idle_ = 0;       // mu_: threads waiting for a job
  std::size_t joining_ = 0;    // mu_: threads claimed by a joiner, not yet joined
  bool closing_ = false;       // mu_
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/worker_threads.ipp"
#endif
