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
//          once since it arrived moves to main; one never read leaves the
//          cache and its key's fingerprint enters the ghost queue. One-hit
//          wonders (scans) therefore pass through small without disturbing
//          main.
//   main   FIFO with reinsertion (a 2-bit CLOCK): at the tail, an entry with
//          frequency f > 0 goes back to the head with f - 1; one with f == 0
//          is evicted.
//   ghost  fingerprints of the keys that recently left small: a key seen
//          again soon after is admitted straight to main. Kept as a
//          direct-mapped table of (fingerprint, insertion number); a
//          fingerprint counts as present while fewer than `capacity` keys
//          were added after it (FIFO order by numbers, not by a list), so a
//          collision only forgets a ghost early.
//
// With capacity 0 (unbounded) nothing is evicted, and main alone keeps the
// entries in write order, so that writers can sweep dead entries from its
// tail (demand-driven: there is no timer).
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

  // s3fifo(): unbounded until configure() says otherwise.
  s3fifo() = default;

  // configure(capacity): capacity 0 = unbounded. Call once, before any
  // insert. Throws std::bad_alloc (the ghost table), changing nothing.
  void configure(std::size_t capacity) {
    if (capacity != 0) {
      const std::size_t slots = ghost_slots(capacity);
      ghost_.reset(new ghost_slot[slots]);
      ghost_mask_ = slots - 1;
    }
    capacity_ = capacity;
    small_target_ = capacity == 0 ? 0 : std::max<std::size_t>(1, capacity / 10);
    ghost_capacity_ = capacity;
  }

  s3fifo(const s3fifo&) = delete;
  s3fifo& operator=(const s3fifo&) = delete;
  ~s3fifo() = default;

  std::size_t size() const noexcept { return small_.n + main_.n; }
  std::size_t capacity() const noexcept { return capacity_; }

  // insert(n): a node that starts holding an entry. It must be in no queue.
  void insert(policy_hook* n) noexcept {
    n->freq.store(0, std::memory_order_relaxed);
    if (capacity_ == 0) {
      push_head(main_, n, main);
    } else if (ghost_take(n->fingerprint)) {
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
        if (t->freq.load(std::memory_order_relaxed) > 0) {  // read while in small: keep
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

  // sweep_one(dead): if the oldest entry of small or of main is dead,
  // removes it from the queues and returns it; else nullptr. Writers call it
  // a couple of times per insert, so dead entries do not pile up in an
  // unbounded cache.
  template <class Dead>
  policy_hook* sweep_one(Dead&& dead) {
    for (queue_list* q : {&small_, &main_}) {
      if (!q->empty() && dead(q->tail)) {
        policy_hook* t = q->tail;
        unlink(*q, t);
        return t;
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
  struct ghost_slot {
    std::uint64_t fingerprint = 0;
    std::uint64_t number = 0;  // 0: empty
  };

  static std::size_t ghost_slots(std::size_t capacity) noexcept {
    std::size_t s = 1;
    while (s < 2 * capacity) s <<= 1U;
    return s;
  }

  static void push_head(queue_list& q, policy_hook* n, std::uint8_t id) noexcept {
    n->queue = id;
    n->prev = nullptr;
    n->next = q.head;
    if (q.head != nullptr) q.head->prev = n;
    q.head = n;
    if (q.tail == nullptr) q.tail = n;
    ++q.n;
  }
  static void unlink(queue_list& q, policy_hook* n) noexcept {
    if (n->prev != nullptr) n->prev->next = n->next;
    if (n->next != nullptr) n->next->prev = n->prev;
    if (q.head == n) q.head = n->next;
    if (q.tail == n) q.tail = n->prev;
    n->prev = n->next = nullptr;
    n->queue = none;
    --q.n;
  }

  void ghost_add(std::uint64_t fp) noexcept {
    ghost_slot& s = ghost_[(fp >> 17U) & ghost_mask_];
    s.fingerprint = fp;
    s.number = ++ghost_added_;
  }
  bool ghost_take(std::uint64_t fp) noexcept {
    ghost_slot& s = ghost_[(fp >> 17U) & ghost_mask_];
    if (s.number == 0 || s.fingerprint != fp || ghost_added_ - s.number >= ghost_capacity_) {
      return false;
    }
    s.number = 0;
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
};

}  // namespace singleflight::detail
