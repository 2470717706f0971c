// tests/support/cache_extern_types.hpp: the cache types test_cache_extern.cpp uses, each
// declared SINGLEFLIGHT_EXTERN_CACHE: their slow path is compiled once, in
// support/cache_extern_types.cpp (SINGLEFLIGHT_INSTANTIATE_CACHE), not in the test's TU.
// docs/cache.md ("A cache type compiled once") shows the marked lines.
#pragma once

// --- snippet: cache-extern ---
// cache_types.hpp, included wherever the cache type is used:
#include <singleflight/cache.hpp>
SINGLEFLIGHT_EXTERN_CACHE(std::uint64_t, int);
// --- end snippet ---

#include <cstdint>
#include <functional>
#include <string>

#include "manual_clock.hpp"

namespace sftest {
using extern_cache = singleflight::cache<std::string, std::string, singleflight::default_hash,
                                         std::equal_to<>, manual_clock>;
}  // namespace sftest

SINGLEFLIGHT_EXTERN_CACHE(std::string, std::string, singleflight::default_hash, std::equal_to<>,
                          sftest::manual_clock);
