// bench/traces/policy_cells.cpp: the cache's eviction policy (detail::wtinylfu) driven alone, as
// one shard, over every cell of bench_traces (the seven traces at their three capacities and the
// round-robin hot sets of 1.00x and 1.05x) and the scan case; a second for the lot, where
// bench_traces takes minutes, so that a change of the policy can be screened on every cell before
// the full run (docs/performance.md, "Eviction, measured", reads it). Not built by CMake:
//   g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/traces/policy_cells.cpp -o /tmp/pc
//   /tmp/pc            # every cell
//   /tmp/pc web07      # the cells whose name contains "web07"
//   /tmp/pc --seeds 8  # each cell also over 7 other fingerprints: least, largest, mean
// The traces' directory as for bench_traces ($SINGLEFLIGHT_TRACES, else ../shared/traces).
//
// The policy is driven as policy_timeline drives it (policy_shard.hpp), with the cache's
// fingerprints: every figure is bench_traces's "1 shard" column's (the default sharding differs
// from it by up to a few hundredths, and holds 2 to 8 shards on the larger cells, so a variant it
// passes still needs the full run). Output: one line a cell, "name@capacity hit-ratio-in-%", and
// "scan" with the scan case's hot-key miss ratio (bench_traces's last table). With --seeds N, each
// line adds the least, the largest and the mean figure over the cache's fingerprints and N - 1
// others (the key mixed with 1 .. N - 1 first): a change smaller than that spread is one the hash
// alone can make, and the mean compares two policies over the same N hashes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "traces/policy_shard.hpp"
#include "traces/trace_file.hpp"

namespace {

// The policy over t at `capacity`; `on_access(i, hit)` is told whether access i hit.
template <class OnAccess>
double drive(const std::vector<std::uint32_t>& t, std::size_t capacity, OnAccess&& on_access,
             std::uint64_t seed = 0) {
  sftrace::policy_shard<> shard(capacity, seed);
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const bool hit = shard.access(t[i]) != nullptr;
    hits += hit ? 1 : 0;
    on_access(i, hit);
  }
  return 100.0 * static_cast<double>(hits) / static_cast<double>(t.size());
}

// One output line: the figure with the cache's fingerprints, and with --seeds the spread.
void print_cell(const std::string& name, const std::vector<std::uint32_t>& t, std::size_t capacity,
                int seeds) {
  const auto none = [](std::size_t, bool) {};
  const double fig = drive(t, capacity, none);
  std::printf("%s@%zu %.2f", name.c_str(), capacity, fig);
  if (seeds > 1) {
    double low = fig;
    double high = fig;
    double sum = fig;
    for (int s = 1; s < seeds; ++s) {
      const double f = drive(t, capacity, none, static_cast<std::uint64_t>(s));
      low = f < low ? f : low;
      high = f > high ? f : high;
      sum += f;
    }
    std::printf(" %.2f %.2f %.3f", low, high, sum / seeds);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = 1;
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seeds" && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else {
      only = argv[i];
    }
  }
  const auto wanted = [only](const std::string& name) {
    return only == nullptr || name.find(only) != std::string::npos;
  };
  const auto dir = sftrace::traces_dir(nullptr);
  for (const auto& spec : sftrace::all_traces) {
    if (!wanted(spec.name)) continue;
    const std::vector<std::uint32_t> t = sftrace::read_trace(dir, spec);
    for (const std::size_t c : spec.capacity) print_cell(spec.name, t, c, seeds);
  }
  for (const std::size_t hot : {std::size_t{1024}, std::size_t{1075}}) {
    const std::string name = "round-robin-" + std::to_string(hot);
    if (!wanted(name)) continue;
    print_cell(name, sftrace::round_robin(hot, 100), 1024, seeds);
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
