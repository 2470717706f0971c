// singleflight/detail/cache/cache_policy.hpp -- internal; do not include directly.
//
// The eviction policy of one shard of singleflight::cache: W-TinyLFU (Einziger,
// Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM
// ToS 2017) with its LRU lists replaced by CLOCK bits and its window sized by
// ghost feedback (docs/performance.md, "Eviction, measured", has the traces
// behind every choice). The hit path stays one relaxed store to the entry
// itself (a 2-bit frequency, saturating at 3): no list to reorder, no shared
// sketch to increment, so hits on different keys write no common cache line
// and need no lock. The policy reads those bits when it reaches an entry.
//
//   window     CLOCK, window_ entries (1 to 99 % of the capacity; 1 % to
//              start): every new entry starts here. At the tail, an entry
//              read since it was last looked at goes back to the head; one
//              that was not is the window's candidate for main.
//   probation  CLOCK, main's entries on trial: the candidate enters at the
//              head if main has room, else only if the frequency sketch saw
//              its key more often than probation's victim (Caffeine's rule:
//              a candidate seen 6 times or more also wins 1 time in 128, so
//              that an attacker cannot pin a victim). At the tail, an entry
//              read since it came is promoted to protected; one that was not
//              is main's victim.
//   protected  CLOCK, at most 80 % of main: entries read in probation. At the
//              tail, an entry read since it was last looked at goes back to
//              the head; one that was not returns to probation's head.
//   sketch     TinyLFU's count-min sketch: four rows of 4-bit counters packed
//              16 to a uint64_t, behind the paper's doorkeeper (a bloom
//              filter that takes a key's first sighting, so that one-hit
//              keys do not load the counters); every counter halved and the
//              doorkeeper cleared after 16 x capacity sightings (see
//              frequency_sketch; with 10 x, web07@1000 was 0.24 points and
//              sprite@100 0.64 lower: docs/performance.md, "The sketch's
//              period"). A miss counts at insert(); an entry's hits are
//              added (its freq, then reset) when the policy reaches it, so a
//              hit writes nothing shared. The rows grow with the entries, to
//              twice as many counters a row as entries (frequency_sketch::fit;
//              as wide as the entries, sprite@100 lost 1.1 points to
//              collisions), so an empty cache has no sketch.
//   ghosts     two fingerprint tables (ghost_table) of 0.25 x capacity keys
//              each: the window's candidates that lost their duel, and main's
//              victims. A miss on a lost key grows the window by one entry if
//              it returns within the cache's capacity in accesses (a recency
//              workload: the window was too small to keep it); a miss on an
//              evicted key shrinks it by one (main was too small). A loop a
//              little longer than the cache returns later than that, and
//              leaves the window small. When the window shrank, its surplus
//              candidate enters probation without a duel (so that main grows
//              by one entry as the window gives one up). A lost key back
//              within the capacity also enters the window as if read once:
//              one more pass through it before its next duel, and its return
//              counted once more in the sketch (the loop just over the
//              capacity 90.6 -> 92.3 %, the mean gap to OPT 5.03 -> 4.93
//              points; docs/performance.md).
//   surge      one entry per returning loser is slow when a new working set
//              arrives: its keys lose their duels against main's victims,
//              which the sketch saw more often in the previous phase. So the
//              inserts are counted in blocks of max(64, capacity / 4); when a
//              third of a block or more were lost keys back within the
//              capacity, the window also takes a quarter of the way to its
//              maximum at once, and the ghost rule brings it back (surge();
//              sprite@1000 +0.43 points with the policy driven alone, no cell
//              down by more than 0.07: docs/performance.md, "A new working
//              set"). Three counters a shard, nothing an entry.
//
// Accesses: the policy sees misses only (insert). Its clock is the shard's
// hits so far, as the read gate counts them per shard over every stripe
// (a `hits()` callable the shard passes to insert() and evict(), called
// only when a candidate loses its duel or a lost key returns), plus the
// shard's inserts: the shard's accesses, compared with the shard's share of
// the capacity (a shard sees about 1/shards of the accesses and holds
// 1/shards of the entries). A stamp refreshed every capacity / 16 misses
// instead ran behind by the hits between refreshes, and the loop just
// over the capacity (docs/performance.md) fell from 92 to 70 %.
//
// With capacity 0 (unbounded) nothing is evicted, and one queue (window_q)
// keeps the entries in write order; no sketch, no ghosts. In both cases
// writers sweep dead entries: a hand walks the queues from their tails a few
// entries per write, past live ones (demand-driven: there is no timer;
// sweep()).
//
// The capacity is the shard's share of the cache's max_entries; the table
// lets a shard hold more than its share while the cache has room
// (cache_table.hpp, "the entry budget").
//
// Entries that are dead (past every window, see cache.hpp) are evicted
// before any live one whenever the policy reaches them.
//
// Locking: every member runs with the shard's mutex held; `freq` is the one
// field readers touch without it (relaxed atomic: a lost increment only makes
// the policy slightly less informed).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "../algorithm.hpp"
#include "../config.hpp"

namespace singleflight::detail {

// The fields a policy needs in a node.
struct policy_hook {
  policy_hook* prev = nullptr;    // towards the head (newer)
  policy_hook* next = nullptr;    // towards the tail (older)
  std::uint64_t fingerprint = 0;  // the key's mixed hash (sketch and ghosts)
  std::uint8_t queue = 0;         // wtinylfu::none / window_q / probation_q / protected_q
  std::atomic<std::uint8_t> freq{0};

  // Reader side, lock-free: one more access, saturating at 3. Stores only
  // when it changes something, so a hot entry's line stays shared.
  void touch() noexcept {
    const std::uint8_t f = freq.load(std::memory_order_relaxed);
    if (f < 3) freq.store(static_cast<std::uint8_t>(f + 1), std::memory_order_relaxed);
  }
};

// frequency_sketch: TinyLFU's count-min sketch of how often keys were seen,
// behind the paper's doorkeeper: four rows of 4-bit counters (16 to a
// uint64_t), conservative increments, and a bloom filter of two bits a key.
// A key's first sighting only sets its doorkeeper bits; the counters count
// from the second, and estimate() is the counters' minimum plus the
// doorkeeper's bit. After `sample` sightings (doorkeeper or counters) every
// counter is halved and the doorkeeper cleared (the paper's reset, which
// ages the counts). Keys seen once, a scan, thus never load the counters: a
// scan of 15x the capacity still gives its keys an estimate of 1, not the 2
// that collisions in counters it had loaded gave (test_cache c9). A scan that
// crosses a halving can flush keys last read before it, as their counts halve:
// that is how the sketch forgets. A row's counter for a key is at hash_r & (width - 1), a
// doorkeeper bit at hash & (16 x width - 1), so doubling the width keeps
// every estimate: each word is copied into both halves (a key's new slot is
// its old one, or the old one + the old size). Made at the first fit() (64
// counters a row: 128 bytes, and 128 bytes of doorkeeper), doubled while
// narrower than the entries. The allocation may fail (noexcept: an insert
// must not throw): the rows then stay as they are (more collisions).
class frequency_sketch {
 public:
  SINGLEFLIGHT_DECL void configure(std::size_t capacity) noexcept;
  // fit(entries): rows at least `entries` wide (and made, if not yet).
  SINGLEFLIGHT_DECL void fit(std::size_t entries) noexcept;
  // estimate(fp): how often fp was seen (0 to 16), an overestimate.
  SINGLEFLIGHT_DECL int estimate(std::uint64_t fp) const noexcept;
  // add(fp, times): fp seen `times` more times.
  SINGLEFLIGHT_DECL void add(std::uint64_t fp, int times) noexcept;
  SINGLEFLIGHT_DECL std::size_t bytes() const noexcept;

 private:
  std::size_t slot(std::uint64_t fp, std::size_t r) const noexcept {
    static constexpr std::uint64_t seeds[4] = {0xc3a5c85c97cb3127ULL, 0xb492b66fbe98f273ULL,
                                               0x9ae16a3b2f90404fULL, 0xcbf29ce484222325ULL};
    std::uint64_t x = (fp ^ seeds[r]) * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 32U;
    return static_cast<std::size_t>(x) & (width_ - 1);
  }
  // The doorkeeper's two bits for fp, as positions in [0, 16 x width).
  void door_bits(std::uint64_t fp, std::size_t (&b)[2]) const noexcept {
    std::uint64_t x = (fp ^ 0x8445d61a4e774912ULL) * 0xd6e8feb86659fd93ULL;
    x ^= x >> 29U;
    const std::size_t mask = 16 * width_ - 1;
    b[0] = static_cast<std::size_t>(x) & mask;
    b[1] = static_cast<std::size_t>(x >> 32U | x << 32U) & mask;
  }
  std::uint64_t* door() const noexcept { return words_.get() + width_ / 4; }
  bool door_has(std::uint64_t fp) const noexcept {
    std::size_t b[2];
    door_bits(fp, b);
    const std::uint64_t* d = door();
    return ((d[b[0] / 64] >> (b[0] % 64)) & (d[b[1] / 64] >> (b[1] % 64)) & 1U) != 0;
  }
  // door_set(fp): sets fp's doorkeeper bits; true if they were not all set.
  bool door_set(std::uint64_t fp) noexcept {
    std::size_t b[2];
    door_bits(fp, b);
    std::uint64_t* d = door();
    bool fresh = false;
    for (const std::size_t i : b) {
      const std::uint64_t bit = std::uint64_t{1} << (i % 64);
      fresh |= (d[i / 64] & bit) == 0;
      d[i / 64] |= bit;
    }
    return fresh;
  }
  static std::uint64_t one(std::size_t s) noexcept { return std::uint64_t{1} << (4 * (s % 16)); }
  int get(std::size_t r, std::size_t s) const noexcept {
    return static_cast<int>((words_[r * (width_ / 16) + s / 16] >> (4 * (s % 16))) & 15U);
  }
  SINGLEFLIGHT_DECL void halve() noexcept;

  std::unique_ptr<std::uint64_t[]> words_;  // row r: words [r * width / 16, (r + 1) * width / 16);
                                            // the doorkeeper: [width / 4, width / 2)
  std::size_t width_ = 0;                   // counters per row, a power of two >= 64
  std::uint64_t adds_ = 0;
  std::uint64_t sample_ = 10;
};

// ghost_table<Stamped>: fingerprints of the last `keys` keys added, with the
// access stamp each was added at if Stamped. Direct-mapped (a collision
// forgets a ghost early): a slot holds the upper 32 bits of a fingerprint
// (never 0), the low 32 bits of its insertion number (a ghost counts as
// present while fewer than `keys` were added after it: FIFO order by
// numbers, not by a list) and the stamp (12 bytes a slot; 8 without: the
// table of main's victims reads no stamp).
// Made by the first add(), with 64 slots, and doubled while it has fewer
// slots than keys added so far (a slot a key: two moved no trace's hit ratio
// by more than 0.11 points and cost 5.3 bytes an entry; docs/performance.md):
// a cache that never evicts has none.
// The allocation may fail (noexcept: an eviction must not throw): the table
// then stays as it is, and remembers fewer keys.
template <bool Stamped>
struct ghost_slot {
  std::uint32_t tag = 0;  // 0: empty
  std::uint32_t number = 0;
  std::uint32_t stamp = 0;
};
template <>
struct ghost_slot<false> {
  std::uint32_t tag = 0;  // 0: empty
  std::uint32_t number = 0;
};

template <bool Stamped>
class ghost_table {
 public:
  using slot = ghost_slot<Stamped>;
  // configure(keys): remembers up to `keys` (< 2^31) keys.
  SINGLEFLIGHT_DECL void configure(std::size_t keys) noexcept;
  // add(fp, stamp): `stamp` is kept if Stamped.
  SINGLEFLIGHT_DECL void add(std::uint64_t fp, std::uint32_t stamp = 0) noexcept;
  // find(fp): fp's slot if fp is remembered, else nullptr.
  SINGLEFLIGHT_DECL const slot* find(std::uint64_t fp) const noexcept;
  SINGLEFLIGHT_DECL std::size_t bytes() const noexcept;

 private:
  static std::uint32_t tag_of(std::uint64_t fp) noexcept {
    const auto t = static_cast<std::uint32_t>(fp >> 32U);
    return t == 0 ? 1 : t;
  }
  SINGLEFLIGHT_DECL void grow() noexcept;

  std::unique_ptr<slot[]> slots_;
  std::size_t mask_ = 0;
  std::size_t keys_ = 1;
  std::uint64_t added_ = 0;
};

#if defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
// Instantiated once, in singleflight/src.hpp's translation unit (impl/cache_policy.ipp).
extern template class ghost_table<true>;
extern template class ghost_table<false>;
#endif

class wtinylfu {
 public:
  enum : std::uint8_t { none = 0, window_q = 1, probation_q = 2, protected_q = 3 };

  // Entries the sweep looks at per write (sweep()).
  static constexpr int sweep_budget = 4;

  // wtinylfu(): unbounded until configure() says otherwise.
  SINGLEFLIGHT_DECL wtinylfu() noexcept;

  // configure(capacity): this shard's share of max_entries (0 =
  // unbounded). Call once, before any insert. Allocates nothing: the sketch
  // and the ghost tables grow with the entries.
  SINGLEFLIGHT_DECL void configure(std::size_t capacity) noexcept;

  wtinylfu(const wtinylfu&) = delete;
  wtinylfu& operator=(const wtinylfu&) = delete;
  SINGLEFLIGHT_DECL ~wtinylfu();

  std::size_t size() const noexcept { return q_[window_q].n + main_size(); }
  std::size_t capacity() const noexcept { return capacity_; }
  // window(): the window's target size now (bounded caches).
  std::size_t window() const noexcept { return window_; }
  // ghost_bytes(): what the ghost tables and the sketch hold allocated now.
  SINGLEFLIGHT_DECL std::size_t ghost_bytes() const noexcept;

  // insert(n, hits): a node that starts holding an entry (a miss, or a put).
  // It must be in no queue. `hits()`: the shard's hits so far (see
  // "accesses" above), called only for a key the window lost.
  template <class Hits>
  void insert(policy_hook* n, Hits&& hits) noexcept {
    n->freq.store(0, std::memory_order_relaxed);
    if (capacity_ == 0) {
      push_head(window_q, n);
      return;
    }
    sketch_.fit(2 * (size() + 1));
    sketch_.add(n->fingerprint, 1);
    if (const ghost_table<true>::slot* g = lost_.find(n->fingerprint)) {
      if (static_cast<std::uint32_t>(now(hits) - g->stamp) < horizon_) {
        window_ = std::min(window_max_, window_ + 1);
        ++surge_back_;
        // Back soon after it lost: it starts as if read once (a second pass
        // through the window before its next duel, and one more sighting for
        // the sketch when its bits are folded).
        n->freq.store(1, std::memory_order_relaxed);
      }
    } else if (evicted_.find(n->fingerprint) != nullptr) {
      window_ = std::max<std::size_t>(1, window_ - 1);
    }
    ++inserts_;
    if (++surge_inserts_ == surge_block_) surge();
    push_head(window_q, n);
  }

  // rewritten(n): a node in a queue got a new value (refresh, put). Bounded:
  // an access. Unbounded: back to the head, so that the queue stays in write
  // order.
  SINGLEFLIGHT_DECL void rewritten(policy_hook* n) noexcept;

  // remove(n): n stops holding an entry (invalidate, clear, expiry).
  SINGLEFLIGHT_DECL void remove(policy_hook* n) noexcept;

  // evict(dead, hits): removes one entry from the queues and returns it,
  // preferring dead ones (`dead(hook)` says whether an entry is past every
  // window; `hits` as for insert(), called when a candidate loses);
  // nullptr when the cache is empty. Called before the insert it makes room
  // for, so the window gives up its candidate once it holds window_ entries
  // (the new one makes window_ + 1). Bounded caches only.
  template <class Dead, class Hits>
  policy_hook* evict(Dead&& dead, Hits&& hits) {
    for (;;) {
      queue_list& w = q_[window_q];
      if (!w.empty() && (w.n >= window_ || main_size() == 0)) {
        policy_hook* c = w.tail;
        if (dead(c)) return take(c);
        if (fold(c)) {  // read in the window: a second chance
          unlink(c);
          push_head(window_q, c);
          continue;
        }
        // main has room, or the window shrank: no duel.
        if (main_size() < capacity_ - window_ || w.n > window_) {
          unlink(c);
          push_head(probation_q, c);
          continue;
        }
        if (main_size() == 0) {  // a capacity too small for a main
          unlink(c);
          lost_.add(c->fingerprint, now(hits));
          return c;
        }
        policy_hook* v = victim(dead);
        if (dead(v) || admits(c, v)) {
          unlink(v);
          if (!dead(v)) evicted_.add(v->fingerprint);
          unlink(c);
          push_head(probation_q, c);
          return v;
        }
        unlink(c);
        lost_.add(c->fingerprint, now(hits));
        return c;
      }
      if (main_size() == 0) return nullptr;
      policy_hook* v = victim(dead);
      unlink(v);
      if (!dead(v)) evicted_.add(v->fingerprint);
      return v;
    }
  }

  // sweep(dead, budget): looks at up to `budget` entries (decremented for
  // each) and removes from the queues and returns the first dead one, or
  // nullptr. A bounded cache looks at the window's tail first; then a hand
  // walks each queue in turn from the tail towards the head and stays where
  // it stopped, so that live entries (a long ttl at the old end) do not hide
  // the dead ones behind them: every entry is looked at once per size() /
  // budget writes. Writers call it while it returns entries, with one budget
  // per write (bounded work), so dead entries do not pile up in an unbounded
  // cache (no timer does it).
  template <class Dead>
  policy_hook* sweep(Dead&& dead, int& budget) {
    if (capacity_ != 0 && budget > 0 && !q_[window_q].empty()) {
      --budget;
      if (dead(q_[window_q].tail)) return take(q_[window_q].tail);
    }
    while (budget > 0 && size() > 0) {
      if (hand_ == nullptr) {  // the next queue, from its tail
        hand_queue_ = hand_queue_ == protected_q ? window_q : hand_queue_ + 1;
        hand_ = q_[hand_queue_].tail;
        continue;
      }
      --budget;
      policy_hook* h = hand_;
      hand_ = h->prev;  // towards the head; nullptr: the next queue
      if (dead(h)) return take(h);
    }
    return nullptr;
  }

 private:
  struct queue_list {
    policy_hook* head = nullptr;
    policy_hook* tail = nullptr;
    std::size_t n = 0;
    bool empty() const noexcept { return n == 0; }
  };

  std::size_t main_size() const noexcept { return q_[probation_q].n + q_[protected_q].n; }
  // now(hits): the shard's accesses so far: its hits and its inserts (32
  // bits: ages are wrapping differences).
  template <class Hits>
  std::uint32_t now(Hits& hits) const noexcept {
    return static_cast<std::uint32_t>(hits() + inserts_);
  }

  // fold(n): n's reads since it was last looked at go into the sketch, and
  // its bits are reset. True if it was read.
  SINGLEFLIGHT_DECL bool fold(policy_hook* n) noexcept;
  // admits(c, v): the window's candidate c takes the place of main's victim v.
  SINGLEFLIGHT_DECL bool admits(const policy_hook* c, const policy_hook* v) noexcept;
  // victim(dead): main's victim, left in its queue: probation's tail once it
  // was not read since it came (or is dead); one that was read moves to
  // protected. protected's tail when probation is empty. main not empty.
  template <class Dead>
  policy_hook* victim(Dead& dead) {
    for (;;) {
      const std::uint8_t q = q_[probation_q].empty() ? protected_q : probation_q;
      policy_hook* t = q_[q].tail;
      if (dead(t) || !fold(t)) return t;
      unlink(t);
      push_head(protected_q, t);
      if (q == probation_q) demote();
    }
  }
  // surge(): the end of a block of surge_block_ inserts. If a third of them
  // or more were keys the window lost coming back within the horizon, a new
  // working set is arriving faster than one entry per returning loser can
  // follow: the window takes a quarter of the way to its maximum at once (the
  // ghost rule brings it back). Starts the next block.
  SINGLEFLIGHT_DECL void surge() noexcept;
  // demote(): protected back to 80 % of main: its tail returns to
  // probation's head, unless read since it was last looked at.
  SINGLEFLIGHT_DECL void demote() noexcept;
  policy_hook* take(policy_hook* n) noexcept {
    unlink(n);
    return n;
  }

  SINGLEFLIGHT_DECL void push_head(std::uint8_t id, policy_hook* n) noexcept;
  SINGLEFLIGHT_DECL void unlink(policy_hook* n) noexcept;

  std::size_t capacity_ = 0;
  std::size_t window_ = 0;         // the window's target size
  std::size_t window_max_ = 0;     // 99 % of the capacity
  std::uint32_t horizon_ = 0;      // a lost key grows the window if back within this many accesses
                                   // (the capacity)
  std::uint64_t inserts_ = 0;      // the shard's misses (and puts) so far
  std::uint32_t surge_block_ = 0;  // inserts a block of surge() (max(64, capacity / 4))
  std::uint32_t surge_inserts_ = 0;  // inserts in this block so far
  std::uint32_t surge_back_ = 0;     // of them, lost keys back within the horizon
  std::uint64_t rng_ = 0x9e3779b97f4a7c15ULL;
  frequency_sketch sketch_;
  ghost_table<true> lost_;              // the window's candidates that lost their duel
  ghost_table<false> evicted_;          // main's victims (no stamp read)
  queue_list q_[4];                     // indexed by queue id; q_[none] unused
  policy_hook* hand_ = nullptr;         // the sweep's place (see sweep())
  std::uint8_t hand_queue_ = window_q;  // the queue hand_ walks
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/cache_policy.ipp"
#endif
