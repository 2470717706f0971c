// bench/profile/cache_hit.cpp: the cache's warm fresh hit in a loop, for valgrind
// --tool=callgrind (not a Google Benchmark; not built by CMake). The clock is free (a
// constant), so the count is the cache's own work; a 36-byte std::string key, uint64_t values.
//   g++ -O2 -g -std=c++20 -I include bench/profile/cache_hit.cpp -o /tmp/cache_hit -pthread
//   for n in 100000 200000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//     /tmp/cache_hit get $n; done
//   # instructions per hit: (total(200000) - total(100000)) / 100000, totals from
//   callgrind_annotate /tmp/cg.N | grep 'PROGRAM TOTALS'
// Modes: get (get(key, loader)), entry (get_entry), peek.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "singleflight/cache.hpp"

namespace {

// A clock that costs nothing: every read is the same moment, so every hit is fresh.
struct free_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::duration<rep, period>;
  using time_point = std::chrono::time_point<free_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(1'000'000'000)); }
};

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "get";
  const long n = argc > 2 ? std::atol(argv[2]) : 200000;
  singleflight::cache<std::string, std::uint64_t, singleflight::default_hash, std::equal_to<>,
                      free_clock>
      c;
  const std::string key = "tenant-007|user-000007|en-GB|v3|t0";
  const auto load = [] { return std::uint64_t{7}; };
  std::uint64_t sum = 0;
  (void)c.put(key, 7);
  if (std::strcmp(mode, "entry") == 0) {
    for (long i = 0; i < n; ++i) sum += *c.get_entry(key, load).value;
  } else if (std::strcmp(mode, "peek") == 0) {
    for (long i = 0; i < n; ++i) sum += *c.peek(key)->value;
  } else {
    for (long i = 0; i < n; ++i) sum += c.get(key, load);
  }
  std::printf("%llu\n", static_cast<unsigned long long>(sum));
}
