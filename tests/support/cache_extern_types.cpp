// tests/support/cache_extern_types.cpp: the one TU of test_cache_extern that compiles the
// slow path of the cache types support/cache_extern_types.hpp declares extern.
// --- snippet: cache-instantiate ---
// cache_types.cpp, exactly one TU of the program:
#include "cache_extern_types.hpp"
SINGLEFLIGHT_INSTANTIATE_CACHE(std::uint64_t, int);
// --- end snippet ---

SINGLEFLIGHT_INSTANTIATE_CACHE(std::string, std::string, singleflight::default_hash,
                               std::equal_to<>, sftest::manual_clock);
