// singleflight::cache's eviction and memory (issue 23, item 5, R04, R05, R06; issue 35, R07):
// the entry budget across shards, the sweep of dead entries, a scan read twice, a loop a little
// longer than the cache, and what an entry and an empty bounded cache cost. One test case per
// point, named after the failure it pins. Time is a manual clock; shard counts are forced through
// the test seam detail::cache_shards_for_tests; every wait is bounded.
#define SINGLEFLIGHT_TEST_HOOKS  // detail::cache_shards_for_tests
#include <singleflight/cache.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/alloc.hpp"  // this executable's operator new/delete
#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"

namespace sf = singleflight;
using sftest::manual_clock;
using namespace std::chrono_literals;

namespace {

using ucache =
    sf::cache<std::uint64_t, std::uint64_t, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options opts(std::chrono::nanoseconds ttl, std::size_t max_entries) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  o.max_entries = max_entries;
  return o;
}

// Forces the shard count of the caches made while it lives.
struct forced_shards {
  explicit forced_shards(std::size_t n) { sf::detail::cache_shards_for_tests.store(n); }
  ~forced_shards() { sf::detail::cache_shards_for_tests.store(0); }
  forced_shards(const forced_shards&) = delete;
  forced_shards& operator=(const forced_shards&) = delete;
};

}  // namespace

// ---- R04: the sweep ------------------------------------------------------------------------

TEST_CASE("dead entries behind long-lived ones are swept from an unbounded cache",
          "[cache][eviction][r04]") {
  // 1,024 entries with a long ttl at the old end, then rounds of one-shot keys that die at the
  // end of their round. A sweep that stops at the first live entry keeps every dead one
  // (size ~ rounds x keys); the hand that walks past live entries keeps about one round.
  manual_clock::reset();
  ucache c(opts(1s, 0));
  for (std::uint64_t k = 0; k < 1024; ++k) {
    c.get(k, [k] { return sf::load_result<std::uint64_t>::value(k, 24h); });
  }
  constexpr std::uint64_t per_round = 20'000;
  constexpr int rounds = 10;
  std::uint64_t next = 1'000'000;
  for (int r = 0; r < rounds; ++r) {
    for (std::uint64_t i = 0; i < per_round; ++i) c.put(next++, i);
    manual_clock::advance(2s);  // this round's keys are dead
  }
  INFO("size " << c.size());
  CHECK(c.size() <= 2 * per_round + 1024);
  // The long-lived entries are all still there.
  const std::uint64_t loads = c.stats().loads;
  for (std::uint64_t k = 0; k < 1024; ++k) c.get(k, [k] { return k; });
  CHECK(c.stats().loads == loads);
}

// ---- item 5 (a): one budget for all shards ---------------------------------------------------

TEST_CASE("a hot set of max_entries keys fits whatever the hash does to it across shards",
          "[cache][eviction][budget]") {
  // With a fixed capacity of max_entries / shards per shard, the shards that draw more than
  // their share of the hot set evict in a loop (88.7% hits instead of 99.8%, issue 23).
  manual_clock::reset();
  for (const std::size_t shards : {std::size_t{1}, std::size_t{8}, std::size_t{64}}) {
    const forced_shards f(shards);
    ucache c(opts(1h, 1024));
    for (int round = 0; round < 3; ++round) {
      for (std::uint64_t k = 0; k < 1024; ++k) c.get(k, [k] { return k; });
    }
    INFO("shards " << shards);
    CHECK(c.stats().loads == 1024);
    CHECK(c.stats().evictions == 0);
    CHECK(c.size() == 1024);
  }
}

TEST_CASE("size never exceeds max_entries while shards take slots from each other",
          "[cache][eviction][budget]") {
  // Four writers on distinct keys of 16 shards, a budget of 2,048 (a share of 128 each): shards
  // under their share take slots from shards over it. size() is checked by every writer after
  // every write and must never pass max_entries; at the end the counts add up.
  manual_clock::reset();
  const forced_shards f(16);
  constexpr std::size_t max_entries = 2048;
  ucache c(opts(1h, max_entries));
  std::atomic<int> over{0};
  constexpr int writers = 4;
  constexpr std::uint64_t per_writer = 20'000;
  {
    std::vector<sftest::jthread> ts;
    for (int w = 0; w < writers; ++w) {
      ts.emplace_back([&c, &over, w] {
        for (std::uint64_t i = 0; i < per_writer; ++i) {
          // Writer 0 spreads over all shards; the others crowd a few hot keys' shards by
          // reusing a small key range, so that shards drift over and under their shares.
          const std::uint64_t k = w == 0 ? i : (static_cast<std::uint64_t>(w) << 40U) | (i % 700);
          if (i % 2 == 0) {
            c.put(k, i);
          } else {
            c.get(k, [k] { return k; });
          }
          if (c.size() > max_entries) over.fetch_add(1, std::memory_order_relaxed);
        }
      });
    }
  }
  CHECK(over.load() == 0);
  const sf::cache_stats s = c.stats();
  CHECK(s.size <= max_entries);
  CHECK(s.size == c.size());
  std::size_t held = 0;
  for (std::uint64_t k = 0; k < per_writer; ++k) held += c.peek(k) ? 1 : 0;
  for (int w = 1; w < writers; ++w) {
    for (std::uint64_t i = 0; i < 700; ++i) {
      held += c.peek((static_cast<std::uint64_t>(w) << 40U) | i) ? 1 : 0;
    }
  }
  CHECK(held == s.size);  // the budget counts exactly the entries there are
}

// ---- R06: promotion after two hits -----------------------------------------------------------

TEST_CASE("a scan whose keys are each read twice does not push the hot keys out",
          "[cache][eviction][r06]") {
  // One shard of 64 entries; 40 hot keys read in turn, then 40 scanned keys each read twice
  // in a row, 100 rounds (4,000 scanned keys). Promoting from small after one hit lets every
  // scanned key into main, which then evicts the hot keys (78% of their reads missed); after
  // two hits, as S3-FIFO's paper does, the scan passes through small.
  manual_clock::reset();
  ucache c(opts(1h, 64));
  std::uint64_t hot_reads = 0;
  std::uint64_t hot_misses = 0;
  std::uint64_t scan = 1000;
  for (int round = 0; round < 100; ++round) {
    for (std::uint64_t h = 0; h < 40; ++h) {
      bool loaded = false;
      c.get(h, [&loaded, h] {
        loaded = true;
        return h;
      });
      if (round > 0) {
        ++hot_reads;
        hot_misses += loaded ? 1 : 0;
      }
    }
    for (int i = 0; i < 40; ++i, ++scan) {
      c.get(scan, [scan] { return scan; });
      c.get(scan, [scan] { return scan; });
    }
  }
  INFO("hot-key misses " << hot_misses << " of " << hot_reads);
  CHECK(hot_misses * 100 <= hot_reads * 2);  // at most 2%
}

TEST_CASE("a loop a little longer than the cache keeps most of its hits",
          "[cache][eviction][r07]") {
  // One shard of 1,024 entries; 1,075 keys (1.05x) read in turn, 100 rounds. LRU hits
  // nothing; S3-FIFO kept 77.7%; W-TinyLFU keeps its window small here (the keys its window
  // turned away return later than the capacity in accesses) and admits to main only what the
  // sketch saw more often than main's victim: about 91%. A ghost rule without the age filter
  // grew the window and fell to 65% (docs/performance.md, "Eviction, measured").
  manual_clock::reset();
  const forced_shards f(1);
  ucache c(opts(1h, 1024));
  std::uint64_t reads = 0;
  std::uint64_t misses = 0;
  for (int round = 0; round < 100; ++round) {
    for (std::uint64_t k = 0; k < 1075; ++k) {
      bool loaded = false;
      c.get(k, [&loaded, k] {
        loaded = true;
        return k;
      });
      if (round > 0) {
        ++reads;
        misses += loaded ? 1 : 0;
      }
    }
  }
  INFO("misses " << misses << " of " << reads);
  CHECK(misses * 100 <= reads * 15);  // at least 85% hits
  CHECK(c.size() <= 1024);
}

TEST_CASE("a new working set that loses its duels grows the window by more than one a loser",
          "[cache][eviction][r07]") {
  // The policy alone, as a one-shard cache drives it. 700 keys read 30 times fill main and
  // the sketch; then 700 new keys read in turn. New keys lose their duels against main's
  // victims (seen 30 times) and come back 700 accesses later, within the capacity: the ghost
  // rule grew the window by one entry per such return, 156 entries after six rounds, while the
  // new set waited on main (sprite@1000's phase changes, docs/performance.md). When a third of
  // a block of inserts (a quarter of the capacity) are such returns, the window now also takes
  // a quarter of the way to its maximum at once: 376 entries.
  struct entry : sf::detail::policy_hook {
    std::uint64_t key = 0;
  };
  constexpr std::size_t capacity = 1000;
  constexpr std::uint64_t keys = 700;
  sf::detail::wtinylfu policy;
  policy.configure(capacity);
  std::unordered_map<std::uint64_t, std::unique_ptr<entry>> held;
  std::uint64_t hits = 0;
  const auto clock = [&hits] { return hits; };
  const auto dead = [](const sf::detail::policy_hook*) { return false; };
  const auto read = [&](std::uint64_t k) {
    if (const auto f = held.find(k); f != held.end()) {
      ++hits;
      f->second->touch();
      return;
    }
    if (policy.size() >= capacity) {
      auto* v = static_cast<entry*>(policy.evict(dead, clock));
      REQUIRE(v != nullptr);
      held.erase(v->key);
    }
    auto e = std::make_unique<entry>();
    e->key = k;
    e->fingerprint = sf::detail::mix64(k);
    policy.insert(e.get(), clock);
    held.emplace(k, std::move(e));
  };
  for (int round = 0; round < 30; ++round) {
    for (std::uint64_t k = 0; k < keys; ++k) read(k);
  }
  const std::size_t before = policy.window();
  for (int round = 0; round < 6; ++round) {
    for (std::uint64_t k = 0; k < keys; ++k) read(100'000 + k);
  }
  INFO("window " << before << " -> " << policy.window());
  CHECK(before <= capacity / 50);
  CHECK(policy.window() >= capacity / 3);
  CHECK(policy.size() <= capacity);
}

// ---- R05: memory -----------------------------------------------------------------------------

TEST_CASE("an empty bounded cache allocates little, its ghost table grows as it fills",
          "[cache][eviction][r05]") {
  // The ghost tables were allocated up front for max_entries (32 MB for 1M entries). The shard
  // count is forced (the default follows the machine's hardware threads: four per thread, up to
  // 256), so that the figure is this cache's, not this machine's; what a shard costs is checked
  // apart, below.
  if (!sftest::alloc::replaced) {
    WARN("allocation counting is not available under ThreadSanitizer");
    return;
  }
  manual_clock::reset();
  const forced_shards f(16);
  std::size_t empty = 0;
  std::size_t filled = 0;
  constexpr std::uint64_t n = 10'000;
  {
    std::unique_ptr<ucache> c;
    empty = sftest::alloc::bytes_during([&] { c = std::make_unique<ucache>(opts(1h, 1'000'000)); });
    filled = sftest::alloc::bytes_during([&] {
      for (std::uint64_t k = 0; k < n; ++k) c->put(k, k);
    });
  }
  INFO("empty " << empty << " B, then " << filled / n << " B per entry for " << n << " entries");
  CHECK(empty < 64 * 1024);
  CHECK(filled / n < 400);  // the entry itself and its share of buckets and ghost slots
}

TEST_CASE("an empty bounded cache's cost per shard is bounded whatever the machine",
          "[cache][eviction][r05]") {
  // 8 and 256 shards (the default's range): the difference over 248 is what one more shard
  // costs (the shard, its read_gate flag and one reader counter per stripe; stripes follow
  // the hardware threads, at most 64), so that an empty cache on a 64-thread machine (256
  // shards) stays small too.
  if (!sftest::alloc::replaced) {
    WARN("allocation counting is not available under ThreadSanitizer");
    return;
  }
  manual_clock::reset();
  const auto empty_with = [](std::size_t shards) {
    const forced_shards f(shards);
    std::unique_ptr<ucache> c;
    return sftest::alloc::bytes_during([&] { c = std::make_unique<ucache>(opts(1h, 1'000'000)); });
  };
  const std::size_t few = empty_with(8);
  const std::size_t many = empty_with(256);
  REQUIRE(many > few);
  const std::size_t per_shard = (many - few) / 248;
  INFO("8 shards " << few << " B, 256 shards " << many << " B: " << per_shard << " B a shard");
  CHECK(few < 64 * 1024);
  CHECK(per_shard < 1024);
}

TEST_CASE(
    "a node of cache<uint64_t, uint64_t> is 96 bytes: its refresh mark and load cost "
    "share a word",
    "[cache][eviction][r05]") {
  // Issue 35: at most 120 bytes an entry at 1M entries, bounded (bench/bench_memory.cpp). The
  // node was 104 bytes, a 64-bit refresh id and a whole duration for the last load's cost.
  using node = sf::detail::cache_node<std::uint64_t, std::uint64_t, std::chrono::steady_clock>;
  if constexpr (sizeof(void*) == 8) CHECK(sizeof(node) <= 96);

  // The cost, a float of ticks: exact for small counts, within 1e-7 beyond, clamped at max.
  sf::detail::load_cost<std::chrono::nanoseconds> cost;
  CHECK(cost.get() == std::chrono::nanoseconds::zero());
  cost.set(std::chrono::milliseconds(123));
  CHECK(cost.get() == std::chrono::milliseconds(123));
  const std::chrono::nanoseconds odd(123'456'789'123);
  cost.set(odd);
  CHECK(std::chrono::abs(cost.get() - odd).count() <= odd.count() / 10'000'000);
  cost.set(std::chrono::nanoseconds::max());
  CHECK(cost.get() == std::chrono::nanoseconds::max());

  // The refresh mark: 32 bits, never 0 (no refresh running), also when the count wraps.
  auto s = std::make_unique<sf::detail::cache_shard<node>>();
  CHECK(s->next_refresh() == 1);
  s->refreshes = std::numeric_limits<std::uint32_t>::max() - 1;
  CHECK(s->next_refresh() == std::numeric_limits<std::uint32_t>::max());
  CHECK(s->next_refresh() == 1);
}

TEST_CASE("a shard keeps a bucket for each node, and finds each of them",
          "[cache][eviction][r05]") {
  // A hit's chain holds at most one node on average: two a bucket (4 bytes an entry less) cost a
  // hit on a 1M-entry cache about a fifth more time (docs/performance.md, cache_hit_large).
  using node = sf::detail::cache_node<std::uint64_t, std::uint64_t, manual_clock>;
  auto s = std::make_unique<sf::detail::cache_shard<node>>();
  std::vector<std::unique_ptr<node>> nodes;
  const auto mixed = [](std::uint64_t k) { return sf::detail::mix64(k + 1); };
  const auto eq = [](std::uint64_t a, std::uint64_t b) { return a == b; };
  bool bounded = true;
  for (std::uint64_t k = 0; k < 5000; ++k) {
    s->reserve_one();
    nodes.push_back(std::make_unique<node>(k, mixed(k)));
    s->link(nodes.back().get());
    const std::size_t buckets = s->mask + 1;
    bounded = bounded && s->nodes <= buckets && (s->nodes <= 8 || buckets <= 2 * s->nodes);
  }
  CHECK(bounded);
  CHECK(s->mask + 1 == 8192);  // 5,000 nodes: 4,096 buckets hold 4,096 at most
  std::size_t found = 0;
  for (std::uint64_t k = 0; k < 5000; ++k) {
    found += s->find(k, mixed(k), eq) == nodes[k].get() ? 1 : 0;
  }
  CHECK(found == 5000);
  for (std::uint64_t k = 0; k < 5000; k += 2) s->unlink(nodes[k].get());
  for (std::uint64_t k = 0; k < 5000; ++k) {
    const node* want = k % 2 == 0 ? nullptr : nodes[k].get();
    found -= s->find(k, mixed(k), eq) == want ? 1 : 0;
  }
  CHECK(found == 0);
}
