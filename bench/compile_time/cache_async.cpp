// bench/compile_time/cache_async.cpp: one call of cache<std::string, int>::async_get, its
// callback a lambda (bench/compile_time.sh compiles it against naive_cache.cpp, and
// cache_async_extern.cpp is the same with the cache type declared extern).
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  int got = 0;
  c.async_get(
      std::string("tenant-7|user-42"), [&] { return argc; },
      [&got](singleflight::outcome<int> o) { got = o.has_value() ? o.value() : -1; });
  return got;
}
