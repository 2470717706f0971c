// singleflight/detail/library_thread.hpp -- internal; do not include directly.
//
// library_thread: the one answer to "is the calling thread one the library started?", which
// every close() consults. A thread is the library's when a group started it (its timer, its
// delivery thread, a thread_executor worker: detail/group/owned_thread.hpp) or a
// worker_threads started it (the cache's loads and refreshes, the batch loader's window and
// bulk calls, the fleet's subscriber, renewer and asynchronous flights:
// detail/worker_threads.hpp). Such a thread may be waited on by an outside closer of the
// object that owns it, so a close() it calls -- of any group, cache, batch loader or fleet --
// stops and rejects and waits for nothing (docs/threads.md). One mark for both kinds, so a
// layer cannot ask about one kind and miss the other: a cache closed from a group's delivery
// thread, or a group closed from a cache's worker, both return at once.
//
// The mark is set once, first thing on the thread, and never cleared: the thread runs
// nothing but the library's loop until it exits.
//
// Locking: none; the mark is the calling thread's own. Like every thread_local of a
// header-only library it is one per shared object under -fvisibility=hidden: a thread started
// by the library in one shared object reads as foreign in another (it then waits, as an
// outside closer does).
#pragma once

#include "config.hpp"

namespace singleflight::detail {

class library_thread {
 public:
  // Marks the calling thread as the library's, for the rest of its life.
  SINGLEFLIGHT_DECL static void mark() noexcept;
  // Whether the calling thread was started by the library (a group or a worker_threads).
  SINGLEFLIGHT_DECL static bool current() noexcept;

 private:
  static inline thread_local bool mark_ = false;
};

// on_library_thread(): see above. The predicate every layer's close() uses.
SINGLEFLIGHT_DECL bool on_library_thread() noexcept;

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/library_thread.ipp"
#endif
