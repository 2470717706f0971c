// singleflight/impl/errors.ipp -- internal; do not include directly.
//
// The out-of-line members of the library's exceptions (singleflight/errors.hpp, which describes
// them): included by that header in header-only mode, by singleflight/src.hpp in compiled mode
// (detail/config.hpp). In compiled mode each class's destructor (error's what()) is its key
// function: its vtable and type_info are emitted once, in src.hpp's translation unit.
#pragma once

#include <stdexcept>

#include "../errors.hpp"

namespace singleflight {

SINGLEFLIGHT_DECL const char* error::what() const noexcept {
  return literal_ != nullptr ? literal_ : std::runtime_error::what();
}

SINGLEFLIGHT_DECL error::error(literal_tag, const char* literal)
    : std::runtime_error(""), literal_(literal) {}

SINGLEFLIGHT_DECL error::error(const error&) noexcept = default;

SINGLEFLIGHT_DECL error::~error() = default;

SINGLEFLIGHT_DECL cancelled_error::cancelled_error()
    : error(literal_tag{}, "singleflight: the call was cancelled") {}

SINGLEFLIGHT_DECL cancelled_error::cancelled_error(const cancelled_error&) noexcept = default;

SINGLEFLIGHT_DECL cancelled_error::~cancelled_error() = default;

SINGLEFLIGHT_DECL closed_error::closed_error()
    : error(literal_tag{}, "singleflight: the group is closed") {}

SINGLEFLIGHT_DECL closed_error::closed_error(const closed_error&) noexcept = default;

SINGLEFLIGHT_DECL closed_error::~closed_error() = default;

SINGLEFLIGHT_DECL timeout_error::timeout_error()
    : error(literal_tag{}, "singleflight: the flight's deadline passed") {}

SINGLEFLIGHT_DECL timeout_error::timeout_error(const timeout_error&) noexcept = default;

SINGLEFLIGHT_DECL timeout_error::~timeout_error() = default;

SINGLEFLIGHT_DECL overloaded_error::overloaded_error()
    : error(literal_tag{}, "singleflight: max_in_flight reached") {}

SINGLEFLIGHT_DECL overloaded_error::overloaded_error(const overloaded_error&) noexcept = default;

SINGLEFLIGHT_DECL overloaded_error::~overloaded_error() = default;

SINGLEFLIGHT_DECL broken_promise_error::broken_promise_error()
    : error(literal_tag{}, "singleflight: the completion was destroyed without a result") {}

SINGLEFLIGHT_DECL broken_promise_error::broken_promise_error(const broken_promise_error&) noexcept =
    default;

SINGLEFLIGHT_DECL broken_promise_error::~broken_promise_error() = default;

SINGLEFLIGHT_DECL abandoned_error::abandoned_error()
    : error(literal_tag{}, "singleflight: fn's thread ended (forced unwind) before fn returned") {}

SINGLEFLIGHT_DECL abandoned_error::abandoned_error(const abandoned_error&) noexcept = default;

SINGLEFLIGHT_DECL abandoned_error::~abandoned_error() = default;

}  // namespace singleflight
