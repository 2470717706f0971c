// singleflight/cache.hpp
//
// `singleflight::cache<Key, T>`: an in-process read-through cache whose
// misses and refreshes are flights of a `singleflight::group` — the layered
// answer to a stampede in one type.
//
//   singleflight::cache<std::string, profile> profiles(
//       {.ttl = 30s, .jitter = 0.1, .stale_while_revalidate = 10s, .stale_if_error = 5min},
//       // The cache-wide loader: kept by the cache for loads and refreshes that outlive the
//       // request; what it captures (the origin client) must outlive the cache.
//       [&origin](const std::string& key, singleflight::stop_token st) {
//         return origin.fetch(st, key);
//       });
//   profile p = profiles.get(tenant + '|' + user + '|' + locale,  // the key is a contract
//                            request_stop_token, 100ms);           // leave at 100 ms at most
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
//     old value (freshness::stale_on_error); with soft_timeout, a caller that
//     has waited that long gets it too (freshness::stale_on_timeout) while
//     the load goes on. A dead value is never returned, not even while a
//     refresh runs or hangs.
// A load is a flight of the cache's group: at most one per key runs at any
// moment, every caller of a key shares it, and the group's guarantees hold
// (per-caller cancellation, wait_bound, flight.timeout, close, max_in_flight).
// By default a load belongs to the cache (load_owner::cache): it runs on the
// cache's own bounded threads (or flight.executor), every caller — the one
// that started it included — leaves at its token or wait_bound, and the load
// runs on to publish, bounded by flight.timeout.
//
// docs/cache.md has the decision table — entry state to what get() does —
// and the choices made where the contract was silent.
//
// Files: the options and result types are in cache_options.hpp (included
// here); what a call does (lookup, refresh, a load as a flight of the cache's
// group, close) in detail/cache/cache_calls.hpp; the shared state it works on
// in detail/cache/cache_core.hpp (a chain of layers: detail/cache/cache_lookup.hpp,
// the lookup decisions; detail/cache/cache_writes.hpp, put / invalidate / expire / clear
// and eviction; detail/cache/cache_loads.hpp, the life of a load;
// detail/cache/cache_loader.hpp, the loader traits), detail/cache/cache_table.hpp
// (shards), detail/cache/read_gate.hpp (the lock-free hit path),
// detail/cache/cache_policy.hpp (W-TinyLFU), detail/cache/cache_clock.hpp (jitter,
// XFetch) and detail/worker_threads.hpp (the cache's own threads: loads and
// refreshes).
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

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache_options.hpp"  // IWYU pragma: export
#include "completion.hpp"
#include "detail/cache/cache_calls.hpp"
#include "detail/cache/cache_clock.hpp"
#include "detail/chrono.hpp"
#include "detail/functional.hpp"
#include "errors.hpp"
#include "group.hpp"
#include "hash.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "stop_token.hpp"
#include "thread_pool.hpp"  // IWYU pragma: export (cache_options::flight.executor)
#include "wait_bound.hpp"   // IWYU pragma: export

namespace singleflight {

namespace detail {
struct cache_access;
}  // namespace detail

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
  using calls_t = detail::cache_calls<Key, T, Hash, KeyEqual, Clock>;

 public:
  // cache(), cache(options)
  //
  // Throws std::invalid_argument for invalid options (see cache_options), and
  // what group's constructor throws (a thread for flight.timeout).
  cache() : cache(cache_options{}) {}
  explicit cache(const cache_options& opts) : calls_(opts) {}

  // cache(options, loader)
  //
  // A cache with a cache-wide loader: get(key), get_entry(key),
  // get_fresh(key), async_get(key, on_done), co_get(key) and get_many(keys)
  // load through it, and every background refresh (stale_while_revalidate,
  // XFetch) runs it, whichever call triggered it — also a call that passed a
  // loader of its own. `loader` takes the key, in any shape get accepts:
  // synchronous (T(const Key&), T(const Key&, stop_token), or returning
  // load_result<T>) or asynchronous (void(const Key&, stop_token,
  // completion<T>), or with completion<load_result<T>>). An asynchronous
  // one holds no thread while its load is pending: every load and refresh
  // through it is started on the thread that asks for it and finishes
  // through its completion — batch_loader::cache_loader() is one, so misses,
  // get_many and refreshes of many keys become few bulk calls. The cache
  // keeps one copy, shared with the flights and refreshes running it, so
  // nothing it is given can dangle; what it captures by reference must
  // outlive the cache (a batch_loader: declare it before the cache). It is
  // called concurrently for different keys. Throws as cache(options), and
  // what copying the loader throws.
  template <class L>
  requires(!std::same_as<std::remove_cvref_t<L>, cache_options>)
      cache(const cache_options& opts, L&& loader)
      : calls_(opts, detail::shared_loader<Key, T>::of(checked_wide<L>(std::forward<L>(loader)))) {}

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
  // load that this call starts or joins. `loader` takes the key or not, the
  // flight's token or not: T(const Key&), T(const Key&, stop_token), T(),
  // T(stop_token), or asynchronous void(const Key&, stop_token,
  // completion<T>) / void(stop_token, completion<T>); it may return
  // load_result<T> (or complete a completion<load_result<T>>) instead, to
  // set this entry's ttl or to report "not found".
  //
  // A call that waits on a load is a caller of the inner group: it leaves
  // on `caller` (cancelled_error) at once, is bounded by flight.timeout, and
  // receives closed_error / overloaded_error as group::do_ would. By default
  // (load_owner::cache) the load belongs to the cache: a synchronous loader
  // runs on flight.executor or the cache's own threads, never on this one,
  // so the caller that started it leaves as any other, and no caller leaving
  // stops it (it runs on and publishes); a per-call loader may therefore run
  // after this call returned: capture by value. Under load_owner::caller the
  // first caller runs it here and returns only when it does. A load that
  // fails while the old value is within stale_if_error is answered with that
  // value (no exception) unless this call was cancelled or the cache closed.
  //
  // Never joins a load that started before a put / invalidate / clear of
  // its key that completed before this call began. Background refreshes
  // belong to the cache: `caller` firing never cancels them.
  //
  // Throws: what the load threw (the same exception object for every caller
  // of that load, and for every caller within error_ttl when it is cached);
  // not_found_error; cancelled_error, timeout_error, closed_error,
  // overloaded_error (see errors.hpp); std::logic_error when a loader calls
  // get for its own key on the thread running it (the caller's, or one of the
  // cache's threads); what Hash, KeyEqual, copies
  // of Key and T or allocation throw. Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.get(k, std::forward<L>(loader), std::move(caller), std::nullopt);
    });
  }

  // get(key, loader, caller, bound)
  //
  // As above, and this call waits on a load at most until `bound` (a
  // wait_bound: a duration from now, or a time point; pass {} for no
  // stop_token): when it passes, the call throws timeout_error and leaves
  // the load, exactly as when `caller` fires (see group::do_ with a
  // wait_bound). An answer from the cache (a hit, a stale value, a cached
  // not-found or failure) is returned whatever the bound. Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get(const K& key, L&& loader, stop_token caller, wait_bound bound) {
    check_loader<L>();
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.get(k, std::forward<L>(loader), std::move(caller), bound);
    });
  }

  // get_entry(key, loader, caller)
  //
  // Like get, and says how fresh the answer is, how old, how it was obtained
  // and the key's version. A cached or freshly loaded "not found" is
  // returned as an entry without a value (found() == false) instead of
  // throwing. Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) cached<T> get_entry(
      const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.get_entry(k, std::forward<L>(loader), std::move(caller), std::nullopt, false);
    });
  }

  // get_entry(key, loader, caller, bound): get_entry with a wait_bound (see
  // get). Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) cached<T> get_entry(
      const K& key, L&& loader, stop_token caller, wait_bound bound) {
    check_loader<L>();
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.get_entry(k, std::forward<L>(loader), std::move(caller), bound, false);
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
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get_fresh(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    cached<T> e = calls_t::with_key(key, [&](const auto& k) {
      return calls_.get_entry(k, std::forward<L>(loader), std::move(caller), std::nullopt, true);
    });
    if (!e.value) throw not_found_error();
    return std::move(*e.value);
  }

  // get_fresh(key, loader, caller, bound): get_fresh with a wait_bound (see
  // get); the bound also covers the wait for a load already under way to
  // end. Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get_fresh(const K& key, L&& loader, stop_token caller, wait_bound bound) {
    check_loader<L>();
    cached<T> e = calls_t::with_key(key, [&](const auto& k) {
      return calls_.get_entry(k, std::forward<L>(loader), std::move(caller), bound, true);
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
    return calls_t::with_key(
        key, [&](const auto& k) { return calls_.state().peek(k, calls_.hash_of(k)); });
  }

  // put(key, value)
  //
  // Stores `value` as a fresh entry (ttl jittered as for a load) and returns
  // the key's new version. A load of this key that started before the put
  // will not publish. Throws what Hash, KeyEqual, copies of Key and T and
  // allocation throw (the cache then unchanged). Thread-safe.
  template <class K, class V>
  requires std::constructible_from<T, V&&> std::uint64_t put(const K& key, V&& value) {
    auto box = detail::value_ref<T>::make(std::forward<V>(value));  // user code: no lock
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.state().put(k, calls_.hash_of(k), std::move(box));
    });
  }

  // invalidate(key)
  //
  // Drops the entry for `key` (value, cached not-found or failure) and
  // returns the key's new version; a load of this key already under way will
  // not publish (its callers still receive its result). Thread-safe.
  template <class K>
  std::uint64_t invalidate(const K& key) {
    return calls_t::with_key(
        key, [&](const auto& k) { return calls_.state().invalidate(k, calls_.hash_of(k)); });
  }

  // expire(key)
  //
  // Stale, but kept: a fresh value for `key` becomes stale now, as if its
  // ttl had just passed: the next get returns it (freshness::stale) within
  // stale_while_revalidate and starts one refresh, and past that it is kept
  // for stale_if_error, both measured from now. It does so under a new
  // version (returned), as put and invalidate: a load of the key that
  // started before it will not publish. A value already stale keeps its
  // windows and its refresh mark (a repeated expire starts no second
  // refresh), and its version unless a load or refresh of the key is under
  // way: that one may have read the origin before what the expire stands for,
  // so the key takes a new version and it does not publish (its callers still
  // receive what it read). A cached not-found or failure is dropped, as by
  // invalidate. Returns the key's version; 0 when the cache holds nothing for
  // the key. Thread-safe.
  template <class K>
  std::uint64_t expire(const K& key) {
    return calls_t::with_key(key, [&](const auto& k) {
      return calls_.state().expire(k, calls_.hash_of(k), Clock::now());
    });
  }

  // expire_all()
  //
  // expire() for every key at once, for when which keys changed is unknown
  // (fleet_cache after a gap in what it hears): every fresh value stored so
  // far becomes stale now, so the next get of its key returns it
  // (freshness::stale) within stale_while_revalidate and starts one
  // refresh, and past that it is kept for stale_if_error, both measured
  // from now; with stale_while_revalidate at zero the next get waits on a
  // load, as after clear(). Every key gets a new version: no load or
  // refresh that started before this call publishes after it (its callers
  // still receive what it loaded), so the stale value stays until a refresh
  // started after it publishes. A value already stale keeps its windows (a
  // refresh of it under way is one of those that will not publish); cached
  // not-founds and failures are dropped, as by invalidate. Shard by shard,
  // not one atomic step: a get concurrent with it may still see a value
  // fresh. Thread-safe.
  void expire_all() { calls_.state().expire_all(calls_.state().stale_while_revalidate); }

  // expire_all(stale_for)
  //
  // expire_all(), with the stale answers it allows bounded: every value's
  // stale_while_revalidate window ends within `stale_for` of the call (for
  // fleet_cache after a gap: a process answers with what it held before it
  // for at most that long). Each value is marked as if its ttl had passed
  // stale_while_revalidate - stale_for ago, at the latest: its stale window
  // ends at now + stale_for, and its stale_if_error window, measured from the
  // same point, is cut by as much; a value already stale whose window would
  // end later is cut the same way. Within `stale_for` the next get of a key
  // returns its value (freshness::stale) and starts one refresh; after it a
  // get waits as on a miss, joining that refresh when it is still running
  // (no second load), within its stop_token and wait_bound. `stale_for` at
  // or above stale_while_revalidate is expire_all(); zero (or negative)
  // allows no stale answer, as expire_all() without stale_while_revalidate.
  // Thread-safe.
  void expire_all(std::chrono::nanoseconds stale_for) {
    calls_.state().expire_all(detail::to_duration<typename Clock::duration>(stale_for));
  }

  // clear(): invalidate every key. Thread-safe.
  void clear() { calls_.state().clear(); }

  // close()
  //
  // Idempotent. From now on get / get_entry / get_fresh throw closed_error
  // and async_get / co_get deliver it; every load and refresh has its token
  // stopped and its waiters receive closed_error. Returns once every loader
  // the cache started has returned (or completed), and the cache's refresh
  // threads are joined. peek, put, invalidate, clear, size and stats keep
  // working. Called from a loader or a callback of this cache it stops and
  // rejects without waiting (the destructor then waits). Thread-safe.
  void close() { calls_.close(); }

  // size(): the entries now (values, cached not-founds, cached failures).
  // Thread-safe; takes no lock.
  std::size_t size() const noexcept { return calls_.state().size(); }

  // stats(): see cache_stats. Thread-safe; takes each shard's lock in turn.
  cache_stats stats() const { return calls_.state().stats(); }

  // flight_stats(): the inner group's counters (singleflight::stats): loads
  // and refreshes started as flights, callers that joined one, cancellations,
  // timeouts, rejections. Thread-safe.
  singleflight::stats flight_stats() const { return calls_.flight_stats(); }

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
  requires(!std::is_invocable_v<std::decay_t<L>&, outcome<T>&&>) void async_get(
      const K& key, L&& loader, Callback&& on_done, stop_token caller = {}) {
    async_impl(key, std::forward<L>(loader), std::forward<Callback>(on_done), std::move(caller),
               std::nullopt);
  }

  // async_get(key, loader, on_done, caller, bound)
  //
  // async_get with a wait_bound: once `bound` passes before the load
  // settles, on_done receives timeout_error (on the inner group's delivery
  // thread) and this call has left the load, as get's. Thread-safe.
  template <class K, class L, class Callback>
  requires(!std::is_invocable_v<std::decay_t<L>&, outcome<T>&&>) void async_get(
      const K& key, L&& loader, Callback&& on_done, stop_token caller, wait_bound bound) {
    async_impl(key, std::forward<L>(loader), std::forward<Callback>(on_done), std::move(caller),
               bound);
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
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>)
      [[nodiscard]] auto co_get(const K& key, L&& loader, stop_token caller = {}) {
    check_loader<L>();
    using awaitable =
        typename calls_t::template get_awaitable<cache, K, std::remove_reference_t<L>>;
    return awaitable(this, key, loader, std::move(caller), std::nullopt);
  }

  // co_get(key, loader, caller, bound): co_get with a wait_bound: the
  // coroutine resumes with timeout_error once `bound` passes (see async_get).
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>)
      [[nodiscard]] auto co_get(const K& key, L&& loader, stop_token caller, wait_bound bound) {
    check_loader<L>();
    using awaitable =
        typename calls_t::template get_awaitable<cache, K, std::remove_reference_t<L>>;
    return awaitable(this, key, loader, std::move(caller), bound);
  }

  // get_many(keys, loader, caller)
  //
  // One outcome per key, in the keys' order (outcome<T>: the value, or the
  // exception get would have thrown for that key — not_found_error, the
  // load's failure, cancelled_error, ...); never throws for a key. Every
  // key's lookup and load are started before this call waits on any: a hit
  // or stale value is answered at once, each miss starts (or joins) its
  // load, and the loads run together — through an asynchronous loader
  // (batch_loader::cache_loader()) without a thread each, so the misses of
  // one get_many share bulk calls. A key given twice is one load, each slot
  // its own copy. `loader` must take the key; with load_owner::caller and no
  // flight.executor a synchronous one runs here, one key after another.
  // Each key is an async_get caller: `caller` firing leaves every key still
  // waiting (cancelled_error in its slot), and its load goes on (see get).
  // Throws only what allocation throws. Thread-safe.
  template <class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) std::vector<outcome<T>> get_many(
      std::span<const Key> keys, L&& loader, stop_token caller = {}) {
    check_many<L>();
    return calls_.get_many(keys, loader, std::move(caller), std::nullopt);
  }

  // get_many(keys, loader, caller, bound)
  //
  // get_many with a wait_bound: returns by `bound`; a key whose load has not
  // settled by then gets timeout_error in its slot, while its load goes on
  // and fills the cache (under load_owner::cache). Answers from the cache
  // are returned whatever the bound. Thread-safe.
  template <class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) std::vector<outcome<T>> get_many(
      std::span<const Key> keys, L&& loader, stop_token caller, wait_bound bound) {
    check_many<L>();
    return calls_.get_many(keys, loader, std::move(caller), bound);
  }

  // ---- with the cache-wide loader ------------------------------------------------------
  //
  // get(key, caller), get_entry(key, caller), get_fresh(key, caller),
  // async_get(key, on_done, caller), co_get(key, caller), get_many(keys,
  // caller), and each with a wait_bound after `caller`: as the forms above,
  // loading through the loader given at construction. Throw
  // std::logic_error (async_get: before calling on_done) when the cache was
  // built without one.
  template <class K>
  T get(const K& key, stop_token caller = {}) {
    return get(key, calls_.wide_loader(), std::move(caller));
  }
  template <class K>
  cached<T> get_entry(const K& key, stop_token caller = {}) {
    return get_entry(key, calls_.wide_loader(), std::move(caller));
  }
  template <class K>
  T get_fresh(const K& key, stop_token caller = {}) {
    return get_fresh(key, calls_.wide_loader(), std::move(caller));
  }
  template <class K, class Callback>
  requires std::is_invocable_v < std::decay_t<Callback>
  &, outcome<T>&& > void async_get(const K& key, Callback&& on_done, stop_token caller = {}) {
    async_get(key, calls_.wide_loader(), std::forward<Callback>(on_done), std::move(caller));
  }
  template <class K>
  [[nodiscard]] auto co_get(const K& key, stop_token caller = {}) {
    return co_get(key, calls_.wide_loader(), std::move(caller));
  }
  template <class K>
  T get(const K& key, stop_token caller, wait_bound bound) {
    return get(key, calls_.wide_loader(), std::move(caller), bound);
  }
  template <class K>
  cached<T> get_entry(const K& key, stop_token caller, wait_bound bound) {
    return get_entry(key, calls_.wide_loader(), std::move(caller), bound);
  }
  template <class K>
  T get_fresh(const K& key, stop_token caller, wait_bound bound) {
    return get_fresh(key, calls_.wide_loader(), std::move(caller), bound);
  }
  template <class K, class Callback>
  requires std::is_invocable_v < std::decay_t<Callback>
  &, outcome<T>&& >
         void async_get(const K& key, Callback&& on_done, stop_token caller, wait_bound bound) {
    async_get(key, calls_.wide_loader(), std::forward<Callback>(on_done), std::move(caller), bound);
  }
  template <class K>
  [[nodiscard]] auto co_get(const K& key, stop_token caller, wait_bound bound) {
    return co_get(key, calls_.wide_loader(), std::move(caller), bound);
  }

  std::vector<outcome<T>> get_many(std::span<const Key> keys, stop_token caller = {}) {
    return get_many(keys, calls_.wide_loader(), std::move(caller));
  }
  std::vector<outcome<T>> get_many(std::span<const Key> keys, stop_token caller, wait_bound bound) {
    return get_many(keys, calls_.wide_loader(), std::move(caller), bound);
  }

 private:
  template <class K, class L, class Callback>
  void async_impl(const K& key, L&& loader, Callback&& on_done, stop_token caller,
                  const std::optional<wait_bound>& bound) {
    check_loader<L>();
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::cache::async_get: on_done must be invocable with "
                  "singleflight::outcome<T>");
    calls_t::with_key(key, [&](const auto& k) {
      calls_.get_async(k, std::forward<L>(loader),
                       std::decay_t<Callback>(std::forward<Callback>(on_done)), std::move(caller),
                       bound);
      return 0;
    });
  }

  template <class L>
  static L&& checked_wide(L&& loader) noexcept {
    check_loader<L>();
    return std::forward<L>(loader);
  }

  template <class L>
  static constexpr void check_many() {
    check_loader<L>();
    static_assert(detail::loader_traits<std::decay_t<L>, Key, T>::takes_key,
                  "singleflight::cache::get_many: the loader loads every key, so it takes the "
                  "key: T(const Key&), T(const Key&, stop_token) or void(const Key&, "
                  "stop_token, completion<T>) (or with load_result<T> instead of T)");
  }

  template <class L>
  static constexpr void check_loader() {
    static_assert(detail::loader_traits<std::decay_t<L>, Key, T>::valid,
                  "singleflight::cache: the loader must be invocable as T(const Key&), "
                  "T(const Key&, stop_token), T() or T(stop_token) (or return "
                  "load_result<T> instead of T), or (asynchronous) void(const Key&, stop_token, "
                  "completion<T>) / void(stop_token, completion<T>) (or with "
                  "completion<load_result<T>>)");
  }

  friend struct detail::cache_access;

  calls_t calls_;
};

namespace detail {
// cache_access: what another layer of the library reaches inside a cache (fleet_cache, while
// it applies the bus: no user code may run there).
//   * table(c): c's entry table, for a garbage_hold (detail/cache/cache_table.hpp): what c's
//     writes on this thread take out of it is destroyed when the hold is, not in the write;
//   * age(c, key): the age c.peek(key) would report (nullopt: none), with no copy of T.
struct cache_access {
  template <class C>
  static auto& table(C& c) noexcept {
    return c.calls_.state().table;
  }
  template <class C>
  static std::optional<std::chrono::nanoseconds> age(C& c, const typename C::key_type& key) {
    return c.calls_.state().peek_age(key, c.calls_.hash_of(key));
  }
};
}  // namespace detail

}  // namespace singleflight

// SINGLEFLIGHT_EXTERN_CACHE(Key, T [, Hash [, KeyEqual [, Clock]]]);
// SINGLEFLIGHT_INSTANTIATE_CACHE(Key, T [, Hash [, KeyEqual [, Clock]]]);
//
// Compile a cache type's slow path once for the whole program rather than in every
// translation unit that calls it: everything a call does past the hit path (the lookup's
// answer, the load as a flight of the cache's group, refreshes, stale-if-error, close and
// destruction), and async_get's / co_get's / get_many's path past the key's conversion, is
// then compiled in the one TU that instantiates the type. A TU calling get / get_entry /
// get_fresh with a synchronous loader compiles only the hit path and small functions per
// loader type (call it, copy it); async_get / co_get / get_many with a synchronous loader or
// the cache-wide one, those and three per callback type (call it, move it, destroy it: the
// callback is kept type-erased, in place when it is no larger than three pointers). The
// arguments are those of singleflight::cache<...>, at namespace scope, each followed by a
// semicolon:
//
//   // cache_types.hpp, included wherever the cache is used:
//   #include <singleflight/cache.hpp>
//   SINGLEFLIGHT_EXTERN_CACHE(std::string, profile);
//   // cache_types.cpp, exactly one TU of the program:
//   #include "cache_types.hpp"
//   SINGLEFLIGHT_INSTANTIATE_CACHE(std::string, profile);
//
// What stays a template of each call (compiled where it is called): the hit path and a call
// with an asynchronous loader of its own (the cache-wide loader, asynchronous or not, takes the
// type's compiled paths). Both modes (header-only or
// SINGLEFLIGHT_SEPARATE_COMPILATION) accept it; docs/performance.md ("Compile time") has what
// it saves.
#define SINGLEFLIGHT_EXTERN_CACHE(...) \
  extern template class ::singleflight::detail::cache_calls<__VA_ARGS__>
#define SINGLEFLIGHT_INSTANTIATE_CACHE(...) \
  template class ::singleflight::detail::cache_calls<__VA_ARGS__>
