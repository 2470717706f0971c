// singleflight/cache.hpp
//
// `singleflight::cache<Key, T>`: an in-process read-through cache whose
// misses and refreshes are flights of a `singleflight::group` — the layered
// answer to a stampede in one type.
//
//   singleflight::cache<std::string, profile> profiles{{
//       .ttl = 30s, .jitter = 0.1, .stale_while_revalidate = 10s, .stale_if_error = 5min}};
//   profile p = profiles.get(tenant + '|' + user + '|' + locale,
//                            [&](singleflight::stop_token st) { return origin.fetch(st, ...); },
//                            request_stop_token);
//
// Overview
//
// Each write (a load that publishes, or put) starts three windows, measured
// from the moment the value was stored:
//
//   written      fresh_until          stale_until            error_until
//      |--- fresh ---|--- stale-while-revalidate ---|                         dead
//      |  (ttl, jittered)                          |
//      |             |--------------- stale-if-error ------------|            dead
//
//   * fresh: get() returns the value (a hit). With early_refresh_beta > 0 a
//     read may also start one background refresh before expiry (XFetch).
//   * stale (within stale_while_revalidate): get() returns the value at once
//     (freshness::stale) and one background refresh starts.
//   * past both: the value is dead. get() waits on a load; only when that
//     load fails (and the value is within stale_if_error) does it return the
//     old value (freshness::stale_on_error). A dead value is never returned,
//     not even while a refresh runs or hangs.
// A load is a flight of the cache's group: at most one per key runs at any
// moment, every caller of a key shares it, and the group's guarantees hold
// (per-caller cancellation, flight.timeout, close, max_in_flight).
//
// README.md ("Cache") has the decision table — entry state to what get() does
// — and the choices made where the contract was silent.
//
// Files: the options and result types are in cache_options.hpp (included
// here); the entry table and what reads and writes it in detail/cache/cache_core.hpp
// (the shared core, a chain of layers: detail/cache/cache_lookup.hpp, the lookup
// decisions; detail/cache/cache_writes.hpp, put / invalidate / clear and eviction;
// detail/cache/cache_loads.hpp, the life of a load; detail/cache/cache_loader.hpp, the
// loader traits), detail/cache/cache_table.hpp (shards), detail/cache/read_gate.hpp (the
// lock-free hit path), detail/cache/cache_policy.hpp (S3-FIFO),
// detail/cache/cache_clock.hpp (jitter, XFetch) and detail/worker_threads.hpp (the
// cache's own refresh threads).
//
// Thread safety: every member may be called concurrently from any number of
// threads, except the destructor (not concurrently with anything, not from a
// loader or callback of this cache).
//
// Locking: the entries are split over shards, each with its own mutex. A hit
// takes no mutex at all: it reads its shard inside a read section (see
// detail/cache/read_gate.hpp) and writes only its own stripe's counters and the
// entry's access bits; it allocates nothing. Writers (loads publishing, put,
// invalidate, eviction) take one shard's mutex and wait for that shard's
// readers only. No lock of the cache is held while user code runs (the
// loader, a callback, a coroutine resumption, the executor, Hash, copies and
// destructors of Key and T), except KeyEqual, which runs in the shard's read
// section or under its mutex and must not call the cache.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "cache_options.hpp"  // IWYU pragma: export
#include "completion.hpp"
#include "detail/cache/cache_clock.hpp"
#include "detail/cache/cache_core.hpp"
#include "detail/resume_gate.hpp"
#include "detail/worker_threads.hpp"
#include "errors.hpp"
#include "group.hpp"
#include "hash.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "stop_token.hpp"

namespace singleflight {

// cache
//
// Template parameters:
//   Key       what identifies a value: the key is a contract (every input that
//             changes the result — tenant, locale, version, scope — and
//             nothing that doesn't). Copy-constructible; hashable by Hash.
//   T         the value; every caller receives its own copy, so T must be
//             copy-constructible (use std::shared_ptr<const X> for big values).
//   Hash, KeyEqual   as for group (default_hash is transparent: a
//             cache<std::string, T> accepts std::string_view and const char*).
//   Clock     any type meeting the standard Clock requirements; every time the
//             cache measures (windows, ages, XFetch's delta) is Clock::now().
//             flight.timeout is measured by the group, on steady_clock.
template <class Key, class T, class Hash = default_hash, class KeyEqual = std::equal_to<>,
          class Clock = std::chrono::steady_clock>
class cache {
  static_assert(std::is_object_v<T> && !std::is_array_v<T> && std::copy_constructible<T>,
                "singleflight::cache<Key, T>: every caller receives its own copy of the value, "
                "so T must be a copy-constructible object type; for big values use "
                "std::shared_ptr<const X>");
  static_assert(std::copy_constructible<Key> && std::is_object_v<Key>,
                "singleflight::cache<Key, T>: Key must be a copy-constructible object type");
  static_assert(std::is_invocable_r_v<std::size_t, const Hash&, const Key&>,
                "singleflight::cache<Key, T, Hash>: Hash must be callable as "
                "std::size_t(const Key&)");
  static_assert(std::is_invocable_r_v<bool, const KeyEqual&, const Key&, const Key&>,
                "singleflight::cache<Key, T, Hash, KeyEqual>: KeyEqual must be callable as "
                "bool(const Key&, const Key&)");
  static_assert(detail::clock_like<Clock>,
                "singleflight::cache<..., Clock>: Clock must meet the Clock requirements "
                "(rep, period, duration, time_point, is_steady, static now())");

 public:
  using key_type = Key;
  using value_type = T;
  using clock = Clock;
  using time_point = typename Clock::time_point;

 private:
  using core = detail::cache_core<Key, T, Hash, KeyEqual, Clock>;
  using loaded_t = typename core::loaded_t;
  using group_t = group<Key, loaded_t, Hash, KeyEqual>;

 public:
  // cache(), cache(options)
  //
  // Throws std::invalid_argument for invalid options (see cache_options), and
  // what group's constructor throws (a thread for flight.timeout).
  cache() : cache(cache_options{}) {}
  explicit cache(const cache_options& opts)
      : core_(std::make_shared<core>(validated(opts))),
        group_has_executor_(static_cast<bool>(opts.flight.executor)),
        group_(opts.flight) {}

  cache(const cache&) = delete;
  cache& operator=(const cache&) = delete;

  // ~cache(): close(), then frees the entries. Undefined if called
  // concurrently with any other member, or from a loader or callback of this
  // cache.
  ~cache() { close(); }

  // get(key, loader, caller)
  //
  // The value for `key`: from the cache when it is fresh (or stale within
  // stale_while_revalidate, starting one background refresh), else from a
  // load that this call starts or joins. `loader` is anything group::do_
  // accepts — T(), T(stop_token), or asynchronous
  // void(stop_token, completion<T>) — or returns load_result<T> (or
  // completes a completion<load_result<T>>) to set this entry's ttl or to
  // report "not found". The loader receives the flight's token.
  //
  // A call that waits on a load is a caller of the inner group: it leaves
  // on `caller` (cancelled_error) without cancelling the load for others,
  // is bounded by flight.timeout, and receives closed_error / overloaded_error
  // as group::do_ would. A load that fails while the old value is within
  // stale_if_error is answered with that value (no exception) unless this
  // call was cancelled or the cache closed.
  //
  // Never joins a load that started before a put / invalidate / clear of
  // its key that completed before this call began. Background refreshes
  // belong to the cache: `caller` firing never cancels them.
  //
  // Throws: what the load threw (the same exception object for every caller
  // of that load, and for every caller within error_ttl when it is cached);
  // not_found_error; cancelled_error, timeout_error, closed_error,
  // overloaded_error (see errors.hpp); std::logic_error when the loader
  // calls get for its own key on its own thread; what Hash, KeyEqual, copies
  // of Key and T or allocation throw. Thread-safe.
  template <class K, class L>
  T get(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    return with_key(key, [&](const auto& k) {
      return get_value(k, std::forward<L>(loader), std::move(caller));
    });
  }

  // get_entry(key, loader, caller)
  //
  // Like get, and says how fresh the answer is, how old, how it was obtained
  // and the key's version. A cached or freshly loaded "not found" is
  // returned as an entry without a value (found() == false) instead of
  // throwing. Thread-safe.
  template <class K, class L>
  cached<T> get_entry(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    return with_key(key, [&](const auto& k) {
      return get_impl(k, std::forward<L>(loader), std::move(caller), false);
    });
  }

  // get_fresh(key, loader, caller)
  //
  // Read-your-writes: returns a value loaded by a flight that started after
  // this call began (group::do_fresh), never one from the cache or from a
  // load already under way; concurrent get_fresh callers share one load, and
  // it never overlaps another load of the key. The value is published as any
  // load's is. No stale-if-error fallback. Throws as get. Thread-safe.
  template <class K, class L>
  T get_fresh(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    cached<T> e = with_key(key, [&](const auto& k) {
      return get_impl(k, std::forward<L>(loader), std::move(caller), true);
    });
    if (!e.value) throw not_found_error();
    return std::move(*e.value);
  }

  // peek(key)
  //
  // What get would answer from the cache right now, without loading,
  // refreshing, counting or touching the entry's eviction state: a fresh,
  // stale (within stale_while_revalidate) or stale_on_error (a failure is
  // throttling loads) value, or a cached not-found (found() == false);
  // nullopt when get would wait on a load or a cached failure would be
  // thrown. Throws only what Hash, KeyEqual and T's copy throw. Thread-safe.
  template <class K>
  std::optional<cached<T>> peek(const K& key) const {
    return with_key(key, [&](const auto& k) { return core_->peek(k, hash_of(k)); });
  }

  // put(key, value)
  //
  // Stores `value` as a fresh entry (ttl jittered as for a load) and returns
  // the key's new version. A load of this key that started before the put
  // will not publish. Throws what Hash, KeyEqual, copies of Key and T and
  // allocation throw (the cache then unchanged). Thread-safe.
  template <class K, class V>
  requires std::constructible_from<T, V&&> std::uint64_t put(const K& key, V&& value) {
    auto box = std::make_shared<const T>(std::forward<V>(value));  // user code: no lock
    return with_key(key, [&](const auto& k) { return core_->put(k, hash_of(k), std::move(box)); });
  }

  // invalidate(key)
  //
  // Drops the entry for `key` (value, cached not-found or failure) and
  // returns the key's new version; a load of this key already under way will
  // not publish (its callers still receive its result). Thread-safe.
  template <class K>
  std::uint64_t invalidate(const K& key) {
    return with_key(key, [&](const auto& k) { return core_->invalidate(k, hash_of(k)); });
  }

  // clear(): invalidate every key. Thread-safe.
  void clear() { core_->clear(); }

  // close()
  //
  // Idempotent. From now on get / get_entry / get_fresh throw closed_error
  // and async_get / co_get deliver it; every load and refresh has its token
  // stopped and its waiters receive closed_error. Returns once every loader
  // the cache started has returned (or completed), and the cache's refresh
  // threads are joined. peek, put, invalidate, clear, size and stats keep
  // working. Called from a loader or a callback of this cache it stops and
  // rejects without waiting (the destructor then waits). Thread-safe.
  void close() {
    closed_.store(true, std::memory_order_relaxed);
    if (threads_.on_own_thread()) {
      (void)group_.close_for(std::chrono::nanoseconds::zero());
      core_->close_raw(false);
      threads_.close();
      return;
    }
    group_.close();
    core_->close_raw(true);
    threads_.close();
  }

  // size(): the entries now (values, cached not-founds, cached failures).
  // Thread-safe; takes no lock.
  std::size_t size() const noexcept { return core_->size(); }

  // stats(): see cache_stats. Thread-safe; takes each shard's lock in turn.
  cache_stats stats() const { return core_->stats(); }

  // flight_stats(): the inner group's counters (singleflight::stats): loads
  // and refreshes started as flights, callers that joined one, cancellations,
  // timeouts, rejections. Thread-safe.
  singleflight::stats flight_stats() const { return group_.stats(); }

  // async_get(key, loader, on_done, caller)
  //
  // get without blocking: on_done(singleflight::outcome<T>) receives this
  // call's own copy of the value, or the exception get would have thrown
  // (not_found_error for a not-found). Exactly once, never under a lock of
  // the cache, and it may re-enter the cache. Where:
  //   * before async_get returns, on this thread, when the cache answers
  //     (hit, stale, cached not-found or failure), or the outcome is
  //     immediate (closed, `caller` already stopped, overloaded);
  //   * otherwise where group::async_do delivers: on the thread that
  //     settles the load (see group.hpp).
  // Throws (and never calls on_done) only what Hash, KeyEqual, copies of Key
  // and the loader, and allocation throw. If on_done throws, std::terminate.
  // Thread-safe.
  template <class K, class L, class Callback>
  void async_get(const K& key, L&& loader, Callback&& on_done, stop_token caller = {}) {
    check_loader<L>();
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::cache::async_get: on_done must be invocable with "
                  "singleflight::outcome<T>");
    with_key(key, [&](const auto& k) {
      start_async(k, std::forward<L>(loader),
                  std::decay_t<Callback>(std::forward<Callback>(on_done)), std::move(caller));
      return 0;
    });
  }

  // co_get(key, loader, caller)
  //
  //   T v = co_await c.co_get(key, loader, token);
  //
  // The coroutine form of async_get: yields this caller's copy of the value
  // or throws what get would throw. Does not suspend when the cache answers;
  // otherwise resumes on the thread that settles the load. The awaitable
  // refers to `key` and `loader`: co_await it in the same full expression.
  // With GCC 12, name a capturing lambda loader before the co_await (see
  // group::co_do). Thread-safe.
  template <class K, class L>
  [[nodiscard]] auto co_get(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    return get_awaitable<K, std::remove_reference_t<L>>(this, key, loader, std::move(caller));
  }

 private:
  using node_t = typename core::node_t;
  using duration = typename Clock::duration;
  using decision = typename core::decision;
  using copied_t = typename core::copied_t;
  static constexpr bool copy_inside = core::copy_inside;

  // ---- keys -----------------------------------------------------------------

  // Whether K probes the table as it is (hash.hpp); otherwise it is converted
  // to Key once, before any lock.
  template <class K>
  static constexpr bool direct_probe = detail::direct_probe<K, Key, Hash, KeyEqual>;

  template <class K, class F>
  static decltype(auto) with_key(const K& key, F&& f) {
    static_assert(direct_probe<K> || std::constructible_from<Key, const K&>,
                  "singleflight::cache: the key argument must be a Key or something a Key can "
                  "be constructed from");
    if constexpr (direct_probe<K>) {
      return std::forward<F>(f)(key);
    } else {
      const Key converted(key);
      return std::forward<F>(f)(converted);
    }
  }

  template <class P>
  std::uint64_t hash_of(const P& key) const {
    return detail::mix64(static_cast<std::uint64_t>(hash_(key)));  // user code: no lock
  }

  template <class L>
  static constexpr void check_loader() {
    static_assert(detail::loader_traits<std::decay_t<L>, T>::valid,
                  "singleflight::cache: the loader must be invocable as T(), T(stop_token), "
                  "load_result<T>(), load_result<T>(stop_token), or (asynchronous) "
                  "void(stop_token, completion<T>) / void(stop_token, "
                  "completion<load_result<T>>)");
  }

  static cache_options validated(const cache_options& o) {
    if (o.ttl <= std::chrono::nanoseconds::zero()) {
      throw std::invalid_argument("singleflight::cache: cache_options::ttl must be > 0");
    }
    if (o.stale_while_revalidate.count() < 0 || o.stale_if_error.count() < 0 ||
        o.error_ttl.count() < 0 || o.not_found_ttl.count() < 0) {
      throw std::invalid_argument("singleflight::cache: cache_options durations must be >= 0");
    }
    if (!(o.jitter >= 0.0 && o.jitter < 1.0)) {
      throw std::invalid_argument("singleflight::cache: cache_options::jitter must be in [0, 1)");
    }
    if (!(o.early_refresh_beta >= 0.0)) {
      throw std::invalid_argument(
          "singleflight::cache: cache_options::early_refresh_beta must be >= 0");
    }
    return o;
  }

  // ---- flights -------------------------------------------------------------

  // A flight body that owns copies of the key and the loader (executor
  // flights, async callers, refreshes: it may outlive the caller's frame).
  template <class L>
  auto owned_fn(const Key& key, std::uint64_t m, L&& loader, bool foreground) {
    using Ld = std::decay_t<L>;
    core* c = core_.get();
    if constexpr (detail::loader_traits<Ld, T>::is_async) {
      return [c, key, m, foreground, loader = Ld(std::forward<L>(loader))](
                 stop_token st, completion<loaded_t> done) mutable {
        c->run_async(key, m, std::move(loader), std::move(st), done, foreground);
      };
    } else {
      return [c, key, m, foreground,
              loader = Ld(std::forward<L>(loader))](stop_token st) mutable -> loaded_t {
        return c->run_sync(key, m, loader, st, foreground);
      };
    }
  }

  template <class P>
  static Key key_of(const P& key) {
    if constexpr (std::same_as<P, Key>) {
      return key;
    } else {
      return Key(key);
    }
  }

  // The blocking path: lookup, then (maybe) a refresh, then (maybe) a load.
  template <class P, class L>
  cached<T> get_impl(const P& key, L&& loader, stop_token caller, bool fresh) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const std::uint64_t m = hash_of(key);
    core* c = core_.get();
    const time_point now = Clock::now();
    bool fired = false;
    if (!fresh) {
      copied_t copy;
      std::shared_ptr<const T> pin;
      duration age{};
      std::uint64_t version = 0;
      if (c->fresh_hit(key, m, now, copy, pin, age, version, fired)) {
        cached<T> e;
        if constexpr (copy_inside) {
          e.value.emplace(*copy);
        } else {
          e.value.emplace(*pin);  // this caller's copy: no lock, no section
        }
        e.age = std::chrono::duration_cast<std::chrono::nanoseconds>(age);
        e.version = version;
        return e;
      }
    }
    return get_slow(key, std::forward<L>(loader), std::move(caller), fresh, m, now, fired);
  }

  // get_value: get's own path, which returns the value itself on a fresh hit.
  template <class P, class L>
  T get_value(const P& key, L&& loader, stop_token caller) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const std::uint64_t m = hash_of(key);
    core* c = core_.get();
    const time_point now = Clock::now();
    bool fired = false;
    copied_t copy;
    std::shared_ptr<const T> pin;
    duration age{};
    std::uint64_t version = 0;
    if (c->fresh_hit(key, m, now, copy, pin, age, version, fired)) {
      if constexpr (copy_inside) {
        return *copy;
      } else {
        return *pin;  // this caller's copy: no lock, no section
      }
    }
    cached<T> e = get_slow(key, std::forward<L>(loader), std::move(caller), false, m, now, fired);
    if (!e.value) throw not_found_error();
    return std::move(*e.value);
  }

  template <class P, class L>
  cached<T> get_slow(const P& key, L&& loader, stop_token caller, bool fresh, std::uint64_t m,
                     time_point now, bool fired) {
    core* c = core_.get();
    if (fresh) {
      auto& sc = c->table.stripe(c->table.gate().my_stripe());
      sc.add(sc.misses);
      node_t* n = c->fresh_enter(key, m);
      const auto leave = make_scope_exit([c, n] { c->fresh_leave(n); });
      return load_blocking(key, m, std::forward<L>(loader), nullptr, std::move(caller), true, 0);
    }
    decision d = c->lookup(key, m, now, fired);
    switch (d.what) {
      case decision::act::serve:
        if (d.refresh != nullptr)
          start_refresh(key, m, std::forward<L>(loader), d.refresh, d.refresh_id);
        return std::move(d).entry();
      case decision::act::not_found:
        return std::move(d).entry();
      case decision::act::failed:
        std::rethrow_exception(d.error);
      case decision::act::load:
      case decision::act::load_fresh:
        break;
    }
    node_t* pinned = d.pinned;
    const auto unpin = make_scope_exit([c, pinned] {
      if (pinned != nullptr) c->unpin(pinned);
    });
    return load_blocking(key, m, std::forward<L>(loader), pinned, std::move(caller),
                         d.what == decision::act::load_fresh, d.seen);
  }

  template <class P, class L>
  cached<T> load_blocking(const P& key, std::uint64_t m, L&& loader, node_t* pinned,
                          stop_token caller, bool fresh, std::uint64_t seen) {
    using Ld = std::remove_reference_t<L>;
    core* c = core_.get();
    call_info info;
    try {
      const auto run = [&](bool fresh_flight) {
        if constexpr (!detail::loader_traits<std::decay_t<L>, T>::is_async) {
          if (!group_has_executor_) {
            // Inline: the leader runs the loader on this thread and cannot
            // leave before it returns, so the body may refer to this frame.
            auto body = [c, &key, m, &loader, fresh_flight](stop_token st) -> loaded_t {
              return c->run_sync(key, m, static_cast<Ld&>(loader), st, !fresh_flight);
            };
            return fresh_flight ? group_.do_fresh(key, body, caller, info)
                                : group_.do_(key, body, caller, info);
          }
        }
        auto body = owned_fn(key_of(key), m, loader, !fresh_flight);
        return fresh_flight ? group_.do_fresh(key, std::move(body), caller, info)
                            : group_.do_(key, std::move(body), caller, info);
      };
      loaded_t r = run(fresh);
      // A load that started before a write this call saw (it joined a flight
      // that was still settling when the call looked): take a newer one.
      if (!fresh && r.version < seen) r = run(true);
      return core::entry_of(r, info.role);
    } catch (...) {
      if (auto e = c->serve_on_error(pinned, std::current_exception())) {
        e->taken_as = info.role;
        return std::move(*e);
      }
      throw;
    }
  }

  // A background refresh: a flight the cache owns (no caller token), run on
  // flight.executor or on the cache's threads, never on this thread.
  template <class P, class L>
  void start_refresh(const P& key, std::uint64_t m, L&& loader, node_t* n,
                     std::uint64_t id) noexcept {
    std::shared_ptr<core> owner = core_;
    try {
      auto done = [owner, n, id](outcome<loaded_t>&&) noexcept { owner->refresh_done(n, id); };
      if (group_has_executor_) {
        group_.async_do(key, owned_fn(key_of(key), m, std::forward<L>(loader), false),
                        std::move(done));
      } else {
        using Ld = std::decay_t<L>;
        auto hand_off = [this, k = key_of(key), m, ld = Ld(std::forward<L>(loader))](
                            stop_token st, completion<loaded_t> d) mutable {
          std::unique_ptr<detail::worker_threads::job> j = std::make_unique<refresh_job<Ld>>(
              core_.get(), std::move(k), m, std::move(ld), std::move(st), std::move(d));
          (void)threads_.post(j);  // after close(): j dies here, unrun (its completion breaks)
        };
        group_.async_do(key, std::move(hand_off), std::move(done));
      }
    } catch (...) {
      owner->refresh_done(n, id);  // async_do threw before attaching: on_done never runs
    }
  }

  template <class Ld>
  struct refresh_job final : detail::worker_threads::job {
    refresh_job(core* c_in, Key k, std::uint64_t m_in, Ld ld, stop_token st_in,
                completion<loaded_t> d)
        : c(c_in),
          key(std::move(k)),
          m(m_in),
          loader(std::move(ld)),
          st(std::move(st_in)),
          done(std::move(d)) {}
    void run() override {  // throws only a forced unwind (the thread then ends)
      try {
        if (st.stop_requested()) throw cancelled_error();
        if constexpr (detail::loader_traits<Ld, T>::is_async) {
          c->run_async(key, m, std::move(loader), st, done, false);
        } else {
          done.set_value(c->run_sync(key, m, loader, st, false));
        }
      } catch (...) {
        SINGLEFLIGHT_RETHROW_FOREIGN();
        if (done) done.set_exception(std::current_exception());
      }
    }
    core* c;
    Key key;
    std::uint64_t m;
    Ld loader;
    stop_token st;
    completion<loaded_t> done;
  };

  // ---- async callers ---------------------------------------------------------

  template <class Cb>
  static void deliver(Cb& cb, outcome<T>&& o) noexcept {
    std::invoke(cb, std::move(o));  // a throw terminates (noexcept)
  }

  // start_async(key, loader, cb, caller): answers from the cache (cb runs
  // here) or starts / joins a load whose outcome reaches cb.
  template <class P, class L, class Cb>
  void start_async(const P& key, L&& loader, Cb cb, stop_token caller) {
    if (closed_.load(std::memory_order_relaxed)) {
      deliver(cb, outcome<T>(std::make_exception_ptr(closed_error())));
      return;
    }
    const std::uint64_t m = hash_of(key);
    core* c = core_.get();
    decision d = c->lookup(key, m, Clock::now(), false);
    switch (d.what) {
      case decision::act::serve: {
        if (d.refresh != nullptr)
          start_refresh(key, m, std::forward<L>(loader), d.refresh, d.refresh_id);
        std::optional<outcome<T>> o;
        try {
          cached<T> e = std::move(d).entry();
          o.emplace(std::in_place, std::move(*e.value));
        } catch (...) {
          o.emplace(std::current_exception());
        }
        deliver(cb, std::move(*o));
        return;
      }
      case decision::act::not_found:
        deliver(cb, outcome<T>(std::make_exception_ptr(not_found_error())));
        return;
      case decision::act::failed:
        deliver(cb, outcome<T>(d.error));
        return;
      case decision::act::load:
      case decision::act::load_fresh:
        break;
    }
    node_t* pinned = d.pinned;
    try {
      auto on_done = [owner = core_, pinned,
                      cb = std::move(cb)](outcome<loaded_t> o) mutable noexcept {
        std::optional<outcome<T>> out;
        try {
          if (o.has_value()) {
            const loaded_t& r = o.value();
            if (r.value) {
              out.emplace(std::in_place, *r.value);  // this caller's copy
            } else {
              out.emplace(std::make_exception_ptr(not_found_error()));
            }
          } else if (auto e = owner->serve_on_error(pinned, o.error())) {
            out.emplace(std::in_place, std::move(*e->value));
          } else {
            out.emplace(o.error());
          }
        } catch (...) {
          out.emplace(std::current_exception());
        }
        if (pinned != nullptr) owner->unpin(pinned);
        deliver(cb, std::move(*out));
      };
      // group has no asynchronous do_fresh: on act::load_fresh (a load that
      // started before an invalidation is still running) an async caller may
      // join that load (README, "Cache": choices).
      group_.async_do(key, owned_fn(key_of(key), m, std::forward<L>(loader), true),
                      std::move(on_done), std::move(caller));
    } catch (...) {
      if (pinned != nullptr) c->unpin(pinned);
      throw;
    }
  }

  // The awaitable co_get returns.
  template <class K, class L>
  class get_awaitable {
   public:
    get_awaitable(cache* c, const K& key, L& loader, stop_token caller) noexcept
        : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
    get_awaitable(const get_awaitable&) = delete;
    get_awaitable& operator=(const get_awaitable&) = delete;
    ~get_awaitable() = default;

    class awaiter {
     public:
      awaiter(cache* c, const K& key, L& loader, stop_token caller) noexcept
          : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
      awaiter(const awaiter&) = delete;
      awaiter& operator=(const awaiter&) = delete;
      ~awaiter() = default;

      // Starts the lookup (and the load if needed); does not suspend when
      // the outcome is already there.
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) {
        gate_.arm(h);
        c_->async_get(
            *key_, *loader_,
            [this](outcome<T> o) noexcept {
              result_.emplace(std::move(o));
              gate_.complete();
            },
            std::move(caller_));
        return gate_.suspend();
      }
      T await_resume() { return std::move(*result_).value(); }

     private:
      cache* c_;
      const K* key_;
      L* loader_;
      stop_token caller_;
      std::optional<outcome<T>> result_;
      detail::resume_gate gate_;
    };

    awaiter operator co_await() && { return awaiter(c_, *key_, *loader_, std::move(caller_)); }

   private:
    cache* c_;
    const K* key_;
    L* loader_;
    stop_token caller_;
  };

  template <class F>
  struct scope_exit {
    F f;
    explicit scope_exit(F fn) : f(std::move(fn)) {}
    scope_exit(const scope_exit&) = delete;
    scope_exit& operator=(const scope_exit&) = delete;
    ~scope_exit() { f(); }
  };
  template <class F>
  static scope_exit<F> make_scope_exit(F f) {
    return scope_exit<F>(std::move(f));
  }

  [[no_unique_address]] Hash hash_{};
  std::shared_ptr<core> core_;
  std::atomic<bool> closed_{false};
  bool group_has_executor_ = false;
  group_t group_;
  detail::worker_threads threads_;  // declared after group_: destroyed (joined) first
};

}  // namespace singleflight
