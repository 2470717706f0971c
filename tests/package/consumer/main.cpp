// The consumer's program: 8 threads ask for the same key at the same time; the origin must
// run once and all 8 must get its value. Exits 0 only if so. It also writes options the way the
// docs do (designated initialisers naming only some fields), which the consumer's -Wall -Wextra
// -Werror build rejects if a public options field has no default member initialiser.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <singleflight/singleflight.hpp>
#include <string>
#include <thread>
#include <vector>

#ifndef SF_CONSUME  // set by the consumer's CMakeLists.txt
#define SF_CONSUME "-I include"
#endif

int main() {
  using namespace std::chrono_literals;
  constexpr int callers = 8;
  singleflight::group<std::string, int> group;
  std::atomic<int> origin_calls{0};
  std::atomic<int> served{0};

  auto origin = [&] {
    origin_calls.fetch_add(1);
    // Keep the flight open until the other 7 callers have joined it (bounded: 10 s), so the
    // result does not depend on thread timing.
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (group.stats().joins < callers - 1 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    return 42;
  };

  {
    std::vector<std::jthread> threads;
    threads.reserve(callers);
    for (int i = 0; i < callers; ++i) {
      threads.emplace_back([&] {
        if (group.do_("answer", origin) == 42) served.fetch_add(1);
      });
    }
  }  // joins

  // Options as the docs write them.
  singleflight::group<std::string, int> bounded({.timeout = 1s});
  singleflight::cache<std::string, int> cache({.ttl = 30s, .flight = {.timeout = 2s}});
  const bool options_ok = bounded.do_("answer", [] { return 42; }) == 42 &&
                          cache.get("answer", [] { return 42; }) == 42;

  const singleflight::stats s = group.stats();
  std::printf(
      "singleflight %d.%d.%d via %s: %d callers, %d served, %d origin call(s), %llu flight(s)\n",
      SINGLEFLIGHT_VERSION_MAJOR, SINGLEFLIGHT_VERSION_MINOR, SINGLEFLIGHT_VERSION_PATCH,
      SF_CONSUME, callers, served.load(), origin_calls.load(),
      static_cast<unsigned long long>(s.flights));
  return options_ok && origin_calls == 1 && served == callers && s.flights == 1 &&
                 s.joins == callers - 1
             ? 0
             : 1;
}
