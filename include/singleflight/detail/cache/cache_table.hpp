// singleflight/detail/cache/cache_table.hpp -- internal; do not include directly.
//
// The sharded entry table of singleflight::cache: what it stores per key
// (cache_node), the shards (a mutex, a chained hash table, the eviction
// policy and the writer-side counters each), the per-stripe reader counters,
// and the read_gate that lets hits read a shard without its mutex.
//
// Locking (one shard at a time; a second one only with try_lock):
//   * shard::mu guards everything in the shard. The one place that holds two
//     is admission into a full bounded table, which may take a slot from
//     another shard (cache_writes.hpp, make_room): it only ever try_locks
//     the second shard, so no thread waits for a mutex while holding one. A writer (anything that
//     changes what a reader may look at: links, outcomes, times, versions)
//     also locks the shard's readers out (shard_lock::write()).
//   * A hit reads inside a read section (read_gate::try_enter): the bucket
//     chain, the node's key, outcome and times, and its value (value_slot: a
//     small trivially copyable T copied out of the node, any other T's
//     shared_ptr copied, which only increments its reference count). Readers write only
//     atomics: the node's `freq` and `refresh_id` hint, and their stripe's
//     counters.
//   * Fields marked "mutex" are never read by a reader and change under the
//     mutex alone.
// Nothing in this file runs user code under the mutex except KeyEqual (in
// find) and allocation (a new bucket array, a new slab of nodes). Keys,
// values and exceptions are destroyed after the mutex is released (see
// garbage and the `old_*` locals in cache_writes.hpp and cache_loads.hpp);
// a node's memory then goes back to its shard's pool without a lock
// (node_pool.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "../algorithm.hpp"
#include "cache_clock.hpp"
#include "cache_policy.hpp"
#include "node_pool.hpp"
#include "owned_array.hpp"
#include "read_gate.hpp"
#include "value_box.hpp"

namespace singleflight::detail {

#if defined(SINGLEFLIGHT_TEST_HOOKS)
// A test-only seam: when nonzero, the shard count of every cache_table made
// from then on (rounded down to a power of two), so that tests and the trace
// benchmark can run the table as a machine with more (or fewer) cores would.
// Relaxed: set before the caches it applies to are made, on the same thread.
inline std::atomic<std::size_t> cache_shards_for_tests{0};
// The shard count of the last cache_table made (what the default rule chose).
inline std::atomic<std::size_t> cache_shards_last_made{0};
#endif

// What a node holds.
enum class held : std::uint8_t {
  nothing,    // no entry: a record kept only for a load, a refresh or a waiter
  value,      // a value (possibly stale, possibly with a failure throttling loads)
  not_found,  // the loader said "no such key" (load_result::not_found)
  error,      // a cached failure (error_ttl), with no usable value
};

// value_slot<T>: where a node keeps its value (kind == value). A small
// trivially copyable T (no larger than two pointers, as aligned as a
// pointer at most) sits in the node itself: a hit copies it (a memcpy) inside
// its read section, and an entry costs no allocation of its own. Any other T
// lives in a shared box (value_box.hpp), so that a hit takes one reference
// count and copies T after the section. Written by writers with the readers locked out; read
// inside read sections or under the mutex.
template <class T>
inline constexpr bool value_in_node = std::is_trivially_copyable_v<T> &&
                                      sizeof(T) <= 2 * sizeof(void*) &&
                                      alignof(T) <= alignof(void*);

template <class T, bool Inline = value_in_node<T>>
struct value_slot {
  value_ref<T> box;

  const T& get() const noexcept { return *box; }
  // share(): the value in a box of its own (a reference count).
  value_ref<T> share() const noexcept { return box; }
  // store(b): the slot holds *b; `b` leaves with the old box, to be released
  // after the lock.
  void store(value_ref<T>& b) noexcept { box.swap(b); }
  // clear(old): the slot holds nothing; `old` leaves with the box, to be
  // released after the lock.
  void clear(value_ref<T>& old) noexcept { old = std::move(box); }  // box: empty
};

template <class T>
struct value_slot<T, true> {
  union {
    char none;
    T v;
  };
  value_slot() noexcept : none() {}

  const T& get() const noexcept { return v; }
  // share(): a copy in a new box (an allocation, no user code: T is trivially copyable).
  value_ref<T> share() const { return value_ref<T>::make(v); }
  // store(b): the slot holds a copy of *b (a memcpy); `b` keeps its box.
  void store(value_ref<T>& b) noexcept { std::construct_at(&v, *b); }
  // clear(old): nothing to release (T's destructor is trivial).
  void clear(value_ref<T>&) noexcept {}
};

// node_side: what a node needs only while a load runs or a get_fresh caller
// waits on its key, or after a failure: allocated then (by the writer that
// needs it, before its lock), released (after the lock) when none of it is
// left (idle()). A node without one has no failure and throttles nothing.
// error and throttle_until are read by hits and written, like the node's
// `side` pointer itself, with the readers locked out; loading and
// fresh_waiters: mutex only.
template <class Clock>
struct node_side {
  using time_point = typename Clock::time_point;
  std::exception_ptr error;                       // the failure (see cache_node::side)
  time_point throttle_until = time_point::min();  // no load before this (after a failure)
  std::uint32_t loading = 0;                      // loads registered and not yet finished
  std::uint32_t fresh_waiters = 0;                // get_fresh callers waiting on this key
  bool idle() const noexcept {
    return !error && throttle_until == time_point::min() && loading == 0 && fresh_waiters == 0;
  }
};

// pin_count: a node's count of holders, changed and read under the shard's
// mutex only. It shares a word with policy_hook::freq, which hits store to
// without the mutex: its accesses are relaxed atomic loads and stores (plain
// moves; never a read-modify-write, the mutex orders them), so that the
// compiler never merges one with a neighbour's into a wider plain access
// that covers `freq` (a race under TSan, though none on the hardware).
struct pin_count {
  std::atomic<std::uint32_t> n{0};
  void operator++() noexcept {
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void operator--() noexcept {
    n.store(n.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  }
  bool zero() const noexcept { return n.load(std::memory_order_relaxed) == 0; }
};

// load_cost<D>: a load's duration (XFetch's delta, cache_clock.hpp) in 32
// bits: for an arithmetic rep, its count as a float (exact to 2^24 ticks, 16
// ms in nanoseconds, and to 6e-8 of itself beyond, which a random draw
// scales anyway), so that it shares a word with the node's refresh mark;
// any other rep as it is. Written with the readers locked out; read by hits.
template <class D, bool Packed = std::is_arithmetic_v<typename D::rep>>
struct load_cost {
  D d{};
  D get() const noexcept { return d; }
  void set(D v) noexcept { d = v; }
};

template <class D>
struct load_cost<D, true> {
  float ticks = 0.0F;
  D get() const noexcept {
    if constexpr (std::is_integral_v<typename D::rep>) {
      // The float of a count near rep's maximum may round above it.
      if (ticks >= static_cast<float>(std::numeric_limits<typename D::rep>::max())) {
        return D::max();
      }
    }
    return D(static_cast<typename D::rep>(ticks));
  }
  void set(D v) noexcept { ticks = static_cast<float>(v.count()); }
};

// One key's record. Lives from the first load, put or refresh of its key
// until it holds nothing and nobody holds its address (pins == 0).
// Layout: kind, load_outdated and pins fill policy_hook's tail padding (the
// hook is not a POD, so the Itanium ABI lays them out there), and the
// windows derived from fresh_until by a fixed option (stale_while_revalidate,
// stale_if_error) are computed, not stored (cache_lookup: stale_until(),
// error_until()); what only loads, get_fresh callers and failures need is in
// a node_side allocated then; the last load's cost (a float of ticks) and the
// refresh mark (32 bits) share the last word. 96 bytes for uint64_t keys and
// values, taken from the shard's node_pool (no malloc header or rounding),
// and no value box (bench/bench_memory.cpp).
template <class Key, class T, class Clock>
struct cache_node : policy_hook {
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;

  template <class K>
  cache_node(const K& k, std::uint64_t mixed) : key(k) {
    fingerprint = mixed;
  }

  // Read by hits; written with the readers locked out.
  held kind = held::nothing;
  // Mutex only: the key's version changed since the last load registered
  // (begin_load clears it; every write of `version` sets it). With
  // loading > 0: a load is running that cannot publish (get_fresh's cue).
  bool load_outdated = false;
  pin_count pins;  // mutex only: holders of this node's address

  cache_node* chain = nullptr;  // next in the bucket (or in a garbage list)
  const Key key;

  // Read by hits; written with the readers locked out.
  value_slot<T> value;        // kind == value
  std::uint64_t version = 0;  // the key's version: bumped by put / invalidate / clear
  time_point written{};       // when the value (or not_found) was stored
  time_point fresh_until{};   // written + jittered ttl
  // The failure (kind == error, or the one behind the throttle), the
  // throttle and the load counters; null while there are none.
  std::unique_ptr<node_side<Clock>> side;
  load_cost<duration> cost;  // the last load's duration (XFetch's delta)

  // A hint for hits ("a refresh is already under way"): the running
  // refresh's number (cache_shard::next_refresh, never 0), or 0; set and
  // cleared under the mutex. Relaxed: a hit that reads a stale hint either
  // skips a refresh another one is doing, or takes the mutex and checks
  // again. 32 bits: the refresh that ends clears it only if it is still its
  // own, and a number comes back only after 2^32 - 1 others in the shard
  // (were one to, a second refresh of the key could start: the hint's
  // failure, harmless).
  std::atomic<std::uint32_t> refresh_id{0};

  // set_version(v): the key's version is now v. Readers locked out.
  void set_version(std::uint64_t v) noexcept {
    version = v;
    load_outdated = true;
  }

  // Read sections or mutex.
  time_point throttle_until() const noexcept {
    return side ? side->throttle_until : time_point::min();
  }
  bool failed() const noexcept { return side && side->error; }
  std::exception_ptr error() const noexcept { return side ? side->error : nullptr; }
  // Mutex only.
  std::uint32_t loading() const noexcept { return side ? side->loading : 0; }
  std::uint32_t fresh_waiters() const noexcept { return side ? side->fresh_waiters : 0; }
  // attach(spare): the side record, `spare` (then null) if the node had none.
  // Readers locked out.
  node_side<Clock>& attach(std::unique_ptr<node_side<Clock>>& spare) noexcept {
    if (!side) side = std::move(spare);
    return *side;
  }
  // settle(out): an idle side record leaves, into `out` (released after the
  // lock). Readers locked out.
  void settle(std::unique_ptr<node_side<Clock>>& out) noexcept {
    if (side && side->idle()) out = std::move(side);
  }
};

// A shard. Aligned so that two shards' mutexes never share a cache line.
template <class Node>
struct alignas(64) cache_shard {
  std::mutex mu;
  // A power-of-two count, at least the nodes (8 to 16 bytes a node): a hit's
  // chain holds at most one node on average. Two a bucket saves 4 bytes an
  // entry and costs a hit about a fifth more time on a large cache (a second
  // dependent load: docs/performance.md); grows, never shrinks.
  owned_array<Node*> buckets;
  std::size_t mask = 0;
  std::size_t nodes = 0;                // linked nodes
  wtinylfu policy;                      // nodes that hold an entry
  std::atomic<std::size_t> entries{0};  // = policy.size(), readable without the mutex
  // The last version handed out here. Written under the mutex; read by hits
  // (the version a call saw when it found no record), hence atomic. Relaxed:
  // a call ordered after an invalidation by its own synchronisation sees it
  // (read-read coherence), and none is needed otherwise.
  std::atomic<std::uint64_t> versions{0};
  std::uint64_t next_version() noexcept {
    const std::uint64_t v = versions.load(std::memory_order_relaxed) + 1;
    versions.store(v, std::memory_order_relaxed);
    return v;
  }
  std::uint32_t refreshes = 0;  // the last refresh number handed out here
  // next_refresh(): a refresh's number (cache_node::refresh_id), never 0
  // (no refresh). Mutex.
  std::uint32_t next_refresh() noexcept {
    if (++refreshes == 0) ++refreshes;
    return refreshes;
  }
  splitmix rng;  // jitter

  // Writer-side counters (mutex).
  std::uint64_t loads = 0;
  std::uint64_t load_failures = 0;
  std::uint64_t early_refreshes = 0;
  std::uint64_t background_refreshes = 0;
  std::uint64_t evictions = 0;
  std::uint64_t rejected_publishes = 0;

  // The memory of the shard's nodes (after what hits read: buckets and mask
  // keep their cache line).
  node_pool<Node> pool;

  // find(key, mixed, eq): the node for `key`, or nullptr. Runs KeyEqual.
  // With the mutex held, or inside a read section.
  template <class K, class Eq>
  Node* find(const K& key, std::uint64_t mixed, const Eq& eq) const {
    if (buckets.get() == nullptr) return nullptr;
    for (Node* n = buckets[mixed & mask]; n != nullptr; n = n->chain) {
      if (n->fingerprint == mixed && eq(n->key, key)) return n;
    }
    return nullptr;
  }

  // reserve_one(): makes room for one more node (may allocate a bigger bucket
  // array, twice as many buckets, once the nodes would be more than the
  // buckets, and throw std::bad_alloc, changing nothing). Writer.
  void reserve_one() {
    if (nodes + 1 <= mask + 1 && buckets.get() != nullptr) return;
    const std::size_t count = buckets.get() == nullptr ? 8 : 2 * (mask + 1);
    Node** const grown = new Node*[count]();  // the only throw; owned by buckets below
    for (std::size_t i = 0; buckets.get() != nullptr && i <= mask; ++i) {
      for (Node* n = buckets[i]; n != nullptr;) {
        Node* next = n->chain;
        n->chain = grown[n->fingerprint & (count - 1)];
        grown[n->fingerprint & (count - 1)] = n;
        n = next;
      }
    }
    buckets.reset(grown);
    mask = count - 1;
  }

  // link(n): after reserve_one(). Writer.
  void link(Node* n) noexcept {
    Node*& head = buckets[n->fingerprint & mask];
    n->chain = head;
    head = n;
    ++nodes;
  }

  // unlink(n): n must be linked. Writer.
  void unlink(Node* n) noexcept {
    for (Node** p = &buckets[n->fingerprint & mask]; *p != nullptr; p = &(*p)->chain) {
      if (*p == n) {
        *p = n->chain;
        n->chain = nullptr;
        --nodes;
        return;
      }
    }
  }
};

// Counters a hit updates: one set per stripe, so that threads on different
// stripes never write the same line. Relaxed: they are statistics, summed by
// stats(); the read section orders nothing through them.
struct alignas(64) stripe_counters {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> stale_hits{0};
  std::atomic<std::uint64_t> negative_hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> stale_on_error{0};
  std::atomic<std::uint64_t> stale_on_timeout{0};
  std::atomic<std::uint64_t> rng{0};  // XFetch draws (racy by design: a repeat is harmless)

  void add(std::atomic<std::uint64_t>& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t draw() noexcept {
    const std::uint64_t s = rng.load(std::memory_order_relaxed) + 0x9e3779b97f4a7c15ULL;
    rng.store(s, std::memory_order_relaxed);
    return mix64(s);
  }
};

// The table: shards, the gate and the stripes.
template <class Key, class T, class Clock>
class cache_table {
 public:
  using node = cache_node<Key, T, Clock>;
  using shard = cache_shard<node>;

  // cache_table(max_entries): max_entries == 0 is unbounded. Shards: about
  // four per hardware thread (8..256); a bounded table has at most one shard
  // per min_share entries, and the shares of its shards add up to
  // max_entries (see the entry budget below).
  explicit cache_table(std::size_t max_entries)
      : max_entries_(max_entries),
        shard_bits_(bits_for(shard_count(max_entries))),
        shards_(new shard[std::size_t{1} << shard_bits_]),
        gate_(std::size_t{1} << shard_bits_, stripe_count()),
        stripes_(new stripe_counters[gate_.stripes()]) {
    // The shares of the entry budget: they add up to max_entries.
    const std::size_t count = shard_total();
    for (std::size_t i = 0; i < count; ++i) {
      shards_[i].policy.configure(
          max_entries == 0 ? 0 : max_entries / count + (i < max_entries % count ? 1 : 0));
      shards_[i].rng.state = mix64(reinterpret_cast<std::uintptr_t>(this) + i);
    }
#if defined(SINGLEFLIGHT_TEST_HOOKS)
    cache_shards_last_made.store(shard_total(), std::memory_order_relaxed);
#endif
  }

  cache_table(const cache_table&) = delete;
  cache_table& operator=(const cache_table&) = delete;

  ~cache_table() {
    for (std::size_t i = 0; i < shard_total(); ++i) {
      shard& s = shards_[i];
      for (std::size_t b = 0; s.buckets.get() != nullptr && b <= s.mask; ++b) {
        for (node* n = s.buckets[b]; n != nullptr;) {
          node* next = n->chain;
          n->~node();
          if constexpr (!node_pool<node>::pooled) s.pool.give_back(n);  // else: with the slabs
          n = next;
        }
      }
    }
  }

  // make_node(s, key, mixed, lk): a node for `key` of shard s, made with
  // `lk` (which holds s) released: its memory is taken from s's pool under
  // the mutex, Key is copied without it. Returns with `lk` held again (and
  // the readers not locked out); on an exception (Key's copy, or no memory)
  // the memory is given back and `lk` is left released.
  template <class K, class Lock>
  node* make_node(shard& s, const K& key, std::uint64_t mixed, Lock& lk) {
    void* raw = s.pool.take();
    lk.unlock();
    node* n = nullptr;
    try {
      n = ::new (raw) node(key, mixed);  // user code: no lock
    } catch (...) {
      s.pool.give_back(raw);
      throw;
    }
    lk.lock();
    return n;
  }

  // garbage: nodes unlinked under a shard's mutex, destroyed (keys, values
  // and exceptions) when this object dies, after the mutex: declare it
  // before the lock. Each node's memory then goes back to the pool of its
  // own shard (the one its fingerprint picks), without a lock. While a
  // garbage_hold of the same table lives on this thread, the nodes go to
  // the hold instead, to be destroyed with it.
  class garbage {
   public:
    explicit garbage(cache_table& t) noexcept : t_(t) {}
    garbage(const garbage&) = delete;
    garbage& operator=(const garbage&) = delete;
    ~garbage() {
      if (head_ != nullptr) {
        for (garbage_hold* h = garbage_hold::top; h != nullptr; h = h->prev_) {
          if (&h->kept_.t_ == &t_) {
            h->kept_.take(head_);
            return;
          }
        }
      }
      using pool_t = node_pool<node>;
      pool_t* first = nullptr;
      typename pool_t::batch b;
      while (head_ != nullptr) {
        node* n = head_;
        head_ = n->chain;
        pool_t& p = t_.shards_[t_.shard_index(n->fingerprint)].pool;
        n->~node();
        if (!pool_t::pooled) {
          p.give_back(static_cast<void*>(n));
          continue;
        }
        if (first == nullptr) first = &p;
        if (&p == first) {
          b.add(n);
        } else {
          p.give_back(static_cast<void*>(n));  // another shard's (take_from_other)
        }
      }
      if (first != nullptr) first->give_back(b);
    }
    void add(node* n) noexcept {
      n->chain = head_;
      head_ = n;
    }

   private:
    friend class garbage_hold;
    // take(list): the nodes chained from `list` join this garbage.
    void take(node* list) noexcept {
      while (list != nullptr) {
        node* n = list;
        list = n->chain;
        add(n);
      }
    }

    cache_table& t_;
    node* head_ = nullptr;
  };

  // garbage_hold: while it lives, the garbage of its table made on this
  // thread (every write's: invalidate, clear, expire, an eviction) is kept,
  // not destroyed; it is destroyed (Key, T and exception destructors: user
  // code) when the hold is, after the hold is unlinked, so that what those
  // destructors write is destroyed at once, or by an outer hold. For a
  // caller that must finish something others wait for before user code
  // runs (fleet_cache's application of the bus: callers wait for it before
  // they read, and a destructor may re-enter, close() included). Holds
  // nest, each on its thread's stack, linked from a thread_local (one per
  // table type, and per shared object under -fvisibility=hidden).
  //
  // Thread safety: touches the calling thread's own links only.
  class garbage_hold {
   public:
    explicit garbage_hold(cache_table& t) noexcept : kept_(t), prev_(top) { top = this; }
    garbage_hold(const garbage_hold&) = delete;
    garbage_hold& operator=(const garbage_hold&) = delete;
    ~garbage_hold() { top = prev_; }  // then kept_ dies: outside this hold

   private:
    friend class garbage;
    garbage kept_;
    garbage_hold* prev_;
    static inline thread_local garbage_hold* top = nullptr;
  };

  std::size_t shard_total() const noexcept { return std::size_t{1} << shard_bits_; }
  std::size_t index_of(const shard& s) const noexcept {
    return static_cast<std::size_t>(&s - shards_.get());
  }

  // -- the entry budget (bounded tables) --
  //
  // max_entries is one budget for the whole table, not a fixed capacity per
  // shard: `used` counts the entries of every shard, and a shard may hold
  // more than its share (its policy's capacity, max_entries / shards) while
  // the table has room. When it is full, a new entry takes the slot of an
  // entry evicted from its own shard if that shard holds its share or more,
  // else from a shard that holds more than its share (so that, under
  // pressure, shards drift back to their shares, and a hot set that fits in
  // max_entries fits whatever the hash does to it).
  // Memory ordering: `used` is changed by read-modify-writes (acq_rel for
  // the reservation's compare-exchange, so that two writers of different
  // shards never both take the last slot; relaxed elsewhere: a count).
  bool bounded() const noexcept { return max_entries_ != 0; }
  std::size_t max_entries() const noexcept { return max_entries_; }
  // try_reserve(): one more entry, if the table has room.
  bool try_reserve() noexcept {
    std::size_t u = used_.load(std::memory_order_relaxed);
    while (u < max_entries_) {
      if (used_.compare_exchange_weak(u, u + 1, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }
  // release(): an entry left the table (not replaced by another).
  void release() noexcept { used_.fetch_sub(1, std::memory_order_relaxed); }
  // used(): the entries held (bounded tables), never above max_entries.
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  std::size_t shard_index(std::uint64_t mixed) const noexcept {
    return shard_bits_ == 0 ? 0 : static_cast<std::size_t>(mixed >> (64U - shard_bits_));
  }
  shard& at(std::size_t i) noexcept { return shards_[i]; }
  const shard& at(std::size_t i) const noexcept { return shards_[i]; }
  read_gate& gate() noexcept { return gate_; }
  stripe_counters& stripe(std::size_t s) noexcept { return stripes_[s]; }
  const stripe_counters& stripe(std::size_t s) const noexcept { return stripes_[s]; }
  std::size_t stripe_total() const noexcept { return gate_.stripes(); }

  // shard_lock: holds a shard's mutex; write() also locks the readers out
  // (once), until the lock is released. unlock() / lock() let a caller step
  // out (to run user code) and back in.
  class shard_lock {
   public:
    shard_lock(cache_table& t, std::size_t i) : t_(t), i_(i) { lock(); }
    // The shard's mutex if it is free at once; owns() says whether it was.
    shard_lock(cache_table& t, std::size_t i, std::try_to_lock_t) : t_(t), i_(i) {
      held_ = t_.shards_[i_].mu.try_lock();
    }
    bool owns() const noexcept { return held_; }
    shard_lock(const shard_lock&) = delete;
    shard_lock& operator=(const shard_lock&) = delete;
    ~shard_lock() {
      if (held_) unlock();
    }
    void lock() {
      t_.shards_[i_].mu.lock();
      held_ = true;
    }
    void unlock() noexcept {
      if (out_) t_.gate_.let_in(i_);
      out_ = false;
      held_ = false;
      t_.shards_[i_].mu.unlock();
    }
    void write() noexcept {
      if (!out_) {
        t_.gate_.lock_out(i_);
        out_ = true;
      }
    }

   private:
    cache_table& t_;
    std::size_t i_;
    bool held_ = false;
    bool out_ = false;
  };

 private:
  // A bounded table has at most one shard per min_share entries: below that
  // a shard's policy (window 1% of its share to start) decides on too few
  // entries, and the hit ratio on real traces falls (docs/cache.md,
  // "Eviction, measured").
  static constexpr std::size_t min_share = 1024;
  static std::size_t shard_count(std::size_t max_entries) noexcept {
#if defined(SINGLEFLIGHT_TEST_HOOKS)
    if (const std::size_t n = cache_shards_for_tests.load(std::memory_order_relaxed); n != 0) {
      return n;
    }
#endif
    const std::size_t hw = std::max(1U, std::thread::hardware_concurrency());
    std::size_t n = std::min<std::size_t>(std::max<std::size_t>(4 * hw, 8), 256);
    if (max_entries != 0) n = std::min(n, std::max<std::size_t>(1, max_entries / min_share));
    return n;
  }
  // Stripes: four per hardware thread (8..64), so that threads running at
  // the same time rarely share one even as threads come and go (a thread
  // keeps the stripe of its ordinal for life).
  static std::size_t stripe_count() noexcept {
    const std::size_t want = std::min<std::size_t>(
        std::max<std::size_t>(4 * std::size_t{std::thread::hardware_concurrency()}, 8), 64);
    std::size_t s = 1;
    while (s < want) s <<= 1U;
    return s;
  }
  static unsigned bits_for(std::size_t n) noexcept {  // floor(log2(n))
    unsigned b = 0;
    while ((std::size_t{2} << b) <= n) ++b;
    return b;
  }

  std::size_t max_entries_;
  alignas(64) std::atomic<std::size_t> used_{0};  // entries held, bounded tables (the budget)
  unsigned shard_bits_;
  owned_array<shard> shards_;
  read_gate gate_;
  owned_array<stripe_counters> stripes_;
};

}  // namespace singleflight::detail
