// bench/compile_time/cache_instantiate.cpp: the one TU of a program that compiles the slow
// path of cache<std::string, int> for every TU declaring it SINGLEFLIGHT_EXTERN_CACHE
// (cache_extern.cpp): compiled once per program and cache type.
#include <singleflight/cache.hpp>

#include <string>

SINGLEFLIGHT_INSTANTIATE_CACHE(std::string, int);
