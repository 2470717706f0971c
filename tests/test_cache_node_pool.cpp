// singleflight::cache's node pool (detail/cache/node_pool.hpp, issue 35): a shard's nodes come
// from slabs, and a node's memory is given back, without a lock, after its key and value were
// destroyed outside the shard's mutex. The pool reuses what was given back instead of growing,
// an exception from Key's copy gives the memory back, and a reader never sees a reused node as
// the one it looked for (readers hit keys of a shard while a writer frees and remakes nodes of
// that shard; under ThreadSanitizer this also checks the hand-over of the memory).
#include <singleflight/cache.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using namespace std::chrono_literals;

namespace {

struct small_node {
  std::uint64_t a[12];  // 96 bytes, the size of cache<uint64_t, uint64_t>'s node
};
struct big_node {
  char a[1024];
};
using small_pool = sf::detail::node_pool<small_node>;

// A key whose copy throws while `throw_copies` is set.
std::atomic<bool> throw_copies{false};
struct fragile_key {
  std::uint64_t k;
  fragile_key(std::uint64_t v) : k(v) {}  // NOLINT: implicit, as an integer key would be
  fragile_key(const fragile_key& o) : k(o.k) {
    if (throw_copies.load()) throw std::runtime_error("key copy");
  }
  fragile_key& operator=(const fragile_key&) = default;
  bool operator==(const fragile_key& o) const { return k == o.k; }
};
struct fragile_hash {
  std::size_t operator()(const fragile_key& k) const { return std::hash<std::uint64_t>{}(k.k); }
};

}  // namespace

TEST_CASE("the node pool reuses given-back slots before it grows", "[cache][node_pool]") {
  STATIC_REQUIRE(small_pool::pooled);
  STATIC_REQUIRE_FALSE(sf::detail::node_pool<big_node>::pooled);
  small_pool p;
  CHECK(p.slab_bytes() == 0);
  std::vector<void*> taken;
  for (int i = 0; i < 8; ++i) taken.push_back(p.take());  // the first slab: 8 nodes
  const std::size_t one_slab = p.slab_bytes();
  CHECK(one_slab >= 8 * sizeof(small_node));
  CHECK(std::set<void*>(taken.begin(), taken.end()).size() == 8);
  for (void* a : taken) {
    CHECK(reinterpret_cast<std::uintptr_t>(a) % alignof(small_node) == 0);
  }
  // Given back: half one by one, half in a batch.
  small_pool::batch b;
  for (int i = 0; i < 4; ++i) p.give_back(taken[static_cast<std::size_t>(i)]);
  for (int i = 4; i < 8; ++i) b.add(taken[static_cast<std::size_t>(i)]);
  p.give_back(b);
  CHECK(b.head == nullptr);
  std::vector<void*> again;
  for (int i = 0; i < 8; ++i) again.push_back(p.take());
  CHECK(p.slab_bytes() == one_slab);  // no new slab
  std::sort(taken.begin(), taken.end());
  std::sort(again.begin(), again.end());
  CHECK(again == taken);
  void* more = p.take();  // the pool is empty: a second slab
  CHECK(p.slab_bytes() > one_slab);
  p.give_back(more);
  for (void* a : again) p.give_back(a);
}

TEST_CASE("a Key copy that throws gives the node's memory back", "[cache][node_pool]") {
  sf::cache<fragile_key, std::uint64_t, fragile_hash, std::equal_to<>> c;
  c.put(1, 1);
  throw_copies.store(true);
  CHECK_THROWS_AS(c.put(2, 2), std::runtime_error);
  throw_copies.store(false);
  CHECK(c.size() == 1);
  CHECK_FALSE(c.peek(2));
  for (std::uint64_t k = 2; k < 100; ++k) c.put(k, k);  // the shard's lock was released
  CHECK(c.size() == 99);
  REQUIRE(c.peek(50));
  CHECK(*c.peek(50)->value == 50);
}

TEST_CASE("readers never see a freed and remade node as theirs", "[cache][node_pool]") {
  // One shard (a bounded table has at most one per 1,024 entries): the writer frees and
  // remakes nodes of the shard the readers read, so freed slots are reused at once.
  sf::cache_options o;
  o.ttl = 1h;
  o.max_entries = 64;
  sf::cache<std::uint64_t, std::uint64_t> c(o);
  constexpr std::uint64_t keys = 32;
  constexpr int rounds = 2000;
  for (std::uint64_t k = 0; k < keys; ++k) c.put(k, k * 1000 + 7);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0};
  std::atomic<std::uint64_t> seen{0};
  const auto reader = [&](std::uint64_t first) {
    for (std::uint64_t i = first; !stop.load(std::memory_order_relaxed); ++i) {
      const std::uint64_t k = i % keys;
      if (auto e = c.peek(k)) {
        if (*e->value != k * 1000 + 7) wrong.fetch_add(1);
        seen.fetch_add(1, std::memory_order_relaxed);
      }
    }
  };
  sftest::thread r1([&] { reader(0); });
  sftest::thread r2([&] { reader(keys / 2); });
  for (int r = 0; r < rounds; ++r) {
    for (std::uint64_t k = 0; k < keys; k += 2) c.invalidate(k);  // freed: their slots go back
    for (std::uint64_t k = 0; k < keys; k += 2) c.put(k, k * 1000 + 7);  // and are reused
  }
  stop.store(true);
  r1.join("reader 1");
  r2.join("reader 2");
  CHECK(wrong.load() == 0);
  CHECK(seen.load() > 0);
  CHECK(c.size() == keys);
}
