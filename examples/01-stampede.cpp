// 01-stampede: 100 requests for one profile arrive within 40 ms of a cache
// miss; the origin takes 200 ms to answer. With a group in front of it, the
// origin is called once and every caller gets the same profile.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  singleflight::group<std::string, std::shared_ptr<const std::string>> profiles;
  std::atomic<int> origin_calls{0};

  constexpr int callers = 100;
  auto fetch_from_origin =
      [&origin_calls, &profiles](singleflight::stop_token) {  // captures what outlives the group
        origin_calls.fetch_add(1);
        std::this_thread::sleep_for(200ms);  // the slow origin
        // For the demo's exit status, the origin also answers only once the other callers wait
        // for it (10 s at most), so a loaded machine that starts the threads late cannot turn
        // one origin call into two: the status checks the coalescing, not the scheduler.
        for (int ms = 0; profiles.stats().joins < callers - 1 && ms < 10'000; ++ms)
          std::this_thread::sleep_for(1ms);
        return std::make_shared<const std::string>("profile of user 42");
      };

  std::atomic<int> served{0};
  std::latch ready(callers + 1);  // start the clock once every thread exists
  std::vector<std::thread> requests;
  for (int i = 0; i < callers; ++i) {
    requests.emplace_back([&, i] {
      ready.arrive_and_wait();
      std::this_thread::sleep_for(400us * i);  // arrivals spread over 40 ms
      // The key holds everything that changes the result: tenant, user, locale, version.
      auto profile = profiles.do_("tenant-7|user-42|en-GB|v3", fetch_from_origin);
      if (*profile == "profile of user 42") served.fetch_add(1);
    });
  }
  ready.arrive_and_wait();
  for (auto& r : requests) r.join();

  const singleflight::stats s = profiles.stats();
  std::printf("callers:          %d\n", callers);
  std::printf("served:           %d\n", served.load());
  std::printf("origin calls:     %d\n", origin_calls.load());
  std::printf("coalescing ratio: %.2f (flights / calls)\n",
              static_cast<double>(s.flights) / static_cast<double>(s.calls));
  return served == callers && origin_calls == 1 ? 0 : 1;
}
