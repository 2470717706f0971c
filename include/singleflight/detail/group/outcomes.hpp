// singleflight/detail/group/outcomes.hpp -- internal; do not include directly.
//
// From a flight's outcome_kind to what a caller receives without a throw:
// its public status, and the exception for the library's own outcomes. The
// exception objects for cancelled, closed, timeout and overloaded are made
// once per program (per shared object) and shared by every caller, so a
// cancellation or a timeout delivered as a value (try_do, async_do) costs
// neither a throw nor an allocation. No lock; thread-safe (immutable after
// their thread-safe initialisation).
#pragma once

#include <exception>

#include "../../errors.hpp"
#include "../../outcome.hpp"
#include "flight.hpp"

namespace singleflight::detail {

constexpr status status_of(outcome_kind k) noexcept {
  switch (k) {
    case outcome_kind::value:
      return status::value;
    case outcome_kind::cancelled:
      return status::cancelled;
    case outcome_kind::closed:
      return status::closed;
    case outcome_kind::timeout:
      return status::timeout;
    case outcome_kind::overloaded:
      return status::overloaded;
    case outcome_kind::fn_error:
    case outcome_kind::dropped:
    case outcome_kind::pending:
      break;
  }
  return status::failed;
}

// The shared exception for one of the library's own outcomes; null for the
// others (value, fn_error, dropped: those carry the flight's own).
inline std::exception_ptr shared_error(outcome_kind k) noexcept {
  switch (k) {
    case outcome_kind::cancelled: {
      static const std::exception_ptr e = std::make_exception_ptr(cancelled_error());
      return e;
    }
    case outcome_kind::closed: {
      static const std::exception_ptr e = std::make_exception_ptr(closed_error());
      return e;
    }
    case outcome_kind::timeout: {
      static const std::exception_ptr e = std::make_exception_ptr(timeout_error());
      return e;
    }
    case outcome_kind::overloaded: {
      static const std::exception_ptr e = std::make_exception_ptr(overloaded_error());
      return e;
    }
    case outcome_kind::value:
    case outcome_kind::fn_error:
    case outcome_kind::dropped:
    case outcome_kind::pending:
      break;
  }
  return nullptr;
}

}  // namespace singleflight::detail
