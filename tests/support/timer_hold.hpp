// tests/support/timer_hold.hpp: a deadline that cannot pass before the test's fn starts.
//
// With an executor, a flight's task may still be queued when its deadline
// passes; the flight then settles with timeout_error and its task never calls
// fn (nobody wants the work any more). A test whose subject is "fn is running
// and ignores its token" must not depend on the executor's thread starting
// within the timeout: on a loaded machine under a sanitizer it may not.
//
// hold_timer parks every group's deadline timer at the timer_due hook (the
// timer has seen a deadline pass and is about to settle it, no lock held)
// until the given gate opens; the test opens it from inside fn. The wait is
// bounded like every gate wait. Needs SINGLEFLIGHT_TEST_HOOKS defined before
// the first singleflight include of the test file. One hold_timer at a time.
#pragma once

#ifndef SINGLEFLIGHT_TEST_HOOKS
#error \
    "tests/support/timer_hold.hpp needs SINGLEFLIGHT_TEST_HOOKS defined before including singleflight"
#endif

#include <singleflight/group.hpp>

#include <atomic>

#include "sync.hpp"

namespace sftest {

class hold_timer {
 public:
  // Holds the timer until `until` opens. Install before the call whose
  // deadline it holds; the hook is removed when this object is destroyed.
  explicit hold_timer(const gate& until) {
    held_.store(&until, std::memory_order_release);
    singleflight::detail::test_hook.store(&on_hook, std::memory_order_release);
  }
  ~hold_timer() {
    singleflight::detail::test_hook.store(nullptr, std::memory_order_release);
    held_.store(nullptr, std::memory_order_release);
  }
  hold_timer(const hold_timer&) = delete;
  hold_timer& operator=(const hold_timer&) = delete;

 private:
  static void on_hook(singleflight::detail::hook_point p, const void*) {
    if (p != singleflight::detail::hook_point::timer_due) return;
    if (const gate* g = held_.load(std::memory_order_acquire))
      g->wait("timer held until fn started");
  }
  // The gate outlives the hook's window: the destructor removes the hook
  // first. A timer already inside on_hook holds a gate that the test opened.
  static inline std::atomic<const gate*> held_{nullptr};
};

}  // namespace sftest
