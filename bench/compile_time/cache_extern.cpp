// bench/compile_time/cache_extern.cpp: cache.cpp with its cache type declared
// SINGLEFLIGHT_EXTERN_CACHE: the slow path is compiled once, in cache_instantiate.cpp (a
// cost per program and cache type, not per TU), and this TU compiles the hit path and the
// loader's two small functions (bench/compile_time.sh compiles it against naive_cache.cpp).
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

SINGLEFLIGHT_EXTERN_CACHE(std::string, int);

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  return c.get(std::string("tenant-7|user-42"), [&] { return argc; });
}
