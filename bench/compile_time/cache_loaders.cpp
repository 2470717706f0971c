// bench/compile_time/cache_loaders.cpp: eight calls of cache<std::string, int>::get, each with
// a loader of its own type (bench/compile_time.sh compiles it against naive_cache.cpp): what
// each further loader type costs a translation unit, beyond cache.cpp's first.
#include <singleflight/cache.hpp>

#include <chrono>
#include <string>

int main(int argc, char**) {
  using namespace std::chrono_literals;
  singleflight::cache<std::string, int> c({.ttl = 30s});
  int r = 0;
  r += c.get(std::string("a"), [&] { return argc; });
  r += c.get(std::string("b"), [&] { return argc + 1; });
  r += c.get(std::string("c"), [&] { return argc + 2; });
  r += c.get(std::string("d"), [&] { return argc + 3; });
  r += c.get(std::string("e"), [&] { return argc + 4; });
  r += c.get(std::string("f"), [&] { return argc + 5; });
  r += c.get(std::string("g"), [&] { return argc + 6; });
  r += c.get(std::string("h"), [&] { return argc + 7; });
  return r;
}
