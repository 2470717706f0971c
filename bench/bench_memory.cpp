// bench/bench_memory.cpp: what an entry of singleflight::cache<uint64_t, uint64_t> costs, at
// 1M entries, by resident set size (RSS) and by sizeof accounting. A plain program (the figure
// is bytes, not time), run by bench/traces.sh:
//
//   bench_memory [bounded|unbounded] [entries]
//
// bounded: max_entries = entries (the table full, the policy's ghost tables and sketch grown
// as it filled and evicted: the fill writes 2 x entries keys); unbounded: max_entries = 0. RSS
// is read from /proc/self/statm before the cache is made and after it is filled; the
// difference over the entries held is the figure. The accounting line adds what each entry
// allocates: its node (rounded up to glibc's 16-byte chunks, with their 8-byte header), its value's
// box if it has one (std::shared_ptr<const T>'s control block and T, likewise rounded; none for
// uint64_t, which the node holds: detail::value_in_node) and its share of the bucket arrays (one
// pointer per bucket, between one and two buckets per node).
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  const bool bounded = argc < 2 || std::strcmp(argv[1], "unbounded") != 0;
  const std::size_t entries = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1'000'000;
  using cache_t = sf::cache<std::uint64_t, std::uint64_t>;
  using node_t = sf::detail::cache_node<std::uint64_t, std::uint64_t, std::chrono::steady_clock>;
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
  // A value in a box of its own: make_shared's control block (two counts and a vtable
  // pointer) and T; none when the node holds the value.
  const std::size_t box =
      sf::detail::value_in_node<std::uint64_t> ? 0 : chunk(16 + sizeof(std::uint64_t));
  std::printf(
      "%s cache<uint64_t, uint64_t>, %zu entries held: %.1f bytes per entry by RSS "
      "(empty cache %.1f KiB); sizeof(node) %zu, node chunk %zu + value box %zu + "
      "buckets 8-16 = %zu-%zu bytes per entry by accounting%s\n",
      bounded ? "bounded" : "unbounded", held,
      static_cast<double>(after - empty) / static_cast<double>(held),
      static_cast<double>(empty - before) / 1024.0, sizeof(node_t), chunk(sizeof(node_t)), box,
      chunk(sizeof(node_t)) + box + 8, chunk(sizeof(node_t)) + box + 16,
      bounded ? ", + the policy's tables (two ghost tables of 0.25 x the entries, the frequency "
                "sketch and its doorkeeper)"
              : "");
  return 0;
}
