// singleflight/detail/functional.hpp -- internal; do not include directly.
//
// What the library uses of <functional>: std::function (singleflight::executor), std::hash and
// std::equal_to (a group's and a cache's defaults), and detail::invoke, std::invoke under
// another name. In C++20, libstdc++'s <functional> also brings <unordered_map>, <vector>,
// <array>, <tuple> and <bits/stl_algo.h> (for the searchers) to every translation unit that
// includes it; with libstdc++ this header includes only the internal headers <functional>
// takes these four from (<bits/std_function.h>, <bits/functional_hash.h>,
// <bits/stl_function.h>, <bits/invoke.h>), so that including a library header parses none of
// the rest (docs/performance.md "Compile time"); elsewhere, or with
// SINGLEFLIGHT_STANDARD_HEADERS defined (for every translation unit), <functional>.
//
// detail::invoke(f, args...): std::invoke(f, args...) (libstdc++'s std::invoke is a call of
// std::__invoke, which <bits/invoke.h> declares: the same function, member pointers included).
#pragma once

#include <version>  // __GLIBCXX__

#if !defined(SINGLEFLIGHT_STANDARD_HEADERS) && defined(__GLIBCXX__) && \
    __has_include(<bits/std_function.h>) && \
    __has_include(<bits/invoke.h>) && __has_include(<bits/functional_hash.h>) && \
    __has_include(<bits/stl_function.h>)
#define SINGLEFLIGHT_DETAIL_GLIBCXX_FUNCTIONAL 1
#include <bits/functional_hash.h>
#include <bits/invoke.h>
#include <bits/std_function.h>
#include <bits/stl_function.h>
#else
#include <functional>
#endif

#include <type_traits>
#include <utility>

namespace singleflight::detail {

template <class F, class... Args>
constexpr std::invoke_result_t<F, Args...> invoke(F&& f, Args&&... args) noexcept(
    std::is_nothrow_invocable_v<F, Args...>) {
#if defined(SINGLEFLIGHT_DETAIL_GLIBCXX_FUNCTIONAL)
  return std::__invoke(std::forward<F>(f), std::forward<Args>(args)...);
#else
  return std::invoke(std::forward<F>(f), std::forward<Args>(args)...);
#endif
}

}  // namespace singleflight::detail
