// singleflight/fleet.hpp
//
// `singleflight::fleet<Key, T>`: one origin call per key across a fleet of
// processes, coordinated through Redis. Optional: needs hiredis (Debian:
// libhiredis-dev) and the CMake target `singleflight::fleet`; nothing else in
// the library includes this header.
//
//   singleflight::fleet_options o;
//   o.redis_uri = "tcp://10.0.0.5:6379";
//   o.key_prefix = "profiles:v3";  // the value format's version belongs here
//   o.value_ttl = std::chrono::minutes(5);
//   singleflight::fleet<std::string, std::string> profiles(o);
//   std::string p = profiles.get(tenant + '|' + user + '|' + locale,
//                                [&](std::stop_token st) { return origin.fetch(st, ...); },
//                                request_stop_token);
//
// What it guarantees, and what it doesn't
//
// An *efficiency lease*, not a lock. With Redis healthy, the processes of a
// fleet that ask for a cold or expired key at the same time make one origin
// call between them (one per key per expiry): one process wins a lease and
// loads, the others wait for its value and are woken by a message. Every
// failure costs at most a duplicate origin call, never a wrong value and
// never an error the caller would not have had without the fleet:
//   * a leader that dies, hangs or is paused past its lease: another process
//     takes the lease once it has expired and loads again; the paused one's
//     late store is refused by its fencing number (a newer one exists);
//   * Redis down, stalled or unreachable (each round trip waits at most
//     redis_timeout, then a circuit breaker skips Redis altogether): every
//     process loads for itself, coalescing its own callers as a group does;
//   * a follower that waited max_wait loads for itself;
//   * a value under the key that is not a record of this fleet's codec
//     (corrupt, truncated, foreign, another Redis type) is a miss.
// Do not use it to make a side effect happen once: two loads of one key can
// overlap (a paused leader resumes while its successor loads). That needs a
// lock service whose fencing token the *side effect's target* checks (etcd,
// ZooKeeper; Kleppmann, "How to do distributed locking", 2016). Here the
// only target is the shared value, and it does check the fence.
//
// The protocol (README "Fleet" has it as a sequence): in each process a
// `group<Key, T>` coalesces the callers first, so one flight per key talks to
// Redis. The flight GETs the value (a hit: one round trip); on a miss it
// races for the lease in one script (re-read the value; SET lease NX PX
// lease_ttl; INCR the fence; read the generation). The winner renews the
// lease every renew_every (another thread), runs the loader, and stores the
// value in one script that checks its fence is the newest and the generation
// unchanged, releases the lease and PUBLISHes. A loser SUBSCRIBEs, races
// again once the subscription is confirmed (the race re-reads the value
// first, so a publish before the confirmation is not lost, nor a lease
// released without a value), waits up to wait_slice for the message, and
// races again (a dead leader's lease expires meanwhile); after max_wait it
// loads for itself. A failed load publishes its error, so followers fail at
// once with remote_load_error instead of loading again (and stores it for
// error_ttl when that is > 0).
//
// Threads: a fleet owns one subscriber thread (pub/sub), one lease renewer
// thread and, for async_get/co_get, a pool of worker threads (one per
// concurrent async flight at most); close() joins them all. get() runs the
// protocol and the loader on the calling thread (or on options.local's
// executor, when set), like a group's inline leader; async_get and co_get
// never block their caller: the flight runs on a worker. The subscriber and
// the renewer never run user code.
//
// Thread safety: every member may be called concurrently from any thread,
// except the destructor, which must not run concurrently with any other call,
// nor on a thread the fleet handed user code to (a loader, a callback).
//
// Platform: POSIX (poll, pipe). hiredis 0.14 has no TLS: run the fleet on a
// trusted network or through a TLS tunnel (stunnel, a service mesh).
#pragma once

// The fleet's waits use std::condition_variable_any's stop-token overloads, which take only
// std::stop_token: it needs a standard library that has <stop_token> (the check below turns
// "'stop_token' file not found" into a message).
#include <version>
#if !defined(__cpp_lib_jthread)
#error \
    "singleflight/fleet.hpp needs std::stop_token (libstdc++ 10 or later, libc++ 20 or later): with an older libc++, singleflight::group and singleflight::cache work (singleflight::stop_token is bundled there) but the fleet layer does not"
#endif

#include <array>
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
#include <stop_token>  // present wherever the check above passes
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "codec.hpp"
#include "detail/fleet/fleet_engine.hpp"
#include "detail/resume_gate.hpp"
#include "errors.hpp"
#include "group.hpp"
#include "metrics.hpp"
#include "options.hpp"
#include "outcome.hpp"
#include "stats.hpp"

namespace singleflight {

// fleet_options
//
// Construction-time settings of a fleet. Durations of 0 where a default is
// derived take that default; the constructor throws std::invalid_argument
// for settings that cannot work (a negative duration, renew_every >=
// lease_ttl, a malformed URI).
struct fleet_options {
  // Where Redis is: "tcp://host:port[/db]" (or "redis://..."), or
  // "unix:///path/to/redis.sock[?db=N]". One server (or a Cluster node whose
  // slot holds the keys: every name of one key shares a hash tag).
  std::string redis_uri = "tcp://127.0.0.1:6379";

  // AUTH: `AUTH password` when only the password is set, `AUTH username
  // password` (Redis 6 ACL) when both are. Sent in clear (no TLS in hiredis 0.14).
  std::string username;
  std::string password;

  // Prefix of every Redis name this fleet uses: "{<key_prefix>:<key text>}:v"
  // and so on. Fleets that must not share values need different prefixes;
  // put the value format's version in it.
  std::string key_prefix = "sf";

  // How long a lease lives without renewal. A leader that dies holds the
  // key up to this long before another process takes over.
  std::chrono::milliseconds lease_ttl{5000};

  // How often a leader renews its lease while its loader runs.
  // 0: lease_ttl / 3. Must be less than lease_ttl.
  std::chrono::milliseconds renew_every{0};

  // How long a follower waits for the leader's message before it re-reads
  // and races for the lease again (the bound on a lost message, and the
  // extra wait after a dead leader's lease expired). 0: lease_ttl / 5.
  std::chrono::milliseconds wait_slice{0};

  // How long a follower waits for other processes in total before it loads
  // for itself. 0: 3 * lease_ttl. Keep it above lease_ttl + wait_slice + the
  // load time, or a slow but live leader costs a second origin call.
  std::chrono::milliseconds max_wait{0};

  // Bound on every wait for Redis: connect, each command's write and reply.
  std::chrono::milliseconds redis_timeout{50};

  // How long a stored value lives in Redis (the fleet-wide freshness).
  std::chrono::milliseconds value_ttl{60000};

  // How long a failed load's error marker lives in Redis; while it does,
  // get() fails at once with remote_load_error in every process. 0 (the
  // default): the error is only published to the followers of that load and
  // the next get() loads again (no poisoned key).
  std::chrono::milliseconds error_ttl{0};

  // Circuit breaker: after this many consecutive calls whose round trip to
  // Redis failed (a call that got a hit or a race answer counts as a
  // success), the fleet skips Redis for breaker_cooldown (loads locally at no
  // extra latency), then lets one call probe it.
  std::uint32_t breaker_threshold = 3;
  std::chrono::milliseconds breaker_cooldown{1000};

  // Idle command connections kept for reuse (more are opened when needed).
  std::size_t max_idle_connections = 8;

  // The local group in front (owner, timeout, max_in_flight, executor).
  options local;
};

// fleet_stats
//
// Counters of one fleet object (this process) since construction. Each is
// exact; a snapshot is not one instant (they are read one by one).
struct fleet_stats {
  std::uint64_t gets = 0;                // get / async_get / co_get calls
  std::uint64_t hits = 0;                // flights answered by their first GET
  std::uint64_t leader = 0;              // flights that won the lease and ran the loader
  std::uint64_t follower_woken = 0;      // flights answered by another process's value
                                         // after its message woke them
  std::uint64_t late_hit = 0;            // flights answered by a value found on a re-read
                                         // without a message (in the race, after subscribing,
                                         // after a wait_slice)
  std::uint64_t local_fallback = 0;      // loads without the lease: Redis failing, breaker
                                         // open, max_wait passed
  std::uint64_t lease_lost = 0;          // renewals that found this process's lease gone
  std::uint64_t fence_rejections = 0;    // stores refused: a newer leader took over
  std::uint64_t invalidated_stores = 0;  // stores refused: invalidate() ran during the load
  std::uint64_t decode_failures = 0;     // values that were not a record of this codec
                                         // (corrupt, foreign): each a miss
  std::uint64_t redis_errors = 0;        // failed connects and round trips, all connections
  std::uint64_t remote_failures = 0;     // flights failed with another process's error
  std::uint64_t origin_calls = 0;        // loader calls here (leader + local_fallback)
  std::uint64_t breaker_opens = 0;       // times the circuit breaker opened
};

// remote_load_error
//
// Thrown to the callers of a flight that waited for another process whose
// load failed (its exception's what() is in the message; the exception
// itself cannot cross processes), and, while an error marker lives
// (error_ttl), to every get() of that key. Callers of the failed load's own
// process receive its original exception.
class SINGLEFLIGHT_EXCEPTION_VISIBLE remote_load_error : public error {
 public:
  using error::error;
};

// fleet_error
//
// Thrown by invalidate() when Redis cannot be reached: an invalidation must
// not be silently lost. get() never throws it.
class SINGLEFLIGHT_EXCEPTION_VISIBLE fleet_error : public error {
 public:
  using error::error;
};

namespace detail {

template <class C, class T>
concept value_codec = requires(const C& c, const T& v, std::string_view bytes) {
  { c.encode(v) } -> std::convertible_to<std::string>;
  { c.decode(bytes) } -> std::convertible_to<T>;
};

template <class C>
std::string_view codec_tag() {
  if constexpr (requires { std::string_view(C::tag); }) {
    return std::string_view(C::tag);
  } else {
    return {};
  }
}

template <class L>
concept loader_takes_token = std::invocable<L&, std::stop_token>;

template <class L, class T>
concept fleet_loader = (loader_takes_token<L> &&
                        std::convertible_to<std::invoke_result_t<L&, std::stop_token>, T>) ||
                       (std::invocable<L&> && std::convertible_to<std::invoke_result_t<L&>, T>);

struct fleet_test_access;

}  // namespace detail

// fleet
//
// Template parameters:
//   Key       what identifies a value, as for group (the key is a contract:
//             everything that changes the result, nothing that doesn't).
//   T         the value; copy-constructible (each caller gets a copy).
//   Codec     codec<T> by default: encode/decode T to bytes (codec.hpp).
//   KeyCodec  key_codec<Key> by default: the key's stable text in Redis.
template <class Key, class T, class Codec = codec<T>, class KeyCodec = key_codec<Key>>
class fleet {
  static_assert(detail::value_codec<Codec, T>,
                "singleflight::fleet<Key, T>: no usable codec for T. Specialise "
                "singleflight::codec<T> with `std::string encode(const T&) const` and "
                "`T decode(std::string_view) const` (see singleflight/codec.hpp), or pass a "
                "Codec type as the third template argument");
  static_assert(
      requires(const KeyCodec& kc, const Key& k) {
        { kc.encode(k) } -> std::convertible_to<std::string>;
      },
      "singleflight::fleet<Key, T>: no key_codec for Key. Specialise "
      "singleflight::key_codec<Key> with `std::string encode(const Key&) const` (a "
      "stable, injective text; see singleflight/codec.hpp), or pass a KeyCodec type "
      "as the fourth template argument");

 public:
  using key_type = Key;
  using value_type = T;

  // fleet(opts, codec, key_codec)
  //
  // Validates the options (std::invalid_argument), starts the subscriber and
  // renewer threads (std::system_error) and the local group. Does not
  // connect: the first call does (a fleet built while Redis is down works,
  // locally).
  explicit fleet(fleet_options opts = {}, Codec codec = Codec{}, KeyCodec key_codec = KeyCodec{})
      : group_(opts.local),
        engine_(std::make_unique<detail::fleet_engine>(configure(opts))),
        codec_(std::move(codec)),
        key_codec_(std::move(key_codec)),
        tag_(detail::codec_tag<Codec>()) {}

  fleet(const fleet&) = delete;
  fleet& operator=(const fleet&) = delete;

  // ~fleet(): close().
  ~fleet() { close(); }

  // get(key, loader, caller)
  //
  // The value for `key`: from Redis when another process stored it (or is
  // loading it: then this call waits for it), else from `loader`, which this
  // process then shares with the fleet. `loader` is invocable as
  // `loader(std::stop_token)` or `loader()` and returns something convertible
  // to T; the token is the local flight's (stopped by the ownership policy,
  // the deadline of options.local.timeout, or close()).
  //
  // Callers in this process share one flight per key (the local group):
  // the same guarantees as group::do_ (per-caller cancellation through
  // `caller`, ownership, deadline, close). Without options.local.executor the
  // first caller runs the protocol and the loader on its own thread and
  // returns when they do.
  //
  // Waiting for another process lasts at most max_wait; then this process
  // loads for itself. `caller` firing makes this caller leave at once with
  // cancelled_error (the flight goes on for the other callers here, as with
  // a group); the flight's own token (its last caller left, its deadline,
  // close()) ends the wait without a load.
  //
  // Throws: what the loader threw (in this process); remote_load_error (the
  // leader in another process failed, or its error marker is stored);
  // cancelled_error, timeout_error, closed_error, overloaded_error as
  // group::do_. Never a Redis error: Redis failing means a local load.
  // Thread-safe.
  template <class K, class Loader>
  T get(const K& key, Loader&& loader, std::stop_token caller = {}) {
    check_loader<Loader>();
    detail::fleet_counters::bump(engine_->counters.gets);
    return group_.do_(
        key,
        [this, text = key_text(key), load = std::forward<Loader>(loader)](
            std::stop_token st) mutable -> T { return run(text, load, st); },
        std::move(caller));
  }

  // async_get(key, loader, on_done, caller)
  //
  // get() without blocking: `on_done(singleflight::outcome<T>)` is called
  // exactly once with this caller's value or error. The flight (Redis round
  // trips, waits for other processes, the loader) runs on a worker thread of
  // the fleet, and on_done runs where group::async_do runs it: on the worker
  // that settles the flight, or on this thread before async_get returns for
  // an immediate outcome (closed, already cancelled, overloaded). Never on
  // the subscriber or renewer thread. on_done must not throw.
  // Thread-safe.
  template <class K, class Loader, class Callback>
  void async_get(const K& key, Loader&& loader, Callback&& on_done, std::stop_token caller = {}) {
    check_loader<Loader>();
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::fleet::async_get: on_done must be invocable with "
                  "singleflight::outcome<T>");
    detail::fleet_counters::bump(engine_->counters.gets);
    group_.async_do(
        key, async_flight<std::decay_t<Loader>>{this, key_text(key), std::forward<Loader>(loader)},
        std::forward<Callback>(on_done), std::move(caller));
  }

  // co_get(key, loader, caller)
  //
  //   T v = co_await profiles.co_get(key, loader, token);
  //
  // The coroutine form of async_get: yields the value or throws what get()
  // throws. Resumes on the thread that settles the flight (a worker of the
  // fleet), or does not suspend for an immediate outcome. The awaitable owns
  // copies of key and loader, so it may be stored before it is awaited; await
  // it once. Destroying the coroutine while it is suspended here is undefined
  // (leave through `caller`). Thread-safe.
  template <class K, class Loader>
  [[nodiscard]] auto co_get(const K& key, Loader&& loader, std::stop_token caller = {}) {
    check_loader<Loader>();
    return awaitable<std::decay_t<Loader>>(this, Key(key), std::forward<Loader>(loader),
                                           std::move(caller));
  }

  // invalidate(key)
  //
  // Fleet-wide: deletes the stored value (or error marker) and bumps the
  // key's generation, so that once invalidate returns no process reads a
  // value stored before it, and no load that acquired its lease before it
  // stores (invalidated_stores); waiting followers race again. In this
  // process the local flight in progress, if any, is forgotten (group::forget)
  // so that later callers here do not join it. Flights in progress in other
  // processes keep serving their own callers (see README "Fleet").
  //
  // Returns the key's new generation. Throws fleet_error when Redis cannot
  // be reached (an invalidation must not be lost silently), closed_error
  // after close(), std::bad_alloc. Thread-safe.
  std::uint64_t invalidate(const Key& key) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const detail::fleet_names names =
        detail::fleet_names::of(engine_->cfg.key_prefix, key_text(key));
    std::uint64_t gen = 0;
    try {
      detail::pooled c = engine_->pool.acquire();
      gen = detail::invalidate(*c, names, engine_->cfg.meta_ttl);
      engine_->breaker.success();
    } catch (const detail::redis_failure& e) {
      detail::fleet_counters::bump(engine_->counters.redis_errors);
      (void)engine_->breaker.failure();
      throw fleet_error(std::string("singleflight::fleet::invalidate: Redis unreachable: ") +
                        e.what());
    }
    (void)group_.forget(key);
    return gen;
  }

  // close()
  //
  // Idempotent. Closes the local group (new calls throw closed_error; every
  // flight's token is stopped; returns once every loader has returned), then
  // stops and joins the fleet's threads and drops its connections. Leases
  // held by loaders that were stopped are released by their flights (or
  // expire after lease_ttl). Called from inside a loader or a callback it does
  // not wait for itself; the destructor finishes. Thread-safe.
  void close() {
    // Relaxed: healthy() only reports it; nothing is ordered by it.
    closed_.store(true, std::memory_order_relaxed);
    if (engine_->workers.on_own_thread()) {
      // On a worker (a loader or on_done of an async flight): stop
      // everything, wait for nothing; the destructor joins.
      (void)group_.close_for(std::chrono::milliseconds(0));
      return;
    }
    group_.close();
    engine_->close();
  }

  // stats(): the fleet's counters (see fleet_stats). Thread-safe.
  fleet_stats stats() const {
    const auto& c = engine_->counters;
    const auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);
    };
    fleet_stats s;
    s.gets = get(c.gets);
    s.hits = get(c.hits);
    s.leader = get(c.leader);
    s.follower_woken = get(c.follower_woken);
    s.late_hit = get(c.late_hit);
    s.local_fallback = get(c.local_fallback);
    s.lease_lost = get(c.lease_lost);
    s.fence_rejections = get(c.fence_rejections);
    s.invalidated_stores = get(c.invalidated_stores);
    s.decode_failures = get(c.decode_failures);
    s.redis_errors = get(c.redis_errors);
    s.remote_failures = get(c.remote_failures);
    s.origin_calls = get(c.origin_calls);
    s.breaker_opens = engine_->breaker.opens();
    return s;
  }

  // local_stats(): the local group's counters (calls, flights, joins...).
  singleflight::stats local_stats() const { return group_.stats(); }

  // healthy(): false while the circuit breaker is open (Redis failing: the
  // fleet loads locally) and after close(). Thread-safe.
  bool healthy() const noexcept {
    return !closed_.load(std::memory_order_relaxed) && engine_->breaker.closed();
  }

 private:
  friend struct detail::fleet_test_access;

  template <class Loader>
  static constexpr void check_loader() {
    static_assert(detail::fleet_loader<std::decay_t<Loader>, T>,
                  "singleflight::fleet: the loader must be invocable as loader(std::stop_token) "
                  "or loader(), returning something convertible to T");
  }

  static detail::fleet_config configure(const fleet_options& o) {
    using ms = std::chrono::milliseconds;
    const auto need = [](bool ok, const char* what) {
      if (!ok) throw std::invalid_argument(std::string("singleflight::fleet_options: ") + what);
    };
    need(o.lease_ttl > ms(0), "lease_ttl must be positive");
    need(o.renew_every >= ms(0), "renew_every must not be negative");
    need(o.wait_slice >= ms(0), "wait_slice must not be negative");
    need(o.max_wait >= ms(0), "max_wait must not be negative");
    need(o.redis_timeout > ms(0), "redis_timeout must be positive");
    need(o.value_ttl > ms(0), "value_ttl must be positive (the shared value needs a lifetime)");
    need(o.error_ttl >= ms(0), "error_ttl must not be negative");
    need(o.breaker_cooldown >= ms(0), "breaker_cooldown must not be negative");
    detail::fleet_config c;
    c.endpoint = detail::redis_endpoint::parse(o.redis_uri);
    c.username = o.username;
    c.password = o.password;
    c.key_prefix = o.key_prefix;
    c.lease_ttl = o.lease_ttl;
    c.renew_every = o.renew_every > ms(0) ? o.renew_every : std::max(ms(1), o.lease_ttl / 3);
    need(c.renew_every < c.lease_ttl, "renew_every must be less than lease_ttl");
    c.wait_slice = o.wait_slice > ms(0) ? o.wait_slice : std::max(ms(1), o.lease_ttl / 5);
    c.max_wait = o.max_wait > ms(0) ? o.max_wait : 3 * o.lease_ttl;
    c.redis_timeout = o.redis_timeout;
    c.value_ttl = o.value_ttl;
    c.error_ttl = o.error_ttl;
    // The metadata (fence, generation) outlives any wait and any lease by far;
    // see fleet_protocol.hpp for why its expiry is safe anyway.
    c.meta_ttl = std::max({ms(60000), 10 * c.lease_ttl, 2 * c.max_wait});
    c.breaker_threshold = o.breaker_threshold;
    c.breaker_cooldown = o.breaker_cooldown;
    c.max_idle_connections = o.max_idle_connections;
    return c;
  }

  template <class K>
  std::string key_text(const K& key) const {
    if constexpr (requires { key_codec_.encode(key); }) {
      return std::string(key_codec_.encode(key));
    } else {
      return std::string(key_codec_.encode(Key(key)));
    }
  }

  template <class Loader>
  static T call_loader(Loader& load, const std::stop_token& st) {
    if constexpr (detail::loader_takes_token<Loader>) {
      return static_cast<T>(load(st));
    } else {
      return static_cast<T>(load());
    }
  }

  // One process's flight for one key: the protocol. Runs on the thread the
  // local group runs fn on (the first caller, the executor, or a worker).
  template <class Loader>
  T run(const std::string& text, Loader& load, const std::stop_token& st) {
    detail::fleet_engine& e = *engine_;
    auto& n = e.counters;
    using clock = std::chrono::steady_clock;
    if (!e.breaker.allow()) return load_locally(load, st);

    const detail::fleet_names names = detail::fleet_names::of(e.cfg.key_prefix, text);
    std::optional<detail::pooled> conn;
    // One round trip; false (and the connection dropped) when Redis failed:
    // a failure for the breaker. Successes are reported per call, below, once
    // the call's Redis part has worked (a hit, or a race that got an answer):
    // a GET that works while writes stall (CLIENT PAUSE WRITE, a read-only
    // replica) must not keep the breaker closed for calls that then time out.
    const auto round_trip = [&](auto&& step) {
      try {
        if (!conn) conn.emplace(e.pool.acquire());
        step(**conn);
        return true;
      } catch (const detail::redis_failure&) {
        conn.reset();
        detail::fleet_counters::bump(n.redis_errors);
        (void)e.breaker.failure();
        return false;
      }
    };

    // 1. GET: a hit costs this one round trip.
    detail::get_result first;
    if (!round_trip([&](detail::redis_conn& c) { first = detail::get_value(c, names); })) {
      return load_locally(load, st);
    }
    bool read_value = true;  // may the race script return the value it finds?
    if (first.kind == detail::get_result::found) {
      e.breaker.success();
      if (std::optional<T> v = decode(first.bytes)) {
        detail::fleet_counters::bump(n.hits);
        return std::move(*v);
      }
      read_value = false;
    } else if (first.kind == detail::get_result::foreign) {
      detail::fleet_counters::bump(n.decode_failures);
      read_value = false;
    }

    // 2. Miss: race for the lease; lose, wait, race again.
    const clock::time_point give_up = clock::now() + e.cfg.max_wait;
    detail::fleet_subscriber::watch w;
    bool woken = false;  // a message woke this follower since its last race
    std::string message;
    for (;;) {
      if (st.stop_requested()) throw cancelled_error();
      std::string token = e.new_token();
      detail::acquire_result a;
      if (!round_trip([&](detail::redis_conn& c) {
            a = detail::acquire(c, names, token, e.cfg.lease_ttl, e.cfg.meta_ttl, read_value);
          })) {
        return load_locally(load, st);
      }
      e.breaker.success();
      if (a.kind == detail::acquire_result::found) {
        if (std::optional<T> v = decode(a.bytes)) {
          detail::fleet_counters::bump(woken ? n.follower_woken : n.late_hit);
          return std::move(*v);
        }
        read_value = false;
        continue;  // not ours to read: race without reading
      }
      if (a.kind == detail::acquire_result::won) {
        conn.reset();  // no connection is held while the loader runs
        return lead(text, names, token, a.fence, a.gen, load, st);
      }

      // Lost: another process holds the lease.
      conn.reset();  // nor while this flight waits
      e.at(detail::fleet_point::lost_race, text);
      if (!w) {
        w = e.subscriber.subscribe(names.channel);
        const auto until = std::min(clock::now() + e.cfg.wait_slice, give_up);
        if (w.wait_confirmed(until, st)) {
          // Whatever the leader published before this point was not seen: a
          // stored value, or a released lease ("r": an abandoned or refused
          // load). Race again now (the race re-reads the value first); from
          // here on no message is missed.
          e.at(detail::fleet_point::subscribed, text);
          read_value = true;
          woken = false;
          continue;
        }
      }
      if (st.stop_requested()) throw cancelled_error();
      if (clock::now() >= give_up) return load_locally(load, st);

      e.at(detail::fleet_point::waiting, text);
      const auto until = std::min(clock::now() + e.cfg.wait_slice, give_up);
      switch (w.wait_event(until, st, message)) {
        case detail::fleet_subscriber::event::message:
          if (!message.empty() && message.front() == 'e') {
            // The leader's load failed: fail fast rather than load again.
            detail::fleet_counters::bump(n.remote_failures);
            throw remote_load_error("singleflight::fleet: the load failed in another process: " +
                                    message.substr(1));
          }
          woken = message == "v";
          break;
        case detail::fleet_subscriber::event::stopped:
          throw cancelled_error();
        case detail::fleet_subscriber::event::closed:
          throw closed_error();
        case detail::fleet_subscriber::event::resubscribed:
        case detail::fleet_subscriber::event::timeout:
          woken = false;
          break;
      }
      if (clock::now() >= give_up) return load_locally(load, st);
      read_value = true;
    }
  }

  // The lease is ours: load, then store (fenced) and publish.
  template <class Loader>
  T lead(const std::string& text, const detail::fleet_names& names, const std::string& token,
         const std::string& fence, const std::string& gen, Loader& load,
         const std::stop_token& st) {
    detail::fleet_engine& e = *engine_;
    detail::fleet_counters::bump(e.counters.leader);
    detail::fleet_counters::bump(e.counters.origin_calls);
    e.at(detail::fleet_point::leading, text);
    detail::lease_renewer::handle renewal = e.renewer.add(names, token);
    std::optional<T> v;
    try {
      v.emplace(call_loader(load, st));
    } catch (...) {
      renewal.release();
      const std::exception_ptr p = std::current_exception();
      if (!p) throw;  // not a C++ exception (a forced unwind): no cleanup, the lease expires
      fail(text, names, token, fence, gen, p, st.stop_requested());
      throw;
    }
    renewal.release();
    e.at(detail::fleet_point::loaded, text);
    std::string rec;
    try {
      rec = detail::make_record('v', tag_, fence, gen, codec_.encode(*v));
    } catch (...) {
      if (!std::current_exception()) throw;
      // Cannot share it: release the lease so that the followers race again.
      publish(text, names, token, fence, gen, "", e.cfg.value_ttl, "r");
      return std::move(*v);
    }
    publish(text, names, token, fence, gen, rec, e.cfg.value_ttl, "v");
    return std::move(*v);
  }

  // The store script: store `rec` (if not empty) for `ttl` when the fence is
  // the newest and the generation unchanged, release the lease, publish
  // `message`. Failures are counted, never thrown.
  void publish(const std::string& text, const detail::fleet_names& names, const std::string& token,
               const std::string& fence, const std::string& gen, const std::string& rec,
               std::chrono::milliseconds ttl, const std::string& message) noexcept {
    detail::fleet_engine& e = *engine_;
    try {
      detail::pooled c = e.pool.acquire();
      switch (detail::store(*c, names, token, fence, gen, rec, ttl, message, e.cfg.meta_ttl)) {
        case detail::store_result::stored:
          break;
        case detail::store_result::fenced_out:
          detail::fleet_counters::bump(e.counters.fence_rejections);
          break;
        case detail::store_result::invalidated:
          detail::fleet_counters::bump(e.counters.invalidated_stores);
          break;
      }
      e.breaker.success();
    } catch (const detail::redis_failure&) {
      detail::fleet_counters::bump(e.counters.redis_errors);
      (void)e.breaker.failure();
    } catch (const std::bad_alloc&) {
      detail::fleet_counters::bump(e.counters.redis_errors);  // the lease expires
    }
    e.at(detail::fleet_point::stored, text);  // a test hook; it must not throw
  }

  // A leader's load failed: publish the error (and store its marker for
  // error_ttl) so that the followers fail fast, or, when the flight was
  // abandoned here (its callers left, deadline, close), only release the
  // lease so that they race again. Never throws.
  void fail(const std::string& text, const detail::fleet_names& names, const std::string& token,
            const std::string& fence, const std::string& gen, const std::exception_ptr& p,
            bool abandoned) noexcept {
    const detail::fleet_engine& e = *engine_;
    if (abandoned) {
      publish(text, names, token, fence, gen, std::string(), e.cfg.value_ttl, "r");
      return;
    }
    std::string rec;
    std::string message;
    try {
      const std::string why = what_of(p);
      if (e.cfg.error_ttl.count() > 0) rec = detail::make_record('e', tag_, fence, gen, why);
      message = "e" + why;
    } catch (const std::bad_alloc&) {
      rec.clear();
      message = "r";
    }
    publish(text, names, token, fence, gen, rec, e.cfg.error_ttl, message);
  }

  template <class Loader>
  T load_locally(Loader& load, const std::stop_token& st) {
    detail::fleet_counters::bump(engine_->counters.local_fallback);
    detail::fleet_counters::bump(engine_->counters.origin_calls);
    return call_loader(load, st);
  }

  // The value in a record, or nullopt (counted) when the bytes are not a
  // record of this codec. An error marker throws remote_load_error.
  std::optional<T> decode(std::string_view bytes) {
    const std::optional<detail::record> r = detail::parse_record(bytes, tag_);
    if (!r) {
      detail::fleet_counters::bump(engine_->counters.decode_failures);
      return std::nullopt;
    }
    if (r->kind == 'e') {
      detail::fleet_counters::bump(engine_->counters.remote_failures);
      throw remote_load_error("singleflight::fleet: the load failed in another process: " +
                              std::string(r->payload));
    }
    try {
      return std::optional<T>(std::in_place, codec_.decode(r->payload));
    } catch (...) {
      if (!std::current_exception()) throw;
      detail::fleet_counters::bump(engine_->counters.decode_failures);
      return std::nullopt;
    }
  }

  static std::string what_of(const std::exception_ptr& p) {
    std::string text = "an exception not derived from std::exception";
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& x) {
      text = x.what();
    } catch (...) {  // NOLINT(bugprone-empty-catch): p is a C++ exception (checked by the caller)
    }
    constexpr std::size_t limit = 256;  // error markers stay small
    if (text.size() > limit) text.resize(limit);
    return text;
  }

  // The fn of an async flight: hands the protocol to a worker and returns.
  template <class Loader>
  struct async_flight {
    fleet* self;
    std::string text;
    Loader load;

    void operator()(std::stop_token st, completion<T> done) {
      auto job = detail::worker_threads::make_job([self = self, text = std::move(text),
                                                   load = std::move(load), st = std::move(st),
                                                   done = std::move(done)]() mutable {
        try {
          done.set_value(self->run(text, load, st));
        } catch (...) {
          const std::exception_ptr p = std::current_exception();
          if (!p) throw;
          done.set_exception(p);
        }
      });
      if (!self->engine_->workers.post(job)) throw closed_error();
    }
  };

  // What co_get returns: owns its key and loader; resumes the coroutine
  // from async_get's callback, or does not suspend when that ran first.
  template <class Loader>
  class awaitable {
   public:
    awaitable(fleet* self, Key key, Loader load, std::stop_token caller)
        : self_(self), key_(std::move(key)), load_(std::move(load)), caller_(std::move(caller)) {}

    bool await_ready() const noexcept { return false; }

    bool await_suspend(std::coroutine_handle<> h) {
      gate_.arm(h);
      self_->async_get(
          key_, std::move(load_),
          [this](outcome<T> o) {
            result_.emplace(std::move(o));
            gate_.complete();
          },
          caller_);
      return gate_.suspend();
    }

    T await_resume() { return std::move(*result_).value(); }

   private:
    fleet* self_;
    Key key_;
    Loader load_;
    std::stop_token caller_;
    std::optional<outcome<T>> result_;
    detail::resume_gate gate_;
  };

  group<Key, T> group_;
  std::unique_ptr<detail::fleet_engine> engine_;
  Codec codec_;
  KeyCodec key_codec_;
  std::string_view tag_;
  std::atomic<bool> closed_{false};
};

namespace metrics {

// fleet_metrics: a fleet's `stats()` (fleet_stats), one counter per field, for
// any exporter that reads metrics::descriptor tables (metrics.hpp), e.g.
//   collector.add_source({{"fleet", "profiles"}}, singleflight::metrics::fleet_metrics,
//                        [&] { return profiles.stats(); });
// and the local group's counters under group_metrics through local_stats().
inline constexpr std::array fleet_metrics{
    counter<&fleet_stats::gets>("singleflight_fleet_gets_total", "Calls to get/async_get/co_get"),
    counter<&fleet_stats::hits>("singleflight_fleet_hits_total",
                                "Flights answered by their first GET"),
    counter<&fleet_stats::leader>("singleflight_fleet_leads_total",
                                  "Flights that won the lease and ran the loader"),
    counter<&fleet_stats::follower_woken>(
        "singleflight_fleet_follower_woken_total",
        "Flights answered by another process's value after its message woke them"),
    counter<&fleet_stats::late_hit>("singleflight_fleet_late_hits_total",
                                    "Flights answered by a value found on a re-read"),
    counter<&fleet_stats::local_fallback>(
        "singleflight_fleet_local_fallbacks_total",
        "Loads without the lease: Redis failing, breaker open, max_wait passed"),
    counter<&fleet_stats::lease_lost>("singleflight_fleet_leases_lost_total",
                                      "Renewals that found this process's lease gone"),
    counter<&fleet_stats::fence_rejections>("singleflight_fleet_fence_rejections_total",
                                            "Stores refused: a newer leader took over"),
    counter<&fleet_stats::invalidated_stores>("singleflight_fleet_invalidated_stores_total",
                                              "Stores refused: invalidate() ran during the load"),
    counter<&fleet_stats::decode_failures>(
        "singleflight_fleet_decode_failures_total",
        "Values that were not a record of this codec (corrupt, foreign): misses"),
    counter<&fleet_stats::redis_errors>("singleflight_fleet_redis_errors_total",
                                        "Failed connects and round trips"),
    counter<&fleet_stats::remote_failures>("singleflight_fleet_remote_failures_total",
                                           "Flights failed with another process's error"),
    counter<&fleet_stats::origin_calls>("singleflight_fleet_origin_calls_total",
                                        "Loader calls in this process"),
    counter<&fleet_stats::breaker_opens>("singleflight_fleet_breaker_opens_total",
                                         "Times the circuit breaker opened"),
};

}  // namespace metrics

namespace detail {
// Test access: the protocol's hook points and the subscriber's state.
struct fleet_test_access {
  template <class F>
  static detail::fleet_engine& engine(F& f) {
    return *f.engine_;
  }
};
}  // namespace detail

}  // namespace singleflight
