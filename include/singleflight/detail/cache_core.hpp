// singleflight/detail/cache_core.hpp -- internal; do not include directly.
//
// cache_core: the state of one singleflight::cache that outlives the cache
// object while callbacks still run (group::close() does not wait for
// callbacks already handed out): the options, the sharded entry table, and
// everything that reads or writes it — what a lookup decides (the decision
// table of README.md, "Cache"), put / invalidate / clear, and the life of a
// load (register, call the loader, publish or record the failure). The cache
// holds it by shared_ptr, as does every pending callback; flights refer to it
// by address (close() waits for them).
//
// Locking: see cache_table.hpp (one shard's mutex at a time, readers locked
// out only by writers of their shard) and read_gate.hpp. User code never runs
// with a shard's mutex held or inside a read section, KeyEqual excepted.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "../cache_options.hpp"
#include "../completion.hpp"
#include "../errors.hpp"
#include "../group.hpp"
#include "../outcome.hpp"
#include "../stats.hpp"
#include "../stop_token.hpp"
#include "cache_clock.hpp"
#include "cache_loader.hpp"
#include "cache_table.hpp"
#include "unwind.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash, class KeyEqual, class Clock>
class cache_core {
 public:
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using loaded_t = loaded<T, Clock>;
  using table_t = cache_table<Key, T, Clock>;
  using node_t = typename table_t::node;
  using shard_t = typename table_t::shard;
  using shard_lock = typename table_t::shard_lock;
  using garbage_t = garbage<node_t>;

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

  struct decision {
    enum class act : std::uint8_t { serve, not_found, failed, load, load_fresh };
    act what = act::load;
    freshness state = freshness::fresh;
    std::shared_ptr<const T> pin;  // serve: the value, copied after the section
    copied_t copy;                 // serve, small trivially copyable T: copied inside
    std::exception_ptr error;      // failed
    duration age{};
    std::uint64_t version = 0;
    std::uint64_t seen = 0;     // load: the key's version this call saw
    node_t* pinned = nullptr;   // load: pinned for a stale-if-error answer
    node_t* refresh = nullptr;  // serve: start this refresh (pinned)
    std::uint64_t refresh_id = 0;

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

  explicit cache_core(const cache_options& o)
      : ttl(detail::to_duration<duration>(o.ttl)),
        jitter(o.jitter),
        swr(detail::to_duration<duration>(o.stale_while_revalidate)),
        sie(detail::to_duration<duration>(o.stale_if_error)),
        error_ttl(detail::to_duration<duration>(o.error_ttl)),
        not_found_ttl(detail::to_duration<duration>(o.not_found_ttl)),
        throttle(detail::to_duration<duration>(o.error_ttl > std::chrono::nanoseconds::zero()
                                                   ? o.error_ttl
                                                   : cache_options::default_error_throttle)),
        beta(o.early_refresh_beta),
        table(o.max_entries) {}

  const duration ttl;
  const double jitter;
  const duration swr;
  const duration sie;
  const duration error_ttl;
  const duration not_found_ttl;
  const duration throttle;
  const double beta;
  [[no_unique_address]] KeyEqual eq{};
  table_t table;

  // Loaders of async-loader caches run as flights of these (created on first
  // use): the group creates the completion<X> they finish through.
  std::mutex raw_mu;
  bool raw_closed = false;
  std::unique_ptr<group<Key, T, Hash, KeyEqual>> raw_value;
  std::unique_ptr<group<Key, load_result<T>, Hash, KeyEqual>> raw_result;

  template <class X>
  auto& raw() {
    std::lock_guard<std::mutex> lk(raw_mu);
    if (raw_closed) throw closed_error();
    if constexpr (std::same_as<X, T>) {
      if (!raw_value) raw_value = std::make_unique<group<Key, T, Hash, KeyEqual>>();
      return *raw_value;
    } else {
      if (!raw_result) raw_result = std::make_unique<group<Key, load_result<T>, Hash, KeyEqual>>();
      return *raw_result;
    }
  }

  void close_raw(bool wait) {
    group<Key, T, Hash, KeyEqual>* v = nullptr;
    group<Key, load_result<T>, Hash, KeyEqual>* r = nullptr;
    {
      std::lock_guard<std::mutex> lk(raw_mu);
      raw_closed = true;
      v = raw_value.get();
      r = raw_result.get();
    }
    if (wait) {
      if (v != nullptr) v->close();
      if (r != nullptr) r->close();
    } else {
      if (v != nullptr) (void)v->close_for(std::chrono::nanoseconds::zero());
      if (r != nullptr) (void)r->close_for(std::chrono::nanoseconds::zero());
    }
  }

  // -- classification (read section or mutex) --

  static bool is_dead(const node_t& n, time_point now) noexcept {
    switch (n.kind) {
      case detail::held::value:
        return now >= n.stale_until && now >= n.error_until;
      case detail::held::not_found:
        return now >= n.fresh_until;
      case detail::held::error:
        return now >= n.throttle_until;
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
            n.refresh_id.load(std::memory_order_relaxed) == 0 && now >= n.throttle_until;
        if (now < n.fresh_until) {
          return may_refresh && beta > 0.0 && draw() ? verdict::fresh_refresh : verdict::fresh;
        }
        if (now < n.stale_until) return may_refresh ? verdict::stale_refresh : verdict::stale;
        if (n.error && now < n.throttle_until && now < n.error_until) {
          return verdict::stale_on_error;
        }
        return verdict::load;
      }
      case detail::held::not_found:
        return now < n.fresh_until ? verdict::not_found : verdict::load;
      case detail::held::error:
        return now < n.throttle_until ? verdict::failed : verdict::load;
      case detail::held::nothing:
        break;
    }
    return verdict::load;
  }

  static void serve(decision& d, const node_t& n, freshness st, time_point now) {
    d.what = decision::act::serve;
    d.state = st;
    if constexpr (copy_inside) {
      d.copy.emplace(*n.value);  // a memcpy: no user code
    } else {
      d.pin = n.value;  // one reference count: T's copy runs after the section
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
        d.error = n.error;
        sc.add(sc.negative_hits);
        return true;
      default:
        return false;
    }
  }

  // lookup(key, m): the hit path. Decides what a get does; pins what the
  // decision refers to.
  template <class P>
  decision lookup(const P& key, std::uint64_t m, time_point now, bool fired) {
    const std::size_t si = table.shard_index(m);
    detail::read_gate& gate = table.gate();
    const std::size_t stripe = gate.my_stripe();
    detail::stripe_counters& sc = table.stripe(stripe);
    decision d;
    bool early = fired;
    if (!fired && gate.try_enter(si, stripe)) {
      section s(gate, si, stripe);
      node_t* n = table.at(si).find(key, m, eq);
      if (n == nullptr) {
        sc.add(sc.misses);
        d.seen = table.at(si).versions.load(std::memory_order_relaxed);
        return d;  // no record: no load registered, nothing to pin
      }
      const verdict v = classify(*n, now, [&] { return draws(*n, now, sc); });
      if (answer(d, *n, v, now, sc, &s.hit)) return d;
      early = v == verdict::fresh_refresh;
    }
    return lookup_locked(key, m, si, now, early, sc);
  }

  // fresh_hit(key, m, now, ...): the hit path proper, for the common case
  // of a fresh value that starts no refresh: one read section, then the
  // value is copied out (inside it for a small trivially copyable T, after
  // it from the pinned box otherwise). Returns false, having changed
  // nothing, for anything else; `fired` then says whether XFetch's draw
  // fired (the caller's lookup must not draw again).
  template <class P>
  bool fresh_hit(const P& key, std::uint64_t m, time_point now, copied_t& copy,
                 std::shared_ptr<const T>& pin, duration& age, std::uint64_t& version,
                 bool& fired) {
    const std::size_t si = table.shard_index(m);
    detail::read_gate& gate = table.gate();
    const std::size_t stripe = gate.my_stripe();
    if (!gate.try_enter(si, stripe)) return false;
    section s(gate, si, stripe);
    node_t* n = table.at(si).find(key, m, eq);
    if (n == nullptr || n->kind != detail::held::value || !(now < n->fresh_until)) return false;
    if (beta > 0.0 && n->refresh_id.load(std::memory_order_relaxed) == 0 &&
        now >= n->throttle_until && draws(*n, now, table.stripe(stripe))) {
      fired = true;
      return false;
    }
    if constexpr (copy_inside) {
      copy.emplace(*n->value);  // a memcpy: no user code
    } else {
      pin = n->value;  // one reference count: T's copy runs after the section
    }
    age = now > n->written ? now - n->written : duration::zero();
    version = n->version;
    n->touch();
    s.hit = 1;
    return true;
  }

  bool draws(const node_t& n, time_point now, detail::stripe_counters& sc) const {
    return detail::xfetch_fires(n.fresh_until - now, n.cost, beta, [&] { return sc.draw(); });
  }

  template <class P>
  decision lookup_locked(const P& key, std::uint64_t m, std::size_t si, time_point now, bool early,
                         detail::stripe_counters& sc) {
    decision d;
    shard_lock lk(table, si);
    auto& s = table.at(si);
    node_t* n = s.find(key, m, eq);
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
        d.refresh_id = ++s.refreshes;
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
    if (sie > duration::zero() && n->kind == detail::held::value && now < n->error_until) {
      ++n->pins;
      d.pinned = n;
    }
    if (n->loading > 0 && n->load_version != n->version) d.what = decision::act::load_fresh;
    return d;
  }

  // peek: lookup without effects.
  template <class P>
  std::optional<cached<T>> peek(const P& key, std::uint64_t m) {
    const std::size_t si = table.shard_index(m);
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
      look(table.at(si).find(key, m, eq));
    } else {
      shard_lock lk(table, si);
      look(table.at(si).find(key, m, eq));
    }
    if (d.what != decision::act::serve && d.what != decision::act::not_found) return std::nullopt;
    return std::move(d).entry();
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

  // -- records --

  // find_or_make(key, m, lk): the node for key, created if missing (Key's
  // copy and the allocation happen with `lk` released). `lk` holds the
  // key's shard; returns with it held and the readers locked out.
  template <class P>
  node_t* find_or_make(const P& key, std::uint64_t m, shard_lock& lk) {
    auto& s = table.at(table.shard_index(m));
    lk.write();
    if (node_t* n = s.find(key, m, eq)) return n;
    lk.unlock();
    auto made = std::make_unique<node_t>(key, m);  // user code: no lock
    lk.lock();
    lk.write();
    if (node_t* n = s.find(key, m, eq)) return n;  // `made` is freed after the lock
    s.reserve_one();
    made->version = s.versions.load(std::memory_order_relaxed);  // only grows, per key too
    made->throttle_until = time_point::min();
    node_t* n = made.release();
    s.link(n);
    return n;
  }

  // drop(n): n stops holding an entry. Its value and error stay in the node
  // (destroyed when it is rewritten or freed, never under the lock).
  static void drop(shard_t& s, node_t* n) noexcept {
    if (n->kind == detail::held::nothing) return;
    s.policy.remove(n);
    s.entries.fetch_sub(1, std::memory_order_relaxed);
    n->kind = detail::held::nothing;
  }

  static void erase_if_unused(shard_t& s, node_t* n, garbage_t& g) noexcept {
    if (n->kind == detail::held::nothing && n->pins == 0) {
      s.unlink(n);
      g.add(n);
    }
  }

  // admit(s, n, now, g): n (readers locked out) now holds an entry. A new
  // entry first makes room (evicting, dead entries first), so that size()
  // never exceeds max_entries, not even for a moment; then a couple of dead
  // entries are swept (no timer does it).
  void admit(shard_t& s, node_t* n, time_point now, garbage_t& g) {
    const auto dead = [now](const detail::policy_hook* h) {
      return is_dead(*static_cast<const node_t*>(h), now);
    };
    const auto remove = [&](node_t* v) {
      s.entries.fetch_sub(1, std::memory_order_relaxed);
      v->kind = detail::held::nothing;
      erase_if_unused(s, v, g);
    };
    if (n->queue == detail::s3fifo::none) {
      while (s.policy.capacity() != 0 && s.policy.size() >= s.policy.capacity()) {
        auto* v = static_cast<node_t*>(s.policy.evict(dead));
        if (v == nullptr) break;
        ++s.evictions;
        remove(v);
      }
      s.policy.insert(n);
      s.entries.fetch_add(1, std::memory_order_relaxed);
    } else {
      s.policy.rewritten(n);
    }
    for (int i = 0; i < 2; ++i) {
      auto* v = static_cast<node_t*>(s.policy.sweep_one(dead));
      if (v == nullptr) break;
      if (v == n) {  // n itself cannot be dead: it was just written
        s.policy.insert(n);
        break;
      }
      remove(v);
    }
  }

  void set_windows(shard_t& s, node_t* n, time_point now, duration d) noexcept {
    n->written = now;
    n->fresh_until = detail::sat_add(now, detail::jittered(d, jitter, s.rng.next()));
    n->stale_until = detail::sat_add(n->fresh_until, swr);
    n->error_until = detail::sat_add(n->fresh_until, sie);
    n->throttle_until = time_point::min();
  }

  template <class P>
  std::uint64_t put(const P& key, std::uint64_t m, std::shared_ptr<const T> box) {
    std::exception_ptr old_error;  // destroyed after the lock (declared before it)
    garbage_t g;
    shard_lock lk(table, table.shard_index(m));
    node_t* n = find_or_make(key, m, lk);
    auto& s = table.at(table.shard_index(m));
    const time_point now = Clock::now();
    n->version = s.next_version();
    n->kind = detail::held::value;
    n->value.swap(box);  // the old value leaves with `box`, after the lock
    old_error = std::exchange(n->error, nullptr);
    set_windows(s, n, now, ttl);
    n->refresh_id.store(0, std::memory_order_relaxed);  // let a new refresh start
    admit(s, n, now, g);
    const std::uint64_t v = n->version;
    erase_if_unused(s, n, g);  // evicted at once (a tiny max_entries)
    lk.unlock();
    return v;
  }

  template <class P>
  std::uint64_t invalidate(const P& key, std::uint64_t m) {
    garbage_t g;
    const std::size_t si = table.shard_index(m);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    const std::uint64_t v = s.next_version();
    if (node_t* n = s.find(key, m, eq)) {
      lk.write();
      n->version = v;
      n->refresh_id.store(0, std::memory_order_relaxed);
      drop(s, n);
      erase_if_unused(s, n, g);
    }
    return v;
  }

  void clear() {
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      garbage_t g;
      auto& s = table.at(si);
      shard_lock lk(table, si);
      lk.write();
      for (std::size_t b = 0; s.buckets != nullptr && b <= s.mask; ++b) {
        for (node_t* n = s.buckets[b]; n != nullptr;) {
          node_t* next = n->chain;
          n->version = s.next_version();
          n->refresh_id.store(0, std::memory_order_relaxed);
          drop(s, n);
          erase_if_unused(s, n, g);
          n = next;
        }
      }
    }
  }

  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (std::size_t si = 0; si < table.shard_total(); ++si) {
      n += table.at(si).entries.load(std::memory_order_relaxed);
    }
    return n;
  }

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
    return st;
  }

  // unpin(n): a holder of n's address is done with it.
  void unpin(node_t* n) noexcept {
    garbage_t g;
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    --n->pins;
    if (n->kind == detail::held::nothing && n->pins == 0) {
      lk.write();
      erase_if_unused(s, n, g);
    }
  }

  // refresh_done(n, id): a background refresh is over, on every path.
  // Clears the key's refresh mark only if it is still this refresh's.
  void refresh_done(node_t* n, std::uint64_t id) noexcept {
    garbage_t g;
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    if (n->refresh_id.load(std::memory_order_relaxed) == id) {
      n->refresh_id.store(0, std::memory_order_relaxed);
    }
    --n->pins;
    if (n->kind == detail::held::nothing && n->pins == 0) {
      lk.write();
      erase_if_unused(s, n, g);
    }
  }

  // -- loads --

  // A load's claim on its node: registered at its start (the version it
  // saw), released by publish / fail, or by the destructor on any other exit.
  class registration {
   public:
    registration(cache_core* c, node_t* n, std::uint64_t v, time_point t0) noexcept
        : c_(c), n_(n), v_(v), t0_(t0) {}
    registration(registration&& o) noexcept
        : c_(std::exchange(o.c_, nullptr)), n_(o.n_), v_(o.v_), t0_(o.t0_) {}
    registration& operator=(registration&&) = delete;
    registration(const registration&) = delete;
    registration& operator=(const registration&) = delete;
    ~registration() {
      if (c_ != nullptr) c_->finish_load(n_, v_, nullptr, false, std::nullopt, t0_, nullptr, true);
    }
    loaded_t publish(std::shared_ptr<const T> box, bool found,
                     std::optional<std::chrono::nanoseconds> entry_ttl) {
      cache_core* c = std::exchange(c_, nullptr);
      return c->finish_load(n_, v_, std::move(box), found, entry_ttl, t0_, nullptr, false);
    }
    void fail(std::exception_ptr e, bool stopped) noexcept {
      cache_core* c = std::exchange(c_, nullptr);
      (void)c->finish_load(n_, v_, nullptr, false, std::nullopt, t0_, std::move(e), stopped);
    }
    // A fresh value already stored (the double check): no load needed.
    bool shortcut(loaded_t& out) const noexcept {
      if (!has_short_) return false;
      out = short_;
      return true;
    }
    void set_shortcut(loaded_t l) noexcept {
      short_ = std::move(l);
      has_short_ = true;
    }

   private:
    // Not a std::optional: moved into a load's completion (run_async), a
    // disengaged optional's payload reads as "maybe uninitialized" to g++ 12
    // at -O3 with -fsanitize=thread, and -Werror fails the build.
    loaded_t short_{};
    bool has_short_ = false;
    cache_core* c_;
    node_t* n_;
    std::uint64_t v_;
    time_point t0_;
  };

  // begin_load(key, m, foreground): registers a load. A foreground load
  // (its caller found no usable value) first checks again: if a fresh value
  // was stored meanwhile and no get_fresh caller is waiting on the key, the
  // flight answers with it and calls no loader (the double check inside the
  // flight).
  template <class P>
  registration begin_load(const P& key, std::uint64_t m, bool foreground) {
    shard_lock lk(table, table.shard_index(m));
    node_t* n = find_or_make(key, m, lk);
    auto& s = table.at(table.shard_index(m));
    const time_point now = Clock::now();
    registration r(this, n, n->version, now);
    ++n->pins;
    ++n->loading;
    n->load_version = n->version;
    if (foreground && n->kind == detail::held::value && now < n->fresh_until &&
        n->fresh_waiters == 0) {
      r.set_shortcut(loaded_t{n->value, n->version, n->written});
    } else {
      ++s.loads;
    }
    return r;
  }

  loaded_t finish_load(node_t* n, std::uint64_t v, std::shared_ptr<const T> box, bool found,
                       std::optional<std::chrono::nanoseconds> ttl_override, time_point t0,
                       std::exception_ptr e, bool abandoned) noexcept {
    const time_point t1 = Clock::now();
    loaded_t out{box, v, t1};
    std::exception_ptr old_error;
    garbage_t g;
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    lk.write();
    --n->loading;
    --n->pins;
    if (abandoned) {
      // Stopped, dropped or unwound: nothing to record.
    } else if (n->version != v) {
      ++s.rejected_publishes;
      if (e) ++s.load_failures;
    } else if (e) {
      ++s.load_failures;
      // A value not yet dead stays, and the failure throttles the key's
      // loads; with none, the failure itself may be cached.
      if (n->kind == detail::held::value && (t1 < n->stale_until || t1 < n->error_until)) {
        old_error = std::exchange(n->error, e);
        n->throttle_until = detail::sat_add(t1, throttle);
      } else if (error_ttl > duration::zero()) {
        drop(s, n);
        box = std::exchange(n->value, nullptr);  // freed after the lock
        old_error = std::exchange(n->error, e);
        n->kind = detail::held::error;
        n->written = t1;
        n->throttle_until = detail::sat_add(t1, error_ttl);
        admit(s, n, t1, g);
      }
    } else if (found) {
      n->kind = detail::held::value;
      n->value.swap(box);  // the old value leaves with `box`, after the lock
      old_error = std::exchange(n->error, nullptr);
      n->cost = t1 > t0 ? t1 - t0 : duration::zero();
      set_windows(s, n, t1, ttl_override ? detail::to_duration<duration>(*ttl_override) : ttl);
      admit(s, n, t1, g);
    } else {
      const duration nf =
          ttl_override ? detail::to_duration<duration>(*ttl_override) : not_found_ttl;
      drop(s, n);
      box = std::exchange(n->value, nullptr);
      old_error = std::exchange(n->error, nullptr);
      if (nf > duration::zero()) {
        n->kind = detail::held::not_found;
        n->cost = t1 > t0 ? t1 - t0 : duration::zero();
        set_windows(s, n, t1, nf);
        n->stale_until = n->error_until = n->fresh_until;
        admit(s, n, t1, g);
      }
    }
    erase_if_unused(s, n, g);
    return out;
  }

  // fresh_enter / fresh_leave: get_fresh callers announce themselves on
  // the key's node, so that no flight they may join answers from the cache.
  template <class P>
  node_t* fresh_enter(const P& key, std::uint64_t m) {
    shard_lock lk(table, table.shard_index(m));
    node_t* n = find_or_make(key, m, lk);
    ++n->pins;
    ++n->fresh_waiters;
    return n;
  }
  void fresh_leave(node_t* n) noexcept {
    garbage_t g;
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    --n->fresh_waiters;
    --n->pins;
    if (n->kind == detail::held::nothing && n->pins == 0) {
      lk.write();
      erase_if_unused(s, n, g);
    }
  }

  // serve_on_error(n, e): the stale-if-error answer for a caller whose load
  // failed with `e`, if n (pinned by the caller) still has a value within
  // stale_if_error. Also throttles the key's loads (a failure the load
  // itself did not record: a deadline, overload).
  std::optional<cached<T>> serve_on_error(node_t* n, const std::exception_ptr& e) {
    if (n == nullptr || !applies(e)) return std::nullopt;
    const time_point now = Clock::now();
    std::shared_ptr<const T> v;
    std::exception_ptr old_error;
    cached<T> out;
    {
      const std::size_t si = table.shard_index(n->fingerprint);
      shard_lock lk(table, si);
      if (n->kind != detail::held::value || now >= n->error_until) return std::nullopt;
      v = n->value;
      out.version = n->version;
      out.age = std::chrono::duration_cast<std::chrono::nanoseconds>(
          now > n->written ? now - n->written : duration::zero());
      if (now >= n->throttle_until) {
        lk.write();
        n->throttle_until = detail::sat_add(now, throttle);
        old_error = std::exchange(n->error, e);
      }
    }
    auto& sc = table.stripe(table.gate().my_stripe());
    sc.add(sc.stale_on_error);
    out.value.emplace(*v);  // user code: no lock
    out.state = freshness::stale_on_error;
    return out;
  }

  // Failures a stale value may stand in for: anything but the caller's own
  // cancellation and the cache closing.
  static bool applies(const std::exception_ptr& e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const cancelled_error&) {
      return false;
    } catch (const closed_error&) {
      return false;
    } catch (...) {
      return true;
    }
  }

  // What a caller of a finished load receives.
  static cached<T> entry_of(const loaded_t& r, role taken) {
    cached<T> e;
    if (r.value) e.value.emplace(*r.value);  // this caller's copy: no lock
    e.state = freshness::fresh;
    const time_point now = Clock::now();
    e.age = std::chrono::duration_cast<std::chrono::nanoseconds>(
        now > r.written ? now - r.written : duration::zero());
    e.taken_as = taken;
    e.version = r.version;
    return e;
  }

  // -- running loaders --

  // run_sync(key, m, loader, st, foreground): a synchronous loader inside a
  // flight: register, call, publish. Rethrows what the loader threw.
  template <class P, class L>
  loaded_t run_sync(const P& key, std::uint64_t m, L& loader, const stop_token& st,
                    bool foreground) {
    using traits = detail::loader_traits<L, T>;
    registration r = begin_load(key, m, foreground);
    loaded_t out;
    if (r.shortcut(out)) {
      r.fail(nullptr, true);  // release the claim; nothing to record
      return out;
    }
    std::shared_ptr<const T> box;
    bool found = true;
    std::optional<std::chrono::nanoseconds> ttl_override;
    try {
      if constexpr (traits::returns_result) {
        load_result<T> res = call_loader<T>(loader, st);
        found = res.loaded.has_value();
        ttl_override = res.ttl;
        if (found) box = std::make_shared<const T>(std::move(*res.loaded));
      } else {
        box = std::make_shared<const T>(call_loader<T>(loader, st));
      }
    }
    // A forced unwind (the loader ended this thread): the registration cleans up.
    catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      r.fail(std::current_exception(), st.stop_requested());
      throw;
    }
    return r.publish(std::move(box), found, ttl_override);
  }

  // run_async(key, m, loader, st, done, foreground): an asynchronous loader
  // runs as a flight of a raw group (which makes the completion it needs);
  // its outcome is published, then `done` is resolved. Throws only before
  // the raw flight started (then `done` is left to the caller).
  template <class P, class L>
  void run_async(const P& key, std::uint64_t m, L loader, stop_token st, completion<loaded_t>& done,
                 bool foreground) {
    using traits = detail::loader_traits<L, T>;
    using X = std::conditional_t<traits::async_value, T, load_result<T>>;
    registration r = begin_load(key, m, foreground);
    loaded_t out;
    if (r.shortcut(out)) {
      r.fail(nullptr, true);
      done.set_value(std::move(out));
      return;
    }
    auto& g = raw<X>();
    auto finish = [r = std::move(r), st, d = std::move(done)](outcome<X> o) mutable noexcept {
      try {
        if (!o.has_value()) {
          r.fail(o.error(), st.stop_requested());
          d.set_exception(o.error());
          return;
        }
        if constexpr (std::same_as<X, T>) {
          d.set_value(
              r.publish(std::make_shared<const T>(std::move(o).value()), true, std::nullopt));
        } else {
          load_result<T> res = std::move(o).value();
          const bool found = res.loaded.has_value();
          std::shared_ptr<const T> box;
          if (found) box = std::make_shared<const T>(std::move(*res.loaded));
          d.set_value(r.publish(std::move(box), found, res.ttl));
        }
      } catch (...) {
        if (d) d.set_exception(std::current_exception());
      }
    };
    g.async_do(key, std::move(loader), std::move(finish), std::move(st));
  }
};

}  // namespace singleflight::detail
