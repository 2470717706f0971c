// singleflight/fleet_cache.hpp
//
// `singleflight::fleet_cache<Key, T>`: a local `singleflight::cache` in front
// of a `singleflight::fleet`, kept coherent across processes. Optional, like
// fleet.hpp: needs hiredis and the CMake target `singleflight::fleet`.
//
//   singleflight::fleet_cache_options o;
//   o.local = {.ttl = 60s, .stale_while_revalidate = 10s};
//   o.fleet.redis_uri = "tcp://10.0.0.5:6379";
//   o.fleet.key_prefix = "profiles:v3";
//   o.fleet.value_ttl = 5min;
//   singleflight::fleet_cache<std::string, profile> profiles(o);
//   profile p = profiles.get(key, [&](singleflight::stop_token st) { return origin.fetch(st, key);
//   },
//                            request_stop_token, 100ms);
//   profiles.invalidate(key);  // every process's local copy goes too
//
// What it does
//
// get: a local hit (fresh, or stale within stale_while_revalidate) is
// answered from this process's memory, with no Redis round trip; a miss
// loads through the fleet (one origin call per key across the fleet, the
// value shared in Redis; Redis down: a local load, no error). The local
// cache's guarantees hold (coalescing, windows, wait_bound, close).
// async_get / co_get: the same without blocking, through the local cache's
// async_get; the fleet part of a miss is synchronous and runs as the local
// cache's load, on its own bounded threads.
//
// invalidate / put: the fleet's write (the Redis value deleted or replaced,
// the key's generation bumped, so no load that started before stores) and,
// in the same script, a message on the fleet's bus channel ("{N:P}:i", one
// per key prefix) naming the key. Every fleet_cache of that prefix listens on
// it through its fleet's subscriber thread and drops the key from its local
// cache before its next read (detail/fleet/invalidation_inbox.hpp), and a
// load of that key already under way there does not publish (the local
// cache's versioned publish).
//
// Coherence (fleet_cache_options::coherence): client tracking, the default
// (CLIENT TRACKING on REDIRECT <subscriber> BCAST PREFIX "{N:P:", from a
// tracker connection the subscriber keeps beside its own): every change of a
// value under the prefix, by anyone (another process, redis-cli, expiry,
// FLUSHALL), drops the key locally; or the bus (publish): only other
// fleet_caches' put and invalidate. A server that refuses CLIENT TRACKING
// (an ACL that denies `client`, a renamed command, no REDIRECT) makes the
// process fall back to the bus, for the fleet_cache's lifetime
// (stats().tracking_refused; its own writes publish on the bus in both
// modes, so the others hear them either way). On a Redis Cluster a tracker
// would hear only its own node's keys, so the fleet_cache does not track there:
// it falls back to the bus as above (stats().tracking_refused_on_cluster), and
// only fleet_caches' own writes are heard; writes by anyone else (redis-cli,
// expiry, FLUSHALL) are not, and a local entry then lives up to its ttl. The
// bound: once a process has received the report, its get never returns a
// value stored before the write. While its subscription or tracker is down
// (a network gap, CLIENT KILL, a Redis restart) reports are lost: when the subscription is
// confirmed again (after the tracker is back), every local entry stored before the gap is marked
// stale (cache::expire_all): the next get of its key is answered with it
// for at most gap_stale_bound after the confirmations (20 ms by default; never past
// stale_while_revalidate) while one refresh reads it again through the
// fleet, and after that (or with stale_while_revalidate at zero) a get waits
// on that read, and no
// load or refresh that started before the confirmation stores its value
// locally. So a process returns a value older than a completed write for at
// most the gap, plus gap_stale_bound after the confirmations. During
// the gap itself a process serves its local entries (up to their ttl).
// docs/fleet_cache.md.
//
// Threads: the fleet's (subscriber, renewer, async workers) and the local
// cache's (loads). The bus is read on the fleet's subscriber thread, which
// only records what it hears; the local cache is changed by callers.
//
// Thread safety: every member may be called concurrently from any thread,
// except the destructor (not concurrently with anything, not from a loader).
#pragma once

#include <atomic>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cache.hpp"
#include "codec.hpp"
#include "detail/chrono.hpp"
#include "detail/fleet/fleet_protocol.hpp"
#include "detail/fleet/invalidation_inbox.hpp"
#include "detail/fleet/kept_reads.hpp"
#include "detail/fleet/read_mark.hpp"
#include "detail/fleet/voided_reads.hpp"
#include "detail/fleet/write_watches.hpp"
#include "detail/functional.hpp"
#include "detail/get_awaitable.hpp"
#include "detail/outcome_slot.hpp"
#include "detail/resume_gate.hpp"
#include "errors.hpp"
#include "fleet.hpp"
#include "fleet_cache_options.hpp"  // IWYU pragma: export
#include "fleet_options.hpp"
#include "outcome.hpp"
#include "stop_token.hpp"
#include "wait_bound.hpp"

namespace singleflight {

template <class Key, class T, class Codec = codec<T>, class KeyCodec = key_codec<Key>>
class fleet_cache;

namespace detail {
struct fleet_cache_test_access;
}  // namespace detail

// fleet_cache
//
// Template parameters as fleet's: Key, T (copy-constructible), Codec
// (codec<T>), KeyCodec (key_codec<Key>: the key's text names it in Redis,
// on the bus, and in the local cache).
template <class Key, class T, class Codec, class KeyCodec>
class fleet_cache {
  static_assert(
      requires(const KeyCodec& kc, const Key& k) {
        { kc.encode(k) } -> std::convertible_to<std::string>;
      },
      "singleflight::fleet_cache<Key, T>: no key_codec for Key. Specialise "
      "singleflight::key_codec<Key> (see singleflight/codec.hpp), or pass a KeyCodec type as "
      "the fourth template argument");

  using fleet_t = fleet<std::string, T, Codec, key_codec<std::string>>;
  using local_t = cache<std::string, T>;
  using wide_t = std::function<T(const Key&, const stop_token&)>;

 public:
  using key_type = Key;
  using value_type = T;

  // fleet_cache(opts, codec, key_codec)
  //
  // Builds the fleet (its threads; no connection yet), subscribes to the bus
  // (the subscriber connects at once, in the background) and builds the
  // local cache. Throws std::invalid_argument for invalid options (of the
  // cache, the fleet, max_pending_invalidations == 0, or a negative
  // gap_stale_bound), std::system_error.
  explicit fleet_cache(fleet_cache_options opts = {}, Codec codec = Codec{},
                       KeyCodec key_codec = KeyCodec{})
      : fleet_(opts.fleet, std::move(codec)),
        key_codec_(std::move(key_codec)),
        inbox_(fleet_.engine_->new_token(), checked_pending(opts.max_pending_invalidations),
               opts.coherence == fleet_coherence::tracking
                   ? detail::tracking_prefix(fleet_.engine_->cfg.key_prefix)
                   : std::string()),
        bus_(detail::bus_channel(fleet_.engine_->cfg.key_prefix)),
        expire_bus_(detail::expire_channel(fleet_.engine_->cfg.key_prefix)),
        watch_(listen(opts.coherence)),
        fallback_watch_(
            opts.coherence == fleet_coherence::tracking
                ? fleet_.engine_->subscriber.subscribe_fallback(bus_, inbox_.bus_listener())
                : detail::fleet_subscriber::watch()),
        expire_watch_(fleet_.engine_->subscriber.subscribe(expire_bus_, inbox_.expire_listener())),
        kept_(opts.max_pending_invalidations),
        voided_(opts.max_pending_invalidations),
        local_(opts.local),
        gap_stale_bound_(checked_bound(opts.gap_stale_bound)),
        coherence_(opts.coherence) {
    // Before any call: the fleet's flights read it (read_mark.hpp).
    if (opts.coherence == fleet_coherence::tracking) {
      fleet_.engine_->reports = &inbox_;
    }
  }

  // fleet_cache(opts, loader, codec, key_codec)
  //
  // With a cache-wide loader, `loader(const Key&, stop_token)` or
  // `loader(const Key&)` returning something convertible to T: get(key),
  // get_entry(key) load through it. It is copied (shared by every load);
  // what it captures by reference must outlive the fleet_cache.
  template <class L>
  requires(!std::same_as<std::remove_cvref_t<L>, Codec>)
      fleet_cache(fleet_cache_options opts, L&& loader, Codec codec = Codec{},
                  KeyCodec key_codec = KeyCodec{})
      : fleet_cache(std::move(opts), std::move(codec), std::move(key_codec)) {
    using D = std::decay_t<L>;
    if constexpr (std::is_invocable_v<const D&, const Key&, stop_token>) {
      static_assert(
          std::is_convertible_v<std::invoke_result_t<const D&, const Key&, stop_token>, T>,
          "singleflight::fleet_cache: the cache-wide loader must return T");
      wide_ = std::make_shared<const wide_t>(
          [l = D(std::forward<L>(loader))](const Key& k, const stop_token& st) -> T {
            return l(k, st);
          });
    } else {
      static_assert(std::is_invocable_v<const D&, const Key&>,
                    "singleflight::fleet_cache: the cache-wide loader must be invocable as "
                    "loader(const Key&, stop_token) or loader(const Key&) (const)");
      static_assert(std::is_convertible_v<std::invoke_result_t<const D&, const Key&>, T>,
                    "singleflight::fleet_cache: the cache-wide loader must return T");
      wide_ = std::make_shared<const wide_t>(
          [l = D(std::forward<L>(loader))](const Key& k, const stop_token&) -> T { return l(k); });
    }
  }

  fleet_cache(const fleet_cache&) = delete;
  fleet_cache& operator=(const fleet_cache&) = delete;

  // ~fleet_cache(): close().
  ~fleet_cache() { close(); }

  // get(key, loader, caller), get(key, loader, caller, bound)
  //
  // The value for `key`: from the local cache (no Redis round trip), else
  // through the fleet (another process's value from Redis, or `loader`,
  // `T(stop_token)` or `T()`, once across the fleet). Invalidations heard on
  // the bus are applied first. As cache::get otherwise: the load belongs to
  // the local cache (load_owner::cache by default: capture by value), the
  // caller leaves at `caller` (cancelled_error) or `bound` (timeout_error).
  // Throws what cache::get and fleet::get throw; never a Redis error.
  // Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get(const K& key, L&& loader, stop_token caller = {}) {
    return local_.get(prepare(key), through(std::forward<L>(loader)), std::move(caller));
  }
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) T
      get(const K& key, L&& loader, stop_token caller, wait_bound bound) {
    return local_.get(prepare(key), through(std::forward<L>(loader)), std::move(caller), bound);
  }

  // get_entry(key, loader, caller[, bound]): get, with the entry's freshness,
  // age and version (cached<T>). Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) cached<T> get_entry(
      const K& key, L&& loader, stop_token caller = {}) {
    return local_.get_entry(prepare(key), through(std::forward<L>(loader)), std::move(caller));
  }
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>) cached<T> get_entry(
      const K& key, L&& loader, stop_token caller, wait_bound bound) {
    return local_.get_entry(prepare(key), through(std::forward<L>(loader)), std::move(caller),
                            bound);
  }

  // get(key, caller[, bound]), get_entry(key, caller[, bound]): through the
  // cache-wide loader. std::logic_error without one. Thread-safe.
  T get(const Key& key, stop_token caller = {}) {
    return local_.get(prepare(key), through(bound_wide(key)), std::move(caller));
  }
  T get(const Key& key, stop_token caller, wait_bound bound) {
    return local_.get(prepare(key), through(bound_wide(key)), std::move(caller), bound);
  }
  cached<T> get_entry(const Key& key, stop_token caller = {}) {
    return local_.get_entry(prepare(key), through(bound_wide(key)), std::move(caller));
  }
  cached<T> get_entry(const Key& key, stop_token caller, wait_bound bound) {
    return local_.get_entry(prepare(key), through(bound_wide(key)), std::move(caller), bound);
  }

  // peek(key): what get would answer from this process's local cache right
  // now (cache::peek), once the invalidations heard are applied; nullopt
  // when get would go to the fleet. No Redis round trip, no load, refresh or
  // count. Thread-safe.
  template <class K>
  std::optional<cached<T>> peek(const K& key) {
    return local_.peek(prepare(key));
  }

  // async_get(key, loader, on_done, caller)
  //
  // get without blocking, as cache::async_get: on_done(singleflight::
  // outcome<T>) receives this call's own copy of the value, or the exception
  // get would have thrown. Exactly once, never under a lock of the library,
  // and it may re-enter the fleet_cache. Invalidations heard on the bus are
  // applied first. Where:
  //   * before async_get returns, on this thread, when the local cache
  //     answers (hit, stale, cached failure) or the outcome is immediate
  //     (closed, `caller` already stopped, overloaded);
  //   * otherwise on the thread that settles the local load: the fleet part
  //     (Redis round trips, the wait for another process's value, `loader`)
  //     is synchronous, so the miss runs as the local cache's load on its
  //     own bounded threads (or local.flight.executor; under
  //     load_owner::caller, as cache::async_get, on this thread), and
  //     on_done runs there.
  // `loader` is T(stop_token) or T() (as get's; no completion form). Throws
  // (and never calls on_done) only what the key's codec, copies of the
  // loader and allocation throw. If on_done throws, std::terminate.
  // Thread-safe.
  template <class K, class L, class Callback>
  requires(!std::is_invocable_v<std::decay_t<L>&, outcome<T>&&>) void async_get(
      const K& key, L&& loader, Callback&& on_done, stop_token caller = {}) {
    check_on_done<Callback>();
    local_.async_get(prepare(key), through(std::forward<L>(loader)),
                     std::forward<Callback>(on_done), std::move(caller));
  }

  // async_get(key, loader, on_done, caller, bound)
  //
  // async_get with a wait_bound: once `bound` passes before the load
  // settles, on_done receives timeout_error and this call has left the
  // load, which goes on (it belongs to the local cache) and fills the local
  // cache and Redis. Thread-safe.
  template <class K, class L, class Callback>
  requires(!std::is_invocable_v<std::decay_t<L>&, outcome<T>&&>) void async_get(
      const K& key, L&& loader, Callback&& on_done, stop_token caller, wait_bound bound) {
    check_on_done<Callback>();
    local_.async_get(prepare(key), through(std::forward<L>(loader)),
                     std::forward<Callback>(on_done), std::move(caller), bound);
  }

  // co_get(key, loader, caller[, bound])
  //
  //   T v = co_await profiles.co_get(key, loader, token);
  //
  // The coroutine form of async_get: yields this caller's copy of the value
  // or throws what get would throw. Does not suspend when the local cache
  // answers; otherwise resumes on the thread that settles the load (see
  // async_get). Unlike cache::co_get, the awaitable owns what it needs (the
  // key's text and a copy of `loader`), so it may be stored and awaited
  // later, once, as an rvalue (co_await std::move(a)); the bus is caught up
  // with when it is awaited. With GCC 12, name a capturing lambda loader
  // before the co_await (see group::co_do). Destroying the coroutine while
  // it is suspended here is undefined (leave through `caller` or `bound`).
  // Thread-safe.
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>)
      [[nodiscard]] auto co_get(const K& key, L&& loader, stop_token caller = {}) {
    return make_awaitable(key_text(key), through(std::forward<L>(loader)), std::move(caller),
                          std::nullopt);
  }
  template <class K, class L>
  requires(!std::same_as<std::remove_cvref_t<L>, stop_token>)
      [[nodiscard]] auto co_get(const K& key, L&& loader, stop_token caller, wait_bound bound) {
    return make_awaitable(key_text(key), through(std::forward<L>(loader)), std::move(caller),
                          bound);
  }

  // async_get(key, on_done, caller[, bound]), co_get(key, caller[, bound]):
  // through the cache-wide loader. std::logic_error without one (async_get:
  // thrown, on_done never called). Thread-safe.
  template <class Callback>
  requires std::is_invocable_v < std::decay_t<Callback>
  &, outcome<T>&& > void async_get(const Key& key, Callback&& on_done, stop_token caller = {}) {
    async_get(key, bound_wide(key), std::forward<Callback>(on_done), std::move(caller));
  }
  template <class Callback>
  requires std::is_invocable_v < std::decay_t<Callback>
  &, outcome<T>&& >
         void async_get(const Key& key, Callback&& on_done, stop_token caller, wait_bound bound) {
    async_get(key, bound_wide(key), std::forward<Callback>(on_done), std::move(caller), bound);
  }
  [[nodiscard]] auto co_get(const Key& key, stop_token caller = {}) {
    return co_get(key, bound_wide(key), std::move(caller));
  }
  [[nodiscard]] auto co_get(const Key& key, stop_token caller, wait_bound bound) {
    return co_get(key, bound_wide(key), std::move(caller), bound);
  }

  // invalidate(key)
  //
  // Fleet-wide: the fleet's invalidate (the Redis value deleted, no load
  // that started before it stores) and, in the same script, the key on the
  // bus; then this process's local entry is dropped. Once it returns, no
  // process that has received the message returns a value stored before it
  // (see the coherence bound above). Returns the key's new generation.
  // Throws fleet_error when Redis cannot be reached or refused the bus
  // PUBLISH (the local entry is dropped anyway), closed_error after close().
  // Thread-safe.
  std::uint64_t invalidate(const Key& key) {
    const std::string text = key_text(key);
    return write(text, std::string(), bus_, [&](bool) {
      (void)local_.invalidate(text);
      return false;
    });
  }

  // expire(key)
  //
  // Fleet-wide "stale, but kept" (FusionCache's Expire). One script in
  // Redis: the value deleted and the key's generation bumped (as
  // invalidate: a process without a local copy loads, once across the
  // fleet; no load that started before it stores), and the key published on
  // the prefix's expire channel. Every process that hears it (and this one
  // at once) marks its local entry stale (cache::expire): its next get
  // returns the old value (freshness::stale) within stale_while_revalidate
  // and starts one refresh through the fleet; past that, the value is kept
  // for stale_if_error, both measured from the expire. A local entry
  // already stale keeps its windows (a local load of it under way does not
  // publish). Under client tracking the server's report of the deletion is
  // recognised as the expire's and does not drop the entry
  // (docs/fleet_cache.md). Returns the key's new generation. Throws as
  // invalidate (this process's entry is then marked stale anyway).
  // Thread-safe.
  std::uint64_t expire(const Key& key) {
    const std::string text = key_text(key);
    return write(
        text, std::string(), expire_bus_,
        [&](bool) {
          (void)local_.expire(text);
          return false;
        },
        [&] { (void)local_.expire(text); });
  }

  // put(key, value)
  //
  // Fleet-wide: stores `value` in Redis (for fleet.value_ttl; a load of the
  // key that started before it does not store), tells every process on the
  // bus (they drop their local copy and read this one on their next get),
  // and stores it in this process's local cache, unless this process heard,
  // while the put was in Redis, of a write of the key (on the bus, another
  // process's; under tracking any, its own included: reports name no writer)
  // or of a gap: that write may have followed this one, so the key is dropped
  // and the next get reads Redis, whichever caller of this process applied
  // what it heard (tests "put_superseded_before_its_local_step_is_not_kept",
  // "put_superseded_applied_by_another_caller_is_not_kept"). A value over
  // fleet.max_value_bytes is not stored in Redis: the key is invalidated
  // fleet-wide instead (counted: fleet.oversized_values). Returns the key's
  // new generation. Throws as invalidate (the local entry is then dropped),
  // and what the codec and T's copy throw. Thread-safe.
  template <class V>
  requires std::constructible_from<T, V&&> std::uint64_t put(const Key& key, V&& value) {
    const std::string text = key_text(key);
    T v(std::forward<V>(value));
    std::string payload(fleet_.codec_.encode(v));
    std::string rec;
    const std::size_t max = fleet_.engine_->cfg.max_value_bytes;
    if (max > 0 && payload.size() > max) {
      detail::fleet_counters::bump(fleet_.engine_->counters.oversized_values);
    } else {
      rec = detail::make_record('v', fleet_.tag_, "0", "0", payload);
    }
    return write(text, rec, bus_, [&](bool superseded) {
      if (superseded) {
        (void)local_.invalidate(text);  // the next get reads Redis
        return false;
      }
      (void)local_.put(text, std::move(v));
      return true;
    });
  }

  // close()
  //
  // Idempotent. Closes the local cache (its loads stopped and waited for),
  // then the fleet (its threads joined; see fleet::close). From a loader it
  // waits for nothing; the destructor finishes. Thread-safe.
  void close() {
    closed_.store(true, std::memory_order_relaxed);  // reported, orders nothing
    local_.close();
    fleet_.close();
  }

  // stats(): the local cache's, the fleet's and the bus's counters.
  // Thread-safe.
  fleet_cache_stats stats() const {
    fleet_cache_stats s;
    s.local = local_.stats();
    s.fleet = fleet_.stats();
    s.broadcasts = broadcasts_.load(std::memory_order_relaxed);
    s.invalidations_heard = inbox_.received();
    s.resyncs = inbox_.resyncs();
    s.overflows = inbox_.overflows();
    s.expires_heard = inbox_.expires_received();
    const bool fell_back = inbox_.fell_back();
    s.tracking_refused = fell_back ? 1 : 0;
    // Set before the inbox heard of the refusal: never 1 without tracking_refused.
    s.tracking_refused_on_cluster =
        fell_back && fleet_.engine_->subscriber.tracking_refused_on_cluster() ? 1 : 0;
    s.coherence = fell_back ? fleet_coherence::publish : coherence_;
    return s;
  }

  // flight_stats(): the local cache's inner group's counters (loads as
  // flights, callers that joined one). Thread-safe.
  singleflight::stats flight_stats() const { return local_.flight_stats(); }

  // healthy(): false while the fleet's circuit breaker is open, and after
  // close(). Thread-safe.
  bool healthy() const noexcept {
    return !closed_.load(std::memory_order_relaxed) && fleet_.healthy();
  }

 private:
  friend struct detail::fleet_cache_test_access;

  static std::size_t checked_pending(std::size_t n) {
    if (n == 0) {
      throw std::invalid_argument(
          "singleflight::fleet_cache_options: max_pending_invalidations must be at least 1");
    }
    return n;
  }

  static std::chrono::nanoseconds checked_bound(std::chrono::nanoseconds b) {
    if (b < std::chrono::nanoseconds::zero()) {
      throw std::invalid_argument(
          "singleflight::fleet_cache_options: gap_stale_bound must not be negative");
    }
    return b;
  }

  // The subscription the inbox hears: the bus, or client tracking's channel
  // (the subscriber's connections tracked for the prefix's names first; the
  // bus as the fallback, fallback_watch_).
  detail::fleet_subscriber::watch listen(fleet_coherence mode) {
    detail::fleet_subscriber& sub = fleet_.engine_->subscriber;
    if (mode == fleet_coherence::publish) return sub.subscribe(bus_, &inbox_);
    sub.track(detail::tracking_prefix(fleet_.engine_->cfg.key_prefix));
    return sub.subscribe(std::string(tracking_channel), &inbox_);
  }

  static constexpr std::string_view tracking_channel = "__redis__:invalidate";

  template <class K>
  std::string key_text(const K& key) const {
    if constexpr (requires { key_codec_.encode(key); }) {
      return std::string(key_codec_.encode(key));
    } else {
      return std::string(key_codec_.encode(Key(key)));
    }
  }

  // Applies what the bus told this process to the local cache: before every
  // read, and before every local write (a mark still pending from a
  // confirmation would otherwise make a later put stale, or a FLUSHALL's
  // clear take it away). Each change is told to the writes watching its key
  // (watches_, write_watches.hpp) before it reaches the local cache.
  //
  // No user code runs inside the application: what it takes out of the local cache (its
  // entries' keys and values) and the stashed values it discards (voided_reads.hpp) are
  // destroyed once it is over (a garbage_hold, made by its first step: nothing on the path
  // with nothing to apply; a set_aside), and kept() reads an entry's age without copying T.
  // Other callers wait for an application under way before they read, and those destructors
  // and copies are user code that may re-enter this fleet_cache, close() included, whose wait
  // for a load would wait for that load's loader reading it.
  void catch_up() {
    using hold_t = typename std::remove_reference_t<decltype(detail::cache_access::table(
        local_))>::garbage_hold;
    typename detail::voided_reads<T>::set_aside discarded;  // stashes discarded, likewise
    std::optional<hold_t> held;
    const auto hold = [&] {
      if (!held) held.emplace(detail::cache_access::table(local_));
    };
    inbox_.apply(
        [&](const std::string& text, std::uint64_t seq) {
          hold();
          if (kept(text, seq)) return;
          watches_.touch(text);
          voided_.dropped(text, seq, &discarded);
          (void)local_.invalidate(text);
        },
        [&] {
          hold();
          watches_.touch_all();
          void_all(&discarded);
          local_.clear();
        },
        [&](const std::string& text) {
          hold();
          watches_.touch(text);
          void_all(&discarded);
          (void)local_.expire(text);
        },
        [&](std::chrono::steady_clock::time_point since) {
          hold();
          watches_.touch_all();
          void_all(&discarded);
          // The bound runs from the mark (the confirmations, an overflow), not from this call:
          // a first get long after a reconnect is answered stale no more than one at once.
          const auto gone = std::chrono::steady_clock::now() - since;
          local_.expire_all(gone < gap_stale_bound_ ? gap_stale_bound_ - gone
                                                    : std::chrono::nanoseconds::zero());
        });
  }

  // void_all(keep): a clear, a stale mark or an expire is applied: no value set aside before it
  // (voided_reads.hpp) may be taken after it; they are discarded, into `keep`.
  void void_all(typename detail::voided_reads<T>::set_aside* keep) noexcept {
    voids_.fetch_add(1, std::memory_order_acq_rel);
    voided_.discard_all(keep);
  }

  // kept(text, seq): under client tracking, whether report `seq` of `text` is one the local
  // entry's value already reflects (detail/fleet/kept_reads.hpp): the value came from a read sent
  // after the report was posted and is still the local entry (stored after that load returned:
  // its age says so, kept_reads::stored_after). Then the report is not applied.
  bool kept(const std::string& text, std::uint64_t seq) {
    static_assert(std::is_same_v<typename local_t::clock, detail::kept_reads::clock>,
                  "the local cache's ages are compared with kept_reads' time points");
    const auto after = kept_.covers(text, seq, writes_.load(std::memory_order_acquire));
    if (!after) return false;
    // No entry: a drop of nothing still voids loads under way.
    return detail::kept_reads::stored_after(*after,
                                            [&]() -> std::optional<std::chrono::nanoseconds> {
                                              // No copy of T: this runs inside an application.
                                              return detail::cache_access::age(local_, text);
                                            });
  }

  // catch_up(), then the key's text.
  template <class K>
  std::string prepare(const K& key) {
    catch_up();
    return key_text(key);
  }

  // The local cache's loader: the fleet, with `loader` as the fleet's. Kept
  // by value (the local cache may run it after the caller left, and keeps a
  // copy for a background refresh); const: copies of it may run at once.
  template <class L>
  auto through(L&& loader) {
    static_assert(detail::fleet_loader<std::decay_t<L>, T>,
                  "singleflight::fleet_cache: the loader must be invocable as loader(stop_token) "
                  "or loader(), returning something convertible to T");
    return [this, load = std::decay_t<L>(std::forward<L>(loader))](const std::string& text,
                                                                   stop_token st) -> T {
      if (fleet_.engine_->reports == nullptr) return fleet_.get(text, load, std::move(st));
      // Under client tracking: a value read from Redis after some reports were posted is
      // recorded (kept_), so that those reports, its own store's included, do not drop it.
      const std::uint64_t writes = writes_.load(std::memory_order_acquire);
      const std::uint64_t voids = voids_.load(std::memory_order_acquire);
      // A value an earlier load read past every report that made the local cache refuse it
      // (voided_reads.hpp): still the key's, when its record is (no report past its read was
      // applied since) and nothing of this process voided it.
      if (auto [held, from] = voided_.take(text); held && from.writes == writes &&
                                                  from.voids == voids &&
                                                  kept_.holds(text, from.reports, from.at)) {
        return T(*held);
      }
      const std::uint64_t began = voided_.load_began(text);
      detail::read_mark& m = detail::this_thread_read_mark();
      m.set = false;
      std::optional<T> v;
      try {
        v.emplace(fleet_.get(text, load, std::move(st)));
      } catch (...) {
        (void)voided_.load_ended(text, began);
        throw;
      }
      const bool read = m.set && m.engine == fleet_.engine_.get() && m.text == text;
      const std::uint64_t reports = m.reports;
      m.set = false;
      const auto at = detail::kept_reads::clock::now();
      if (read) kept_.record(text, reports, at, writes);
      const std::optional<std::uint64_t> dropped = voided_.load_ended(text, began);
      if (read && dropped && *dropped <= reports &&
          writes_.load(std::memory_order_acquire) == writes &&
          voids_.load(std::memory_order_acquire) == voids) {
        try {
          voided_.stash(text, std::make_shared<const T>(*v), {reports, at, writes, voids});
        } catch (...) {  // bad_alloc, a throwing copy: nothing stashed (one more read)
        }
      }
      return std::move(*v);
    };
  }

  template <class Callback>
  static constexpr void check_on_done() {
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::fleet_cache::async_get: on_done must be invocable with "
                  "singleflight::outcome<T>");
  }

  // What co_get returns: the key's text and the local cache's loader (through(...)), owned;
  // awaiting it catches up with the bus and runs local_.async_get, resumed through a
  // resume_gate (detail/resume_gate.hpp: who resumes).
  template <class Load>
  class get_awaitable {
   public:
    get_awaitable(fleet_cache* c, std::string text, Load load, stop_token caller,
                  std::optional<wait_bound> bound)
        : c_(c),
          text_(std::move(text)),
          load_(std::move(load)),
          caller_(std::move(caller)),
          bound_(bound) {}

    class awaiter {
     public:
      explicit awaiter(get_awaitable&& a) : a_(std::move(a)) {}
      awaiter(const awaiter&) = delete;
      awaiter& operator=(const awaiter&) = delete;
      ~awaiter() = default;

      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) {
        gate_.arm(h);
        auto on_done = [this](outcome<T>&& o) noexcept {
          detail::put_outcome(result_, std::move(o));  // T's move: a throw is this caller's
          gate_.complete();
        };
        a_.c_->catch_up();
        if (a_.bound_) {
          a_.c_->local_.async_get(a_.text_, std::move(a_.load_), on_done, std::move(a_.caller_),
                                  *a_.bound_);
        } else {
          a_.c_->local_.async_get(a_.text_, std::move(a_.load_), on_done, std::move(a_.caller_));
        }
        return gate_.suspend();
      }
      T await_resume() { return std::move(*result_).value(); }

     private:
      get_awaitable a_;
      std::optional<outcome<T>> result_;
      detail::resume_gate gate_;
    };

    awaiter operator co_await() && { return awaiter(std::move(*this)); }
    template <class Self = get_awaitable>
    void operator co_await() & {
      static_assert(detail::dependent_false_awaitable<Self>,
                    "singleflight::fleet_cache::co_get: await it as an rvalue: co_await "
                    "c.co_get(key, loader), or co_await std::move(stored) (once)");
    }

   private:
    fleet_cache* c_;
    std::string text_;
    Load load_;
    stop_token caller_;
    std::optional<wait_bound> bound_;
  };

  template <class Load>
  get_awaitable<Load> make_awaitable(std::string text, Load load, stop_token caller,
                                     std::optional<wait_bound> bound) {
    return get_awaitable<Load>(this, std::move(text), std::move(load), std::move(caller), bound);
  }

  // The cache-wide loader for one key, as a per-call loader.
  auto bound_wide(const Key& key) const {
    if (!wide_) {
      throw std::logic_error(
          "singleflight::fleet_cache::get(key): no cache-wide loader (construct the "
          "fleet_cache with one, or pass a loader to get)");
    }
    return [wide = wide_, key](const stop_token& st) -> T { return (*wide)(key, st); };
  }

  // put / invalidate / expire: the write script with the message on
  // `channel`, then the local step, local(superseded), which returns whether it
  // stored a value locally; when Redis fails, `failed` (by default the local
  // entry is dropped) and the error thrown.
  template <class Local>
  std::uint64_t write(const std::string& text, const std::string& rec, const std::string& channel,
                      Local&& local) {
    return write(text, rec, channel, std::forward<Local>(local),
                 [&] { (void)local_.invalidate(text); });
  }
  template <class Local, class Failed>
  std::uint64_t write(const std::string& text, const std::string& rec, const std::string& channel,
                      Local&& local, Failed&& failed) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    // What was heard before the write is sent is of writes Redis ran before it: applied now,
    // so that what is applied after it, by any caller, may be a later write (see below).
    catch_up();
    // From before the write is sent to after the local step: every change of the key applied
    // meanwhile, by this caller or another one (write_watches.hpp).
    const detail::write_watches::watch watched(watches_, text);
    // Counted before and after: a load that overlaps a write keeps no report (kept_reads.hpp).
    const write_count counted(writes_);
    voided_.discard_all();  // none can be taken any more (their write count is past)
    std::uint64_t gen = 0;
    try {
      gen = fleet_.engine_->write(text, rec, channel, inbox_.self() + text);
    } catch (...) {
      failed();
      throw;
    }
    broadcasts_.fetch_add(1, std::memory_order_relaxed);     // a counter
    fleet_.engine_->at(detail::fleet_point::written, text);  // a test hook; it must not throw
    (void)fleet_.group_.forget(text);
    // What was applied of the key since the write was sent, here or by another caller, may be
    // a later write by another process (on the bus, another process's; under tracking, reports
    // name no writer: this write's own too), or a gap that hid one (a stale mark of every key):
    // `local` is told so, and a put then drops the key instead of keeping a value another write
    // replaced. A change applied by another caller after this check and before the put's local
    // step reached the local cache first: the put's value is dropped again.
    catch_up();
    if (local(watched.touched()) && watched.touched()) (void)local_.invalidate(text);
    return gen;
  }

  // Bumps a count on construction and on destruction (fleet_cache's writes).
  struct write_count {
    explicit write_count(std::atomic<std::uint64_t>& c) noexcept : n(c) {
      n.fetch_add(1, std::memory_order_acq_rel);
    }
    write_count(const write_count&) = delete;
    write_count& operator=(const write_count&) = delete;
    ~write_count() { n.fetch_add(1, std::memory_order_acq_rel); }
    std::atomic<std::uint64_t>& n;
  };

  fleet_t fleet_;
  KeyCodec key_codec_;
  std::shared_ptr<const wide_t> wide_;
  detail::invalidation_inbox inbox_;
  std::string bus_;
  std::string expire_bus_;
  detail::fleet_subscriber::watch watch_;           // before local_: outlives its loads' flights
  detail::fleet_subscriber::watch fallback_watch_;  // tracking: the bus, once it is refused
  detail::fleet_subscriber::watch expire_watch_;
  detail::kept_reads kept_;               // tracking: loads whose value reflects some reports
  detail::voided_reads<T> voided_;        // tracking: such values the local cache refused
  std::atomic<std::uint64_t> voids_{0};   // stale marks, clears, expires applied (voided_)
  std::atomic<std::uint64_t> writes_{0};  // put / invalidate / expire begun and ended
  detail::write_watches watches_;         // put / invalidate / expire: their keys' changes
  local_t local_;                         // destroyed first: joins its loads
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> broadcasts_{0};
  const std::chrono::nanoseconds gap_stale_bound_;  // the option's
  const fleet_coherence coherence_;                 // the option's
};

namespace detail {
// Test access: the fleet's engine (its hook, its subscriber).
struct fleet_cache_test_access {
  template <class C>
  static detail::fleet_engine& engine(C& c) {
    return fleet_test_access::engine(c.fleet_);
  }
};
}  // namespace detail

}  // namespace singleflight
