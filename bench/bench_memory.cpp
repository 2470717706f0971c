// bench/bench_memory.cpp: what an entry of singleflight::cache<uint64_t, uint64_t> costs, at
// 1M entries, by resident set size (RSS) and by sizeof accounting. A plain program (the figure
// is bytes, not time), run by bench/traces.sh:
//
//   bench_memory [bounded|unbounded|shrunk] [entries]
//
// bounded: max_entries = entries (the table full, the policy's ghost tables and sketch grown
// as it filled and evicted: the fill writes 2 x entries keys); unbounded: max_entries = 0. RSS
// is read from /proc/self/statm before the cache is made and after it is filled; the
// difference over the entries held is the figure. The accounting line adds what each entry
// allocates: its node (sizeof, from its shard's node pool: detail::node_pool, whose slabs of
// up to 256 nodes pay no per-node malloc header; a node too large for the pool would take a
// glibc chunk, rounded up to 16 bytes with its 8-byte header), its value's box if it has one
// (std::shared_ptr<const T>'s control block and T, likewise rounded; none for uint64_t, which
// the node holds: detail::value_in_node), its share of the bucket arrays (one pointer per
// bucket, between one and two buckets per node: cache_shard::reserve_one) and, bounded, its share
// of the policy's tables (computed from their sizing rules in cache_policy.hpp, per shard). shrunk:
// an unbounded cache filled to `entries`, then invalidated down to entries / 1000: the RSS it still
// holds (the node pool keeps its slabs while the cache lives, for reuse).
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#define SINGLEFLIGHT_TEST_HOOKS  // detail::cache_shards_last_made: the shard count
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/cache.hpp"
#pragma GCC diagnostic pop

namespace sf = singleflight;

namespace {

std::size_t rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

constexpr std::size_t chunk(std::size_t request) {  // glibc malloc's chunk for a request
  const std::size_t c = (request + 8 + 15) / 16 * 16;
  return c < 32 ? 32 : c;
}

constexpr std::size_t pow2_at_least(std::size_t n, std::size_t from) {
  while (from < n) from *= 2;
  return from;
}

// The policy's tables of one shard whose share is `c` entries, once full (cache_policy.hpp):
// the sketch (4 rows of 4-bit counters, at least twice as many a row as entries, and a
// doorkeeper of as many bytes) and two ghost tables of c / 4 keys, at least two slots a key
// (12-byte slots for the window's losers, 8-byte ones for main's victims).
constexpr std::size_t policy_bytes(std::size_t c) {
  const std::size_t sketch = 4 * pow2_at_least(2 * (c + 1), 64);
  const std::size_t ghost_slots = pow2_at_least(c / 4, 64);
  return sketch + ghost_slots * (12 + 8);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "bounded";
  const bool bounded = mode == "bounded";
  const bool shrunk = mode == "shrunk";
  const std::size_t entries = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1'000'000;
  using cache_t = sf::cache<std::uint64_t, std::uint64_t>;
  using node_t = sf::detail::cache_node<std::uint64_t, std::uint64_t, std::chrono::steady_clock>;
  constexpr bool pooled = sf::detail::node_pool<node_t>::pooled;
  const std::size_t before = rss_bytes();
  sf::cache_options o;
  o.ttl = std::chrono::hours(1);
  o.max_entries = bounded ? entries : 0;
  auto c = std::make_unique<cache_t>(o);
  const std::size_t empty = rss_bytes();
  const std::size_t writes = bounded ? 2 * entries : entries;
  for (std::uint64_t k = 0; k < writes; ++k) c->put(k, k);
  const std::size_t after = rss_bytes();
  const std::size_t held = c->size();
  if (shrunk) {
    const std::size_t keep = entries / 1000;
    for (std::uint64_t k = keep; k < writes; ++k) c->invalidate(k);
    const std::size_t left = rss_bytes();
    std::printf(
        "shrunk cache<uint64_t, uint64_t>: %zu entries held %.1f MiB; invalidated down to %zu "
        "entries, it holds %.1f MiB (the node pool keeps its slabs while the cache lives)\n",
        held, static_cast<double>(after - empty) / 1048576.0, c->size(),
        static_cast<double>(left - empty) / 1048576.0);
    return 0;
  }
  const std::size_t shards = sf::detail::cache_shards_last_made.load();
  // A value in a box of its own: make_shared's control block (two counts and a vtable
  // pointer) and T; none when the node holds the value.
  const std::size_t box =
      sf::detail::value_in_node<std::uint64_t> ? 0 : chunk(16 + sizeof(std::uint64_t));
  const std::size_t node = pooled ? sizeof(node_t) : chunk(sizeof(node_t));
  // The buckets of a shard holding its share: a power of two, at least its nodes
  // (cache_shard::reserve_one); between 8 and 16 bytes a node as the arrays fill.
  const double buckets =
      static_cast<double>(shards * pow2_at_least(held / shards, 8) * sizeof(void*)) /
      static_cast<double>(held);
  const double policy = bounded ? static_cast<double>(shards * policy_bytes(entries / shards)) /
                                      static_cast<double>(held)
                                : 0.0;
  std::printf(
      "%s cache<uint64_t, uint64_t>, %zu entries held: %.1f bytes per entry by RSS "
      "(empty cache %.1f KiB); sizeof(node) %zu, node %zu (%s) + value box %zu + "
      "buckets %.1f (8-16)",
      bounded ? "bounded" : "unbounded", held,
      static_cast<double>(after - empty) / static_cast<double>(held),
      static_cast<double>(empty - before) / 1024.0, sizeof(node_t), node,
      pooled ? "pooled" : "malloc chunk", box, buckets);
  if (bounded) {
    std::printf(" + policy tables %.1f (%zu shards: sketch and doorkeeper, two ghost tables)",
                policy, shards);
  }
  std::printf(" = %.1f bytes per entry by accounting (%.1f-%.1f as the bucket arrays fill)\n",
              static_cast<double>(node + box) + buckets + policy,
              static_cast<double>(node + box + 8) + policy,
              static_cast<double>(node + box + 16) + policy);
  return 0;
}
