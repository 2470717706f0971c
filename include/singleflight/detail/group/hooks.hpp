// singleflight/detail/group/hooks.hpp -- internal; do not include directly.
//
// A test-only seam. Built with SINGLEFLIGHT_TEST_HOOKS defined, the group
// calls detail::hook(point) at the places where the order of two threads
// decides the outcome, always with the group's mutex released, so a test can
// park one thread there (on a gate) and run another schedule to completion
// first: the schedules of the seed documents and of peer bugs, reproduced
// step by step instead of by sleeping and hoping. In normal builds every hook
// compiles to nothing.
#pragma once

#if defined(SINGLEFLIGHT_TEST_HOOKS)
#include <atomic>
#endif

namespace singleflight::detail {

enum class hook_point {
  caller_entering,     // a caller hashed its key and is about to take the lock
  leader_fn_returned,  // fn returned; its runner has not yet taken the lock to finish
  caller_exiting,      // a caller's outcome is decided, the lock released, not yet delivered
  stop_requesting,     // a flight was stopped under the lock; request_stop() comes next
  timer_due,           // the timer found the earliest deadline passed; it settles next
  close_marking,       // close() marked shard 0 closed (only that one); the others next
  close_marked,        // close() marked the group closed, settled, stopped and notified
  observer_returning,  // an async observer was claimed; it attaches again next
  observer_relooking,  // a blocked caller's wait for a stopped fn ended; it looks again next
};

#if defined(SINGLEFLIGHT_TEST_HOOKS)
using hook_fn = void (*)(hook_point, const void* group);

// Memory ordering: tests install the hook before starting the threads that
// reach it (thread creation orders that), so acquire/release only matters
// for a hook swapped while threads run; it is enough for that.
inline std::atomic<hook_fn> test_hook{nullptr};

inline void hook(hook_point p, const void* group) {
  if (hook_fn h = test_hook.load(std::memory_order_acquire)) h(p, group);
}
#define SINGLEFLIGHT_HOOK(point) \
  ::singleflight::detail::hook(::singleflight::detail::hook_point::point, this)
// Opens a window with `lk` released, only in hook builds.
#define SINGLEFLIGHT_HOOK_UNLOCKED(lk, point) \
  do {                                        \
    (lk).unlock();                            \
    SINGLEFLIGHT_HOOK(point);                 \
    (lk).lock();                              \
  } while (false)
#else
#define SINGLEFLIGHT_HOOK(point) static_cast<void>(0)
#define SINGLEFLIGHT_HOOK_UNLOCKED(lk, point) static_cast<void>(0)
#endif

}  // namespace singleflight::detail
