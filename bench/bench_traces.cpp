// bench/bench_traces.cpp: singleflight::cache's eviction on real traces. Not a timing benchmark
// (the figures are hit ratios): a plain program, built with the other benchmarks, run by
// bench/traces.sh (docs/cache.md, "Eviction, measured", holds one run's table).
//
//   bench_traces [--traces DIR] [--shards N] [--only NAME] [--no-r06] [--windows]
//
// For each trace of ../shared/traces (formats and licences in its README; read from DIR,
// $SINGLEFLIGHT_TRACES, or ../shared/traces next to the repository, decompressed at run time) at
// three capacities, and for a round-robin hot set of 1.00x and 1.05x max_entries, the hit ratio
// (hits / accesses, in %) of
//   cache     singleflight::cache<uint32_t, uint32_t> itself, max_entries = the capacity, every
//             access a get() whose loader returns the key (ttl 24 h on a clock that never moves),
//             with its real sharding (this machine's default, or N shards with --shards)
//   1 shard   the same cache with one shard: the unsharded policy
//   LRU       plain LRU
//   W-TinyLFU the TinyLFU paper's static W-TinyLFU (reference.hpp), for scale
//   OPT       Belady's MIN, the limit
// then the mean gap of the cache to OPT, and the cells where the cache trails LRU or the
// unsharded policy. Then (unless --no-r06) the S3-FIFO choices the library made, measured with
// the reference model of reference.hpp: promotion after 1 or 2 hits in small, ghost of 1.0x or
// 0.9x the capacity, on the same cells and on a scan case.
// --windows prints instead how W-TinyLFU's window size decides its hit ratio on the same cells:
// fixed windows, Caffeine's hill climber and a ghost-feedback rule (reference.hpp,
// w_tinylfu_sized_hits), each with the window's final share of the capacity.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define SINGLEFLIGHT_TEST_HOOKS  // detail::cache_shards_for_tests
// include/singleflight/detail/group/flight.hpp trips -Wshadow (see bench_group.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/cache.hpp"
#pragma GCC diagnostic pop

#include "traces/reference.hpp"
#include "traces/trace_file.hpp"

namespace sf = singleflight;

namespace {

// A clock that never moves: nothing expires, so every miss is the policy's.
struct still_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<still_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(std::chrono::hours(1)); }
};

using trace_cache =
    sf::cache<std::uint32_t, std::uint32_t, sf::default_hash, std::equal_to<>, still_clock>;

// The cache's hits over a trace, with `shards` shards (0: the default).
double cache_ratio(const std::vector<std::uint32_t>& t, std::size_t capacity, std::size_t shards,
                   std::size_t* shards_used = nullptr) {
  sf::detail::cache_shards_for_tests.store(shards, std::memory_order_relaxed);
  sf::cache_options o;
  o.ttl = std::chrono::hours(24);
  o.jitter = 0;
  o.max_entries = capacity;
  trace_cache c(o);
  sf::detail::cache_shards_for_tests.store(0, std::memory_order_relaxed);
  std::size_t worst = 0;
  for (const std::uint32_t k : t) {
    (void)c.get(k, [k] { return k; });
    worst = std::max(worst, c.size());
  }
  if (worst > capacity) {
    std::fprintf(stderr, "size() %zu exceeded max_entries %zu\n", worst, capacity);
    std::exit(1);
  }
  if (shards_used != nullptr) {
    *shards_used = sf::detail::cache_shards_last_made.load(std::memory_order_relaxed);
  }
  return 100.0 * static_cast<double>(c.stats().hits) / static_cast<double>(t.size());
}

double pct(std::uint64_t hits, const std::vector<std::uint32_t>& t) {
  return 100.0 * static_cast<double>(hits) / static_cast<double>(t.size());
}

struct cell {
  std::string trace;
  std::size_t capacity;
  const std::vector<std::uint32_t>* keys;
};

}  // namespace

// --windows: W-TinyLFU's hit ratio by the rule that sizes its window (reference model,
// unsharded), next to LRU and the S3-FIFO model; "w" is the window's final share.
template <class Cells>
int window_study(const Cells& cells) {
  using rule = sftrace::window_rule;
  struct column {
    const char* name;
    rule r;
  };
  const column cols[] = {
      {"fixed 1 %", {rule::fixed, 0.01}},
      {"fixed 20 %", {rule::fixed, 0.20}},
      {"fixed 60 %", {rule::fixed, 0.60}},
      {"hill climber", {rule::climb, 0.01}},
      {"ghosts 0.25 / 0.25", {rule::ghosts, 0.01, 0.25, 0.25}},
      {"ghosts 0.10 / 0.25", {rule::ghosts, 0.01, 0.10, 0.25}},
      {"ghosts 0.02 / 0.25", {rule::ghosts, 0.01, 0.02, 0.25}},
      {"ghosts 0.25 / 0.25, age < 1x", {rule::ghosts, 0.01, 0.25, 0.25, 1.0}},
  };
  std::printf(
      "W-TinyLFU by window rule (reference model, unsharded): hit ratio %% (final window "
      "share)\n\n| trace | capacity | LRU | S3-FIFO |");
  for (const column& c : cols) std::printf(" %s |", c.name);
  std::printf("\n|---|---:|---:|---:|");
  for (std::size_t i = 0; i < std::size(cols); ++i) std::printf("---:|");
  std::printf("\n");
  for (const auto& c : cells) {
    const auto& t = *c.keys;
    std::printf("| %s | %zu | %.2f | %.2f |", c.trace.c_str(), c.capacity,
                pct(sftrace::lru_hits(t, c.capacity), t),
                pct(sftrace::s3fifo_hits(t, c.capacity, 2, 0.9), t));
    for (const column& col : cols) {
      double w = 0;
      const double r = pct(sftrace::w_tinylfu_sized_hits(t, c.capacity, col.r, &w), t);
      std::printf(" %.2f (%.0f) |", r, 100 * w);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* dir_arg = nullptr;
  const char* only = nullptr;
  std::size_t shards = 0;
  bool r06 = true;
  bool windows = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--traces" && i + 1 < argc) {
      dir_arg = argv[++i];
    } else if (a == "--shards" && i + 1 < argc) {
      shards = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--no-r06") {
      r06 = false;
    } else if (a == "--windows") {
      windows = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--traces DIR] [--shards N] [--only NAME] [--no-r06] [--windows]\n",
                   argv[0]);
      return 2;
    }
  }
  const auto dir = sftrace::traces_dir(dir_arg);
  std::vector<std::vector<std::uint32_t>> traces;
  traces.reserve(std::size(sftrace::all_traces) + 2);
  std::vector<cell> cells;
  for (const auto& spec : sftrace::all_traces) {
    if (only != nullptr && std::strcmp(only, spec.name) != 0) continue;
    traces.push_back(sftrace::read_trace(dir, spec));
    for (const std::size_t c : spec.capacity) cells.push_back({spec.name, c, &traces.back()});
  }
  if (only == nullptr || std::strcmp(only, "round-robin") == 0) {
    traces.push_back(sftrace::round_robin(1024, 100));
    cells.push_back({"round-robin 1.00x", 1024, &traces.back()});
    traces.push_back(sftrace::round_robin(1075, 100));
    cells.push_back({"round-robin 1.05x", 1024, &traces.back()});
  }

  if (windows) return window_study(cells);
  std::printf("shards: %s\n\n", shards == 0 ? "the default for this machine" : "--shards");
  std::printf(
      "| trace | capacity | shards | cache | 1 shard | LRU | W-TinyLFU | OPT | cache - OPT |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  double gap_sum = 0;
  int below_lru = 0;
  double worst_shard_loss = 0;
  std::string worst_shard_cell;
  for (const cell& c : cells) {
    const auto& t = *c.keys;
    std::size_t used = 0;
    const double mine = cache_ratio(t, c.capacity, shards, &used);
    const double one = cache_ratio(t, c.capacity, 1);
    const double lru = pct(sftrace::lru_hits(t, c.capacity), t);
    const double wt = pct(sftrace::w_tinylfu_hits(t, c.capacity), t);
    const double opt = pct(sftrace::optimal_hits(t, sftrace::next_use(t), c.capacity), t);
    gap_sum += opt - mine;
    if (mine < lru) ++below_lru;
    if (one - mine > worst_shard_loss) {
      worst_shard_loss = one - mine;
      worst_shard_cell = c.trace + " @ " + std::to_string(c.capacity);
    }
    std::printf("| %s | %zu | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", c.trace.c_str(),
                c.capacity, used, mine, one, lru, wt, opt, mine - opt);
    std::fflush(stdout);
  }
  std::printf(
      "\nmean gap of the cache to OPT: %.2f points over %zu cells; cells below LRU: %d; "
      "largest loss to the unsharded policy: %.2f points (%s)\n",
      gap_sum / static_cast<double>(cells.size()), cells.size(), below_lru, worst_shard_loss,
      worst_shard_cell.empty() ? "none" : worst_shard_cell.c_str());

  if (!r06) return 0;
  std::printf(
      "\nS3-FIFO choices (reference model, unsharded): hit ratio %% by promotion "
      "threshold and ghost size\n\n");
  std::printf(
      "| trace | capacity | 1 hit, ghost 1.0x | 1 hit, 0.9x | 2 hits, 1.0x | 2 hits, 0.9x |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  double sums[4] = {};
  for (const cell& c : cells) {
    const auto& t = *c.keys;
    const double v[4] = {pct(sftrace::s3fifo_hits(t, c.capacity, 1, 1.0), t),
                         pct(sftrace::s3fifo_hits(t, c.capacity, 1, 0.9), t),
                         pct(sftrace::s3fifo_hits(t, c.capacity, 2, 1.0), t),
                         pct(sftrace::s3fifo_hits(t, c.capacity, 2, 0.9), t)};
    for (int i = 0; i < 4; ++i) sums[i] += v[i];
    std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f |\n", c.trace.c_str(), c.capacity, v[0],
                v[1], v[2], v[3]);
  }
  const auto n = static_cast<double>(cells.size());
  std::printf("| mean | | %.2f | %.2f | %.2f | %.2f |\n", sums[0] / n, sums[1] / n, sums[2] / n,
              sums[3] / n);
  // The scan case: the hot keys' misses after their first round, 64 entries in one shard.
  const std::vector<std::uint32_t> scan = sftrace::scan_case();
  const auto hot_miss = [&](const std::function<bool(std::size_t)>& hit_at) {
    std::uint64_t hot = 0;
    std::uint64_t missed = 0;
    for (std::size_t i = 120; i < scan.size(); ++i) {
      if (scan[i] >= 40) continue;
      ++hot;
      if (!hit_at(i)) ++missed;
    }
    return 100.0 * static_cast<double>(missed) / static_cast<double>(hot);
  };
  std::printf(
      "\nscan case (64 entries, one shard; 40 hot keys in turn, then 40 scanned keys "
      "each read twice, 100 rounds): hot-key miss ratio after round one, %%\n\n");
  std::printf("| reference, 1 hit | reference, 2 hits | cache |\n|---:|---:|---:|\n");
  const std::vector<bool> one_hit = sftrace::s3fifo_replay(scan, 64, 1, 1.0);
  const std::vector<bool> two_hits = sftrace::s3fifo_replay(scan, 64, 2, 0.9);
  std::vector<bool> lib(scan.size(), false);
  {
    sf::detail::cache_shards_for_tests.store(1, std::memory_order_relaxed);
    sf::cache_options o;
    o.ttl = std::chrono::hours(24);
    o.max_entries = 64;
    trace_cache c(o);
    sf::detail::cache_shards_for_tests.store(0, std::memory_order_relaxed);
    for (std::size_t i = 0; i < scan.size(); ++i) {
      bool loaded = false;
      const std::uint32_t k = scan[i];
      (void)c.get(k, [&loaded, k] {
        loaded = true;
        return k;
      });
      lib[i] = !loaded;
    }
  }
  std::printf("| %.1f | %.1f | %.1f |\n", hot_miss([&](std::size_t i) { return one_hit[i]; }),
              hot_miss([&](std::size_t i) { return two_hits[i]; }),
              hot_miss([&](std::size_t i) { return lib[i]; }));
  return 0;
}
