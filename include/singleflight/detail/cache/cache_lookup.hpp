// singleflight/detail/cache/cache_lookup.hpp -- internal; do not include directly.
//
// cache_lookup<Key, T, KeyEqual, Clock>: the bottom layer of cache_core (see
// cache_core.hpp for the layers above). It holds the cache's options (as
// durations of Clock; immutable once constructed), KeyEqual and the sharded
// entry table (cache_table.hpp), and decides what a read does — the decision
// table of docs/cache.md, "What get does":
//   * classify(): what an entry's state at `now` calls for (a verdict), with
//     XFetch's random draw (draws()) for a fresh value that may refresh;
//   * lookup(): get's decision, first inside a read section (no mutex) and,
//     when it must start a refresh, register a load or pin a stale value (or
//     the gate is closed), again under the shard's mutex (lookup_locked());
//   * fresh_hit(): the hit path proper, a fresh value that starts nothing;
//   * peek(): the entry as it stands, with no effect at all; peek_age():
//     only its age, with no copy of T (nor of its reference).
// A decision carries the value out (copied inside the section, or pinned and
// copied after it: copy_inside) and whatever the caller must start or undo.
//
// Locking: see cache_table.hpp and read_gate.hpp. A node is read inside a
// read section of its shard (section) or under the shard's mutex; nothing
// here locks readers out: under the mutex, lookup_locked() writes only fields
// readers never read (pins, the shard's counters) and atomics readers write
// too (the refresh_id hint, the policy's freq). The hit counters are the
// caller's stripe's (relaxed: statistics). No user code runs in a section or
// under the mutex except KeyEqual.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "../../cache_options.hpp"
#include "../chrono.hpp"
#include "cache_clock.hpp"
#include "cache_table.hpp"
#include "read_gate.hpp"

namespace singleflight::detail {

template <class Key, class T, class KeyEqual, class Clock>
class cache_lookup {
 public:
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using table_t = cache_table<Key, T, Clock>;
  using node_t = typename table_t::node;
  using shard_t = typename table_t::shard;
  using shard_lock = typename table_t::shard_lock;
  using garbage_t = typename table_t::garbage;
  using side_t = node_side<Clock>;

  // verdict: what an entry's state at a given moment calls for (classify()):
  // serve it (fresh, stale, stale_on_error; the *_refresh ones also start a
  // refresh), answer "not found" or the cached failure, or load.
  enum class verdict : std::uint8_t {
    fresh,
    fresh_refresh,
    stale,
    stale_refresh,
    stale_on_error,
    not_found,
    failed,
    load
  };

  // A small trivially copyable T is copied inside the read section (a
  // memcpy: no user code); any other T is pinned and copied after it.
  static constexpr bool copy_inside = std::is_trivially_copyable_v<T> && sizeof(T) <= 64;
  struct no_copy {};
  using copied_t = std::conditional_t<copy_inside, std::optional<T>, no_copy>;

  // decision: what lookup() decided for one get, with what it pinned for
  // the caller (a value to copy, a node to refresh or to serve from on
  // error; the caller unpins the nodes).
  struct decision {
    enum class act : std::uint8_t { serve, not_found, failed, load, load_fresh };
    act what = act::load;
    freshness state = freshness::fresh;
    value_ref<T> pin;          // serve: the value, copied after the section
    copied_t copy;             // serve, small trivially copyable T: copied inside
    std::exception_ptr error;  // failed
    duration age{};
    std::uint64_t version = 0;
    std::uint64_t seen = 0;        // load: the key's version this call saw
    node_t* pinned = nullptr;      // load: pinned for a stale-if-error answer
    node_t* refresh = nullptr;     // serve: start this refresh (pinned)
    std::uint32_t refresh_id = 0;  // serve: its number (cache_shard::next_refresh)

    cached<T> entry() && {
      cached<T> e;
      if (what == act::serve) {
        if constexpr (copy_inside) {
          e.value.emplace(*copy);
        } else {
          e.value.emplace(*pin);
        }
      }
      e.state = state;
      e.age = std::chrono::duration_cast<std::chrono::nanoseconds>(age);
      e.version = version;
      return e;
    }
  };

  // Throws std::invalid_argument for invalid options (see cache_options).
  explicit cache_lookup(const cache_options& o) : cache_lookup(validated(o), checked{}) {}

 private:
  struct checked {};
  cache_lookup(const cache_options& o, checked)
      : ttl(detail::to_duration<duration>(o.ttl)),
        jitter(o.jitter),
        stale_while_revalidate(detail::to_duration<duration>(o.stale_while_revalidate)),
        stale_if_error(detail::to_duration<duration>(o.stale_if_error)),
        error_ttl(detail::to_duration<duration>(o.error_ttl)),
        not_found_ttl(detail::to_duration<duration>(o.not_found_ttl)),
        throttle(detail::to_duration<duration>(o.error_ttl > std::chrono::nanoseconds::zero()
                                                   ? o.error_ttl
                                                   : cache_options::default_error_throttle)),
        beta(o.early_refresh_beta),
        table(o.max_entries) {}

  static const cache_options& validated(const cache_options& o) {
    if (o.ttl <= std::chrono::nanoseconds::zero()) {
      throw std::invalid_argument("singleflight::cache: cache_options::ttl must be > 0");
    }
    if (o.stale_while_revalidate.count() < 0 || o.stale_if_error.count() < 0 ||
        o.error_ttl.count() < 0 || o.not_found_ttl.count() < 0 || o.soft_timeout.count() < 0) {
      throw std::invalid_argument("singleflight::cache: cache_options durations must be >= 0");
    }
    if (!(o.jitter >= 0.0 && o.jitter < 1.0)) {
      throw std::invalid_argument("singleflight::cache: cache_options::jitter must be in [0, 1)");
    }
    // Finite and >= 0: NaN and -inf fail the first test, +inf the second.
    if (!(o.early_refresh_beta >= 0.0 &&
          o.early_refresh_beta <= std::numeric_limits<double>::max())) {
      throw std::invalid_argument(
          "singleflight::cache: cache_options::early_refresh_beta must be finite and >= 0");
    }
    return o;
  }

 public:
  // The options (cache_options.hpp says what each means), in Clock's
  // duration. Immutable: read by any thread, with or without a lock.
  const duration ttl;
  const double jitter;
  const duration stale_while_revalidate;
  const duration stale_if_error;
  const duration error_ttl;
  const duration not_found_ttl;
  const duration throttle;
  const double beta;
  [[no_unique_address]] KeyEqual eq{};
  // table: the entries, in shards (cache_table.hpp: the shards' mutexes,
  // the read gate, the per-stripe counters).
  table_t table;

  // -- classification (read section or mutex) --

  // stale_until(n), error_until(n): the end of n's stale window and of its
  // stale-if-error window, fixed offsets from fresh_until (set_windows and
  // expire measure both from it), so the node does not store them. For
  // kind == value only.
  time_point stale_until(const node_t& n) const noexcept {
    return detail::sat_add(n.fresh_until, stale_while_revalidate);
  }
  time_point error_until(const node_t& n) const noexcept {
    return detail::sat_add(n.fresh_until, stale_if_error);
  }

  bool is_dead(const node_t& n, time_point now) const noexcept {
    switch (n.kind) {
      case detail::held::value:
        return now >= stale_until(n) && now >= error_until(n);
      case detail::held::not_found:
        return now >= n.fresh_until;
      case detail::held::error:
        return now >= n.throttle_until();
      case detail::held::nothing:
        break;
    }
    return true;
  }

  // classify(n, now, draw): draw() is XFetch's random test, called only for
  // a fresh value that may refresh.
  template <class Draw>
  verdict classify(const node_t& n, time_point now, Draw&& draw) const {
    switch (n.kind) {
      case detail::held::value: {
        const bool may_refresh =
            n.refresh_id.load(std::memory_order_relaxed) == 0 && now >= n.throttle_until();
        if (now < n.fresh_until) {
          return may_refresh && beta > 0.0 && draw() ? verdict::fresh_refresh : verdict::fresh;
        }
        if (now < stale_until(n)) return may_refresh ? verdict::stale_refresh : verdict::stale;
        if (n.failed() && now < n.throttle_until() && now < error_until(n)) {
          return verdict::stale_on_error;
        }
        return verdict::load;
      }
      case detail::held::not_found:
        return now < n.fresh_until ? verdict::not_found : verdict::load;
      case detail::held::error:
        return now < n.throttle_until() ? verdict::failed : verdict::load;
      case detail::held::nothing:
        break;
    }
    return verdict::load;
  }

  static void serve(decision& d, const node_t& n, freshness st, time_point now) {
    d.what = decision::act::serve;
    d.state = st;
    if constexpr (copy_inside) {
      d.copy.emplace(n.value.get());  // a memcpy: no user code
    } else {
      d.pin = n.value.share();  // one reference count: T's copy runs after the section
    }
    d.age = now > n.written ? now - n.written : duration::zero();
    d.version = n.version;
  }

  // Applies a verdict that needs no write. Returns false for the others.
  // `counted`, when given, receives a fresh hit's count (the read section
  // adds it as it ends: one atomic operation for both).
  bool answer(decision& d, node_t& n, verdict v, time_point now, detail::stripe_counters& sc,
              std::uint64_t* counted = nullptr) {
    switch (v) {
      case verdict::fresh:
        serve(d, n, freshness::fresh, now);
        n.touch();
        if (counted != nullptr) {
          *counted = 1;
        } else {
          sc.add(sc.hits);
        }
        return true;
      case verdict::stale:
        serve(d, n, freshness::stale, now);
        n.touch();
        sc.add(sc.stale_hits);
        return true;
      case verdict::stale_on_error:
        serve(d, n, freshness::stale_on_error, now);
        n.touch();
        sc.add(sc.stale_hits);
        sc.add(sc.stale_on_error);
        return true;
      case verdict::not_found:
        d.what = decision::act::not_found;
        d.age = now > n.written ? now - n.written : duration::zero();
        d.version = n.version;
        sc.add(sc.negative_hits);
        return true;
      case verdict::failed:
        d.what = decision::act::failed;
        d.error = n.error();
        sc.add(sc.negative_hits);
        return true;
      default:
        return false;
    }
  }

  // lookup(key, mixed): the hit path. Decides what a get does; pins what the
  // decision refers to.
  template <class P>
  decision lookup(const P& key, std::uint64_t mixed, time_point now, bool fired) {
    const std::size_t si = table.shard_index(mixed);
    detail::read_gate& gate = table.gate();
    const std::size_t stripe = gate.my_stripe();
    detail::stripe_counters& sc = table.stripe(stripe);
    decision d;
    bool early = fired;
    if (!fired && gate.try_enter(si, stripe)) {
      section s(gate, si, stripe);
      node_t* n = table.at(si).find(key, mixed, eq);
      if (n == nullptr) {
        sc.add(sc.misses);
        d.seen = table.at(si).versions.load(std::memory_order_relaxed);
        return d;  // no record: no load registered, nothing to pin
      }
      const verdict v = classify(*n, now, [&] { return draws(*n, now, sc); });
      if (answer(d, *n, v, now, sc, &s.hit)) return d;
      early = v == verdict::fresh_refresh;
    }
    return lookup_locked(key, mixed, si, now, early, sc);
  }

  // fresh_hit(key, mixed, now, ...): the hit path proper, for the common case
  // of a fresh value that starts no refresh: one read section, then the
  // value is copied out (inside it for a small trivially copyable T, after
  // it from the pinned box otherwise). Returns false, having changed
  // nothing, for anything else; `fired` then says whether XFetch's draw
  // fired (the caller's lookup must not draw again).
  template <class P>
  bool fresh_hit(const P& key, std::uint64_t mixed, time_point now, copied_t& copy,
                 value_ref<T>& pin, duration& age, std::uint64_t& version, bool& fired) {
    const std::size_t si = table.shard_index(mixed);
    detail::read_gate& gate = table.gate();
    const std::size_t stripe = gate.my_stripe();
    if (!gate.try_enter(si, stripe)) return false;
    section s(gate, si, stripe);
    node_t* n = table.at(si).find(key, mixed, eq);
    if (n == nullptr || n->kind != detail::held::value || !(now < n->fresh_until)) return false;
    if (beta > 0.0 && n->refresh_id.load(std::memory_order_relaxed) == 0 &&
        now >= n->throttle_until() && draws(*n, now, table.stripe(stripe))) {
      fired = true;
      return false;
    }
    if constexpr (copy_inside) {
      copy.emplace(n->value.get());  // a memcpy: no user code
    } else {
      pin = n->value.share();  // one reference count: T's copy runs after the section
    }
    age = now > n->written ? now - n->written : duration::zero();
    version = n->version;
    n->touch();
    s.hit = 1;
    return true;
  }

  // draws(n, now, sc): XFetch's test for n (cache_clock.hpp), on random
  // numbers from the caller's stripe. Inside a read section or under the
  // shard's mutex.
  bool draws(const node_t& n, time_point now, detail::stripe_counters& sc) const {
    return detail::xfetch_fires(n.fresh_until - now, n.cost.get(), beta, [&] { return sc.draw(); });
  }

  // lookup_locked(key, mixed, si, now, early, sc): lookup() under the shard's
  // mutex, for what the read section could not decide (the gate was closed,
  // or the verdict needs a write): a refresh to start (the node's refresh
  // mark and a pin), or a load, pinning a value that may yet serve as
  // stale-if-error. `early`: XFetch's draw already fired for this call.
  // Memory ordering: relaxed for refresh_id and versions (cache_table.hpp
  // says why).
  template <class P>
  decision lookup_locked(const P& key, std::uint64_t mixed, std::size_t si, time_point now,
                         bool early, detail::stripe_counters& sc) {
    decision d;
    shard_lock lk(table, si);
    auto& s = table.at(si);
    node_t* n = s.find(key, mixed, eq);
    if (n == nullptr) {
      sc.add(sc.misses);
      d.seen = s.versions.load(std::memory_order_relaxed);
      return d;
    }
    const verdict v = classify(*n, now, [&] { return early || draws(*n, now, sc); });
    if (answer(d, *n, v, now, sc)) return d;
    switch (v) {
      case verdict::fresh_refresh:
      case verdict::stale_refresh: {
        const bool fresh = v == verdict::fresh_refresh;
        serve(d, *n, fresh ? freshness::fresh : freshness::stale, now);
        n->touch();
        sc.add(fresh ? sc.hits : sc.stale_hits);
        d.refresh_id = s.next_refresh();
        n->refresh_id.store(d.refresh_id, std::memory_order_relaxed);
        ++n->pins;
        d.refresh = n;
        ++(fresh ? s.early_refreshes : s.background_refreshes);
        return d;
      }
      default:
        break;
    }
    sc.add(sc.misses);
    d.seen = n->version;
    if (stale_if_error > duration::zero() && n->kind == detail::held::value &&
        now < error_until(*n)) {
      ++n->pins;
      d.pinned = n;
    }
    if (n->loading() > 0 && n->load_outdated) d.what = decision::act::load_fresh;
    return d;
  }

  // peek: lookup without effects.
  template <class P>
  std::optional<cached<T>> peek(const P& key, std::uint64_t mixed) {
    const std::size_t si = table.shard_index(mixed);
    detail::read_gate& gate = table.gate();
    const std::size_t stripe = gate.my_stripe();
    const time_point now = Clock::now();
    decision d;
    const auto look = [&](node_t* n) {
      if (n == nullptr) return;
      switch (classify(*n, now, [] { return false; })) {
        case verdict::fresh:
        case verdict::fresh_refresh:
          serve(d, *n, freshness::fresh, now);
          break;
        case verdict::stale:
        case verdict::stale_refresh:
          serve(d, *n, freshness::stale, now);
          break;
        case verdict::stale_on_error:
          serve(d, *n, freshness::stale_on_error, now);
          break;
        case verdict::not_found:
          d.what = decision::act::not_found;
          d.age = now > n->written ? now - n->written : duration::zero();
          d.version = n->version;
          break;
        default:
          break;
      }
    };
    if (gate.try_enter(si, stripe)) {
      const section s(gate, si, stripe);
      look(table.at(si).find(key, mixed, eq));
    } else {
      shard_lock lk(table, si);
      look(table.at(si).find(key, mixed, eq));
    }
    if (d.what != decision::act::serve && d.what != decision::act::not_found) return std::nullopt;
    return std::move(d).entry();
  }

  // peek_age(key, mixed): the age peek() would report, nullopt when it would report nothing;
  // no T is copied, nor its reference count touched (so none is destroyed by this call).
  // Under the shard's mutex.
  template <class P>
  std::optional<std::chrono::nanoseconds> peek_age(const P& key, std::uint64_t mixed) {
    const std::size_t si = table.shard_index(mixed);
    const time_point now = Clock::now();
    shard_lock lk(table, si);
    const node_t* n = table.at(si).find(key, mixed, eq);
    if (n == nullptr) return std::nullopt;
    switch (classify(*n, now, [] { return false; })) {
      case verdict::fresh:
      case verdict::fresh_refresh:
      case verdict::stale:
      case verdict::stale_refresh:
      case verdict::stale_on_error:
      case verdict::not_found:
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
            now > n->written ? now - n->written : duration::zero());
      default:
        return std::nullopt;
    }
  }

  // Leaves a read section on every exit (KeyEqual may throw).
  struct section {
    detail::read_gate& g;
    std::size_t shard;
    std::size_t stripe;
    std::uint64_t hit = 0;  // 1: count a hit as the section ends
    section(detail::read_gate& gate, std::size_t sh, std::size_t st) noexcept
        : g(gate), shard(sh), stripe(st) {}
    section(const section&) = delete;
    section& operator=(const section&) = delete;
    ~section() { g.leave(shard, stripe, hit); }
  };
};

}  // namespace singleflight::detail
