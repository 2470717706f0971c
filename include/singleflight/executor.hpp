// singleflight/executor.hpp
//
// `singleflight::executor`: where a group runs its flights
// (`options::executor`).
#pragma once

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "detail/functional.hpp"
#include "task.hpp"
#include "thread_executor.hpp"

namespace singleflight {

namespace detail {
struct executor_access;
}

// executor
//
// One of three things, fixed when it is made:
//   * none (default-constructed, or nullptr): the first caller runs fn on its
//     own thread and returns when fn does;
//   * your callable, `void(singleflight::task)`: the group hands it each
//     flight as a task (see task.hpp for what it must do with it); the
//     threads are yours: the group never joins them;
//   * `thread_executor{}`: a new thread per flight, owned and joined by the
//     group.
// The kind is decided by the type you assign, never by looking inside a
// wrapper, so wrapping an executor cannot silently change what it means
// (thread_executor is not callable, so it cannot be wrapped at all).
//
// A value type (copyable); thread-safe to copy. Calling the wrapped
// callable is the group's business: an executor has no public call operator.
class executor {
 public:
  executor() noexcept = default;
  executor(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): like std::function
  executor(thread_executor) noexcept
      : kind_(kind::group_threads) {}  // NOLINT(google-explicit-constructor)

  // executor(f): calls `f(task)` for every flight. F must be copyable.
  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, executor> &&
           !std::same_as<std::remove_cvref_t<F>, thread_executor> &&
           !std::same_as<std::remove_cvref_t<F>, std::nullptr_t>)
      executor(F&& f)  // NOLINT(google-explicit-constructor,bugprone-forwarding-reference-overload)
      : kind_(kind::call), fn_(std::forward<F>(f)) {
    static_assert(
        std::is_invocable_v<std::decay_t<F>&, task>,
        "singleflight::executor: an executor must be callable as void(singleflight::task)");
    static_assert(std::copy_constructible<std::decay_t<F>>,
                  "singleflight::executor: an executor must be copyable (options are copied); "
                  "hold a shared pool by reference or shared_ptr");
    if (!fn_) kind_ = kind::none;  // an empty std::function or a null function pointer
  }

  // True unless this is "none".
  explicit operator bool() const noexcept { return kind_ != kind::none; }

  // True for thread_executor: the group starts, owns and joins the threads.
  bool owns_threads() const noexcept { return kind_ == kind::group_threads; }

 private:
  friend struct detail::executor_access;
  enum class kind : unsigned char { none, call, group_threads };
  kind kind_ = kind::none;
  std::function<void(task)> fn_;
};

namespace detail {
// The group's way to hand an executor a task (user code: never under a lock).
struct executor_access {
  static void submit(const executor& e, task t) { e.fn_(std::move(t)); }
};
}  // namespace detail

}  // namespace singleflight
