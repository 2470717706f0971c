// singleflight/detail/group/owned_thread.hpp -- internal; do not include directly.
//
// owned_thread: a thread the group starts and joins (its timer, its delivery
// thread, a thread_executor worker). The group hands user code to these
// threads (stop callbacks, on_done, resumptions, fn), and that code may call
// close() or destroy the group. So:
//   * close() on an owned thread never joins that thread (it would join
//     itself: std::system_error, then std::terminate on a noexcept path); it
//     leaves it to the destructor;
//   * the destructor on an owned thread detaches that thread and marks it
//     orphaned: when the user code returns, the thread sees the mark and
//     touches nothing of the group any more. The mark lives in a small shared
//     record (`home`) that outlives the group.
//
// How it relates to detail::worker_threads (worker_threads.hpp), the piece the
// cache, the batch loader and the fleet run their threads on: the same close
// rules -- close() on a library thread (an owned_thread of any group, or a
// worker_threads thread: detail/library_thread.hpp, which both mark) stops and rejects and waits
// for nothing, joining no thread; from outside it waits and joins; concurrent closers all wait (the
// group's join_mu_); no thread joins itself. It stays a thread of its own because the group also
// lets its destructor run on these threads (orphaning them, above), which worker_threads forbids,
// and because the group's timer and delivery threads are part of its model-checked schedule
// (tests/model/singleflight.pml), a pool is not. Not thread-safe by itself: the group serialises
// join/orphan calls.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include "../../task.hpp"
#include "../config.hpp"
#include "../library_thread.hpp"

namespace singleflight::detail {

class owned_thread {
 public:
  // Shared by the thread and its owner.
  struct home {
    // Written by the owner's destructor running *on this very thread* and
    // read by the thread afterwards: same thread, no synchronisation needed.
    bool orphaned = false;
    // Set when the body has returned (or unwound). Memory ordering: release,
    // so that a join decided on seeing it (acquire) happens after everything
    // the body did; join() itself synchronises too.
    std::atomic<bool> done{false};
  };

  owned_thread() noexcept = default;

  // owned_thread(loop, owner): starts `loop(owner, home&)` on a new thread (the group's timer
  // and delivery threads). owned_thread(tk): starts a thread that runs tk once (a
  // thread_executor worker). Both throw std::system_error when no thread can be started (or
  // bad_alloc), with nothing started; tk is then dropped.
  //
  // Neither is a template on the body: the thread's entry (its std::thread state) is compiled
  // once for every group type, and a group type adds one plain function per loop.
  using loop_fn = void (*)(void* owner, home& self);
  SINGLEFLIGHT_DECL owned_thread(loop_fn loop, void* owner);
  SINGLEFLIGHT_DECL explicit owned_thread(task tk);

  SINGLEFLIGHT_DECL owned_thread(owned_thread&&) noexcept;
  SINGLEFLIGHT_DECL owned_thread& operator=(owned_thread&&) noexcept;
  owned_thread(const owned_thread&) = delete;
  owned_thread& operator=(const owned_thread&) = delete;
  // Joined or orphaned by then (std::thread terminates otherwise).
  SINGLEFLIGHT_DECL ~owned_thread();

  bool started() const noexcept { return thread_.joinable(); }
  bool is_current() const noexcept { return started() && id_ == std::this_thread::get_id(); }
  bool finished() const noexcept { return home_ && home_->done.load(std::memory_order_acquire); }

  // Joins the thread unless it is the calling thread. Returns false (and
  // leaves the thread alone) when it is.
  SINGLEFLIGHT_DECL bool join_unless_current();

  // For the destructor: joins the thread, or, on the thread itself, detaches
  // it and marks it orphaned.
  SINGLEFLIGHT_DECL void join_or_orphan();

 private:
  struct started_tag {};
  // Starts body(home&) on a new thread. Defined, and instantiated, in the .ipp only.
  template <class F>
  owned_thread(started_tag, F body);

  std::shared_ptr<home> home_;
  std::thread thread_;
  std::thread::id id_;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/owned_thread.ipp"
#endif
