// bench/compile_time/cache_async_extern.cpp: cache_async.cpp with its cache type declared
// SINGLEFLIGHT_EXTERN_CACHE: async_get's callback path is compiled once, in
// cache_instantiate.cpp, and this TU compiles the loader's and the callback's small functions
// (bench/compile_time.sh compiles it against naive_cache.cpp).
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

SINGLEFLIGHT_EXTERN_CACHE(std::string, int);

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  int got = 0;
  c.async_get(
      std::string("tenant-7|user-42"), [&] { return argc; },
      [&got](singleflight::outcome<int> o) { got = o.has_value() ? o.value() : -1; });
  return got;
}
