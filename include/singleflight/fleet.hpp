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
//                                [&](singleflight::stop_token st) { return origin.fetch(st, ...);
//                                }, request_stop_token);
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
//     (corrupt, truncated, foreign, another Redis type) is a miss; foreign
//     data under the lease or metadata names is taken over;
//   * a race whose reply was lost (a timeout) leaves no lease behind: its
//     tombstone stops it from taking one if it runs later; a release that
//     fails (a stalled server) is retried on the renewer thread until it
//     works or the lease would have expired anyway;
//   * a value that cannot be stored (over max_value_bytes, refused by Redis,
//     an encode that throws) is returned to its callers; the lease is
//     released and the followers load for themselves at once.
// Do not use it to make a side effect happen once: two loads of one key can
// overlap (a paused leader resumes while its successor loads). That needs a
// lock service whose fencing token the *side effect's target* checks (etcd,
// ZooKeeper; Kleppmann, "How to do distributed locking", 2016). Here the
// only target is the shared value, and it does check the fence.
//
// The protocol (docs/fleet.md has it as a sequence; detail/fleet/
// fleet_flight.hpp runs it): in each process a `group<Key, T>` coalesces the
// callers first, so one flight per key talks to Redis. The flight GETs the
// value (a hit: one round trip); on a miss it races for the lease in one
// script (re-read the value; SET lease NX PX lease_ttl; INCR the fence; read
// the generation). The winner renews the lease every renew_every (another
// thread), runs the loader, and stores the value in one script that checks
// its fence is the newest and the generation unchanged, releases the lease
// and PUBLISHes. A loser SUBSCRIBEs, races again once the subscription is
// confirmed (the race re-reads the value first, so a publish before the
// confirmation is not lost, nor a lease released without a value), waits up
// to wait_slice for the message, and races again (a dead leader's lease
// expires meanwhile); after max_wait it loads for itself. A failed load
// publishes its error, so followers fail at once with remote_load_error
// instead of loading again (and stores it for error_ttl when that is > 0).
//
// Threads: a fleet owns one subscriber thread (pub/sub; on a Redis Cluster, one
// more per master a follower has waited on: sharded pub/sub), one lease renewer
// thread and, for async_get/co_get, a pool of worker threads (one per
// concurrent async flight at most, max_async_threads); all are
// detail::worker_threads, and close() follows its protocol (from outside it
// joins them all; from a library thread it waits for nothing). get() runs the
// protocol and the loader on the calling thread (or on options.local's
// executor, when set), like a group's inline leader; async_get and co_get
// never block their caller: the flight runs on a worker. The subscriber and
// the renewer never run user code.
//
// Thread safety: every member may be called concurrently from any thread,
// except the destructor, which must not run concurrently with any other call,
// nor on a thread the fleet handed user code to (a loader, a callback).
//
// One Redis server, or a Redis Cluster: on a cluster every command about a
// key goes to the master of its slot, following MOVED and ASK, and a key's
// pub/sub messages travel on its shard channel (docs/fleet.md, "Redis
// Cluster").
//
// Platform: POSIX (poll, pipe). hiredis 0.14 has no TLS: run the fleet on a
// trusted network or through a TLS tunnel (stunnel, a service mesh).
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "codec.hpp"
#include "detail/cache/refresh_runs.hpp"
#include "detail/chrono.hpp"
#include "detail/fleet/fleet_engine.hpp"
#include "detail/fleet/fleet_flight.hpp"
#include "detail/fleet/queued_flights.hpp"
#include "detail/fn_shapes.hpp"
#include "detail/get_awaitable.hpp"
#include "detail/library_thread.hpp"
#include "detail/unwind.hpp"
#include "detail/worker_threads.hpp"
#include "errors.hpp"
#include "fleet_options.hpp"
#include "group.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "stop_token.hpp"

namespace singleflight {

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

// A fleet's loader: a group's synchronous fn shapes (detail/fn_shapes.hpp), T(stop_token) or T().
template <class L, class T>
concept fleet_loader = (takes_token<L> &&
                        std::convertible_to<std::invoke_result_t<L&, stop_token>, T>) ||
                       (!takes_token<L> && std::invocable<L&> &&
                        std::convertible_to<std::invoke_result_t<L&>, T>);

struct fleet_test_access;

// fleet_inline_run: a get() flight of one fleet (`owner`) for one key text running on this
// thread without an executor (fleet::inline_flight), linked on this thread's stack while it
// runs, so that a loader calling get for its own key is found without a lock.
struct fleet_inline_start {
  // The inline_start of the fleet::get_inline whose async_do runs on this thread, and the
  // number of get_inline calls this thread made (their sequence numbers).
  static inline thread_local const void* current = nullptr;
  static inline thread_local std::uint64_t seq = 0;
};

struct fleet_inline_run {
  fleet_inline_run(const void* o, const std::string& t) noexcept : owner(o), text(&t), prev(top) {
    top = this;
  }
  fleet_inline_run(const fleet_inline_run&) = delete;
  fleet_inline_run& operator=(const fleet_inline_run&) = delete;
  ~fleet_inline_run() { top = prev; }

  // find(owner, text): the innermost run of `owner` on this thread (for `*text`, unless null).
  static const fleet_inline_run* find(const void* owner, const std::string* text = nullptr) {
    for (const fleet_inline_run* r = top; r != nullptr; r = r->prev) {
      if (r->owner == owner && (text == nullptr || *r->text == *text)) return r;
    }
    return nullptr;
  }

  const void* owner;
  const std::string* text;
  fleet_inline_run* prev;
  static inline thread_local fleet_inline_run* top = nullptr;
};

}  // namespace detail

template <class Key, class T, class Codec, class KeyCodec>
class fleet_cache;

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
      : inline_(!opts.local.executor),
        group_(opts.local),
        engine_(std::make_unique<detail::fleet_engine>(
            detail::fleet_config::of(opts, detail::codec_tag<Codec>()))),
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
  // `loader(stop_token)` or `loader()` and returns something convertible
  // to T; the token is the local flight's (stopped by the ownership policy,
  // the deadline of options.local.timeout, or close()).
  //
  // Callers in this process share one flight per key (the local group):
  // the same guarantees as group::do_ (per-caller cancellation through
  // `caller`, ownership, deadline, close). Without options.local.executor the
  // first caller runs the protocol and the loader on its own thread.
  //
  // Waiting for another process lasts at most max_wait; then this process
  // loads for itself. `caller` firing makes this caller leave at once with
  // cancelled_error (the flight goes on for the other callers here, as with
  // a group): a first caller running the flight on its own thread that is
  // waiting for another process hands the rest of the wait to a fleet worker
  // (within the same max_wait) and leaves; one running the loader (or waiting
  // for a cluster master's failover) leaves when that returns, as a group's
  // inline leader does. The flight's own token (its last caller left, its
  // deadline, close()) ends the wait without a load. On a fleet worker (a loader of
  // async_get or co_get calling back), a flight of `key` still queued for a
  // worker runs on this thread: the workers are bounded, and this wait must
  // not keep busy the worker it waits for.
  //
  // Throws: what the loader threw (in this process); remote_load_error (the
  // leader in another process failed, or its error marker is stored);
  // cancelled_error, timeout_error, closed_error, overloaded_error as
  // group::do_; std::logic_error when a loader calls get for its own key on
  // the thread running it (the caller's, the executor's, or a fleet worker's
  // for async_get and co_get), which would wait for itself forever. Never a
  // Redis error: Redis failing means a local load.
  // Thread-safe.
  template <class K, class Loader>
  T get(const K& key, Loader&& loader, stop_token caller = {}) {
    check_loader<Loader>();
    detail::fleet_counters::bump(engine_->counters.gets);
    std::string text = key_text(key);
    if (engine_->workers.on_own_thread()) {
      // An async flight's loader runs on a worker after its fn returned: the group no longer
      // knows that thread, so the fleet does (runs_). Other threads skip its lock.
      if (runs_.running_here(text, 0, std::equal_to<std::string>{})) {
        throw std::logic_error(
            "singleflight::fleet::get: a loader called get for its own key on the fleet worker "
            "running it (it would wait for itself forever; use async_get or co_get)");
      }
      return get_on_worker(key, std::move(text), std::forward<Loader>(loader), std::move(caller));
    }
    if (inline_) {
      if (detail::fleet_inline_run::find(this, &text) != nullptr) {
        throw std::logic_error(
            "singleflight::fleet::get: a loader called get for its own key on the thread "
            "running it; it would wait for itself forever");
      }
      return get_inline(key, std::move(text), std::forward<Loader>(loader), std::move(caller));
    }
    return group_.do_(
        key,
        [this, text = std::move(text), load = std::forward<Loader>(loader)](
            stop_token st) mutable -> T { return run(text, load, st); },
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
  void async_get(const K& key, Loader&& loader, Callback&& on_done, stop_token caller = {}) {
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
  // fleet), or does not suspend for an immediate outcome. The awaitable
  // refers to `key` and `loader`, as group::co_do's and cache::co_get's do:
  // co_await it in the same full expression (co_await on a stored awaitable
  // does not compile); the flight copies what it keeps. With GCC 12, name a
  // capturing lambda loader before the co_await (see group::co_do).
  // Destroying the coroutine while it is suspended here is undefined (leave
  // through `caller`). Thread-safe.
  template <class K, class Loader>
  [[nodiscard]] auto co_get(const K& key, Loader&& loader, stop_token caller = {}) {
    check_loader<Loader>();
    return detail::get_awaitable<fleet, K, std::remove_reference_t<Loader>, T>(this, key, loader,
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
  // processes keep serving their own callers (docs/fleet.md).
  //
  // Returns the key's new generation, greater than any this key's
  // invalidate() returned before (also across the expiry or eviction of its
  // metadata, while the server's clock does not go back). Throws fleet_error
  // when Redis cannot be reached (an invalidation must not be lost silently)
  // or, with options.replicas, fewer replicas acknowledged it within
  // replica_timeout (applied on the primary; see docs/fleet.md, "Replicas and
  // failover"), closed_error after close(), std::bad_alloc. Thread-safe.
  std::uint64_t invalidate(const Key& key) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const std::uint64_t gen = engine_->invalidate(key_text(key));
    (void)group_.forget(key);
    return gen;
  }

  // close()
  //
  // Idempotent and thread-safe; the protocol of detail/worker_threads.hpp.
  // New calls throw closed_error and every flight's token is stopped.
  //   * From outside the library's threads: closes the local group (returns
  //     once every loader has returned), then stops the fleet's threads, joins
  //     them and drops its connections. Concurrent closers all wait.
  //   * From a library thread (a loader or on_done on a fleet worker, a thread
  //     of the local group or any group, or of another fleet, cache or batch
  //     loader): stops and rejects,
  //     waits for nothing and joins nothing; the subscriber and the renewer
  //     keep serving the flights still finishing until an outside close() or
  //     the destructor. Loaders of two fleets closing each other both return.
  // Leases held by loaders that were stopped are released by their flights (or
  // expire after lease_ttl). From inside a loader of this fleet's get() on
  // its caller's thread it stops and rejects and waits for nothing, as from a
  // library thread; an outside close() or the destructor finishes.
  void close() {
    // Relaxed: healthy() only reports it; nothing is ordered by it.
    closed_.store(true, std::memory_order_relaxed);
    // A loader of get() on its caller's thread (an inline flight of this fleet) does not wait
    // for itself either: its flight's completion is unresolved until the loader returns.
    if (detail::on_library_thread() || detail::fleet_inline_run::find(this) != nullptr) {
      // The closed group starts no flight, so no async flight reaches the workers; they,
      // the subscriber and the renewer are joined by a close() from outside or the destructor.
      (void)group_.close_for(std::chrono::milliseconds(0));
      return;
    }
    group_.close();
    engine_->close();
  }

  // stats(): the fleet's counters (see fleet_stats). Thread-safe.
  fleet_stats stats() const { return engine_->stats(); }

  // local_stats(): the local group's counters (calls, flights, joins...).
  singleflight::stats local_stats() const { return group_.stats(); }

  // healthy(): false while a circuit breaker is open (Redis failing: the
  // fleet loads locally; on a Redis Cluster, one breaker per node) and after
  // close(). Thread-safe.
  bool healthy() const noexcept {
    return !closed_.load(std::memory_order_relaxed) && engine_->router.healthy();
  }

 private:
  friend struct detail::fleet_test_access;
  // fleet_cache (fleet_cache.hpp) writes through the engine and forgets local flights.
  template <class, class, class, class>
  friend class fleet_cache;

  template <class Loader>
  static constexpr void check_loader() {
    static_assert(detail::fleet_loader<std::decay_t<Loader>, T>,
                  "singleflight::fleet: the loader must be invocable as loader(stop_token) "
                  "or loader(), returning something convertible to T");
  }

  template <class K>
  std::string key_text(const K& key) const {
    if constexpr (requires { key_codec_.encode(key); }) {
      return std::string(key_codec_.encode(key));
    } else {
      return std::string(key_codec_.encode(Key(key)));
    }
  }

  // One flight's value: the loader it calls, the codec, and its result.
  template <class Loader>
  class flight_value final : public detail::fleet_value {
   public:
    flight_value(const Codec& codec, Loader& load) noexcept : codec_(codec), load_(load) {}

    void decode(std::string_view payload) override { result.emplace(codec_.decode(payload)); }
    void load(const stop_token& st) override {
      if constexpr (detail::takes_token<Loader>) {
        result.emplace(static_cast<T>(load_(st)));
      } else {
        result.emplace(static_cast<T>(load_()));
      }
    }
    std::string encode() override { return std::string(codec_.encode(*result)); }

    std::optional<T> result;

   private:
    const Codec& codec_;
    Loader& load_;
  };

  // One process's flight for one key: the protocol (detail::fleet_flight).
  // Runs on the thread the local group runs fn on (the first caller, the
  // executor, or a worker).
  template <class Loader>
  T run(const std::string& text, Loader& load, const stop_token& st,
        const std::optional<std::chrono::steady_clock::time_point>& until = std::nullopt) {
    flight_value<Loader> v(codec_, load);
    detail::fleet_flight f(*engine_, tag_, text, v, st);
    if (until) f.wait_until(*until);
    f.run();
    return std::move(*v.result);
  }

  // run() on a fleet worker, marked in runs_ while it runs: a loader that calls get() for its
  // own key there throws logic_error (see get). The mark ends before the flight settles, so an
  // on_done that runs here afterwards may start the key's next flight.
  template <class Loader>
  T run_on_worker(
      const std::string& text, Loader& load, const stop_token& st,
      const std::optional<std::chrono::steady_clock::time_point>& until = std::nullopt) {
    const runs::scope running(runs_, text, 0);
    return run(text, load, st, until);
  }

  // get() on a fleet worker (a loader of an async flight calling the fleet): the workers are
  // bounded, so this caller must not block on a flight whose body is queued behind it
  // (queued_flights.hpp). It joins or starts the flight as an async caller (a flight it
  // starts runs here, inline) and, while it waits, runs the key's queued bodies itself.
  template <class K, class Loader>
  T get_on_worker(const K& key, std::string text, Loader&& loader, stop_token caller) {
    std::optional<outcome<T>> r;
    bool ready = false;
    const std::string awaited = text;
    group_.async_do(
        key,
        [this, text = std::move(text), load = std::forward<Loader>(loader)](
            stop_token st) mutable -> T { return run_on_worker(text, load, st); },
        [this, &r, &ready](outcome<T> o) noexcept {
          r.emplace(std::move(o));  // before done(): the waiter reads it once ready
          queued_.done(ready);
        },
        std::move(caller));
    queued_.help_until(awaited, ready);
    return std::move(*r).value();
  }

  // The fn of an async flight: hands the protocol to a worker and returns. `until`: the end of
  // the wait for other processes of a flight its first caller left (inline_flight).
  template <class Loader>
  struct async_flight {
    fleet* self;
    std::string text;
    Loader load;
    std::optional<std::chrono::steady_clock::time_point> until{};

    void operator()(stop_token st, completion<T> done) {
      std::string text_of_job = text;
      auto job = detail::worker_threads::make_job(
          [self = self, text = std::move(text), load = std::move(load), st = std::move(st),
           done = std::move(done), until = until]() mutable {
            try {
              done.set_value(self->run_on_worker(text, load, st, until));
            } catch (...) {
              const std::exception_ptr p = std::current_exception();
              if (!p) throw;
              done.set_exception(p);
            }
          });
      // Queued as a slot too, so that a worker waiting for this key may run it (get_on_worker).
      auto slot = std::make_shared<detail::queued_flights::slot>(text_of_job, std::move(job));
      self->queued_.add(slot);
      auto post =
          detail::worker_threads::make_job([q = &self->queued_, slot]() mutable { q->run(slot); });
      bool posted = false;
      try {
        posted = self->engine_->workers.post(post);
      } catch (...) {
        self->queued_.drop(slot);
        throw;
      }
      if (!posted) {
        self->queued_.drop(slot);
        throw closed_error();
      }
    }
  };

  // get() without an executor. This caller joins or starts the flight as an async caller
  // (the group then sees it leave at its token at once, also while its flight runs here) and,
  // when it starts the flight, runs it on this thread once async_do has returned
  // (inline_flight: the fast path, no thread hop). When its token fires while the flight waits
  // for another process, the flight leaves this thread (fleet_flight::leave_on) and the rest of
  // it runs on a worker as an async_get's, within the same max_wait; a loader running here
  // finishes first, as a group's inline leader's fn does.
  template <class K, class Loader>
  T get_inline(const K& key, std::string text, Loader&& loader, stop_token caller) {
    using L = std::decay_t<Loader>;
    struct waiter {
      std::mutex mu;
      std::condition_variable cv;
      std::optional<outcome<T>> r;  // guarded by mu
    } w;
    inline_start<L> start;
    auto& current = detail::fleet_inline_start::current;
    start.seq = ++detail::fleet_inline_start::seq;
    {
      const void* const outer = current;
      current = &start;
      const detail::on_unwind restore([&] { current = outer; });
      group_.async_do(
          key, inline_flight<L>{this, text, std::forward<Loader>(loader), &start, start.seq},
          [&w](outcome<T> o) noexcept {
            // Notified under mu: once get() sees r it may destroy w.
            const std::lock_guard<std::mutex> lk(w.mu);
            try {
              w.r.emplace(std::move(o));
            } catch (...) {  // T's move threw: this caller gets that exception instead
              w.r.emplace(std::current_exception());
            }
            w.cv.notify_all();
          },
          caller);
    }
    if (start.done) run_inline(text, *start.load, start.st, std::move(*start.done), caller);
    std::unique_lock<std::mutex> lk(w.mu);
    w.cv.wait(lk, [&] { return w.r.has_value(); });
    return std::move(*w.r).value();
  }

  // What inline_flight hands back to get_inline when the group starts it inside async_do.
  template <class Loader>
  struct inline_start {
    std::uint64_t seq = 0;
    std::optional<Loader> load;
    stop_token st;
    std::optional<completion<T>> done;
  };

  // The fn of get_inline's flight: started inside that get's async_do on its thread (the
  // thread-local fleet_inline_start names it, with its sequence number), it hands the loader,
  // token and completion back for get_inline to run; started anywhere else (a caller that went
  // round again after a stopped flight), it runs as an async_get's flight, on a worker.
  template <class Loader>
  struct inline_flight {
    fleet* self;
    std::string text;
    Loader load;
    inline_start<Loader>* start;  // compared, dereferenced only when it is this thread's current
    std::uint64_t seq;

    void operator()(stop_token st, completion<T> done) {
      if (detail::fleet_inline_start::current == start && start->seq == seq) {
        start->load.emplace(std::move(load));
        start->st = std::move(st);
        start->done.emplace(std::move(done));
        return;
      }
      async_flight<Loader>{self, std::move(text), std::move(load)}(std::move(st), std::move(done));
    }
  };

  // run_inline(...): get_inline's flight on its caller's thread, marked in
  // detail::fleet_inline_run (a loader calling get for its own key throws logic_error; close()
  // from it waits for nothing: this completion is unresolved until it returns).
  template <class Loader>
  void run_inline(const std::string& text, Loader& load, stop_token st, completion<T> done,
                  const stop_token& caller) {
    std::optional<std::chrono::steady_clock::time_point> until;
    try {
      const detail::fleet_inline_run here(this, text);
      flight_value<Loader> v(codec_, load);
      detail::fleet_flight f(*engine_, tag_, text, v, st);
      f.leave_on(caller);
      f.run();
      if (!f.left()) {
        done.set_value(std::move(*v.result));
        return;
      }
      until = f.give_up();
    } catch (...) {
      const std::exception_ptr p = std::current_exception();
      if (!p) throw;  // not a C++ exception (a forced unwind): the completion dies unresolved
      done.set_exception(p);
      return;
    }
    // The caller left while the flight waited for another process: a worker goes on with it.
    try {
      async_flight<Loader>{this, text, std::move(load), until}(std::move(st), std::move(done));
    } catch (...) {
      const std::exception_ptr p = std::current_exception();
      if (!p) throw;
      // closed_error (the workers closed), bad_alloc: the completion, moved into the dropped
      // job, died unresolved and failed the flight; nothing is left to report here.
    }
  }

  using runs = detail::refresh_runs<std::string, std::equal_to<std::string>>;

  const bool inline_;  // no options.local.executor: get()'s first caller runs the flight
  group<Key, T> group_;
  std::unique_ptr<detail::fleet_engine> engine_;
  runs runs_;  // the keys (texts) whose async flights run on the fleet's workers now
  // The async flights' bodies not started yet. Its slots outlive the workers' jobs: the
  // destructor's close() joins the workers before any member dies.
  detail::queued_flights queued_;
  Codec codec_;
  KeyCodec key_codec_;
  std::string_view tag_;
  std::atomic<bool> closed_{false};
};

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
