// singleflight/thread_executor.hpp
//
// `singleflight::thread_executor`: the ready-made executor that runs each
// flight on a thread of its own, owned by the group.
#pragma once

#include "task.hpp"

namespace singleflight {

// thread_executor
//
// Set it as `options::executor` and the group runs every flight on a new
// `std::thread` that the group itself owns: finished threads are joined when
// the next flight starts, and `close()` (hence `~group()`) joins the rest, so
// no thread outlives the group. Callers never run `fn`; every caller, the
// first included, can leave at once on its stop_token.
//
//   singleflight::group<std::string, int> g{{.executor = singleflight::thread_executor{}}};
//
// It is a tag, not a callable: `options::executor` recognises the type
// itself, so it cannot be wrapped (in a lambda, a std::function) and silently
// lose the group's ownership of its threads. For a bounded number of threads
// shared by several groups, use `singleflight::thread_pool`.
//
// close() or ~group() called on one of these threads (from fn, on_done or a
// resumption the worker runs) never joins that thread: close() leaves it to
// the destructor, and the destructor detaches it.
struct thread_executor {
  template <class Task = task>
  void operator()(Task&&) const {
    static_assert(sizeof(Task) == 0,
                  "singleflight::thread_executor is not callable: set it as options::executor "
                  "directly (the group owns and joins its threads); to run tasks on threads of "
                  "your own, use singleflight::thread_pool or your own executor");
  }
};

}  // namespace singleflight
