// singleflight/task.hpp
//
// `singleflight::task` is the unit of work a group hands to
// `options::executor`: one flight's `fn`, wrapped so that running it publishes
// the outcome to the flight's waiters.
#pragma once

#include <cassert>
#include <memory>
#include <utility>

#include "detail/task_base.hpp"

namespace singleflight {

// task
//
// A move-only callable `void()`. An executor must do exactly one of:
//   * call it once (on any thread, now or later), or
//   * destroy it without calling it: the flight then fails for its waiters
//     with `singleflight::error` ("the executor dropped the task"), its entry
//     is removed, and `close()` does not wait for it.
// An executor that keeps a task forever makes `close()` wait forever.
//
// Thread safety: a task is a value; distinct tasks may run concurrently.
// Calling operator() on an empty (moved-from or already run) task is
// undefined; it asserts in debug builds.
// Exceptions: operator() never throws; whatever `fn` throws is captured and
// rethrown in the flight's waiters. (It is not declared noexcept so that fn
// may end its thread, pthread_exit-style: the forced unwind then passes
// through operator() after the flight has failed with abandoned_error. Call
// it where that is acceptable, i.e. not from a noexcept function.)
class task {
 public:
  task() noexcept = default;
  explicit task(std::unique_ptr<detail::task_base> body) noexcept : body_(std::move(body)) {}
  task(task&&) noexcept = default;
  task& operator=(task&&) noexcept = default;
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() = default;  // dropping an un-run body fails its flight (see above)

  // Runs the flight's body once and leaves this task empty.
  void operator()() {
    assert(body_ && "singleflight::task: called an empty task");
    const std::unique_ptr<detail::task_base> body = std::move(body_);
    body->run();
  }

  // True while the task holds a body that has not run.
  explicit operator bool() const noexcept { return static_cast<bool>(body_); }

 private:
  std::unique_ptr<detail::task_base> body_;
};

}  // namespace singleflight
