// singleflight/cache.hpp
//
// `singleflight::cache<Key, T>`: an in-process read-through cache whose
// misses and refreshes are flights of a `singleflight::group` — the layered
// answer to a stampede in one type.
//
//   singleflight::cache<std::string, profile> profiles{{
//       .ttl = 30s, .jitter = 0.1, .stale_while_revalidate = 10s, .stale_if_error = 5min}};
//   profile p = profiles.get(tenant + '|' + user + '|' + locale,
//                            [&](std::stop_token st) { return origin.fetch(st, ...); },
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
// Thread safety: every member may be called concurrently from any number of
// threads, except the destructor (not concurrently with anything, not from a
// loader or callback of this cache).
//
// Locking: the entries are split over shards, each with its own mutex. A hit
// takes no mutex at all: it reads its shard inside a read section (see
// detail/read_gate.hpp) and writes only its own stripe's counters and the
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
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <type_traits>
#include <utility>

#if defined(__GLIBCXX__) && __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define SINGLEFLIGHT_FORCED_UNWIND 1
#endif

#include "completion.hpp"
#include "detail/cache_clock.hpp"
#include "detail/cache_table.hpp"
#include "detail/refresh_threads.hpp"
#include "errors.hpp"
#include "group.hpp"
#include "hash.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"

namespace singleflight {

// freshness
//
// How a cache's answer relates to its windows.
enum class freshness {
  fresh,           // within ttl, or just loaded
  stale,           // past ttl, within stale_while_revalidate (a refresh is under way)
  stale_on_error,  // past its windows for normal use, served because a load failed
                   // within stale_if_error (no exception reached the caller)
};

// cache_options
//
// Construction-time settings of a cache. The cache constructor throws
// std::invalid_argument when ttl <= 0, a duration is negative, jitter is not
// in [0, 1) or early_refresh_beta < 0.
struct cache_options {
  // Fresh window of each write, > 0.
  std::chrono::nanoseconds ttl{std::chrono::seconds(30)};
  // Each write's ttl is scaled by a factor uniform in [1 - jitter, 1 + jitter],
  // so keys written together do not expire together. 0 = off.
  double jitter = 0.1;
  // After the fresh window: serve the old value at once (freshness::stale)
  // and start one background refresh. 0 = off.
  std::chrono::nanoseconds stale_while_revalidate{0};
  // After the fresh window: when a load fails, serve the old value
  // (freshness::stale_on_error) instead of the exception. 0 = off.
  std::chrono::nanoseconds stale_if_error{0};
  // Negative caching of failures: a failed load with no usable old value is
  // stored, and callers within error_ttl receive the same exception object
  // without a load. A failure with a usable old value throttles loads of its
  // key for error_ttl (default_error_throttle when 0). 0 = never stored.
  std::chrono::nanoseconds error_ttl{0};
  // Negative caching of "no such key" (load_result::not_found). 0 = never stored.
  std::chrono::nanoseconds not_found_ttl{0};
  // XFetch: a fresh read refreshes early, in the background, when
  // now - delta * beta * ln(u) >= expiry (u uniform in (0, 1], delta the
  // last load's duration). 1 is the usual value; 0 = off.
  double early_refresh_beta = 0;
  // Bound on entries (values, cached not-founds and cached failures); size()
  // never exceeds it. Eviction: S3-FIFO per shard. 0 = unbounded.
  std::size_t max_entries = 0;
  // The inner group's options: ownership, timeout (bounds every load, the
  // background refreshes included), max_in_flight, executor (where
  // background refreshes run; the cache's own threads when empty).
  options flight{};

  // How long a failure throttles the loads of a key that still has a usable
  // value, when error_ttl is 0.
  static constexpr std::chrono::nanoseconds default_error_throttle{std::chrono::seconds(1)};
};

// cached<T>
//
// One answer of get_entry() or peek(): the value and where it came from.
template <class T>
struct cached {
  // The value; empty when the answer is a cached "no such key"
  // (load_result::not_found), which get() reports as not_found_error.
  std::optional<T> value;
  freshness state = freshness::fresh;
  // Time since the value was stored (0 for a value this call loaded).
  std::chrono::nanoseconds age{0};
  // leader / follower: this call waited on a load and started / joined it;
  // none: it was answered from the cache.
  role taken_as = role::none;
  // The key's version when the value was stored (put / invalidate bump it).
  std::uint64_t version = 0;

  bool found() const noexcept { return value.has_value(); }
};

// load_result<T>
//
// What a loader may return instead of a T, to set a per-entry ttl or to say
// "no such key":
//   return singleflight::load_result<T>::value(v, 5min);   // this entry's ttl
//   return singleflight::load_result<T>::not_found();      // cached for not_found_ttl
// A ttl given here replaces cache_options::ttl (for a value) or
// not_found_ttl (for not_found) for this write; jitter still applies.
template <class T>
struct load_result {
  std::optional<T> loaded;                      // empty: not found
  std::optional<std::chrono::nanoseconds> ttl;  // empty: the cache's

  static load_result value(T v, std::optional<std::chrono::nanoseconds> ttl = std::nullopt) {
    return load_result{std::optional<T>(std::move(v)), ttl};
  }
  static load_result not_found(std::optional<std::chrono::nanoseconds> ttl = std::nullopt) {
    return load_result{std::nullopt, ttl};
  }
};

// not_found_error
//
// Thrown by get() (and delivered by async_get / co_get) when the loader
// reported load_result::not_found, now or within not_found_ttl.
class not_found_error : public error {
 public:
  not_found_error() : error(literal_tag{}, "singleflight: no such key (load_result::not_found)") {}
  using error::error;
};

// cache_stats
//
// Counters since construction. Every get / get_entry / async_get / co_get
// call that returns or throws after its lookup counts as exactly one of hits,
// stale_hits, negative_hits or misses (get_fresh counts as a miss).
// Summed over shards and stripes without stopping them: a snapshot taken
// while calls run may be mid-way, one taken when they are over adds up.
struct cache_stats {
  std::uint64_t hits = 0;             // answered fresh from the cache
  std::uint64_t stale_hits = 0;       // answered stale (SWR, or stale-if-error while throttled)
  std::uint64_t misses = 0;           // waited on a load
  std::uint64_t loads = 0;            // loader invocations (origin calls)
  std::uint64_t load_failures = 0;    // loads that threw (not counting stopped flights)
  std::uint64_t early_refreshes = 0;  // background refreshes started by XFetch
  std::uint64_t background_refreshes = 0;  // background refreshes started in the SWR window
  std::uint64_t negative_hits = 0;         // answered with a cached not-found or failure
  std::uint64_t evictions = 0;             // entries removed to respect max_entries
  std::uint64_t rejected_publishes = 0;    // finished loads that started before a put /
                                           // invalidate / clear of their key: not stored
  std::uint64_t stale_on_error = 0;        // answers with freshness::stale_on_error (also in
                                           // stale_hits or misses)
  std::uint64_t size = 0;                  // entries now (same as cache::size())
};

namespace detail {

// A loader that finishes through a completion (asynchronous).
template <class L, class R>
concept async_loader_for = std::invocable<L&, std::stop_token, completion<R>> &&
    std::is_void_v<std::invoke_result_t<L&, std::stop_token, completion<R>>>;

// What kind of loader L is, for a cache of T.
template <class L, class T>
struct loader_traits {
  static constexpr bool async_value = async_loader_for<L, T>;
  static constexpr bool async_result = !async_value && async_loader_for<L, load_result<T>>;
  static constexpr bool is_async = async_value || async_result;
  static constexpr bool takes_token = !is_async && std::invocable<L&, std::stop_token>;
  static constexpr bool plain = !is_async && !takes_token && std::invocable<L&>;

  static auto sync_result_type() {
    if constexpr (takes_token) {
      return std::type_identity<std::invoke_result_t<L&, std::stop_token>>{};
    } else if constexpr (plain) {
      return std::type_identity<std::invoke_result_t<L&>>{};
    } else {
      return std::type_identity<void>{};
    }
  }
  using sync_result = typename decltype(sync_result_type())::type;
  static constexpr bool returns_result =
      std::same_as<std::remove_cvref_t<sync_result>, load_result<T>>;
  static constexpr bool valid =
      is_async ||
      ((takes_token || plain) &&
       (returns_result || (!std::is_void_v<sync_result> && std::convertible_to<sync_result, T>)));
};

// What one load hands to every caller of its flight.
template <class T, class Clock>
struct loaded {
  std::shared_ptr<const T> value;  // null: not found
  std::uint64_t version = 0;       // the key's version the load saw when it started
  typename Clock::time_point written{};
};

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
  static_assert(std::chrono::is_clock_v<Clock>,
                "singleflight::cache<..., Clock>: Clock must meet the Clock requirements "
                "(rep, period, duration, time_point, is_steady, static now())");

 public:
  using key_type = Key;
  using value_type = T;
  using clock = Clock;
  using time_point = typename Clock::time_point;

 private:
  using loaded_t = detail::loaded<T, Clock>;
  using group_t = group<Key, loaded_t, Hash, KeyEqual>;
  struct core;

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
  // accepts — T(), T(std::stop_token), or asynchronous
  // void(std::stop_token, completion<T>) — or returns load_result<T> (or
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
  T get(const K& key, L&& loader, std::stop_token caller = {}) {
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
  cached<T> get_entry(const K& key, L&& loader, std::stop_token caller = {}) {
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
  T get_fresh(const K& key, L&& loader, std::stop_token caller = {}) {
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
  void async_get(const K& key, L&& loader, Callback&& on_done, std::stop_token caller = {}) {
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
  [[nodiscard]] auto co_get(const K& key, L&& loader, std::stop_token caller = {}) {
    check_loader<L>();
    return get_awaitable<K, std::remove_reference_t<L>>(this, key, loader, std::move(caller));
  }

 private:
  using node_t = typename detail::cache_table<Key, T, Clock>::node;
  using table_t = detail::cache_table<Key, T, Clock>;
  using shard_lock = typename table_t::shard_lock;
  using shard_t = typename table_t::shard;
  using garbage_t = detail::garbage<node_t>;
  using duration = typename Clock::duration;

  // ---- keys -----------------------------------------------------------------

  // Probes that hash and compare like Key are used as they are; anything
  // else is converted to Key once, before any lock.
  template <class K>
  static constexpr bool direct_probe = std::same_as<std::remove_cvref_t<K>, Key> ||
                                       (std::same_as<Hash, default_hash> &&
                                        std::same_as<KeyEqual, std::equal_to<>> &&
                                        detail::string_like<K> && detail::string_like<Key>);

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
                  "singleflight::cache: the loader must be invocable as T(), T(std::stop_token), "
                  "load_result<T>(), load_result<T>(std::stop_token), or (asynchronous) "
                  "void(std::stop_token, completion<T>) / void(std::stop_token, "
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

  // ---- what a lookup decides --------------------------------------------------

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

  // ---- the shared core ---------------------------------------------------------

  // Everything a callback may touch after the cache object itself is gone
  // (group::close() does not wait for callbacks already handed out): the
  // table and the options. Held by the cache and by every pending callback.
  struct core {
    explicit core(const cache_options& o)
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
        if (!raw_result)
          raw_result = std::make_unique<group<Key, load_result<T>, Hash, KeyEqual>>();
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
    decision lookup_locked(const P& key, std::uint64_t m, std::size_t si, time_point now,
                           bool early, detail::stripe_counters& sc) {
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
      registration(core* c, node_t* n, std::uint64_t v, time_point t0) noexcept
          : c_(c), n_(n), v_(v), t0_(t0) {}
      registration(registration&& o) noexcept
          : c_(std::exchange(o.c_, nullptr)), n_(o.n_), v_(o.v_), t0_(o.t0_) {}
      registration& operator=(registration&&) = delete;
      registration(const registration&) = delete;
      registration& operator=(const registration&) = delete;
      ~registration() {
        if (c_ != nullptr)
          c_->finish_load(n_, v_, nullptr, false, std::nullopt, t0_, nullptr, true);
      }
      loaded_t publish(std::shared_ptr<const T> box, bool found,
                       std::optional<std::chrono::nanoseconds> entry_ttl) {
        core* c = std::exchange(c_, nullptr);
        return c->finish_load(n_, v_, std::move(box), found, entry_ttl, t0_, nullptr, false);
      }
      void fail(std::exception_ptr e, bool stopped) noexcept {
        core* c = std::exchange(c_, nullptr);
        (void)c->finish_load(n_, v_, nullptr, false, std::nullopt, t0_, std::move(e), stopped);
      }
      // A fresh value already stored (the double check): no load needed.
      bool shortcut(loaded_t& out) const noexcept {
        if (!short_) return false;
        out = *short_;
        return true;
      }
      std::optional<loaded_t> short_;

     private:
      core* c_;
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
        r.short_.emplace(loaded_t{n->value, n->version, n->written});
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
    loaded_t run_sync(const P& key, std::uint64_t m, L& loader, const std::stop_token& st,
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
          load_result<T> res = call(loader, st);
          found = res.loaded.has_value();
          ttl_override = res.ttl;
          if (found) box = std::make_shared<const T>(std::move(*res.loaded));
        } else {
          box = std::make_shared<const T>(call(loader, st));
        }
#ifdef SINGLEFLIGHT_FORCED_UNWIND
      } catch (abi::__forced_unwind&) {
        throw;  // thread cancellation: the registration's destructor cleans up
#endif
      } catch (...) {
        r.fail(std::current_exception(), st.stop_requested());
        throw;
      }
      return r.publish(std::move(box), found, ttl_override);
    }

    template <class L>
    static decltype(auto) call(L& loader, const std::stop_token& st) {
      if constexpr (detail::loader_traits<L, T>::takes_token) {
        return std::invoke(loader, st);
      } else {
        return std::invoke(loader);
      }
    }

    // run_async(key, m, loader, st, done, foreground): an asynchronous loader
    // runs as a flight of a raw group (which makes the completion it needs);
    // its outcome is published, then `done` is resolved. Throws only before
    // the raw flight started (then `done` is left to the caller).
    template <class P, class L>
    void run_async(const P& key, std::uint64_t m, L loader, std::stop_token st,
                   completion<loaded_t>& done, bool foreground) {
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

  // ---- flights -------------------------------------------------------------

  // A flight body that owns copies of the key and the loader (executor
  // flights, async callers, refreshes: it may outlive the caller's frame).
  template <class L>
  auto owned_fn(const Key& key, std::uint64_t m, L&& loader, bool foreground) {
    using Ld = std::decay_t<L>;
    core* c = core_.get();
    if constexpr (detail::loader_traits<Ld, T>::is_async) {
      return [c, key, m, foreground, loader = Ld(std::forward<L>(loader))](
                 std::stop_token st, completion<loaded_t> done) mutable {
        c->run_async(key, m, std::move(loader), std::move(st), done, foreground);
      };
    } else {
      return [c, key, m, foreground,
              loader = Ld(std::forward<L>(loader))](std::stop_token st) mutable -> loaded_t {
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
  cached<T> get_impl(const P& key, L&& loader, std::stop_token caller, bool fresh) {
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
  T get_value(const P& key, L&& loader, std::stop_token caller) {
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
  cached<T> get_slow(const P& key, L&& loader, std::stop_token caller, bool fresh, std::uint64_t m,
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
                          std::stop_token caller, bool fresh, std::uint64_t seen) {
    using Ld = std::remove_reference_t<L>;
    core* c = core_.get();
    call_info info;
    try {
      const auto run = [&](bool fresh_flight) {
        if constexpr (!detail::loader_traits<std::decay_t<L>, T>::is_async) {
          if (!group_has_executor_) {
            // Inline: the leader runs the loader on this thread and cannot
            // leave before it returns, so the body may refer to this frame.
            auto body = [c, &key, m, &loader, fresh_flight](std::stop_token st) -> loaded_t {
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
                            std::stop_token st, completion<loaded_t> d) mutable {
          threads_.post(std::make_unique<refresh_job<Ld>>(
              core_.get(), std::move(k), m, std::move(ld), std::move(st), std::move(d)));
        };
        group_.async_do(key, std::move(hand_off), std::move(done));
      }
    } catch (...) {
      owner->refresh_done(n, id);  // async_do threw before attaching: on_done never runs
    }
  }

  template <class Ld>
  struct refresh_job final : detail::refresh_threads::job {
    refresh_job(core* c_in, Key k, std::uint64_t m_in, Ld ld, std::stop_token st_in,
                completion<loaded_t> d)
        : c(c_in),
          key(std::move(k)),
          m(m_in),
          loader(std::move(ld)),
          st(std::move(st_in)),
          done(std::move(d)) {}
    void run() noexcept override {
      try {
        if (st.stop_requested()) throw cancelled_error();
        if constexpr (detail::loader_traits<Ld, T>::is_async) {
          c->run_async(key, m, std::move(loader), st, done, false);
        } else {
          done.set_value(c->run_sync(key, m, loader, st, false));
        }
      } catch (...) {
        if (done) done.set_exception(std::current_exception());
      }
    }
    core* c;
    Key key;
    std::uint64_t m;
    Ld loader;
    std::stop_token st;
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
  void start_async(const P& key, L&& loader, Cb cb, std::stop_token caller) {
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
    get_awaitable(cache* c, const K& key, L& loader, std::stop_token caller) noexcept
        : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
    get_awaitable(const get_awaitable&) = delete;
    get_awaitable& operator=(const get_awaitable&) = delete;
    ~get_awaitable() = default;

    class awaiter {
     public:
      awaiter(cache* c, const K& key, L& loader, std::stop_token caller) noexcept
          : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
      awaiter(const awaiter&) = delete;
      awaiter& operator=(const awaiter&) = delete;
      ~awaiter() = default;

      // Starts the lookup (and the load if needed); does not suspend when
      // the outcome is already there.
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) {
        handle_ = h;
        c_->async_get(
            *key_, *loader_,
            [this](outcome<T> o) noexcept {
              result_.emplace(std::move(o));
              if (phase_.exchange(ready, std::memory_order_acq_rel) == suspended) handle_.resume();
            },
            std::move(caller_));
        // Memory ordering: acq_rel on both exchanges, so the outcome written
        // before one side's exchange is visible to whoever resumes.
        return phase_.exchange(suspended, std::memory_order_acq_rel) != ready;
      }
      T await_resume() { return std::move(*result_).value(); }

     private:
      enum : unsigned char { starting, suspended, ready };
      cache* c_;
      const K* key_;
      L* loader_;
      std::stop_token caller_;
      std::coroutine_handle<> handle_;
      std::optional<outcome<T>> result_;
      std::atomic<unsigned char> phase_{starting};
    };

    awaiter operator co_await() && { return awaiter(c_, *key_, *loader_, std::move(caller_)); }

   private:
    cache* c_;
    const K* key_;
    L* loader_;
    std::stop_token caller_;
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
  detail::refresh_threads threads_;  // declared after group_: destroyed (joined) first
};

}  // namespace singleflight

#undef SINGLEFLIGHT_FORCED_UNWIND
