// singleflight/detail/cache/cache_loads.hpp -- internal; do not include directly.
//
// cache_loads<Key, T, KeyEqual, Clock>: the top layer of cache_core
// (see cache_core.hpp), on cache_writes: the life of a load.
//   * begin_load() registers a load on its key's node (a pin, and the
//     version it saw) and makes the double check; the registration it
//     returns ends the load exactly once: publish(), fail(), or its
//     destructor on any other exit, each through finish_load(), which
//     records the outcome only if the key's version is still the one the
//     load saw;
//   * run_sync() / run_async(): a loader called inside a flight, between
//     begin_load() and publish() / fail(); an asynchronous loader finishes
//     through a relayed completion (detail/completion_relay.hpp);
//   * pin / fresh_waiter: a caller's hold on a node (released on every
//     exit); refresh_done(): a background refresh is over;
//   * serve_on_error() / applies(): the stale-if-error answer for a caller
//     whose load failed; usable_old() / serve_on_timeout(): the soft-timeout
//     answer for a caller that stopped waiting (no failure, no throttle);
//   * entry_of(): what a caller of a finished load receives;
//   * stats(): the counters, with the gauges of the loads whose loader runs
//     now (running_loads.hpp: each registration holds a ticket while it does).
//
// Locking: the key's shard mutex around every change of a node, with the
// readers locked out for anything they may see (finish_load() always). The
// loader, T's copies and the completion a load resolves run with no lock held.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../errors.hpp"
#include "../../outcome.hpp"
#include "../../stats.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "../completion_relay.hpp"
#include "../functional.hpp"
#include "../unwind.hpp"
#include "cache_clock.hpp"
#include "cache_loader.hpp"
#include "cache_writes.hpp"
#include "loader_ref.hpp"
#include "running_loads.hpp"

namespace singleflight::detail {

template <class Key, class T, class KeyEqual, class Clock>
class cache_loads : public cache_writes<Key, T, KeyEqual, Clock> {
  using base = cache_writes<Key, T, KeyEqual, Clock>;

 public:
  using typename base::duration;
  using typename base::garbage_t;
  using typename base::node_t;
  using typename base::shard_lock;
  using typename base::side_t;
  using typename base::time_point;
  using loaded_t = loaded<T, Clock>;

  using base::base;

  using base::admit;
  using base::drop;
  using base::erase_if_unused;
  using base::error_ttl;
  using base::error_until;
  using base::find_or_make;
  using base::not_found_ttl;
  using base::set_windows;
  using base::stale_until;
  using base::table;
  using base::throttle;
  using base::ttl;
  using base::unpin;

  // -- loads --

  // A load's claim on its node: registered at its start (the version it
  // saw), released by publish / fail, or by the destructor on any other exit.
  class registration {
   public:
    registration(cache_loads* c, node_t* n, std::uint64_t v, time_point t0) noexcept
        : c_(c), n_(n), v_(v), t0_(t0) {}
    registration(registration&& o) noexcept
        : c_(std::exchange(o.c_, nullptr)),
          n_(o.n_),
          v_(o.v_),
          t0_(o.t0_),
          run_(std::move(o.run_)) {}
    registration& operator=(registration&&) = delete;
    registration(const registration&) = delete;
    registration& operator=(const registration&) = delete;
    ~registration() {
      run_.end();
      if (c_ != nullptr) c_->finish_load(n_, v_, nullptr, false, std::nullopt, t0_, nullptr, true);
    }
    // The loader is about to be called with `st`: counted in the running-load gauges until
    // the registration ends. Throws std::bad_alloc (then the loader is not called).
    void running(const stop_token& st) { run_ = c_->running_.start(st); }
    loaded_t publish(value_ref<T> box, bool found,
                     std::optional<std::chrono::nanoseconds> entry_ttl) {
      run_.end();
      cache_loads* c = std::exchange(c_, nullptr);
      return c->finish_load(n_, v_, std::move(box), found, entry_ttl, t0_, nullptr, false);
    }
    void fail(std::exception_ptr e, bool stopped) noexcept {
      run_.end();
      cache_loads* c = std::exchange(c_, nullptr);
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
    cache_loads* c_;
    node_t* n_;
    std::uint64_t v_;
    time_point t0_;
    typename running_loads<Clock>::ticket run_;  // linked while the loader runs
  };

  // begin_load(key, mixed, foreground): registers a load. A foreground load
  // (its caller found no usable value) first checks again: if a fresh value
  // was stored meanwhile and no get_fresh caller is waiting on the key, the
  // flight answers with it and calls no loader (the double check inside the
  // flight).
  template <class P>
  registration begin_load(const P& key, std::uint64_t mixed, bool foreground) {
    auto spare = std::make_unique<side_t>();  // the load's count, if the node has no side record
    garbage_t g{table};                       // a node made for nothing, freed after the lock
    shard_lock lk(table, table.shard_index(mixed));
    node_t* n = find_or_make(key, mixed, lk, g);
    auto& s = table.at(table.shard_index(mixed));
    const time_point now = Clock::now();
    // The double check's answer first: share() may allocate (and throw) before anything
    // is registered.
    const bool shortcut = foreground && n->kind == detail::held::value && now < n->fresh_until &&
                          n->fresh_waiters() == 0;
    value_ref<T> answer = shortcut ? n->value.share() : nullptr;
    registration r(this, n, n->version, now);
    ++n->pins;
    ++n->attach(spare).loading;
    n->load_outdated = false;
    if (shortcut) {
      r.set_shortcut(loaded_t{std::move(answer), n->version, n->written});
    } else {
      ++s.loads;
    }
    return r;
  }

  // finish_load(n, v, box, found, ttl_override, t0, e, abandoned): a load
  // registered with version `v` is over (once per registration). Unless
  // abandoned, its outcome is recorded if the key's version is still `v` — a
  // value (found), "not found", or the failure `e` — and counted as a
  // rejected publish otherwise. Returns what the load's flight hands its
  // callers.
  loaded_t finish_load(node_t* n, std::uint64_t v, value_ref<T> box, bool found,
                       std::optional<std::chrono::nanoseconds> ttl_override, time_point t0,
                       std::exception_ptr e, bool abandoned) noexcept {
    const time_point t1 = Clock::now();
    loaded_t out{box, v, t1};
    std::exception_ptr old_error;
    std::unique_ptr<side_t> old_side;
    garbage_t g{table};
    const std::size_t si = table.shard_index(n->fingerprint);
    auto& s = table.at(si);
    shard_lock lk(table, si);
    lk.write();
    side_t& side = *n->side;  // attached by the load's registration (begin_load)
    --side.loading;
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
      if (n->kind == detail::held::value && (t1 < stale_until(*n) || t1 < error_until(*n))) {
        old_error = std::exchange(side.error, e);
        side.throttle_until = detail::sat_add(t1, throttle);
      } else if (error_ttl > duration::zero()) {
        drop(s, n);
        n->value.clear(box);  // freed after the lock
        old_error = std::exchange(side.error, e);
        n->kind = detail::held::error;
        n->written = t1;
        side.throttle_until = detail::sat_add(t1, error_ttl);
        admit(s, n, t1, g);
      }
    } else if (found && ttl_override && *ttl_override <= std::chrono::nanoseconds::zero()) {
      // A value its loader gave no lifetime: handed to this load's callers, not stored (dead
      // on arrival, it would push out a live value). The key keeps what it had.
    } else if (found) {
      n->kind = detail::held::value;
      n->value.store(box);  // the old value leaves with `box`, after the lock
      old_error = std::exchange(side.error, nullptr);
      n->cost.set(t1 > t0 ? t1 - t0 : duration::zero());
      set_windows(s, n, t1, ttl_override ? detail::to_duration<duration>(*ttl_override) : ttl);
      admit(s, n, t1, g);
    } else {
      const duration nf =
          ttl_override ? detail::to_duration<duration>(*ttl_override) : not_found_ttl;
      drop(s, n);
      n->value.clear(box);
      old_error = std::exchange(side.error, nullptr);
      if (nf > duration::zero()) {
        n->kind = detail::held::not_found;
        n->cost.set(t1 > t0 ? t1 - t0 : duration::zero());
        set_windows(s, n, t1, nf);
        admit(s, n, t1, g);
      }
    }
    n->settle(old_side);
    erase_if_unused(s, n, g);
    return out;
  }

  // pin: a caller's hold on a node it found (lookup() took it): the node
  // stays linked while held; released on every exit. Null: nothing held.
  class pin {
   public:
    pin(cache_loads* c, node_t* n) noexcept : c_(c), n_(n) {}
    pin(const pin&) = delete;
    pin& operator=(const pin&) = delete;
    ~pin() {
      if (n_ != nullptr) c_->unpin(n_);
    }
    node_t* get() const noexcept { return n_; }
    // release(): gives the pin up without unpinning (its new owner unpins).
    node_t* release() noexcept { return std::exchange(n_, nullptr); }

   private:
    cache_loads* c_;
    node_t* n_;
  };

  // fresh_waiter: a get_fresh caller announced on its key's node, so that no
  // flight it may join answers from the cache (begin_load's double check);
  // withdrawn on every exit.
  class fresh_waiter {
   public:
    template <class P>
    fresh_waiter(cache_loads* c, const P& key, std::uint64_t mixed) : c_(c) {
      auto spare = std::make_unique<side_t>();  // the count, if the node has no side record
      garbage_t g{c->table};                    // a node made for nothing, freed after the lock
      shard_lock lk(c->table, c->table.shard_index(mixed));
      n_ = c->find_or_make(key, mixed, lk, g);
      ++n_->pins;
      ++n_->attach(spare).fresh_waiters;
    }
    fresh_waiter(const fresh_waiter&) = delete;
    fresh_waiter& operator=(const fresh_waiter&) = delete;
    ~fresh_waiter() {
      node_t* n = n_;
      c_->unpin(n, [n]() noexcept { --n->side->fresh_waiters; });
    }

   private:
    cache_loads* c_;
    node_t* n_ = nullptr;
  };

  // refresh_done(n, id): a background refresh is over, on every path.
  // Clears the key's refresh mark only if it is still this refresh's.
  void refresh_done(node_t* n, std::uint32_t id) noexcept {
    unpin(n, [n, id]() noexcept {
      if (n->refresh_id.load(std::memory_order_relaxed) == id) {
        n->refresh_id.store(0, std::memory_order_relaxed);
      }
    });
  }

  // serve_on_error(n, seen, e, out): the stale-if-error answer for a caller
  // whose load failed with `e`, into `out` (an empty cached<T>), if n (pinned
  // by the caller) still has a value within stale_if_error; false, `out`
  // untouched, otherwise. Also throttles the key's loads (a failure the load
  // itself did not record: a deadline, overload), unless the key's version is
  // no longer `seen`, the one the caller saw: a write since (put, expire,
  // invalidate) outdates the failure as it outdates the load, and the value
  // now held is not the one whose origin failed. An out-parameter, not a
  // std::optional<cached<T>>: no optional's layers to instantiate per T.
  bool serve_on_error(node_t* n, std::uint64_t seen, const std::exception_ptr& e, cached<T>& out) {
    if (n == nullptr || !applies(e)) return false;
    const time_point now = Clock::now();
    value_ref<T> v;
    std::exception_ptr old_error;
    auto spare = std::make_unique<side_t>();  // for the throttle, if n has no side record
    {
      const std::size_t si = table.shard_index(n->fingerprint);
      shard_lock lk(table, si);
      if (n->kind != detail::held::value || now >= error_until(*n)) return false;
      take(*n, v, out);
      out.version = n->version;
      out.age = std::chrono::duration_cast<std::chrono::nanoseconds>(
          now > n->written ? now - n->written : duration::zero());
      if (n->version == seen && now >= n->throttle_until()) {
        lk.write();
        side_t& side = n->attach(spare);
        side.throttle_until = detail::sat_add(now, throttle);
        old_error = std::exchange(side.error, e);
      }
    }
    auto& sc = table.stripe(table.gate().my_stripe());
    sc.add(sc.stale_on_error);
    if (v) out.value.emplace(*v);  // user code: no lock
    out.state = freshness::stale_on_error;
    return true;
  }

  // usable_old(n): whether n (pinned by the caller; null: none) holds a value
  // within stale_if_error now (soft_timeout applies to its callers).
  bool usable_old(node_t* n) {
    if (n == nullptr) return false;
    const time_point now = Clock::now();
    shard_lock lk(table, table.shard_index(n->fingerprint));
    return n->kind == detail::held::value && now < error_until(*n);
  }

  // serve_on_timeout(n, out): the soft-timeout answer for a caller that
  // stopped waiting on a load at soft_timeout, into `out` (an empty
  // cached<T>): n's value if it is still within stale_if_error, as
  // freshness::stale_on_timeout; false, `out` untouched, otherwise. The load
  // goes on; nothing is throttled (the origin has not failed).
  bool serve_on_timeout(node_t* n, cached<T>& out) {
    if (n == nullptr) return false;
    const time_point now = Clock::now();
    value_ref<T> v;
    {
      shard_lock lk(table, table.shard_index(n->fingerprint));
      if (n->kind != detail::held::value || now >= error_until(*n)) return false;
      take(*n, v, out);
      out.version = n->version;
      out.age = std::chrono::duration_cast<std::chrono::nanoseconds>(
          now > n->written ? now - n->written : duration::zero());
    }
    if (v) out.value.emplace(*v);  // user code: no lock
    out.state = freshness::stale_on_timeout;
    auto& sc = table.stripe(table.gate().my_stripe());
    sc.add(sc.stale_on_timeout);
    return true;
  }

  // take(n, v, out): n's value for a caller, under the mutex: copied into
  // `out` at once if it sits in the node (a memcpy), else its box into `v`,
  // for T's copy after the lock.
  static void take(const node_t& n, value_ref<T>& v, cached<T>& out) {
    if constexpr (detail::value_in_node<T>) {
      out.value.emplace(n.value.get());
    } else {
      v = n.value.share();
    }
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

  // stats(): cache_writes' counters, with the running-load gauges (running_loads.hpp) and the
  // soft-timeout answers.
  cache_stats stats() {
    cache_stats st = base::stats();
    const auto g = running_.read(Clock::now());
    st.loads_running = g.running;
    st.loads_stuck = g.stuck;
    st.oldest_load_age = g.oldest;
    return st;
  }

  // -- running loaders --

  // run_sync(key, mixed, loader, st, foreground): a synchronous loader inside a
  // flight: register, call, publish. Rethrows what the loader threw.
  template <class P, class L>
  loaded_t run_sync(const P& key, std::uint64_t mixed, L& loader, const stop_token& st,
                    bool foreground) {
    using traits = detail::loader_traits<L, Key, T>;
    static_assert(!traits::takes_key || std::same_as<P, Key>,
                  "cache_loads::run_sync: a loader that takes the key receives a Key");
    registration r = begin_load(key, mixed, foreground);
    loaded_t out;
    if (r.shortcut(out)) {
      r.fail(nullptr, true);  // release the claim; nothing to record
      return out;
    }
    r.running(st);
    value_ref<T> box;
    bool found = true;
    std::optional<std::chrono::nanoseconds> ttl_override;
    try {
      if constexpr (std::same_as<std::remove_cv_t<L>, loader_ref<Key, T>>) {
        box = loader.load(key, st, found, ttl_override);  // boxed by the loader's own thunk
      } else if constexpr (traits::returns_result) {
        load_result<T> res = call_loader<T>(loader, key, st);
        found = res.loaded.has_value();
        ttl_override = res.ttl;
        if (found) box = value_ref<T>::make(std::move(*res.loaded));
      } else {
        box = value_ref<T>::make(call_loader<T>(loader, key, st));
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

  // publishing_here(): whether the calling thread is recording the outcome of one of this
  // cache's asynchronous loads (run_async), before that load's flight is settled. User code
  // runs there: the destructors of what the record lets go of (the value it replaces, an
  // evicted entry's Key and T, an old exception). A close() they call must not wait for the
  // flight this very thread is about to settle: cache_calls::close() then stops and rejects
  // and waits for nothing, as on one of the cache's own threads.
  //
  // Thread safety: reads the calling thread's own marks only.
  bool publishing_here() const noexcept {
    for (const publishing* m = publishing::top; m != nullptr; m = m->prev) {
      if (m->cache == this) return true;
    }
    return false;
  }

  // run_async(key, mixed, loader, st, done, foreground): an asynchronous
  // loader, called with a relayed completion (completion_relay.hpp); its
  // outcome is published, then `done` is resolved, on the thread that
  // resolves the loader's completion. A synchronous throw of the loader fails
  // the load with that exception. Throws only before the loader was called
  // (then `done` is left to the caller).
  template <class P, class L>
  void run_async(const P& key, std::uint64_t mixed, L& loader, const stop_token& st,
                 completion<loaded_t>& done, bool foreground) {
    using traits = detail::loader_traits<L, Key, T>;
    using X = std::conditional_t<traits::async_value, T, load_result<T>>;
    static_assert(!traits::takes_key || std::same_as<P, Key>,
                  "cache_loads::run_async: a loader that takes the key receives a Key");
    registration r = begin_load(key, mixed, foreground);
    loaded_t out;
    if (r.shortcut(out)) {
      r.fail(nullptr, true);
      done.set_value(std::move(out));
      return;
    }
    r.running(st);
    // The outcome is recorded inside a `publishing` mark, `done` resolved after it: what the
    // record lets go of (the value it replaces, an evicted entry's Key and T, an old
    // exception) is destroyed inside the mark, before the load's flight is settled.
    auto finish = [r = std::move(r), st, d = std::move(done),
                   c = this](outcome<X>&& o) mutable noexcept {
      try {
        if (!o.has_value()) {
          {
            const publishing mark(c);
            r.fail(o.error(), st.stop_requested());
          }
          d.set_exception(o.error());
          return;
        }
        value_ref<T> box;
        bool found = true;
        std::optional<std::chrono::nanoseconds> entry_ttl;
        if constexpr (std::same_as<X, T>) {
          box = value_ref<T>::make(std::move(o).value());
        } else {
          load_result<T> res = std::move(o).value();
          found = res.loaded.has_value();
          entry_ttl = res.ttl;
          if (found) box = value_ref<T>::make(std::move(*res.loaded));
        }
        loaded_t published;
        {
          const publishing mark(c);
          published = r.publish(std::move(box), found, entry_ttl);
        }
        d.set_value(std::move(published));
      } catch (...) {
        if (d) d.set_exception(std::current_exception());
      }
    };
    auto start = [&](completion<X> c) { start_loader<T>(loader, key, st, std::move(c)); };
    detail::start_relayed<X>(start, std::move(finish));
  }

 private:
  // publishing: the calling thread records an asynchronous load's outcome for `cache` while
  // it lives (publishing_here()). Marks nest (a destructor run inside one may finish a load
  // of another cache), each on its thread's stack, linked from a thread_local: one per cache
  // type, and per shared object under -fvisibility=hidden (detail/library_thread.hpp).
  struct publishing {
    explicit publishing(const cache_loads* c) noexcept : cache(c), prev(top) { top = this; }
    publishing(const publishing&) = delete;
    publishing& operator=(const publishing&) = delete;
    ~publishing() { top = prev; }
    const cache_loads* cache;
    const publishing* prev;
    static inline thread_local const publishing* top = nullptr;
  };

  running_loads<Clock> running_;  // loads whose loader runs now (the gauges)
};

}  // namespace singleflight::detail
