// bench/compile_time/cache_two_types.cpp: cache.cpp with a second cache type, cache<int,
// std::string>, in the same translation unit: compared with cache.cpp, what each further (Key, T)
// costs a TU. docs/performance.md "Compile time" counts its functions.
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  singleflight::cache<int, std::string> d({.ttl = 30s});
  const int a = c.get(std::string("tenant-7|user-42"), [&] { return argc; });
  const std::string b = d.get(argc, [&] { return std::string("tenant-7"); });
  return a + static_cast<int>(b.size());
}
