// singleflight/detail/cache/cache_policy.hpp -- internal; do not include directly.
//
// The eviction policy of one shard of singleflight::cache: S3-FIFO (Yang,
// Zhang, Qiu, Yue, Vinayak, "FIFO queues are all you need for cache
// eviction", SOSP 2023), chosen over W-TinyLFU because its hit path is one
// relaxed store to the entry itself (a 2-bit frequency, saturating at 3) —
// no list to reorder, no shared sketch to increment, so hits on different
// keys write no common cache line and need no lock.
//
//   small  FIFO, ~10% of the capacity: every new entry starts here, unless
//          its key is in the ghost queue. At the tail, an entry read at least
//          twice since it arrived moves to main (promote_at, the paper's
//          freq > 1); one read less leaves the cache and its key's
//          fingerprint enters the ghost queue. One-hit wonders, and scans
//          that read each key twice in a row, therefore pass through small
//          without disturbing main.
//   main   FIFO with reinsertion (a 2-bit CLOCK): at the tail, an entry with
//          frequency f > 0 goes back to the head with f - 1; one with f == 0
//          is evicted.
//   ghost  fingerprints of the keys that recently left small: a key seen
//          again soon after is admitted straight to main. Kept as a
//          direct-mapped table of (32-bit tag, insertion number), 8 bytes a
//          slot, made by the first eviction and grown as keys are added; a
//          tag counts as present while fewer than 0.9 x capacity keys were
//          added after it (FIFO order by numbers, not by a list), so a
//          collision only forgets a ghost early.
//
// With capacity 0 (unbounded) nothing is evicted, and main alone keeps the
// entries in write order. In both cases writers sweep dead entries: a hand
// walks main from the tail a few entries per write, past live ones
// (demand-driven: there is no timer; sweep()).
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

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace singleflight::detail {

// The fields a policy needs in a node.
struct policy_hook {
  policy_hook* prev = nullptr;    // towards the head (newer)
  policy_hook* next = nullptr;    // towards the tail (older)
  std::uint64_t fingerprint = 0;  // the key's mixed hash (for the ghost queue)
  std::uint8_t queue = 0;         // s3fifo::none / small / main
  std::atomic<std::uint8_t> freq{0};

  // Reader side, lock-free: one more access, saturating at 3. Stores only
  // when it changes something, so a hot entry's line stays shared.
  void touch() noexcept {
    const std::uint8_t f = freq.load(std::memory_order_relaxed);
    if (f < 3) freq.store(static_cast<std::uint8_t>(f + 1), std::memory_order_relaxed);
  }
};

class s3fifo {
 public:
  enum : std::uint8_t { none = 0, small = 1, main = 2 };

  // Hits in small that move an entry to main at small's tail. The paper's
  // Algorithm 1 keeps an entry when freq > 1 (2 hits); docs/cache.md,
  // "Eviction, measured", has the traces behind the choice.
  static constexpr std::uint8_t promote_at = 2;
  // Entries the sweep looks at per write (sweep()).
  static constexpr int sweep_budget = 4;

  // s3fifo(): unbounded until configure() says otherwise.
  s3fifo() = default;

  // configure(capacity): capacity 0 = unbounded. Call once, before any
  // insert. Allocates nothing: the ghost table grows with the entries.
  void configure(std::size_t capacity) noexcept {
    capacity_ = capacity;
    small_target_ = capacity == 0 ? 0 : std::max<std::size_t>(1, capacity / 10);
    // The ghost remembers 0.9 x capacity keys (the paper's size); ages are
    // 32-bit (ghost_slot): at most 2^31 - 1 of them.
    ghost_capacity_ = capacity == 0 ? 0
                                    : std::clamp<std::size_t>(capacity - capacity / 10, 1,
                                                              (std::size_t{1} << 31U) - 1);
  }

  s3fifo(const s3fifo&) = delete;
  s3fifo& operator=(const s3fifo&) = delete;
  ~s3fifo() = default;

  std::size_t size() const noexcept { return small_.n + main_.n; }
  std::size_t capacity() const noexcept { return capacity_; }
  // ghost_bytes(): what the ghost table holds allocated now.
  std::size_t ghost_bytes() const noexcept {
    return ghost_ ? (ghost_mask_ + 1) * sizeof(ghost_slot) : 0;
  }

  // insert(n): a node that starts holding an entry. It must be in no queue.
  void insert(policy_hook* n) noexcept {
    n->freq.store(0, std::memory_order_relaxed);
    if (capacity_ == 0) {
      push_head(main_, n, main);
      return;
    }
    if (ghost_take(n->fingerprint)) {
      push_head(main_, n, main);
    } else {
      push_head(small_, n, small);
    }
  }

  // rewritten(n): a node in a queue got a new value (refresh, put). Bounded:
  // an access. Unbounded: back to the head, so that main stays in write order.
  void rewritten(policy_hook* n) noexcept {
    if (capacity_ == 0) {
      unlink(main_, n);
      push_head(main_, n, main);
    } else {
      n->touch();
    }
  }

  // remove(n): n stops holding an entry (invalidate, clear, expiry).
  void remove(policy_hook* n) noexcept {
    if (n->queue == small) unlink(small_, n);
    if (n->queue == main) unlink(main_, n);
  }

  // evict(dead): removes one entry from the queues and returns it, preferring
  // dead ones (`dead(hook)` says whether an entry is past every window);
  // nullptr when the cache is empty. Bounded caches only.
  template <class Dead>
  policy_hook* evict(Dead&& dead) {
    for (;;) {
      if (!small_.empty() && (small_.n >= small_target_ || main_.empty())) {
        policy_hook* t = small_.tail;
        unlink(small_, t);
        if (dead(t)) return t;
        if (t->freq.load(std::memory_order_relaxed) >= promote_at) {  // read again in small
          t->freq.store(0, std::memory_order_relaxed);
          push_head(main_, t, main);
          continue;
        }
        ghost_add(t->fingerprint);
        return t;
      }
      if (main_.empty()) return nullptr;
      policy_hook* t = main_.tail;
      unlink(main_, t);
      const std::uint8_t f = t->freq.load(std::memory_order_relaxed);
      if (f > 0 && !dead(t)) {
        t->freq.store(static_cast<std::uint8_t>(f - 1), std::memory_order_relaxed);
        push_head(main_, t, main);
        continue;
      }
      return t;
    }
  }

  // sweep(dead, budget): looks at up to `budget` entries (decremented for
  // each) and removes from the queues and returns the first dead one, or
  // nullptr. It looks at small's tail, then walks main from the tail towards
  // the head with a hand that stays where it stopped, so that live entries
  // (a long ttl at the old end) do not hide the dead ones behind them: every
  // entry of main is looked at once per size() / budget writes. Writers call
  // it while it returns entries, with one budget per write (bounded work),
  // so dead entries do not pile up in an unbounded cache (no timer does it).
  template <class Dead>
  policy_hook* sweep(Dead&& dead, int& budget) {
    if (budget > 0 && !small_.empty()) {
      --budget;
      if (dead(small_.tail)) {
        policy_hook* t = small_.tail;
        unlink(small_, t);
        return t;
      }
    }
    while (budget > 0 && !main_.empty()) {
      --budget;
      policy_hook* h = hand_ != nullptr ? hand_ : main_.tail;
      hand_ = h->prev;  // towards the head; nullptr: start again from the tail
      if (dead(h)) {
        unlink(main_, h);
        return h;
      }
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
  // One remembered key: the upper 32 bits of its fingerprint (never 0) and
  // the low 32 bits of its insertion number (ages are wrapping differences:
  // a ghost is remembered for fewer than 2^31 insertions). tag 0: empty.
  struct ghost_slot {
    std::uint32_t tag = 0;
    std::uint32_t number = 0;
  };

  void push_head(queue_list& q, policy_hook* n, std::uint8_t id) noexcept {
    n->queue = id;
    n->prev = nullptr;
    n->next = q.head;
    if (q.head != nullptr) q.head->prev = n;
    q.head = n;
    if (q.tail == nullptr) q.tail = n;
    ++q.n;
  }
  void unlink(queue_list& q, policy_hook* n) noexcept {
    if (hand_ == n) hand_ = n->prev;
    if (n->prev != nullptr) n->prev->next = n->next;
    if (n->next != nullptr) n->next->prev = n->prev;
    if (q.head == n) q.head = n->next;
    if (q.tail == n) q.tail = n->prev;
    n->prev = n->next = nullptr;
    n->queue = none;
    --q.n;
  }

  static std::uint32_t tag_of(std::uint64_t fp) noexcept {
    const auto t = static_cast<std::uint32_t>(fp >> 32U);
    return t == 0 ? 1 : t;  // 0 marks an empty slot
  }
  // A ghost's slot depends on its tag alone, so that a growing table can
  // move the ghosts it has. (The tag's low bits are the fingerprint's bits
  // 32 and up; shards take the top bits.)
  std::size_t slot_of(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>(tag) & ghost_mask_;
  }
  // The ghost table (direct-mapped: a collision forgets a ghost early) has
  // up to two slots per key it may remember. It is made by the first
  // eviction, with 64 slots, and doubles while fewer than twice as many
  // slots as keys added to it so far: a cache that never fills has none, one
  // that fills pays for it as it evicts. The allocation may fail (noexcept:
  // an eviction must not throw): the table then stays as it is, and
  // remembers fewer keys.
  void grow_ghost() noexcept {
    const std::size_t have = ghost_ ? ghost_mask_ + 1 : 0;
    const std::size_t keys =
        static_cast<std::size_t>(std::min<std::uint64_t>(ghost_added_ + 1, ghost_capacity_));
    std::size_t want = have == 0 ? 64 : have;
    while (want < 2 * keys) want *= 2;
    if (want == have) return;
    std::unique_ptr<ghost_slot[]> grown(new (std::nothrow) ghost_slot[want]());
    if (!grown) return;  // keeps the smaller table (it remembers fewer keys)
    for (std::size_t i = 0; i < have; ++i) {
      if (ghost_[i].tag != 0) grown[ghost_[i].tag & (want - 1)] = ghost_[i];
    }
    ghost_ = std::move(grown);
    ghost_mask_ = want - 1;
  }

  void ghost_add(std::uint64_t fp) noexcept {
    grow_ghost();
    if (!ghost_) return;
    const std::uint32_t tag = tag_of(fp);
    ghost_slot& s = ghost_[slot_of(tag)];
    s.tag = tag;
    s.number = static_cast<std::uint32_t>(++ghost_added_);
  }
  bool ghost_take(std::uint64_t fp) noexcept {
    if (!ghost_) return false;
    const std::uint32_t tag = tag_of(fp);
    ghost_slot& s = ghost_[slot_of(tag)];
    const auto age =
        static_cast<std::uint32_t>(static_cast<std::uint32_t>(ghost_added_) - s.number);
    if (s.tag != tag || age >= ghost_capacity_) return false;
    s = ghost_slot{};
    return true;
  }

  std::size_t capacity_ = 0;
  std::size_t small_target_ = 0;
  std::size_t ghost_capacity_ = 0;
  std::size_t ghost_mask_ = 0;
  std::unique_ptr<ghost_slot[]> ghost_;
  std::uint64_t ghost_added_ = 0;
  queue_list small_;
  queue_list main_;
  policy_hook* hand_ = nullptr;  // the sweep's place in main (see sweep())
};

}  // namespace singleflight::detail
