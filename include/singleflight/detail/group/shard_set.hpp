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
#include "../chrono.hpp"
#include "../config.hpp"
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

  SINGLEFLIGHT_DECL explicit shard_set(options opts);

  shard_set(const shard_set&) = delete;
  shard_set& operator=(const shard_set&) = delete;
  SINGLEFLIGHT_DECL ~shard_set();

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
  SINGLEFLIGHT_DECL void link(shard& s, flight_base* f, std::uint64_t mixed);

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
  SINGLEFLIGHT_DECL clock::time_point started(shard& s, flight_base& f) noexcept;

  // Publishes f's outcome and claims its waiters (not its observers) into
  // `wake`, doing their bookkeeping: from here on they no longer count as
  // users. After this nobody can join f; if its fn still runs, the entry
  // stays, settled, so that no second fn for the key starts until it returns.
  SINGLEFLIGHT_DECL void settle(shard& s, flight_base& f, kind k, wake_batch& wake) noexcept;

  // f's fn has returned (or will never run): settle if still pending, erase
  // the entry (this very flight: it may have been forgotten and replaced),
  // claim the observers.
  SINGLEFLIGHT_DECL void finish(shard& s, flight_base* f, kind k, wake_batch& wake) noexcept;

  // A counted caller leaves f (ownership accounting). Returns whether f's
  // token must be stopped once the lock is released.
  SINGLEFLIGHT_DECL bool leave(shard& s, flight_base& f, bool is_leader, wake_batch& wake) noexcept;

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
  SINGLEFLIGHT_DECL singleflight::stats snapshot() noexcept;

  // The entries, summed shard by shard (each under its lock in turn): each
  // shard counted at its own moment, exact once no call is running.
  SINGLEFLIGHT_DECL std::size_t entries() noexcept;

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
  SINGLEFLIGHT_DECL void rehash(shard& s, std::size_t n);
  SINGLEFLIGHT_DECL void relink(shard& s, flight_base* chain) noexcept;

  options opts_;
  timer_gate gate_;
  std::unique_ptr<shard[]> shards_;
  std::size_t shard_count_ = 1;
  unsigned shard_bits_ = 0;
  std::atomic<std::size_t> entries_{0};  // only with max_in_flight
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/shard_set.ipp"
#endif
