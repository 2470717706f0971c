// bench/compile_time/cache.cpp: one call of cache<std::string, int>::get (bench/compile_time.sh
// compiles it against naive_cache.cpp, the same program with a mutex and an unordered_map).
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  return c.get(std::string("tenant-7|user-42"), [&] { return argc; });
}
