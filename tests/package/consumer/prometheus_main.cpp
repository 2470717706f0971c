// The consumer's Prometheus program, built when singleflight::prometheus exists (prometheus-cpp
// found): one group's counters through singleflight/prometheus.hpp. Exits 0 only if the
// collected calls_total is the group's call count.
#include <singleflight/prometheus.hpp>
#include <singleflight/singleflight.hpp>

#include <cstdio>
#include <string>

int main() {
  singleflight::group<std::string, int> group;
  singleflight::metrics::prometheus_collector metrics;
  const auto registered = metrics.add(group, "answers");
  group.do_("answer", [] { return 42; });
  group.do_("answer", [] { return 42; });
  double calls = -1;
  for (const auto& family : metrics.Collect()) {
    if (family.name == "singleflight_calls_total") calls = family.metric.at(0).counter.value;
  }
  std::printf("singleflight::prometheus: singleflight_calls_total{group=\"answers\"} %g\n", calls);
  return calls == 2 ? 0 : 1;
}
