// singleflight/detail/task_base.hpp -- internal; do not include directly.
#pragma once

namespace singleflight::detail {

// task_base
//
// What a `singleflight::task` owns: one flight's body. `run()` executes it;
// destroying a task_base whose run() was never called reports the flight as
// dropped (the flight fails rather than stranding its waiters).
class task_base {
 public:
  task_base() = default;
  task_base(const task_base&) = delete;
  task_base& operator=(const task_base&) = delete;
  virtual ~task_base() = default;

  // Runs the body exactly once. Throws nothing: the body's outcome, value or
  // exception, is delivered to the flight's waiters. Not declared noexcept
  // only so that a forced unwind (fn ending its thread with pthread_exit or
  // pthread_cancel) can pass through, after the flight has been failed.
  virtual void run() = 0;
};

}  // namespace singleflight::detail
