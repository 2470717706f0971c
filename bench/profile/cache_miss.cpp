// bench/profile/cache_miss.cpp: the cache's miss (invalidate, then get: one load each time) in a
// loop, for valgrind --tool=callgrind (not a Google Benchmark; not built by CMake). A 34-byte
// std::string key, uint64_t values.
//   g++ -O2 -g -std=c++20 -I include bench/profile/cache_miss.cpp -o /tmp/cache_miss -pthread
//   for n in 10000 20000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \
//     /tmp/cache_miss cache $n; done
//   # instructions per miss: (total(20000) - total(10000)) / 10000, totals from
//   callgrind_annotate /tmp/cg.N | grep 'PROGRAM TOTALS'
// Modes: cache (load_owner::cache, the default: the loader runs on the cache's thread, so the
// count includes the hand-off and the wake-up), caller (load_owner::caller: the leader runs it),
// evict (a bounded cache, max_entries 4,096, read in turn over 8,192 keys with
// load_owner::caller: every get misses and evicts, so the count includes the eviction policy;
// no thread hand-off, so the count is the same from one run to the next).
// Compiled mode: add -DSINGLEFLIGHT_SEPARATE_COMPILATION src/singleflight.cpp to the g++ command.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "singleflight/cache.hpp"

int main(int argc, char** argv) {
  const bool caller = argc > 1 && std::strcmp(argv[1], "caller") == 0;
  const long n = argc > 2 ? std::atol(argv[2]) : 20000;
  if (argc > 1 && std::strcmp(argv[1], "evict") == 0) {
    singleflight::cache_options o;
    o.max_entries = 4096;
    o.loads = singleflight::load_owner::caller;
    singleflight::cache<std::string, std::uint64_t> c(o);
    std::vector<std::string> keys;
    for (int i = 0; i < 8192; ++i) keys.push_back("tenant-007|user-" + std::to_string(1000000 + i));
    std::uint64_t x = 0, sum = 0;
    // One pass to fill the cache, then n misses that each evict.
    for (long i = 0; i < 8192 + n; ++i) {
      sum += c.get(keys[static_cast<std::size_t>(i) % keys.size()], [&] { return ++x; });
    }
    std::printf("%llu\n", static_cast<unsigned long long>(sum));
    return 0;
  }
  singleflight::cache_options o;
  o.ttl = std::chrono::seconds(30);
  if (caller) o.loads = singleflight::load_owner::caller;
  singleflight::cache<std::string, std::uint64_t> c(o);
  const std::string key = "tenant-007|user-000007|en-GB|v3|t0";
  std::uint64_t x = 0, sum = 0;
  for (long i = 0; i < n; ++i) {
    (void)c.invalidate(key);
    sum += c.get(key, [&] { return ++x; });
  }
  std::printf("%llu\n", static_cast<unsigned long long>(sum));
}
