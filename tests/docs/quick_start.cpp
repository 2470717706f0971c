// The README's quick start, verbatim between the markers (ctest docs.snippets checks it):
// built and run as ctest docs.quick_start, which checks its output (one origin call). The
// origin waits until the other 99 callers have joined (stats().joins counts them under the
// shard lock), so the check holds however late the threads are scheduled: with a 200 ms sleep
// instead it printed "5 origin call" once in CI, under load.
// --- snippet: quick-start ---
#include <singleflight/singleflight.hpp>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

int main() {
  singleflight::group<std::string, std::string> profiles;
  std::vector<std::thread> requests;
  for (int i = 0; i < 100; ++i)
    requests.emplace_back([&] {
      profiles.do_("tenant-7|user-42|en-GB|v3", [&] {  // key: everything that changes the result
        // The slow origin. For the demo it answers once the other 99 requests wait for it
        // (after 10 s at most: no wait without a bound).
        for (int ms = 0; profiles.stats().joins < 99 && ms < 10'000; ++ms)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return std::string("profile of user 42");
      });
    });
  for (std::thread& r : requests) r.join();
  std::cout << profiles.stats().calls << " calls, " << profiles.stats().flights << " origin call\n";
}
// --- end snippet ---
