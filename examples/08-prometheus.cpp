// 08-prometheus: two groups' counters on a Prometheus /metrics endpoint
// (singleflight/prometheus.hpp with prometheus-cpp's exposer).
//
// It runs a short scripted workload and checks what a scrape then shows:
//  * "profiles": 100 callers ask for one key at once: 100 calls, 1 flight,
//    1 origin call (fn start), 99 joins;
//  * "avatars": one origin that fails (a failure shared by its one caller) and
//    one caller whose request was cancelled before it arrived (a
//    cancellation, no flight).
// Then it prints the text exposition (what GET /metrics answers) and exits 0
// if every value is as expected.
//
//   ./build/dev/examples/08-prometheus                 # workload, check, print, exit
//   ./build/dev/examples/08-prometheus --serve         # ... then keep serving until stdin
//                                                      #     closes (or 60 s pass)
//   curl http://127.0.0.1:<port>/metrics               # the port it printed
//
// Options: --listen ADDR:PORT (default 127.0.0.1:0, a free port chosen by the
// system), --port-file FILE (write the port there once serving; CI's scrape
// test uses it: tests/prometheus/scrape.sh).
#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <singleflight/prometheus.hpp>
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct args {
  std::string listen = "127.0.0.1:0";
  std::string port_file;
  bool serve = false;
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--serve") {
      a.serve = true;
    } else if (arg == "--listen" && i + 1 < argc) {
      a.listen = argv[++i];
    } else if (arg == "--port-file" && i + 1 < argc) {
      a.port_file = argv[++i];
    } else {
      std::cerr << "usage: " << argv[0] << " [--listen ADDR:PORT] [--port-file FILE] [--serve]\n";
      std::exit(2);
    }
  }
  return a;
}

// Value of one series in a collection; -1 when absent.
double sample(const std::vector<prometheus::MetricFamily>& fams, const std::string& name,
              const std::string& group) {
  for (const auto& f : fams) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      for (const auto& l : m.label) {
        if (l.name == "group" && l.value == group) {
          return f.type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
        }
      }
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const args a = parse(argc, argv);

  // Declared before the groups' registrations: the groups must outlive them.
  singleflight::group<std::string, std::string> profiles;
  singleflight::group<std::string, std::string> avatars;

  prometheus::Exposer exposer(a.listen);
  auto metrics = std::make_shared<singleflight::metrics::prometheus_collector>();
  exposer.RegisterCollectable(metrics);
  const auto profiles_metrics = metrics->add(profiles, "profiles");
  const auto avatars_metrics = metrics->add(avatars, "avatars");

  // profiles: a stampede of 100 callers on one key. The origin holds the flight open until
  // the other 99 have joined (bounded: 20 s), so the counts do not depend on thread timing.
  constexpr int callers = 100;
  std::atomic<int> origin_calls{0};
  {
    auto origin = [&] {
      origin_calls.fetch_add(1);
      const auto give_up = std::chrono::steady_clock::now() + 20s;
      while (profiles.stats().joins < callers - 1 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(1ms);
      }
      return std::string("profile of user 42");
    };
    std::vector<std::jthread> requests;
    requests.reserve(callers);
    for (int i = 0; i < callers; ++i) {
      requests.emplace_back([&] { profiles.do_("tenant-7|user-42|en-GB|v3", origin); });
    }
  }

  // avatars: an origin failure, then a request cancelled before it reached the group.
  try {
    avatars.do_("user-42", []() -> std::string { throw std::runtime_error("avatar store down"); });
  } catch (const std::runtime_error&) {
  }
  singleflight::stop_source cancelled;
  cancelled.request_stop();
  try {
    avatars.do_(
        "user-43", [] { return std::string("avatar"); }, cancelled.get_token());
  } catch (const singleflight::cancelled_error&) {
  }

  const auto fams = metrics->Collect();
  std::cout << prometheus::TextSerializer().Serialize(fams);
  const bool ok = origin_calls == 1 &&
                  sample(fams, "singleflight_calls_total", "profiles") == callers &&
                  sample(fams, "singleflight_flights_total", "profiles") == 1 &&
                  sample(fams, "singleflight_fn_starts_total", "profiles") == 1 &&
                  sample(fams, "singleflight_joins_total", "profiles") == callers - 1 &&
                  sample(fams, "singleflight_in_flight", "profiles") == 0 &&
                  sample(fams, "singleflight_failures_total", "avatars") == 1 &&
                  sample(fams, "singleflight_cancellations_total", "avatars") == 1;
  std::cout << "# check: " << (ok ? "ok" : "FAILED") << "\n";
  const std::vector<int> ports = exposer.GetListeningPorts();
  if (!ports.empty()) {
    std::cout << "# serving http://127.0.0.1:" << ports.front() << "/metrics\n";
  }
  std::cout.flush();
  if (!ok) return 1;

  if (a.serve) {
    if (!a.port_file.empty() && !ports.empty()) {
      std::ofstream(a.port_file) << ports.front() << "\n";
    }
    // Until stdin closes (the scrape test closes it when done), at most 60 s.
    std::atomic<bool> eof{false};
    std::thread reader([&] {
      char c = 0;
      while (std::cin.get(c)) {
      }
      eof = true;
    });
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!eof && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    if (!eof) {
      std::cerr << "08-prometheus: still serving after 60 s; exiting\n";
      std::_Exit(3);  // the reader thread is blocked in std::cin
    }
    reader.join();
  }
  return 0;
}
