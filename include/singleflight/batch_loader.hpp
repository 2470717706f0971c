// singleflight/batch_loader.hpp
//
// `singleflight::batch_loader<Key, T>`: callers ask for one key each; the
// loader collects the keys asked for within a short window and loads them
// with one call of a bulk function, then hands each caller its key's result.
// A group coalesces callers of one key; a batch_loader also amortises across
// different keys (DataLoader's batching, for threads and coroutines).
//
//   singleflight::batch_loader<std::string, user> users(
//       [&](std::span<const std::string> ids, singleflight::stop_token st) {
//         return db.users_by_id(ids, st);  // std::vector<user>, aligned with ids
//       },
//       {.max_batch = 100, .window = std::chrono::milliseconds(2)});
//   user u = users.load(tenant + '|' + id, request_token);
//
// Overview
//
// Inside is a group<Key, T> (group.hpp): each key a caller asks for is a
// flight of that group, shared by every caller of the key while it is in
// flight (pending, in a running bulk call, or being delivered). The flight's
// work is to put its key into the open batch. The batch closes when its
// window has passed since its first key arrived, when it holds max_batch
// keys, or on flush(); it is then dispatched: the bulk function is called
// with its keys, each once, and each key's result settles that key's flight
// for all its callers. Nothing is kept afterwards: a batch_loader is not a
// cache (put one in front of it, see "Cache" below).
//
// Guarantees (docs/batch_loader.md has the tests):
//  1. Keys asked for within the window (or until max_batch are waiting) go
//     in one bulk call; a full batch is dispatched at once; each distinct key
//     appears once in a batch.
//  2. A key already pending, or in a running bulk call, is joined, not
//     loaded again.
//  3. The bulk call belongs to the loader, never to the first caller: its
//     stop token fires only when every waiter of every key in it has left
//     (under options::owner, see batch_options::flight), or on close(). A key
//     whose waiters all left before dispatch is dropped from its batch; a
//     batch whose keys were all dropped is not run.
//  4. A bulk failure is shared with that batch's waiters (the same exception
//     object), then forgotten; nothing is cached.
//  5. The window runs on a thread the loader owns, never on a caller's; the
//     bulk call runs on a thread the loader owns (or flight.executor); no
//     lock is held while user code runs, and the loader may be re-entered
//     from the bulk function, a callback or a resumption.
//
// The bulk function, one of:
//   R bulk(std::span<const Key> keys, singleflight::stop_token st);
//   R bulk(std::span<const Key> keys);
//   void bulk(std::span<const Key> keys, singleflight::stop_token st,
//             singleflight::batch_completion<Key, T> done);   // asynchronous
// where R is
//   * a sized sequence aligned with `keys` (R[i] answers keys[i]) of T (or
//     anything converting to T), of load_result<T> (cache_options.hpp; empty
//     = not_found_error for that key; its ttl is ignored here), or of
//     outcome<T> (a value or that key's own exception). A sequence of another
//     length than `keys` fails every key of the batch with batch_size_error;
//   * a map from Key (anything with find(key) and end(): std::map,
//     std::unordered_map, ...) to any of those three: a key missing from the
//     map is not_found_error.
// An exception thrown by the bulk function fails every key of its batch. It
// receives the batch's keys in the order they arrived; `st` fires when no
// key of the batch is wanted any more, or on close(). It may be called on
// several threads at once (one per running batch, up to
// max_in_flight_batches): make it safe for that, or set the cap to 1.
//
// Where user code runs:
//  * the bulk function: on one of the loader's worker threads (a new one is
//    started when every worker is busy, up to batch_options::max_threads,
//    64 by default; one idle for 10 s exits),
//    or, with a callable flight.executor, on whatever thread the executor
//    runs its task; never on a caller's thread and never on the window
//    thread;
//  * results are delivered on the thread that resolves the batch (the worker
//    that ran a synchronous bulk function, the thread that resolves an
//    asynchronous one's batch_completion): blocked callers are woken there,
//    async_load callbacks run and co_load coroutines resume there, inline,
//    with no lock held, in the keys' order. A callback that blocks delays the
//    keys after it in that batch; a blocking call made from it (load,
//    load_many, close) first delivers the rest of the batch, so it never
//    waits for a key held behind itself;
//  * a blocking call of the bulk function for a key of its own batch would
//    wait for itself: it throws std::logic_error instead. Keys of other
//    batches are fine: a blocking call on one of the loader's threads (the
//    bulk function, a callback on its worker) never waits for a slot or a
//    thread; while its keys have no result it runs the open batch, closed
//    ones waiting for a slot, and ones a busy worker has not started, on
//    its own thread (batch_queue::help_until);
//  * the executor, when set, is called on the window thread: it must queue
//    the task and return (thread_pool's does). One that refuses (throws)
//    fails that batch with its own exception, delivered on one of the
//    loader's workers, never on the window thread.
//
// Cache: a cache<Key, T> in front of the loader keeps the results; give it
// cache_loader() as its cache-wide loader (or pass loader_for(key) per call),
// and misses, get_many and refreshes of many keys due together become few
// bulk calls, with no thread waiting per key. The batch_loader must outlive
// the cache.
//
// Thread safety: every member may be called concurrently from any number of
// threads, except the destructor, which must not run concurrently with any
// other call, nor inside the bulk function, a callback or a resumption that
// this loader runs (use close() there).
//
// Locking: the group's shards (group.hpp) and one mutex of the loader's
// batching (detail/batch/batch_queue.hpp), held for bookkeeping only.
//
// Where the parts live (include/singleflight/detail/batch/): batch.hpp (one
// batch and its keys), batch_queue.hpp (the window, dispatch, delivery,
// re-entrancy), bulk_fn.hpp (the
// bulk-function shapes), bulk_results.hpp (an answer into per-key results);
// batch_completion.hpp and batch_options.hpp at the top.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "batch_completion.hpp"  // IWYU pragma: export
#include "batch_options.hpp"     // IWYU pragma: export
#include "cache_options.hpp"
#include "completion.hpp"
#include "detail/batch/batch_queue.hpp"
#include "detail/batch/bulk_fn.hpp"
#include "detail/chrono.hpp"
#include "detail/functional.hpp"
#include "detail/library_thread.hpp"
#include "detail/outcome_slot.hpp"
#include "group.hpp"
#include "hash.hpp"
#include "outcome.hpp"
#include "stats.hpp"
#include "stop_token.hpp"
#include "wait_bound.hpp"

namespace singleflight {

// batch_loader
//
// Template parameters: as for group (Key a contract: every input that
// changes the result, tenant included, and nothing else; T copy-constructible,
// each caller gets its own copy).
template <class Key, class T, class Hash = default_hash, class KeyEqual = std::equal_to<>>
class batch_loader {
  static_assert(std::is_object_v<T> && !std::is_array_v<T> && std::copy_constructible<T>,
                "singleflight::batch_loader<Key, T>: every caller receives its own copy of the "
                "value, so T must be a copy-constructible object type; for big values use "
                "std::shared_ptr<const X>");
  static_assert(std::copy_constructible<Key> && std::is_object_v<Key>,
                "singleflight::batch_loader<Key, T>: Key must be a copy-constructible object "
                "type");

  using group_t = group<Key, T, Hash, KeyEqual>;
  using queue_t = detail::batch_queue<Key, T>;
  using time_point = std::chrono::steady_clock::time_point;

  // A key's flight: put the key into the open batch. by_ref refers to the
  // caller's key (a blocking caller or a coroutine stays until its flight
  // is decided); by_value keeps a copy (an async caller may go at once).
  struct by_ref {
    queue_t* q;
    const Key* key;
    void operator()(stop_token st, completion<T> done) const {
      q->add(Key(*key), std::move(st), std::move(done));
    }
  };
  struct by_value {
    queue_t* q;
    Key key;
    void operator()(stop_token st, completion<T> done) const {
      q->add(Key(key), std::move(st), std::move(done));
    }
  };

 public:
  using key_type = Key;
  using value_type = T;

  // batch_loader(bulk, options)
  //
  // `bulk` is one of the shapes above (copied or moved into the loader; it
  // lives until the loader is destroyed). Starts the window thread. Throws
  // std::invalid_argument for a negative window, std::system_error when a
  // thread cannot be started, and what group's constructor throws.
  template <class Bulk>
  explicit batch_loader(Bulk bulk, batch_options opts = {})
      : queue_(make_bulk(std::move(bulk)), checked(opts)), group_(flight_options(opts)) {}

  batch_loader(const batch_loader&) = delete;
  batch_loader& operator=(const batch_loader&) = delete;

  // ~batch_loader(): close(). Not concurrently with anything else, and not
  // inside the bulk function, a callback or a resumption of this loader.
  ~batch_loader() { close(); }

  // load(key, caller), load(key, caller, bound)
  //
  // Returns key's value: joins the key's flight if one is pending, running
  // or delivering, else puts the key into the open batch and waits for its
  // result. Blocks until the result arrives, `caller` fires (cancelled_error;
  // the key is dropped from its batch if nobody else wants it) or `bound`
  // passes (timeout_error, the same). Throws the key's error: the bulk
  // function's exception (the same object for every key of the batch),
  // that key's own exception or not_found_error, batch_size_error,
  // broken_promise_error; closed_error, overloaded_error (flight.max_in_flight)
  // and timeout_error (flight.timeout) as group::do_ does; std::logic_error
  // from inside the bulk function for a key of its own batch. Thread-safe.
  T load(const Key& key, stop_token caller = {}) {
    if (auto o = reentrant(key, caller, nullptr)) return std::move(*o).value();
    return group_.do_(key, by_ref{&queue_, &key}, std::move(caller));
  }
  T load(const Key& key, stop_token caller, wait_bound bound) {
    const time_point at = bound.deadline();
    if (auto o = reentrant(key, caller, &at)) return std::move(*o).value();
    return group_.do_(key, by_ref{&queue_, &key}, std::move(caller), bound);
  }

  // try_load(key, caller[, bound]): load without a throw for the call's
  // outcome (see group::try_do). Throws only std::logic_error (above), and
  // what Hash, KeyEqual, Key's copy or allocation throw. Thread-safe.
  outcome<T> try_load(const Key& key, stop_token caller = {}) {
    if (auto o = reentrant(key, caller, nullptr)) return std::move(*o);
    return group_.try_do(key, by_ref{&queue_, &key}, std::move(caller));
  }
  outcome<T> try_load(const Key& key, stop_token caller, wait_bound bound) {
    const time_point at = bound.deadline();
    if (auto o = reentrant(key, caller, &at)) return std::move(*o);
    return group_.try_do(key, by_ref{&queue_, &key}, std::move(caller), bound);
  }

  // async_load(key, on_done, caller[, bound])
  //
  // load without blocking: `on_done(singleflight::outcome<T>)` receives this
  // caller's outcome, exactly once, with no lock held; it may re-enter the
  // loader. Where: on the thread that delivers the batch (see the top of
  // this file), or, for an immediate outcome (closed, cancelled, overloaded),
  // before async_load returns; with cancelled_error on the thread that
  // stopped `caller`; with timeout_error (`bound`) on the group's delivery
  // thread. Capture by value: on_done outlives this call. Throws (and then
  // never calls on_done) only what Hash, KeyEqual, Key's copy or allocation
  // throw. Thread-safe.
  template <class Callback>
  void async_load(const Key& key, Callback&& on_done, stop_token caller = {}) {
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::batch_loader::async_load: on_done must be invocable with "
                  "singleflight::outcome<T>");
    group_.async_do(key, by_value{&queue_, key}, std::forward<Callback>(on_done),
                    std::move(caller));
  }
  template <class Callback>
  void async_load(const Key& key, Callback&& on_done, stop_token caller, wait_bound bound) {
    static_assert(std::is_invocable_v<std::decay_t<Callback>&, outcome<T>&&>,
                  "singleflight::batch_loader::async_load: on_done must be invocable with "
                  "singleflight::outcome<T>");
    group_.async_do(key, by_value{&queue_, key}, std::forward<Callback>(on_done), std::move(caller),
                    bound);
  }

  // load_operation: what co_load returns. Refers to the key until co_awaited
  // (co_await it in the same full expression).
  class load_operation {
   public:
    load_operation(const load_operation&) = delete;
    load_operation& operator=(const load_operation&) = delete;
    ~load_operation() = default;

    auto operator co_await() && {
      if (bound_) {
        return l_->group_.co_do(*key_, fn_, std::move(caller_), wait_bound(*bound_))
            .
            operator co_await();
      }
      return l_->group_.co_do(*key_, fn_, std::move(caller_)).operator co_await();
    }
    template <class Self = load_operation>
    void operator co_await() & {
      static_assert(sizeof(Self) == 0,
                    "singleflight::batch_loader::co_load: co_await the result in the same "
                    "expression (co_await loader.co_load(key)); it refers to the key");
    }

   private:
    friend class batch_loader;
    load_operation(batch_loader* l, const Key& key, stop_token caller,
                   std::optional<time_point> bound) noexcept
        : l_(l), key_(&key), fn_{&l->queue_, &key}, caller_(std::move(caller)), bound_(bound) {}

    batch_loader* l_;
    const Key* key_;
    by_ref fn_;
    stop_token caller_;
    std::optional<time_point> bound_;
  };

  // co_load(key, caller[, bound])
  //
  //   user u = co_await users.co_load(id, token);
  //
  // The coroutine form of async_load: yields this caller's copy of the value
  // or throws what load would throw. Resumes where async_load's on_done
  // would run; does not suspend for an immediate outcome. Works from any
  // coroutine whose promise does not reject foreign awaitables (see
  // group::co_do; the same GCC 12 note applies to a key built inside the
  // co_await expression: name it first). Thread-safe.
  [[nodiscard]] load_operation co_load(const Key& key, stop_token caller = {}) {
    return load_operation(this, key, std::move(caller), std::nullopt);
  }
  [[nodiscard]] load_operation co_load(const Key& key, stop_token caller, wait_bound bound) {
    return load_operation(this, key, std::move(caller), bound.deadline());
  }

  // load_many(keys, caller[, bound])
  //
  // One outcome per key, aligned with `keys` (a key given twice is asked
  // for once: both get its outcome). Blocks until every key has its outcome; no
  // throw for a key's failure (DataLoader's loadMany: errors in place).
  // The keys go into the open batch together: its window does not close
  // while they are being added, so up to max_batch of them share one bulk
  // call (more are split over full batches). `caller` and `bound` apply to
  // each key. Throws only std::logic_error from inside the bulk function for
  // a key of its own batch, and what allocation throws; a key whose Hash,
  // KeyEqual or copy threw gets that exception as its outcome, and the keys
  // after it load. Thread-safe.
  std::vector<outcome<T>> load_many(std::span<const Key> keys, stop_token caller = {}) {
    return many(keys, caller, nullptr);
  }
  std::vector<outcome<T>> load_many(std::span<const Key> keys, stop_token caller,
                                    wait_bound bound) {
    const time_point at = bound.deadline();
    return many(keys, caller, &at);
  }

  // key_loader: what loader_for returns.
  class key_loader {
   public:
    // The async loader shape of singleflight::cache: `done` receives the
    // key's value, load_result<T>::not_found() for not_found_error (so the
    // cache's not_found_ttl applies), or the key's exception.
    void operator()(stop_token st, completion<load_result<T>> done) const {
      start_for_cache(l_, key_, std::move(st), std::move(done));
    }

   private:
    friend class batch_loader;
    key_loader(batch_loader* l, Key key) : l_(l), key_(std::move(key)) {}
    batch_loader* l_;
    Key key_;
  };

  // loader_for(key): a loader for `key` in the asynchronous shape of
  // singleflight::cache (`void(stop_token, completion<load_result<T>>)`):
  //
  //   cache.get(key, loader.loader_for(key));
  //
  // The cache's misses and refreshes of many keys then share bulk calls. The
  // cache's load token is this key's caller token. The returned loader
  // refers to this batch_loader, which must outlive every use of it.
  key_loader loader_for(const Key& key) { return key_loader(this, key); }

  // wide_loader: what cache_loader returns.
  class wide_loader {
   public:
    // The asynchronous cache-wide loader shape of singleflight::cache; as
    // key_loader's, for any key.
    void operator()(const Key& key, stop_token st, completion<load_result<T>> done) const {
      start_for_cache(l_, key, std::move(st), std::move(done));
    }

   private:
    friend class batch_loader;
    explicit wide_loader(batch_loader* l) noexcept : l_(l) {}
    batch_loader* l_;
  };

  // cache_loader(): this loader as a cache-wide loader of singleflight::cache
  // (`void(const Key&, stop_token, completion<load_result<T>>)`):
  //
  //   singleflight::batch_loader<std::string, user> users(bulk, {.max_batch = 64});
  //   singleflight::cache<std::string, user> cache(options, users.cache_loader());
  //
  // Every load of the cache — get, async_get, co_get, get_many, and every
  // background refresh — is then an async_load of this loader: misses and
  // refreshes of many keys due together become few bulk calls, and no thread
  // waits per key. A key not found (not_found_error) is answered as
  // load_result<T>::not_found(), so the cache's not_found_ttl applies. The
  // cache's load token is the key's caller token. The loader refers to this
  // batch_loader, which must outlive the cache: declare the batch_loader
  // first, so that the cache is closed and destroyed before it. Closed
  // before the cache, every load of the cache fails with closed_error.
  wide_loader cache_loader() noexcept { return wide_loader(this); }

  // flush(): dispatches the open batch now, without waiting for its window
  // (as soon as max_in_flight_batches allows). Returns at once; nothing to do
  // without an open batch. Thread-safe.
  void flush() { queue_.flush(); }

  // close()
  //
  // Idempotent. New calls get closed_error; every key in flight settles with
  // closed_error for its waiters and is dropped or, in a running bulk call,
  // has that call's token stopped. Returns once every bulk call has been
  // answered and delivered and the loader's threads are joined. Called from
  // a callback or a resumption the loader runs, it first delivers the rest
  // of that batch, then waits for the other bulk calls and deliveries but
  // those of callbacks in close() themselves. Called from inside the bulk
  // function it does not wait for that batch (the destructor finishes the
  // drain, and joins that thread). On any thread the library started (this
  // loader's, another loader's, a cache's, a fleet's or a group's: see
  // docs/threads.md) it stops and rejects as from a bulk function, waiting
  // for no work and joining nothing; concurrent outside closers all wait.
  // A bulk function that ignores its token makes close() wait for it.
  // Thread-safe.
  void close() {
    if (queue_.has_frames()) queue_.drain_here();
    queue_.close_begin();
    if (waits_for_nothing()) {
      (void)group_.close_for(std::chrono::nanoseconds(0));
      queue_.close_finish(queue_t::wait_for::nobody);
      return;
    }
    group_.close();
    queue_.close_finish(queue_t::wait_for::others_not_closing);
  }

  // close_for(timeout)
  //
  // close() that gives up waiting after `timeout` (any duration, up to
  // duration::max()) and says what is still running then: drained (as
  // close() returns) or not, with the bulk calls not yet answered and the
  // keys whose flight has not finished. Not drained, the loader stays closed
  // (every key settled for its waiters with closed_error, every running bulk
  // call's token stopped) and its threads stay; a later close() or the
  // destructor waits for the rest. From inside the bulk function it returns
  // at once, as close() does. Thread-safe.
  template <class Rep, class Period>
  batch_close_result close_for(std::chrono::duration<Rep, Period> timeout) {
    const auto until = detail::after(std::chrono::steady_clock::now(), timeout);
    if (queue_.has_frames()) queue_.drain_here();
    queue_.close_begin();
    bool drained = false;
    if (waits_for_nothing()) {
      (void)group_.close_for(std::chrono::nanoseconds(0));
      (void)queue_.close_finish(queue_t::wait_for::nobody);
    } else {
      const auto now = std::chrono::steady_clock::now();
      drained = group_.close_for(until > now ? until - now : std::chrono::nanoseconds(0)) &&
                queue_.close_finish(queue_t::wait_for::others_not_closing, until);
    }
    batch_close_result r;
    r.drained = drained;
    if (!drained) {
      r.running_batches = static_cast<std::size_t>(queue_.stats().running_batches);
      r.keys_in_flight = group_.in_flight();
    }
    return r;
  }

  // stats(): the loader's counters, one snapshot under the batching's lock,
  // then the group's calls and joins (its shards in turn) and load_many's
  // repeats, read right after and not part of that snapshot
  // (batch_options.hpp, batch_stats).
  // Thread-safe.
  batch_stats stats() const {
    batch_stats s = queue_.stats();
    const singleflight::stats g = group_.stats();
    // A key repeated in load_many is one call of the group; it counts as a call that joined.
    const std::uint64_t r = repeats_.load(std::memory_order_relaxed);
    s.calls = g.calls + r;
    s.joins = g.joins + r;
    return s;
  }

  // flight_stats(): the per-key group's own counters (stats.hpp), for
  // metrics::group_metrics. Thread-safe.
  singleflight::stats flight_stats() const { return group_.stats(); }

  // in_flight(): keys whose flight has not finished (pending, loading or
  // being delivered). Thread-safe.
  std::size_t in_flight() const { return group_.in_flight(); }

 private:
  // start_for_cache(l, key, st, done): an async_load of `key` that resolves a cache's load
  // completion: the value, load_result<T>::not_found() for not_found_error, or the error.
  // The callback runs where the group delivers (noexcept): a T move that throws on the way
  // into the completion fails the cache's load with that exception instead.
  static void start_for_cache(batch_loader* l, const Key& key, stop_token st,
                              completion<load_result<T>> done) {
    l->async_load(
        key,
        [d = std::move(done)](outcome<T> o) mutable {
          if (o.has_value()) {
            try {
              d.set_value(load_result<T>::value(std::move(o).value()));  // T's moves
            } catch (...) {  // before set_value ran: `d` is still unresolved
              d.set_exception(std::current_exception());
            }
          } else if (is_not_found(o.error())) {
            d.set_value(load_result<T>::not_found());
          } else {
            d.set_exception(o.error());
          }
        },
        std::move(st));
  }
  static bool is_not_found(const std::exception_ptr& e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const not_found_error&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  template <class Bulk>
  static std::unique_ptr<detail::bulk_call<Key, T>> make_bulk(Bulk&& bulk) {
    using F = std::decay_t<Bulk>;
    static_assert(detail::bulk_fn_for<F, Key, T>,
                  "singleflight::batch_loader: the bulk function must be invocable as "
                  "R(std::span<const Key>, singleflight::stop_token) or R(std::span<const Key>), "
                  "with R a sized sequence aligned with the keys (of T, load_result<T> or "
                  "outcome<T>) or a map from Key to one of those; or, asynchronous, as "
                  "void(std::span<const Key>, singleflight::stop_token, "
                  "singleflight::batch_completion<Key, T>)");
    if constexpr (detail::bulk_fn_for<F, Key, T>) {
      return std::make_unique<detail::bulk_impl<Key, T, F>>(std::forward<Bulk>(bulk));
    } else {
      return nullptr;
    }
  }

  static const batch_options& checked(const batch_options& o) {
    if (o.window < std::chrono::nanoseconds::zero()) {
      throw std::invalid_argument("singleflight::batch_loader: window must not be negative");
    }
    return o;
  }

  // The group's options: the bulk calls, not the per-key flights, run on
  // the executor.
  static options flight_options(const batch_options& o) {
    options f = o.flight;
    f.executor = nullptr;
    return f;
  }

  // The outcome one caller of this loader waits for (reentrant, many). T's move (user code)
  // runs under no lock: put() writes a slot, by its key's delivery alone, before arrived()
  // counts it under `m` (inside the queue's settle, which holds the queue's lock); the waiter
  // reads the slots only once the count says they are written. A move that throws fills the
  // slot with its exception (detail/outcome_slot.hpp): the slot is counted all the same.
  struct one_waiter {
    std::mutex m;
    std::condition_variable cv;
    std::optional<outcome<T>> o;  // written by put(), then read by wait() once `done`
    bool done = false;            // m
    void put(outcome<T>&& x) noexcept { detail::put_outcome(o, std::move(x)); }
    void arrived() {
      const std::lock_guard<std::mutex> lk(m);
      done = true;
      cv.notify_all();  // under the lock: the waiter's frame may go right after
    }
    outcome<T> wait() {
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return done; });
      }
      return std::move(*o);
    }
    bool ready() {
      const std::lock_guard<std::mutex> lk(m);
      return done;
    }
  };
  struct many_waiter {
    explicit many_waiter(std::size_t n) : slots(n), left(n) {}
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::optional<outcome<T>>> slots;  // slot i: its delivery's, then the waiter's
    std::size_t left;                              // m
    void put(std::size_t i, outcome<T>&& x) noexcept {
      detail::put_outcome(slots[i], std::move(x));
    }
    void arrived() {
      const std::lock_guard<std::mutex> lk(m);
      if (--left == 0) cv.notify_all();  // under the lock, as above
    }
    void set(std::size_t i, outcome<T>&& x) {
      put(i, std::move(x));
      arrived();
    }
    // The outcomes; slot i is empty for a repeated key (many() fills it).
    std::vector<std::optional<outcome<T>>> wait() {
      {
        std::unique_lock<std::mutex> lk(m);
        cv.wait(lk, [&] { return left == 0; });
      }
      return std::move(slots);
    }
    bool ready() {
      const std::lock_guard<std::mutex> lk(m);
      return left == 0;
    }
  };

  // A blocking call from inside the bulk function for a key of its own
  // batch would wait for itself.
  // close() waits for no work when called inside a bulk function of this loader or on
  // any thread the library started (detail/library_thread.hpp: this loader's workers, another
  // layer's, a group's): such a thread may be the one the work it would wait for waits on.
  bool waits_for_nothing() const noexcept {
    return queue_.calling_any_here() || detail::on_library_thread();
  }

  void check_not_own_batch(const Key& key) const {
    for (const auto* b : queue_.calling_here()) {
      for (const Key& k : b->keys) {
        if (eq_(k, key)) {
          throw std::logic_error(
              "singleflight::batch_loader: the bulk function asked (blocking) for a key of its "
              "own batch; it would wait for itself");
        }
      }
    }
  }

  // A blocking call on a thread that is inside this loader: calling its bulk
  // function (a key of that batch: logic_error) or delivering a batch (the
  // key's result may be held behind this very call: attach, deliver the
  // rest, then wait). nullopt: nothing special, go the usual way.
  std::optional<outcome<T>> reentrant(const Key& key, const stop_token& caller,
                                      const time_point* bound) {
    const bool help = queue_.may_help_here();
    if (!help && !queue_.has_frames()) return std::nullopt;
    if (queue_.has_frames()) check_not_own_batch(key);
    if (!help && !queue_.delivering_here()) return std::nullopt;
    one_waiter w;
    auto on_done = [&w, q = &queue_](outcome<T>&& o) {
      w.put(std::move(o));  // T's move: no lock; a throw is the key's outcome
      q->settle([&] { w.arrived(); });
    };
    if (bound != nullptr) {
      group_.async_do(key, by_value{&queue_, key}, on_done, caller, wait_bound(*bound));
    } else {
      group_.async_do(key, by_value{&queue_, key}, on_done, caller);
    }
    queue_.drain_here();
    if (help) queue_.help_until([&] { return w.ready(); });
    return w.wait();
  }

  // Hashing a key given to load_many, to find its repeats.
  struct key_ptr_hash {
    const Hash* h;
    std::size_t operator()(const Key* k) const { return static_cast<std::size_t>((*h)(*k)); }
  };
  struct key_ptr_eq {
    const KeyEqual* e;
    bool operator()(const Key* a, const Key* b) const { return (*e)(*a, *b); }
  };

  // load_many: each distinct key is asked for once (a repeat gets a copy of its first
  // occurrence's outcome); a key whose Hash, KeyEqual or copy throws gets that exception,
  // and the keys after it go on.
  std::vector<outcome<T>> many(std::span<const Key> keys, const stop_token& caller,
                               const time_point* bound) {
    if (keys.empty()) return {};
    if (queue_.has_frames()) {
      for (const Key& k : keys) check_not_own_batch(k);
    }
    const std::size_t none = keys.size();
    std::vector<std::size_t> first(keys.size(), none);  // a repeat: its first occurrence
    std::vector<std::exception_ptr> failed(keys.size());
    std::size_t asked = 0;
    {
      std::unordered_map<const Key*, std::size_t, key_ptr_hash, key_ptr_eq> seen(
          keys.size(), key_ptr_hash{&hash_}, key_ptr_eq{&eq_});
      for (std::size_t i = 0; i < keys.size(); ++i) {
        try {
          const auto [it, added] = seen.try_emplace(&keys[i], i);
          if (!added) {
            first[i] = it->second;
            repeats_.fetch_add(1, std::memory_order_relaxed);
            continue;
          }
        } catch (...) {  // Hash, KeyEqual, allocation: this key only
          failed[i] = std::current_exception();
        }
        ++asked;
      }
    }
    auto w = std::make_shared<many_waiter>(keys.size());
    w->left = asked;
    queue_.hold();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (first[i] != none) continue;
      if (failed[i]) {
        w->set(i, outcome<T>(failed[i]));
        continue;
      }
      try {
        auto on_done = [w, i, q = &queue_](outcome<T>&& o) {
          w->put(i, std::move(o));  // T's move: no lock; a throw is the key's outcome
          q->settle([&] { w->arrived(); });
        };
        if (bound != nullptr) {
          group_.async_do(keys[i], by_value{&queue_, keys[i]}, on_done, caller, wait_bound(*bound));
        } else {
          group_.async_do(keys[i], by_value{&queue_, keys[i]}, on_done, caller);
        }
      } catch (...) {  // nothing attached for keys[i] (Hash, Key's copy, allocation)
        w->set(i, outcome<T>(std::current_exception()));
      }
    }
    queue_.release();
    if (queue_.has_frames()) queue_.drain_here();
    if (queue_.may_help_here()) queue_.help_until([&] { return w->ready(); });
    std::vector<std::optional<outcome<T>>> slots = w->wait();
    std::vector<outcome<T>> out;
    out.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (first[i] == none) {
        detail::append_outcome(out, std::move(*slots[i]));  // T's move: a throw, this key's
        continue;
      }
      try {
        out.push_back(out[first[i]]);  // T's copy
      } catch (...) {
        out.push_back(outcome<T>(std::current_exception()));
      }
    }
    return out;
  }

  KeyEqual eq_{};
  Hash hash_{};
  std::atomic<std::uint64_t> repeats_{0};  // load_many's repeated keys (stats: calls, joins)
  queue_t queue_;                          // before group_: the group's flights refer to it
  group_t group_;
};

}  // namespace singleflight
