// singleflight/detail/algorithm.hpp -- internal; do not include directly.
//
// What the library uses of <algorithm>: std::min and std::max. In C++20, libstdc++'s
// <algorithm> also brings the parallel algorithms' declarations, the ranges algorithms and
// <bits/stl_algo.h> to every translation unit that includes it; std::min and std::max live in
// <bits/stl_algobase.h>, which <string>, <memory>, <vector> and most other headers include
// anyway. With libstdc++ this header includes that one only, so that including a library header
// parses none of the rest (docs/performance.md "Compile time"); elsewhere, or with
// SINGLEFLIGHT_STANDARD_HEADERS defined (for every translation unit), <algorithm>.
#pragma once

#include <version>  // __GLIBCXX__

#if !defined(SINGLEFLIGHT_STANDARD_HEADERS) && defined(__GLIBCXX__) && \
    __has_include(<bits/stl_algobase.h>)
#include <bits/stl_algobase.h>
#else
#include <algorithm>
#endif
