// bench/traces/policy_cells.cpp: the cache's eviction policy (detail::wtinylfu) driven alone, as
// one shard, over every cell of bench_traces (the seven traces at their three capacities and the
// round-robin hot sets of 1.00x and 1.05x) and the scan case; a second for the lot, where
// bench_traces takes minutes, so that a change of the policy can be screened on every cell before
// the full run (docs/performance.md, "Eviction, measured", reads it). Not built by CMake:
//   g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/traces/policy_cells.cpp -o /tmp/pc
//   /tmp/pc            # every cell
//   /tmp/pc web07      # the cells whose name contains "web07"
// The traces' directory as for bench_traces ($SINGLEFLIGHT_TRACES, else ../shared/traces).
//
// The policy is driven as policy_timeline drives it (policy_shard.hpp). It does not reproduce the
// cache in every detail: its figures differ from bench_traces's "1 shard" column by up to a few
// tenths on some cells (round-robin 1.05x: 92.35 against 92.86), so a variant it passes still needs
// the full run. Output: one line a cell, "name@capacity hit-ratio-in-%", and "scan" with the scan
// case's hot-key miss ratio (bench_traces's last table).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "traces/policy_shard.hpp"
#include "traces/trace_file.hpp"

namespace {

// The policy over t at `capacity`; `on_access(i, hit)` is told whether access i hit.
template <class OnAccess>
double drive(const std::vector<std::uint32_t>& t, std::size_t capacity, OnAccess&& on_access) {
  sftrace::policy_shard<> shard(capacity);
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const bool hit = shard.access(t[i]) != nullptr;
    hits += hit ? 1 : 0;
    on_access(i, hit);
  }
  return 100.0 * static_cast<double>(hits) / static_cast<double>(t.size());
}

}  // namespace

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : nullptr;
  const auto wanted = [only](const std::string& name) {
    return only == nullptr || name.find(only) != std::string::npos;
  };
  const auto dir = sftrace::traces_dir(nullptr);
  const auto none = [](std::size_t, bool) {};
  for (const auto& spec : sftrace::all_traces) {
    if (!wanted(spec.name)) continue;
    const std::vector<std::uint32_t> t = sftrace::read_trace(dir, spec);
    for (const std::size_t c : spec.capacity) {
      std::printf("%s@%zu %.2f\n", spec.name, c, drive(t, c, none));
    }
    std::fflush(stdout);
  }
  for (const std::size_t hot : {std::size_t{1024}, std::size_t{1075}}) {
    const std::string name = "round-robin-" + std::to_string(hot);
    if (!wanted(name)) continue;
    const std::vector<std::uint32_t> t = sftrace::round_robin(hot, 100);
    std::printf("%s@1024 %.2f\n", name.c_str(), drive(t, 1024, none));
  }
  // bench_traces's scan case: 64 entries, the hot keys' misses after round one.
  if (wanted("scan")) {
    const std::vector<std::uint32_t> t = sftrace::scan_case();
    std::uint64_t hot = 0;
    std::uint64_t missed = 0;
    drive(t, 64, [&](std::size_t i, bool hit) {
      if (i < 120 || t[i] >= 40) return;
      ++hot;
      missed += hit ? 0 : 1;
    });
    std::printf("scan %.2f\n", 100.0 * static_cast<double>(missed) / static_cast<double>(hot));
  }
  return 0;
}
