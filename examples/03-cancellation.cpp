// 03-cancellation: every caller can give up on its own stop_token. With an
// executor, the first caller can leave too; under ownership::waiters the work
// is stopped only when the last interested caller has left.
#include <singleflight/singleflight.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

int main() {
  using namespace std::chrono_literals;
  singleflight::options opts;
  opts.owner = singleflight::ownership::waiters;  // the default, spelled out
  opts.executor = singleflight::thread_executor{};
  singleflight::group<std::string, std::string> g(opts);

  auto slow_origin = [](singleflight::stop_token st) {
    for (int i = 0; i < 500 && !st.stop_requested(); ++i) std::this_thread::sleep_for(1ms);
    return std::string(st.stop_requested() ? "abandoned" : "done");
  };

  singleflight::stop_source impatient;
  std::thread a([&] {
    try {
      (void)g.do_("report|q3", slow_origin, impatient.get_token());
    } catch (const singleflight::cancelled_error&) {
      std::puts("impatient caller: left after 20 ms (the work goes on for the other caller)");
    }
  });
  std::string patient_result;
  std::thread b([&] {
    std::this_thread::sleep_for(5ms);
    patient_result = g.do_("report|q3", slow_origin);
  });
  std::this_thread::sleep_for(20ms);
  impatient.request_stop();
  a.join();
  b.join();
  std::printf("patient caller: %s\n", patient_result.c_str());
  const auto s = g.stats();
  std::printf("calls %llu, flights %llu, cancellations %llu\n",
              static_cast<unsigned long long>(s.calls), static_cast<unsigned long long>(s.flights),
              static_cast<unsigned long long>(s.cancellations));
  return patient_result == "done" ? 0 : 1;
}
