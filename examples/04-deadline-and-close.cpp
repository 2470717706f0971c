// 04-deadline-and-close: a deadline inside each flight, so a hanging origin
// never holds its callers forever; and close(), which rejects new calls,
// stops the work in progress and waits for it before the resources it uses
// are torn down.
#include <singleflight/singleflight.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

int main() {
  using namespace std::chrono_literals;
  singleflight::options opts;
  opts.timeout = 50ms;
  opts.executor = singleflight::thread_executor{};
  singleflight::group<std::string, int> g(opts);

  auto hanging_origin = [](singleflight::stop_token st) {
    while (!st.stop_requested()) std::this_thread::sleep_for(1ms);  // until told to stop
    return 0;
  };
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)g.do_("slow-key", hanging_origin);
  } catch (const singleflight::timeout_error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0);
    std::printf("after %lld ms: %s\n", static_cast<long long>(ms.count()), e.what());
  }

  std::thread late([&] {
    try {
      (void)g.do_("other-key", hanging_origin);
    } catch (const singleflight::closed_error& e) {
      std::printf("in-flight caller: %s\n", e.what());
    } catch (const singleflight::timeout_error& e) {
      std::printf("in-flight caller: %s\n", e.what());
    }
  });
  std::this_thread::sleep_for(10ms);
  g.close();  // stops "other-key" and joins its thread
  std::puts("close() returned: no flight of this group is running any more");
  try {
    (void)g.do_("slow-key", [] { return 1; });
  } catch (const singleflight::closed_error& e) {
    std::printf("new caller: %s\n", e.what());
  }
  late.join();
  return g.in_flight() == 0 ? 0 : 1;
}
