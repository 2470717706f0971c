// bench/compile_time/cache_extern.cpp: cache.cpp with its cache type declared
// SINGLEFLIGHT_EXTERN_CACHE: the slow path is compiled once, in cache_instantiate.cpp (a
// cost per program and cache type, not per TU), and this TU compiles the hit path and the
// loader's two small functions (bench/compile_time.sh compiles it against naive_cache.cpp).
// The program is cache.cpp itself, included after the declaration.
#include <singleflight/cache.hpp>

#include <string>

SINGLEFLIGHT_EXTERN_CACHE(std::string, int);

#include "cache.cpp"
