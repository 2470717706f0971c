// bench/profile/leader_path.cpp: the uncontended leader path in a loop, for
// valgrind --tool=callgrind (not a Google Benchmark; not built by CMake).
//   g++ -O2 -g -std=c++20 -I include bench/profile/leader_path.cpp -o /tmp/leader_path -pthread
//   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out /tmp/leader_path [tok|cv|future]
//   callgrind_annotate --inclusive=yes /tmp/cg.out | head -60
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stop_token>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/singleflight.hpp"
#pragma GCC diagnostic pop
#include "../baselines.hpp"

int main(int argc, char** argv) {
  const bool tok = argc > 1 && std::strcmp(argv[1], "tok") == 0;
  singleflight::group<std::string, std::uint64_t> g;
  const std::string key = "tenant-007|user-000007|en-GB|v3|t0";
  std::uint64_t x = 0, sum = 0;
  if (argc > 1 && std::strcmp(argv[1], "cv") == 0) {
    sfbench::cv_group<std::string, std::uint64_t> c;
    for (int i = 0; i < 200000; ++i) sum += c.do_(key, [&] { return ++x; });
    std::printf("%llu\n", static_cast<unsigned long long>(sum));
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "future") == 0) {
    sfbench::future_group<std::string, std::uint64_t> c;
    for (int i = 0; i < 200000; ++i) sum += c.do_(key, [&] { return ++x; });
    std::printf("%llu\n", static_cast<unsigned long long>(sum));
    return 0;
  }
  for (int i = 0; i < 200000; ++i) {
    if (tok) {
      sum += g.do_(key, [&](std::stop_token) { return ++x; });
    } else {
      sum += g.do_(key, [&] { return ++x; });
    }
  }
  std::printf("%llu\n", static_cast<unsigned long long>(sum));
}
