// singleflight/detail/unwind.hpp -- internal; do not include directly.
//
// Forced unwinding (pthread_exit, pthread_cancel at a cancellation point:
// the C++ analogue of Go's runtime.Goexit) runs destructors up the stack of
// the thread that ends. With libstdc++ a `catch (...)` also catches it, and
// must rethrow it ("FATAL: exception not rethrown" otherwise). Every
// `catch (...)` on a path where fn (or an executor running fn synchronously)
// may end its thread starts with SINGLEFLIGHT_RETHROW_FOREIGN(): a forced
// unwind is not a C++ exception, so std::current_exception() is empty for it
// (catching it as abi::__forced_unwind& instead would bind a reference to a
// non-object, which UBSan reports). The cleanup itself is done by destructors
// (on_unwind guards), which run with every C++ runtime.
#pragma once

#include <exception>
#include <utility>

#define SINGLEFLIGHT_RETHROW_FOREIGN()    \
  do {                                    \
    if (!std::current_exception()) throw; \
  } while (false)

namespace singleflight::detail {

// on_unwind(f): runs f() when destroyed still armed, i.e. when the scope is
// left by an exception (in practice: a forced unwind, the only one that can
// cross the scopes that use it). disarm() on the normal path.
template <class F>
class on_unwind {
 public:
  explicit on_unwind(F f) noexcept : f_(std::move(f)) {}
  on_unwind(const on_unwind&) = delete;
  on_unwind& operator=(const on_unwind&) = delete;
  ~on_unwind() {
    if (armed_) f_();
  }
  void disarm() noexcept { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace singleflight::detail
