// singleflight/outcome.hpp
//
// `singleflight::outcome<T>`: what one caller receives without a throw (the
// argument of `group::async_do`'s callback, the result of `group::try_do`):
// the flight's value, as this caller's own copy, or the exception that ended
// it; how it ended (`status`), and the caller's role and flight number
// (`info`, as `do_(..., call_info&)` reports them).
#pragma once

#include <cassert>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "stats.hpp"

namespace singleflight {

// status
//
// How a call ended, without looking inside the exception:
enum class status : unsigned char {
  value,       // the flight's value
  failed,      // fn's exception, or the library's failure of that flight
               // (broken_promise_error, abandoned_error, a dropped task)
  cancelled,   // cancelled_error
  closed,      // closed_error
  timeout,     // timeout_error
  overloaded,  // overloaded_error
};

namespace detail {
// The group's way to make an outcome with its status and call_info.
struct from_flight_t {
  explicit from_flight_t() = default;
};
inline constexpr from_flight_t from_flight{};
}  // namespace detail

// outcome
//
// Holds either a T or a non-null std::exception_ptr, never both and never
// neither. A value type: copyable when T is, movable.
//
// Thread safety: like any value; distinct outcomes may be used concurrently.
// The exception object an outcome refers to is shared with the flight's
// other waiters (the same object for all of them; for cancelled, closed,
// timeout and overloaded, one object per kind for every caller): do not
// modify it.
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

  // outcome(e): an error (status failed). Undefined if `e` is null (asserts).
  explicit outcome(std::exception_ptr e) noexcept : error_(std::move(e)), status_(status::failed) {
    assert(error_ && "singleflight::outcome: an error outcome needs a non-null exception_ptr");
  }

  // For the library: a value with the caller's call_info.
  template <class... Args>
  outcome(detail::from_flight_t, const call_info& info, std::in_place_t, Args&&... args)
      : value_(std::in_place, std::forward<Args>(args)...), info_(info) {}
  // For the library: an error with its status and the caller's call_info.
  outcome(detail::from_flight_t, const call_info& info, singleflight::status s,
          std::exception_ptr e) noexcept
      : error_(std::move(e)), status_(s), info_(info) {
    assert(error_ && s != status::value);
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

  // status(): how the call ended (value, failed, cancelled, closed, timeout,
  // overloaded), so that a caller can branch without a rethrow.
  singleflight::status status() const noexcept { return status_; }

  // info(): this caller's role (leader: its fn ran; follower: it joined;
  // none: rejected before it attached) and the flight's number. Outcomes
  // made by the user carry role::none.
  const call_info& info() const noexcept { return info_; }

 private:
  std::optional<T> value_;
  std::exception_ptr error_;
  singleflight::status status_ = singleflight::status::value;
  call_info info_{};
};

}  // namespace singleflight
