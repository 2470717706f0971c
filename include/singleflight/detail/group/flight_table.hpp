// singleflight/detail/group/flight_table.hpp -- internal; do not include directly.
//
// flight_table<Key, T, Hash, KeyEqual>: the bottom layer of a group (see
// group.hpp for the layers above). It owns the group's state, split into
// shards by key hash so that calls for different keys rarely share a lock
// or a cache line:
//   * the identity-checked table: an intrusive hash table of flights (each
//     flight carries its key and is its own node), so an entry is erased by
//     unlinking that very flight, never by key: a late finisher cannot evict
//     a newer flight for the same key (golang/go#31420);
//   * recycling: finished flights, with their key's storage, kept by the
//     thread that finished them (flight_pool.hpp);
//   * the settle/finish bookkeeping (what happens under the lock when a
//     flight gets its outcome and when its fn returns), the drain count
//     (`users`) and the statistics.
//
// Locking: each shard has one std::mutex guarding everything in it; a flight
// is guarded by the lock of its shard. Code here runs with that lock held
// unless a comment says otherwise. Locks of two shards are only ever held
// together in index order (stats(), close()); the timer gate's mutex is
// taken last. User code never runs under a shard's lock, except KeyEqual
// (lookups) and Key's copy or assignment (a new entry).
//
// Sharing between cores: a call for a key that is not in flight writes two
// cache lines of its shard (the lock and the chain head; the counters, the
// drain count, the live and frame lists) and nothing else shared (its flight
// comes from its own thread's pool). Two threads on distinct keys only meet
// when their keys share a shard, so the shard count is what spreads them
// (options::shards).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "../../options.hpp"
#include "../../stats.hpp"
#include "claim.hpp"
#include "deadline_list.hpp"
#include "flight.hpp"
#include "flight_pool.hpp"
#include "frames.hpp"
#include "observers.hpp"
#include "outcomes.hpp"
#include "ownership.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash, class KeyEqual>
class flight_table {
 public:
  using flight_t = flight<Key, T>;
  using ref_t = flight_ref<flight_t>;
  using kind = outcome_kind;
  using clock = std::chrono::steady_clock;

  // One shard: every key whose hash selects it, under one lock. Its first
  // two cache lines hold what every call writes (a shard that another core
  // wrote costs one transfer per line); the rest is touched only by bounded
  // waits, deadlines, notification loops, close() and rarer counters.
  // Aligned so that two shards never share a cache line (128: x86 prefetches
  // pairs of lines).
  struct alignas(128) shard {
    // ---- line 0: the lock and the table ----
    std::mutex mu;
    flight_t* chain = nullptr;  // the only bucket while bucket_bits == 0
    std::size_t size = 0;       // entries: flights whose fn has not returned
    std::uint64_t seq = 0;      // flights started here (stats::flights)
    // ---- line 1: per-call bookkeeping ----
    // The drain count: calls inside the group, unfinished tasks, unresolved
    // completions, registered notification loops. close() waits for it.
    std::size_t users = 0;
    std::uint64_t calls = 0;      // stats::calls
    std::uint64_t fn_starts = 0;  // stats::fn_starts
    flight_base* live = nullptr;  // flights whose fn has not returned
    record_list<frame> frames;
    unsigned bucket_bits = 0;  // 0: `chain` only; else buckets.size() == 1 << bucket_bits
    std::uint32_t index = 0;
    bool closed = false;
    // ---- the rest ----
    std::vector<flight_t*> buckets;  // chains through flight::bucket_prev/next
    // The other counters (calls, flights, fn_starts and in_flight unused).
    singleflight::stats st{};
    deadline_list deadlines;
    bound_list bounds;
    record_list<loop_record> loops;
    std::condition_variable drain_cv;
  };

  explicit flight_table(options opts) : opts_(std::move(opts)) {
    if (opts_.timeout < std::chrono::nanoseconds::zero())
      opts_.timeout = std::chrono::nanoseconds::zero();
    std::size_t n = opts_.shards;
    if (n == 0) {
      const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
      n = std::clamp<std::size_t>(8 * cores, 8, 256);
    }
    n = std::bit_ceil(std::clamp<std::size_t>(n, 1, max_shards));
    shard_bits_ = static_cast<unsigned>(std::countr_zero(n));
    shard_count_ = n;
    shards_ = std::make_unique<shard[]>(n);
    for (std::size_t i = 0; i < n; ++i) shards_[i].index = static_cast<std::uint32_t>(i);
  }

  flight_table(const flight_table&) = delete;
  flight_table& operator=(const flight_table&) = delete;

  ~flight_table() = default;

  // The most shards a group can have (options::shards is clamped to it).
  static constexpr std::size_t max_shards = std::size_t{1} << 16;

  // ---- shards ---------------------------------------------------------------

  // The user's hash, mixed once (a bijection, so equal mixes mean equal
  // hashes): its top bits pick the shard, the next ones the bucket. Cheap
  // hashes (std::hash<int> is the identity) are spread too.
  static std::uint64_t mix(std::size_t h) noexcept {
    return static_cast<std::uint64_t>(h) * 0x9E3779B97F4A7C15ULL;
  }
  shard& shard_of(std::uint64_t m) noexcept {
    return shards_[shard_bits_ == 0 ? 0 : static_cast<std::size_t>(m >> (64 - shard_bits_))];
  }
  shard& shard_of(const flight_base& f) noexcept { return shards_[f.shard]; }
  std::size_t shard_count() const noexcept { return shard_count_; }
  shard& shard_at(std::size_t i) noexcept { return shards_[i]; }

  // Locks every shard, in index order (stats(), close()).
  void lock_all() noexcept {
    for (std::size_t i = 0; i < shard_count_; ++i) shards_[i].mu.lock();
  }
  void unlock_all() noexcept {
    for (std::size_t i = shard_count_; i-- > 0;) shards_[i].mu.unlock();
  }

  // ---- the table ------------------------------------------------------------

  // The entry for `key` (mixed hash m), or null. Runs KeyEqual.
  template <class P>
  flight_t* find(shard& s, const P& key, std::uint64_t m) const {
    if (s.size == 0) return nullptr;
    for (flight_t* f = head_of(s, m); f != nullptr; f = f->bucket_next) {
      if (f->hash == m && eq_(*f->key, key)) return f;
    }
    return nullptr;
  }

  // Makes f the entry for `key`. Throws (Key's copy, allocation) with the
  // table unchanged (f's key may have been overwritten; f is not linked).
  template <class P>
  void insert(shard& s, const P& key, std::uint64_t m, flight_t* f) {
    if constexpr (std::is_assignable_v<Key&, const P&>) {
      if (f->key) {
        assign_key(*f->key, key);  // reuses the previous key's storage
      } else {
        f->key.emplace(key);
      }
    } else {
      f->key.emplace(key);
    }
    f->hash = m;
    // One chain in the shard's first line up to chain_limit entries (no
    // bucket array to fetch), then buckets; rehash may throw (allocation)
    // before anything changed.
    if (s.size + 1 > std::max(chain_limit, s.buckets.size()))
      rehash(s, s.buckets.empty() ? 2 * chain_limit : 2 * s.buckets.size());
    flight_t*& head = head_of(s, m);
    f->bucket_prev = nullptr;
    f->bucket_next = head;
    if (head != nullptr) head->bucket_prev = f;
    head = f;
    ++s.size;
    f->in_table = true;
  }

  // Unlinks this very flight (identity, never by key). Never throws, runs
  // neither Hash nor KeyEqual.
  void erase(shard& s, flight_t* f) noexcept {
    (f->bucket_prev != nullptr ? f->bucket_prev->bucket_next : head_of(s, f->hash)) =
        f->bucket_next;
    if (f->bucket_next != nullptr) f->bucket_next->bucket_prev = f->bucket_prev;
    f->bucket_prev = f->bucket_next = nullptr;
    --s.size;
    f->in_table = false;
    if (opts_.max_in_flight != 0) entries_.fetch_sub(1, std::memory_order_relaxed);
  }

  // max_in_flight: takes one of the group's entries, or returns false at the
  // cap. Exact across shards: one atomic counter, touched only when a cap is
  // set. Memory ordering: relaxed suffices, the counter orders nothing else.
  bool reserve_entry() noexcept {
    if (opts_.max_in_flight == 0) return true;
    if (entries_.fetch_add(1, std::memory_order_relaxed) < opts_.max_in_flight) return true;
    entries_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  void unreserve_entry() noexcept {
    if (opts_.max_in_flight != 0) entries_.fetch_sub(1, std::memory_order_relaxed);
  }

  // ---- recycling --------------------------------------------------------------

  // A flight object for a new start in shard s: one from this thread's pool
  // when there is one. Throws (allocation, a stop state) with nothing
  // changed.
  flight_t* acquire(shard& s, bool stoppable) {
    flight_t* f = flight_pool<flight_t>::take();
    if (f == nullptr) {
      f = new flight_t();
      if (stoppable) {
        try {
          f->stop = stop_source();
        } catch (...) {
          f->release();
          throw;
        }
      }
    } else {
      try {
        f->reuse(stoppable);  // may throw (the stop state)
      } catch (...) {
        flight_pool<flight_t>::put_back(f);
        throw;
      }
    }
    f->shard = s.index;
    return f;
  }

  // Keeps a settled, unlinked flight that nobody else references for this
  // thread's next start, or leaves `mine` to release it.
  void recycle(ref_t& mine) noexcept {
    flight_t* f = mine.get();
    if (!f->unique() || f->value || f->error) return;
    f->retire();
    if (flight_pool<flight_t>::give(f)) mine.detach();
  }

  // ---- the drain count --------------------------------------------------------

  void enter_user(shard& s) noexcept { ++s.users; }
  void exit_user(shard& s) noexcept {
    --s.users;
    if (s.closed) s.drain_cv.notify_all();
  }

  // ---- settle / finish bookkeeping --------------------------------------------

  // Starts the bookkeeping of a new flight f (just inserted): its number, the
  // live list, its deadline. Returns its number.
  std::uint64_t started(shard& s, flight_t* f) noexcept {
    f->seq = ++s.seq;
    f->waiters = 1;
    f->live_prev = nullptr;
    f->live_next = s.live;
    if (s.live != nullptr) s.live->live_prev = f;
    s.live = f;
    const bool timed = opts_.timeout > std::chrono::nanoseconds::zero();
    if (!timed && !opts_.tracer) return f->seq;
    // One reading of the clock for both: a traced flight's reported duration
    // is then at least options.timeout when its deadline settles it.
    const clock::time_point now = clock::now();
    if (timed) {
      f->deadline = after(now, opts_.timeout);
      s.deadlines.push(*f);
      gate_.linked(f->deadline);
    }
    if (opts_.tracer) {
      f->trace.begin(opts_.tracer, (f->seq - 1) * shard_count_ + s.index + 1, s.index, *f->key,
                     now);
    }
    return f->seq;
  }

  // Publishes f's outcome and claims its waiters (not its observers) into
  // `wake`, doing their bookkeeping: from here on they no longer count as
  // users. After this nobody can join f; if its fn still runs, the entry
  // stays, settled, so that no second fn for the key starts until it returns.
  void settle(shard& s, flight_base& f, kind k, wake_batch& wake) noexcept {
    f.kind = k;
    if (f.trace.tracer) {  // report it once the lock is released
      f.trace.settled(status_of(k), clock::now(), f.joins, f.fn_started);
      wake.add_trace(f);
    }
    s.deadlines.erase(f);
    if (k == kind::timeout) ++s.st.timeouts;
    if (k == kind::fn_error || k == kind::dropped) ++s.st.failures;
    const bool cancelled = k == kind::cancelled;
    (void)f.list.claim_if([](const waiter& w) { return !w.observer; },
                          [&](waiter& w) {
                            if (cancelled) ++s.st.cancellations;
                            exit_user(s);
                            s.bounds.unlink(static_cast<bounded_wait&>(w));  // its own bound
                            wake.add(w);
                          },
                          [&] {
                            if (cancelled) ++s.st.cancellations;
                            exit_user(s);
                            wake.add_blocked(f);
                          });
  }

  // f's fn has returned (or will never run): settle if still pending, erase
  // the entry (this very flight: it may have been forgotten and replaced),
  // claim the observers.
  void finish(shard& s, flight_t* f, kind k, wake_batch& wake) noexcept {
    f->fn_done = true;
    if (f->kind == kind::pending) settle(s, *f, k, wake);
    if (f->in_table) {
      erase(s, f);
      f->release();  // the table's reference
    }
    (f->live_prev != nullptr ? f->live_prev->live_next : s.live) = f->live_next;
    if (f->live_next != nullptr) f->live_next->live_prev = f->live_prev;
    f->live_prev = f->live_next = nullptr;
    claim_observers(*f, s.bounds, wake);
  }

  // A counted caller leaves f (ownership accounting). Returns whether f's
  // token must be stopped once the lock is released.
  bool leave(shard& s, flight_base& f, bool is_leader, wake_batch& wake) noexcept {
    --f.waiters;
    if (f.kind != kind::pending) return false;
    if (!leaving_stops(opts_.owner, f.waiters, is_leader)) return false;
    settle(s, f, kind::cancelled, wake);
    return f.stop.stop_possible();
  }

  // ---- queries ----------------------------------------------------------------

  // One consistent snapshot: every shard locked at once, in index order.
  singleflight::stats snapshot() {
    singleflight::stats sum{};
    lock_all();
    for (std::size_t i = 0; i < shard_count_; ++i) {
      const shard& s = shards_[i];
      sum.calls += s.calls;
      sum.flights += s.seq;
      sum.fn_starts += s.fn_starts;
      sum.joins += s.st.joins;
      sum.rejections += s.st.rejections;
      sum.failures += s.st.failures;
      sum.cancellations += s.st.cancellations;
      sum.timeouts += s.st.timeouts;
      sum.wait_timeouts += s.st.wait_timeouts;
      sum.overloaded += s.st.overloaded;
      sum.in_flight += s.size;
    }
    unlock_all();
    return sum;
  }

  std::size_t entries() {
    std::size_t n = 0;
    lock_all();
    for (std::size_t i = 0; i < shard_count_; ++i) n += shards_[i].size;
    unlock_all();
    return n;
  }

 protected:
  options opts_;
  [[no_unique_address]] Hash hash_{};
  [[no_unique_address]] KeyEqual eq_{};
  timer_gate gate_;

 private:
  // Entries a shard keeps in its one chain before it allocates buckets.
  static constexpr std::size_t chain_limit = 4;

  // The chain head that `m` selects: the shard's own while it has no
  // buckets.
  flight_t*& head_of(shard& s, std::uint64_t m) const noexcept {
    return s.bucket_bits == 0 ? s.chain : s.buckets[bucket_of(s, m)];
  }
  flight_t* head_of(const shard& s, std::uint64_t m) const noexcept {
    return s.bucket_bits == 0 ? s.chain : s.buckets[bucket_of(s, m)];
  }
  std::size_t bucket_of(const shard& s, std::uint64_t m) const noexcept {
    // The top bits below the shard's (a multiplicative hash's best bits),
    // independent of which shard was picked. bucket_bits >= 3 here.
    return static_cast<std::size_t>((m << shard_bits_) >> (64 - s.bucket_bits));
  }

  // Moves every entry of s into n buckets (from its one chain the first
  // time). Throws (allocation) with nothing changed.
  void rehash(shard& s, std::size_t n) {
    std::vector<flight_t*> next(n, nullptr);  // may throw: nothing changed yet
    std::swap(s.buckets, next);
    flight_t* const first = s.bucket_bits == 0 ? std::exchange(s.chain, nullptr) : nullptr;
    s.bucket_bits = static_cast<unsigned>(std::countr_zero(n));
    relink(s, first);
    for (flight_t* chain : next) relink(s, chain);
  }
  void relink(shard& s, flight_t* chain) noexcept {
    while (chain != nullptr) {
      flight_t* f = chain;
      chain = f->bucket_next;
      flight_t*& head = s.buckets[bucket_of(s, f->hash)];
      f->bucket_prev = nullptr;
      f->bucket_next = head;
      if (head != nullptr) head->bucket_prev = f;
      head = f;
    }
  }

  template <class P>
  static void assign_key(Key& k, const P& key) {
// GCC 12 at -O3 reports a bogus -Wrestrict overlap inside std::string's
// assignment from a C string once it is inlined here (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
    k = key;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  }

  std::unique_ptr<shard[]> shards_;
  std::size_t shard_count_ = 1;
  unsigned shard_bits_ = 0;
  std::atomic<std::size_t> entries_{0};  // only with max_in_flight
};

}  // namespace singleflight::detail
