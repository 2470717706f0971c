// singleflight/outcome.hpp
//
// `singleflight::outcome<T>`: what one asynchronous waiter receives (the
// argument of `group::async_do`'s callback): the flight's value, as this
// waiter's own copy, or the exception that ended it.
#pragma once

#include <cassert>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

namespace singleflight {

// outcome
//
// Holds either a T or a non-null std::exception_ptr, never both and never
// neither. A value type: copyable when T is, movable.
//
// Thread safety: like any value; distinct outcomes may be used concurrently.
// The exception object an outcome refers to is shared with the flight's
// other waiters (the same object for all of them): do not modify it.
template <class T>
class outcome {
  static_assert(std::is_object_v<T> && !std::is_array_v<T>,
                "singleflight::outcome<T>: T must be an object type");

 public:
  // outcome(std::in_place, args...): a value constructed from args.
  template <class... Args>
  requires std::constructible_from<T, Args...>
  explicit outcome(std::in_place_t, Args&&... args)
      : value_(std::in_place, std::forward<Args>(args)...) {}

  // outcome(e): an error. Undefined if `e` is null (asserts).
  explicit outcome(std::exception_ptr e) noexcept : error_(std::move(e)) {
    assert(error_ && "singleflight::outcome: an error outcome needs a non-null exception_ptr");
  }

  // has_value(): true when the flight delivered a value.
  bool has_value() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return has_value(); }

  // value(): the value; rethrows error() when there is none.
  T& value() & {
    if (!value_) std::rethrow_exception(error_);
    return *value_;
  }
  const T& value() const& {
    if (!value_) std::rethrow_exception(error_);
    return *value_;
  }
  T&& value() && {
    if (!value_) std::rethrow_exception(error_);
    return std::move(*value_);
  }

  // error(): the exception that ended the call; null when has_value().
  std::exception_ptr error() const noexcept { return error_; }

 private:
  std::optional<T> value_;
  std::exception_ptr error_;
};

}  // namespace singleflight
