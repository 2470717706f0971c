// singleflight/detail/impl/library_thread.ipp -- internal; do not include directly.
//
// library_thread's definitions (detail/library_thread.hpp): included by that header in
// header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include "../library_thread.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL void library_thread::mark() noexcept { mark_ = true; }

SINGLEFLIGHT_DECL bool library_thread::current() noexcept { return mark_; }

SINGLEFLIGHT_DECL bool on_library_thread() noexcept { return library_thread::current(); }

}  // namespace singleflight::detail
