// singleflight/detail/group/shard_set.hpp -- internal; do not include directly.
//
// shard_set: the bottom of a group, and everything in it that does not depend
// on the group's Key and T (flight_table.hpp adds the key's side on top):
//   * the shards (shard.hpp) and which one a mixed hash selects;
//   * the identity-checked table's links: a flight is linked under the mixed
//     hash of its key and unlinked as that very flight, never by key, so a
//     late finisher cannot evict a newer flight for the same key
//     (golang/go#31420);
//   * the settle/finish bookkeeping (what happens under the lock when a
//     flight gets its outcome and when its fn returns), the ownership
//     accounting of a caller leaving, the drain count (`users`), the cap on
//     entries and the statistics;
//   * the group's options and its timer gate.
//
// Locking: each shard's mutex guards everything in it (shard.hpp); code here
// runs with that lock held unless a comment says otherwise. Nothing holds two
// shards' locks at once: what reads or marks every shard (snapshot(),
// entries(), close()) takes each one's lock in turn, so a group of any size
// stays within ThreadSanitizer's bound on locks held by one thread (64).
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "../../options.hpp"
#include "../../stats.hpp"
#include "../after.hpp"
#include "claim.hpp"
#include "deadline_list.hpp"
#include "flight.hpp"
#include "observers.hpp"
#include "outcomes.hpp"
#include "ownership.hpp"
#include "shard.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

class shard_set {
 public:
  using kind = outcome_kind;
  using clock = std::chrono::steady_clock;

  explicit shard_set(options opts) : opts_(std::move(opts)) {
    if (opts_.timeout < std::chrono::nanoseconds::zero())
      opts_.timeout = std::chrono::nanoseconds::zero();
    std::size_t n = opts_.shards;
    if (n == 0) {
      const std::size_t cores = std::thread::hardware_concurrency();
      n = cores <= 1 ? 8 : cores >= 32 ? 256 : 8 * cores;  // 8 per hardware thread, 8 to 256
    }
    n = std::bit_ceil(n < 1 ? 1 : n > max_shards ? max_shards : n);
    shard_bits_ = static_cast<unsigned>(std::countr_zero(n));
    shard_count_ = n;
    shards_ = std::make_unique<shard[]>(n);
    for (std::size_t i = 0; i < n; ++i) shards_[i].index = static_cast<std::uint32_t>(i);
  }

  shard_set(const shard_set&) = delete;
  shard_set& operator=(const shard_set&) = delete;
  ~shard_set() = default;

  // The most shards a group can have (options::shards is clamped to it).
  static constexpr std::size_t max_shards = std::size_t{1} << 16;

  const options& opts() const noexcept { return opts_; }
  timer_gate& gate() noexcept { return gate_; }

  // ---- shards ---------------------------------------------------------------

  // The user's hash, mixed once (a bijection, so equal mixes mean equal
  // hashes): its top bits pick the shard, the next ones the bucket. Cheap
  // hashes (std::hash<int> is the identity) are spread too.
  static std::uint64_t mix(std::size_t h) noexcept {
    return static_cast<std::uint64_t>(h) * 0x9E3779B97F4A7C15ULL;
  }
  shard& shard_of(std::uint64_t mixed) noexcept {
    return shards_[shard_bits_ == 0 ? 0 : static_cast<std::size_t>(mixed >> (64 - shard_bits_))];
  }
  shard& shard_of(const flight_base& f) noexcept { return shards_[f.shard]; }
  std::size_t shard_count() const noexcept { return shard_count_; }
  shard& shard_at(std::size_t i) noexcept { return shards_[i]; }

  // ---- the table's links ------------------------------------------------------

  // The chain head that `mixed` selects: the shard's own while it has no
  // buckets.
  flight_base* head_of(const shard& s, std::uint64_t mixed) const noexcept {
    return s.bucket_bits == 0 ? s.chain : s.buckets[bucket_of(s, mixed)];
  }

  // Links f (its key already set) as the entry for the key whose mixed hash
  // is `mixed`. Throws (allocation) with nothing changed.
  void link(shard& s, flight_base* f, std::uint64_t mixed) {
    // One chain in the shard's first line up to chain_limit entries (no
    // bucket array to fetch), then buckets; rehash may throw (allocation)
    // before anything changed.
    if (s.size + 1 > (s.buckets.size() > chain_limit ? s.buckets.size() : chain_limit))
      rehash(s, s.buckets.empty() ? 2 * chain_limit : 2 * s.buckets.size());
    f->hash = mixed;
    flight_base*& head = head_ref(s, mixed);
    f->bucket_prev = nullptr;
    f->bucket_next = head;
    if (head != nullptr) head->bucket_prev = f;
    head = f;
    ++s.size;
    f->in_table = true;
  }

  // Unlinks this very flight (identity, never by key). Never throws, runs
  // neither Hash nor KeyEqual.
  void erase(shard& s, flight_base* f) noexcept {
    (f->bucket_prev != nullptr ? f->bucket_prev->bucket_next : head_ref(s, f->hash)) =
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

  // ---- the drain count --------------------------------------------------------

  void enter_user(shard& s) noexcept { ++s.users; }
  void exit_user(shard& s) noexcept {
    --s.users;
    if (s.closed) s.drain_cv.notify_all();
  }

  // ---- settle / finish bookkeeping --------------------------------------------

  // Starts the bookkeeping of a new flight f (just linked): its number, the
  // live list, its deadline. Returns the time it read from the clock (the
  // deadline's start, for a tracer's report too), or the epoch when neither a
  // deadline nor a tracer needs one.
  clock::time_point started(shard& s, flight_base& f) noexcept {
    f.seq = ++s.seq;
    f.waiters = 1;
    f.live_prev = nullptr;
    f.live_next = s.live;
    if (s.live != nullptr) s.live->live_prev = &f;
    s.live = &f;
    const bool timed = opts_.timeout > std::chrono::nanoseconds::zero();
    if (!timed && !opts_.tracer) return clock::time_point{};
    // One reading of the clock for both: a traced flight's reported duration
    // is then at least options.timeout when its deadline settles it.
    const clock::time_point now = clock::now();
    if (timed) {
      f.deadline = after(now, opts_.timeout);
      s.deadlines.push(f);
      gate_.linked(f.deadline);
    }
    return now;
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
  void finish(shard& s, flight_base* f, kind k, wake_batch& wake) noexcept {
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

  // The flight's number as call_info reports it: unique within the group
  // (the shard's count interleaved with the shard's index); with one shard
  // it counts flights from 1 in the order they started.
  std::uint64_t number(const flight_base& f) const noexcept {
    return (f.seq - 1) * shard_count_ + f.shard + 1;
  }

  // ---- queries ----------------------------------------------------------------

  // The counters summed over the shards, each read under its own lock in
  // turn (never two at once): each shard's figures are read together, but
  // while calls run the sum is not one instant across shards. What holds in
  // every shard at every moment (joins <= calls, fn_starts <= flights) holds
  // for the sum; calls == flights + joins + rejections once no call is
  // running; a later snapshot never reports a smaller counter.
  singleflight::stats snapshot() noexcept {
    singleflight::stats sum{};
    for (std::size_t i = 0; i < shard_count_; ++i) {
      const shard& s = shards_[i];
      std::lock_guard<std::mutex> lk(shards_[i].mu);
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
    return sum;
  }

  // The entries, summed shard by shard (each under its lock in turn): each
  // shard counted at its own moment, exact once no call is running.
  std::size_t entries() noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < shard_count_; ++i) {
      std::lock_guard<std::mutex> lk(shards_[i].mu);
      n += shards_[i].size;
    }
    return n;
  }

 private:
  // Entries a shard keeps in its one chain before it allocates buckets.
  static constexpr std::size_t chain_limit = 4;

  flight_base*& head_ref(shard& s, std::uint64_t mixed) const noexcept {
    return s.bucket_bits == 0 ? s.chain : s.buckets[bucket_of(s, mixed)];
  }
  std::size_t bucket_of(const shard& s, std::uint64_t mixed) const noexcept {
    // The top bits below the shard's (a multiplicative hash's best bits),
    // independent of which shard was picked. bucket_bits >= 3 here.
    return static_cast<std::size_t>((mixed << shard_bits_) >> (64 - s.bucket_bits));
  }

  // Moves every entry of s into n buckets (from its one chain the first
  // time). Throws (allocation) with nothing changed.
  void rehash(shard& s, std::size_t n) {
    std::vector<flight_base*> next(n, nullptr);  // may throw: nothing changed yet
    std::swap(s.buckets, next);
    flight_base* const first = s.bucket_bits == 0 ? std::exchange(s.chain, nullptr) : nullptr;
    s.bucket_bits = static_cast<unsigned>(std::countr_zero(n));
    relink(s, first);
    for (flight_base* chain : next) relink(s, chain);
  }
  void relink(shard& s, flight_base* chain) noexcept {
    while (chain != nullptr) {
      flight_base* f = chain;
      chain = f->bucket_next;
      flight_base*& head = s.buckets[bucket_of(s, f->hash)];
      f->bucket_prev = nullptr;
      f->bucket_next = head;
      if (head != nullptr) head->bucket_prev = f;
      head = f;
    }
  }

  options opts_;
  timer_gate gate_;
  std::unique_ptr<shard[]> shards_;
  std::size_t shard_count_ = 1;
  unsigned shard_bits_ = 0;
  std::atomic<std::size_t> entries_{0};  // only with max_in_flight
};

}  // namespace singleflight::detail
