// singleflight/detail/cache/cache_writes.hpp -- internal; do not include directly.
//
// cache_writes<Key, T, KeyEqual, Clock>: the second layer of cache_core (see
// cache_core.hpp), on cache_lookup. Every change to the table that is not a
// load's outcome, and the pieces loads write with:
//   * records: find_or_make() (a key's node, created if missing), drop() (a
//     node stops holding an entry), erase_if_unused() (a node that holds
//     nothing and is pinned by nobody leaves its shard), unpin() (a holder
//     of a node's address lets go of it);
//   * entries: admit() (into the shard's W-TinyLFU policy, making room first
//     in a bounded table's entry budget, and sweeping dead entries after),
//     make_room() / take_from_other() (a slot of the budget: free, or that of
//     an evicted entry of this shard or of one over its share), leave() (an
//     entry's count and slot) and set_windows() (the windows of a write);
//   * put(), invalidate(), expire(), expire_all(), clear(): each gives the key
//     (every key, for the last two) a new version, so that a load that started
//     before it cannot publish over it;
//   * size(), stats(): the counters, summed.
//
// Locking: one shard's mutex at a time (expire_all(), clear() and stats() take
// them in turn), except take_from_other(), which try_locks a second shard while
// holding one and never waits for it; anything a reader may look at changes with the shard's
// readers locked out (shard_lock::write()). Nodes, values and exceptions leave under the mutex and
// are destroyed after it (garbage_t and the `old_*` locals are declared before the lock), nodes
// find_or_make() made for nothing included. No user code runs under the mutex except KeyEqual:
// find_or_make() copies Key with the mutex released, and no Key or T dies under it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "../../cache_options.hpp"
#include "cache_clock.hpp"
#include "cache_lookup.hpp"
#include "cache_policy.hpp"

namespace singleflight::detail {

template <class Key, class T, class KeyEqual, class Clock>
class cache_writes : public cache_lookup<Key, T, KeyEqual, Clock> {
  using base = cache_lookup<Key, T, KeyEqual, Clock>;

 public:
  using typename base::duration;
  using typename base::garbage_t;
  using typename base::node_t;
  using typename base::shard_lock;
  using typename base::shard_t;
  using typename base::side_t;
  using typename base::time_point;

  using base::base;

  using base::eq;
  using base::is_dead;
  using base::jitter;
  using base::stale_if_error;
  using base::stale_while_revalidate;
  using base::table;
  using base::ttl;

  // -- records --

  // find_or_make(key, mixed, lk, g): the node for key, created if missing
  // (its memory taken from the shard's pool under the mutex, Key's copy made
  // with `lk` released: cache_table::make_node). `lk` holds
  // the key's shard; returns with it held and the readers locked out. A node
  // made for nothing (another writer linked one for the key meanwhile) goes
  // to `g`, which the caller declared before `lk`: its Key is destroyed
  // after the mutex, as every other key the table lets go of.
  template <class P>
  node_t* find_or_make(const P& key, std::uint64_t mixed, shard_lock& lk, garbage_t& g) {
    auto& s = table.at(table.shard_index(mixed));
    lk.write();
    if (node_t* n = s.find(key, mixed, eq)) return n;
    node_t* made = table.make_node(s, key, mixed, lk);  // Key's copy with `lk` released
    lk.write();
    if (node_t* n = s.find(key, mixed, eq)) {
      g.add(made);  // not here: `made` would die under the mutex, readers locked out
      return n;
    }
    try {
      s.reserve_one();
    } catch (...) {
      g.add(made);
      throw;
    }
    made->version = s.versions.load(std::memory_order_relaxed);  // only grows, per key too
    s.link(made);
    return made;
  }

  // drop(n): n stops holding an entry. Its value and error stay in the node
  // (destroyed when it is rewritten or freed, never under the lock).
  void drop(shard_t& s, node_t* n) noexcept {
    if (n->kind == detail::held::nothing) return;
    s.policy.remove(n);
    leave(s, n, true);
  }

  // erase_if_unused(s, n, g): unlinks n if it holds nothing and nobody holds
  // its address; `g` frees it after the lock. Readers locked out.
  static void erase_if_unused(shard_t& s, node_t* n, garbage_t& g) noexcept {
    if (n->kind == detail::held::nothing && n->pins.zero()) {
      s.unlink(n);
      g.add(n);
    }
  }

  // hits_clock(s): the hits of shard s, read when its policy needs the time
  // (wtinylfu, "accesses"): what the read sections counted, over every
  // stripe. With s's mutex held.
  auto hits_clock(shard_t& s) noexcept {
    return [this, &s]() noexcept { return table.gate().hits_of(table.index_of(s)); };
  }

  // admit(s, n, now, g): n (readers locked out) now holds an entry. A new
  // entry first makes room (make_room: evicting, dead entries first), so
  // that size() never exceeds max_entries, not even for a moment; then the
  // sweep removes dead entries it finds within its budget of looks (no
  // timer does it; wtinylfu::sweep).
  void admit(shard_t& s, node_t* n, time_point now, garbage_t& g) {
    const auto dead = [this, now](const detail::policy_hook* h) {
      return is_dead(*static_cast<const node_t*>(h), now);
    };
    if (n->queue == detail::wtinylfu::none) {
      if (table.bounded()) make_room(s, dead, g);
      s.policy.insert(n, hits_clock(s));
      s.entries.fetch_add(1, std::memory_order_relaxed);
    } else {
      s.policy.rewritten(n);
    }
    int budget = detail::wtinylfu::sweep_budget;
    while (auto* v = static_cast<node_t*>(s.policy.sweep(dead, budget))) {
      if (v == n) {  // n itself is dead on arrival (a ttl of zero): it stays until evicted
        s.policy.insert(n, hits_clock(s));
        continue;
      }
      leave(s, v, true);
      erase_if_unused(s, v, g);
    }
  }

  // make_room(s, dead, g): a slot of the table's budget for one new entry of
  // shard s (cache_table.hpp, "the entry budget"): a free one, else that of
  // an entry evicted from s (if s holds its share or more) or from a shard
  // holding more than its share, taken with try_lock (never waiting for a
  // second mutex; the policy prefers dead entries). Readers of s locked out.
  template <class Dead>
  void make_room(shard_t& s, const Dead& dead, garbage_t& g) {
    for (;;) {
      if (table.try_reserve()) return;
      if (s.policy.size() < s.policy.capacity() && take_from_other(s, dead, g)) return;
      if (auto* v = static_cast<node_t*>(s.policy.evict(dead, hits_clock(s)))) {
        ++s.evictions;
        leave(s, v, false);  // its slot is the new entry's
        erase_if_unused(s, v, g);
        return;
      }
      // s is empty and every shard over its share was busy: they finish
      // without waiting for s's mutex (they only try_lock), so try again.
      std::this_thread::yield();
    }
  }

  // take_from_other(s, dead, g): evicts one entry of a shard (other than s)
  // that holds more than its share and whose mutex is free; its slot becomes
  // s's. False when there is none.
  template <class Dead>
  bool take_from_other(shard_t& s, const Dead& dead, garbage_t& g) {
    const std::size_t count = table.shard_total();
    const std::size_t self = table.index_of(s);
    const std::size_t start = static_cast<std::size_t>(s.rng.next());
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = (start + k) & (count - 1);
      shard_t& o = table.at(i);
      if (i == self || o.entries.load(std::memory_order_relaxed) <= o.policy.capacity()) continue;
      shard_lock lk(table, i, std::try_to_lock);
      if (!lk.owns() || o.policy.size() <= o.policy.capacity()) continue;
      lk.write();
      if (auto* v = static_cast<node_t*>(o.policy.evict(dead, hits_clock(o)))) {
        ++o.evictions;
        leave(o, v, false);
        erase_if_unused(o, v, g);  // freed with s's garbage, after both locks
        return true;
      }
    }
    return false;
  }

  // leave(s, v, release): v stops holding an entry (it is in no queue any
  // more); `release`: its slot of the budget is free (false: a new entry
  // takes it).
  void leave(shard_t& s, node_t* v, bool release) noexcept {
    s.entries.fetch_sub(1, std::memory_order_relaxed);
    v->kind = detail::held::nothing;
    if (release && table.bounded()) table.release();
  }

  // set_windows(s, n, now, d): the windows of a write at `now` whose fresh
  // window lasts `d` (jittered), with no throttle. Readers locked out.
  void set_windows(shard_t& s, node_t* n, time_point now, duration d) noexcept {
    n->written = now;
    n->fresh_until = detail::sat_add(now, detail::jittered(d, jitter, s.rng.next()));
    if (n->side) n->side->throttle_until = time_point::min();
  }

  // put(key, mixed, box): key holds `box`, fresh from now, under a new version
  // (returned). Clears the refresh mark, so that a new refresh may start.
  template <class P>
  std::uint64_t put(const P& key, std::uint64_t mixed, value_ref<T> box) {
    std::exception_ptr old_error;  // destroyed after the lock (declared before it)
    std::unique_ptr<side_t> old_side;
    garbage_t g{table};
    shard_lock lk(table, table.shard_index(mixed));
    node_t* n = find_or_make(key, mixed, lk, g);
    auto& s = table.at(table.shard_index(mixed));
    const time_point now = Clock::now();
    n->set_version(s.next_version());
    n->kind = detail::held::value;
    n->value.store(box);  // the old value leaves with `box`, after the lock
    if (n->side) old_error = std::exchange(n->side->error, nullptr);
    set_windows(s, n, now, ttl);
    n->settle(old_side);
    n->refresh_id.store(0, std::memory_order_relaxed);  // let a new refresh start
    admit(s, n, now, g);
    const std::uint64_t v = n->version;
    erase_if_unused(s, n, g);  // evicted at once (a tiny max_entries)
    lk.unlock();
    return v;
  }

  // invalidate(key, mixed): key holds no entry, under a new version (returned)
  // that a load already running cannot publish over.
  template <class P>
  std::uint64_t invalidate(const P& key, std::uint64_t mixed) {
    garbage_t g{table};
    const std::size_t si = table.shard_index(mixed);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    const std::uint64_t v = s.next_version();
    if (node_t* n = s.find(key, mixed, eq)) {
      lk.write();
      n->set_version(v);
      n->refresh_id.store(0, std::memory_order_relaxed);
      drop(s, n);
      erase_if_unused(s, n, g);
    }
    return v;
  }

  // mark_stale(s, n, latest, g): what expire() and expire_all() do to one
  // record, readers locked out: a new version (returned), so that a load or
  // refresh registered before it cannot publish over it, and the refresh
  // mark cleared, so that the next read may start one refresh; a value whose
  // fresh window ends after `latest` becomes stale at `latest` (its
  // stale_while_revalidate and stale_if_error windows measured from there:
  // `latest` is the mark's now, or before it for a bounded mark), a value
  // whose fresh window ended by then keeps its windows, and a cached
  // not-found or failure is dropped, as by invalidate (`g` frees the record
  // after the lock when nobody holds it).
  std::uint64_t mark_stale(shard_t& s, node_t* n, time_point latest, garbage_t& g) noexcept {
    n->set_version(s.next_version());
    n->refresh_id.store(0, std::memory_order_relaxed);
    const std::uint64_t v = n->version;
    if (n->kind == detail::held::value) {
      if (latest < n->fresh_until) {
        n->fresh_until = latest;  // the stale windows follow (stale_until(), error_until())
      }
      return v;
    }
    drop(s, n);
    erase_if_unused(s, n, g);
    return v;
  }

  // expire(key, mixed, now): mark_stale() at `now` for key's record, unless
  // it holds a value already past its fresh window: that one keeps its
  // windows and its refresh mark (a repeated expire starts no second
  // refresh), and its version too unless a load or refresh of the key is
  // registered — that one may have read the origin before what the expire
  // stands for, so the key takes a new version and it does not publish. The
  // key's version is returned; 0 without a record.
  template <class P>
  std::uint64_t expire(const P& key, std::uint64_t mixed, time_point now) {
    garbage_t g{table};
    const std::size_t si = table.shard_index(mixed);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    node_t* n = s.find(key, mixed, eq);
    if (n == nullptr) return 0;
    if (n->kind == detail::held::value && !(now < n->fresh_until)) {
      if (n->loading() == 0) return n->version;
      lk.write();
      n->set_version(s.next_version());
      return n->version;
    }
    lk.write();
    return mark_stale(s, n, now, g);
  }

  // expire_all(stale_for): mark_stale() for every record, values already
  // stale included (their version new: a refresh of one already under way
  // read the origin before the mark and must not publish). Every value's
  // stale_while_revalidate window ends within `stale_for` of the mark: its
  // fresh window ends at now - (stale_while_revalidate - stale_for) at the
  // latest (at now when stale_for >= stale_while_revalidate: the plain
  // mark, a value already stale keeping its windows; an earlier end cuts
  // stale_if_error as much, both being measured from it). Shard by shard,
  // each under its mutex, at Clock::now() read there: not one atomic step
  // across shards, but a load registered before the call began publishes
  // nothing fresh once it returned (its shard was visited either after it
  // published, or before it could).
  void expire_all(duration stale_for) {
    const duration cut =
        stale_for < stale_while_revalidate ? stale_while_revalidate - stale_for : duration::zero();
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      garbage_t g{table};
      auto& s = table.at(si);
      shard_lock lk(table, si);
      if (s.nodes == 0) continue;
      lk.write();
      const time_point latest = detail::sat_sub(Clock::now(), cut);
      for (std::size_t b = 0; s.buckets.get() != nullptr && b <= s.mask; ++b) {
        for (node_t* n = s.buckets[b]; n != nullptr;) {
          node_t* next = n->chain;  // n may be unlinked
          (void)mark_stale(s, n, latest, g);
          n = next;
        }
      }
    }
  }

  // clear(): invalidate() for every key, shard by shard (each shard's mutex
  // in turn: not one atomic step across shards).
  void clear() {
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      garbage_t g{table};
      auto& s = table.at(si);
      shard_lock lk(table, si);
      lk.write();
      for (std::size_t b = 0; s.buckets.get() != nullptr && b <= s.mask; ++b) {
        for (node_t* n = s.buckets[b]; n != nullptr;) {
          node_t* next = n->chain;
          n->set_version(s.next_version());
          n->refresh_id.store(0, std::memory_order_relaxed);
          drop(s, n);
          erase_if_unused(s, n, g);
          n = next;
        }
      }
    }
  }

  // size(): the entries held, without a lock: a bounded table's budget in
  // use (never above max_entries), an unbounded one's shards summed.
  // Memory ordering: relaxed; a snapshot, possibly of different moments for
  // different shards.
  std::size_t size() const noexcept {
    if (table.bounded()) return table.used();
    std::size_t n = 0;
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      n += table.at(si).entries.load(std::memory_order_relaxed);
    }
    return n;
  }

  // stats(): the counters: the stripes' without a lock (relaxed: statistics),
  // each shard's under its mutex in turn.
  cache_stats stats() {
    cache_stats st;
    st.hits = table.gate().hits();
    for (std::size_t i = 0; i < table.stripe_total(); ++i) {
      const auto& c = table.stripe(i);
      st.hits += c.hits.load(std::memory_order_relaxed);
      st.stale_hits += c.stale_hits.load(std::memory_order_relaxed);
      st.negative_hits += c.negative_hits.load(std::memory_order_relaxed);
      st.misses += c.misses.load(std::memory_order_relaxed);
      st.stale_on_error += c.stale_on_error.load(std::memory_order_relaxed);
      st.stale_on_timeout += c.stale_on_timeout.load(std::memory_order_relaxed);
    }
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      auto& s = table.at(si);
      shard_lock lk(table, si);
      st.loads += s.loads;
      st.load_failures += s.load_failures;
      st.early_refreshes += s.early_refreshes;
      st.background_refreshes += s.background_refreshes;
      st.evictions += s.evictions;
      st.rejected_publishes += s.rejected_publishes;
      st.size += s.entries.load(std::memory_order_relaxed);
    }
    if (table.bounded()) st.size = table.used();
    return st;
  }

  // unpin(n): a holder of n's address is done with it. unpin(n, also): the
  // same, after also() (noexcept) has run under the same lock: a change of
  // fields the readers never need locked out for (mutex fields, the relaxed
  // refresh_id hint).
  void unpin(node_t* n) noexcept {
    unpin(n, []() noexcept {});
  }
  template <class Also>
  void unpin(node_t* n, Also also) noexcept {
    std::unique_ptr<side_t> old_side;  // released after the lock
    garbage_t g{table};
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    also();
    --n->pins;
    if (n->side && n->side->idle()) {
      lk.write();
      n->settle(old_side);
    }
    if (n->kind == detail::held::nothing && n->pins.zero()) {
      lk.write();
      erase_if_unused(s, n, g);
    }
  }
};

}  // namespace singleflight::detail
