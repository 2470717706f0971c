// bench/compile_time/cache_async_extern.cpp: cache_async.cpp with its cache type declared
// SINGLEFLIGHT_EXTERN_CACHE: async_get's callback path is compiled once, in
// cache_instantiate.cpp, and this TU compiles the loader's and the callback's small functions
// (bench/compile_time.sh compiles it against naive_cache.cpp). The program is cache_async.cpp
// itself, included after the declaration.
#include <singleflight/cache.hpp>

#include <string>

SINGLEFLIGHT_EXTERN_CACHE(std::string, int);

#include "cache_async.cpp"
