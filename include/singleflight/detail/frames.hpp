// singleflight/detail/frames.hpp -- internal; do not include directly.
#pragma once

#include <cstddef>

namespace singleflight::detail {

// frame
//
// A thread-local stack of "this thread is inside group G": one frame per
// do_/do_fresh call in progress and per executor task being run. `flight` is
// set while that frame runs the flight's fn. The stack answers two questions
// without any shared state:
//   * is the caller about to wait for a flight that this very thread is
//     running (self-deadlock, answered with std::logic_error)?
//   * how many of a group's users are this thread's own, so that close()
//     called from inside fn waits for everyone but itself?
class frame {
 public:
  explicit frame(const void* group) noexcept : group_(group), prev_(top()) { top() = this; }
  frame(const frame&) = delete;
  frame& operator=(const frame&) = delete;
  ~frame() { top() = prev_; }

  void set_flight(const void* flight) noexcept { flight_ = flight; }
  // Whether this frame holds one of the group's user counts; cleared when
  // the count is given back, so close() from later code on this thread (a
  // callback run by a settler) does not mistake it for its own.
  void set_counted(bool counted = true) noexcept { counted_ = counted; }

  // True when a frame of this thread is running `flight`'s fn.
  static bool runs_here(const void* flight) noexcept {
    for (const frame* f = top(); f != nullptr; f = f->prev_) {
      if (f->flight_ == flight) return true;
    }
    return false;
  }

  // The number of this thread's frames that count as users of `group`.
  static std::size_t users_here(const void* group) noexcept {
    std::size_t n = 0;
    for (const frame* f = top(); f != nullptr; f = f->prev_) {
      if (f->group_ == group && f->counted_) ++n;
    }
    return n;
  }

 private:
  static frame*& top() noexcept {
    static thread_local frame* t = nullptr;
    return t;
  }

  const void* group_;
  const void* flight_ = nullptr;
  bool counted_ = false;
  frame* prev_;
};

}  // namespace singleflight::detail
