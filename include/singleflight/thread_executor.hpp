// singleflight/thread_executor.hpp
//
// `singleflight::thread_executor`: the ready-made executor that runs each
// flight on a thread of its own.
#pragma once

#include <thread>
#include <utility>

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
// The group recognises this type inside the std::function and bypasses
// operator(). Called directly (outside a group) it starts a detached thread,
// which nothing joins: prefer a real thread pool there.
//
// Thread safety: stateless. Exceptions: std::system_error when no thread can
// be started; the group then fails that flight with this exception.
struct thread_executor {
  void operator()(task t) const { std::thread(std::move(t)).detach(); }
};

}  // namespace singleflight
