// singleflight/detail/resume_gate.hpp -- internal; do not include directly.
//
// resume_gate: who resumes a coroutine suspended on an operation that may complete on
// another thread before, during or after await_suspend. Every awaitable of the library
// (group::co_do, cache::co_get, fleet::co_get) runs the same three steps:
//
//   await_suspend(h):  gate.arm(h); start the operation; return gate.suspend();
//   completing thread: write the outcome; gate.complete();
//
// Two parties exchange one byte: whoever comes second does the resuming. When the
// operation completes before suspend(), suspend() returns false and the awaiting thread
// goes on without suspending (nobody calls resume); otherwise complete() resumes it, on
// the completing thread.
//
// Memory ordering: acq_rel on both exchanges. The release of complete()'s exchange
// publishes the outcome written before it to the awaiting thread when that one reads
// `ready` (it then does not suspend and reads the outcome itself); the release of
// suspend()'s exchange publishes `handle_` (written by arm()) to the completing thread,
// which reads it only after its acquire has seen `suspended`.
//
// Thread safety: arm() and suspend() on the awaiting thread, in that order; complete() once,
// on any thread. Not movable: the completing side refers to it by address.
#pragma once

#include <atomic>
#include <coroutine>

namespace singleflight::detail {

class resume_gate {
 public:
  resume_gate() noexcept = default;
  resume_gate(const resume_gate&) = delete;
  resume_gate& operator=(const resume_gate&) = delete;
  ~resume_gate() = default;

  // arm(h): the coroutine complete() will resume. Before the operation starts.
  void arm(std::coroutine_handle<> h) noexcept { handle_ = h; }

  // suspend(): after the operation started; the last touch of the gate by the awaiting
  // thread. True: suspend (complete() resumes it). False: the operation already completed;
  // do not suspend.
  bool suspend() noexcept { return phase_.exchange(suspended, std::memory_order_acq_rel) != ready; }

  // complete(): once, after the outcome is written. Resumes the coroutine, on this thread,
  // if it has suspended; otherwise leaves it to suspend() to find the outcome.
  void complete() noexcept {
    if (phase_.exchange(ready, std::memory_order_acq_rel) == suspended) handle_.resume();
  }

 private:
  enum : unsigned char { starting, suspended, ready };
  std::coroutine_handle<> handle_;
  std::atomic<unsigned char> phase_{starting};
};

}  // namespace singleflight::detail
