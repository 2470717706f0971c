// singleflight/detail/cache/cache_calls.hpp -- internal; do not include directly.
//
// cache_calls<Key, T, Hash, KeyEqual, Clock>: what one call of singleflight::cache does,
// on the shared state (cache_core) it owns with every pending callback:
//   * keys: with_key() converts a key argument that cannot probe the table as it is, once,
//     before any lock; hash_of() is the mixed hash every layer below takes;
//   * the blocking path: the hit path (try_fresh), else lookup, then the decision's answer
//     (answered: served, not found, a cached failure, and the refresh it asks for), else a
//     load as a flight of the cache's group (load_blocking), with stale-if-error; the
//     caller's wait_bound, when given, bounds its wait on the group;
//   * the callback path: the same lookup and answer, then the load through group::async_do
//     (get_async, async_path); co_get's awaiter on top of it; get_many: one async caller per
//     key, all started before one wait for their outcomes (many_of);
//   * the cache-wide loader (shared_loader) is synchronous or asynchronous; each entry point
//     dispatches on its form once, so an asynchronous one takes the asynchronous path
//     everywhere (loads, refreshes) and holds no thread while pending;
//   * who runs a load (load_owner): under load_owner::cache the group owns every flight
//     (ownership::group) and a synchronous loader is handed to flight.executor or to the
//     cache's own bounded threads (hand_off, load_job), so every caller is a waiter that
//     may leave at once; a loader already on those threads runs a load it starts there
//     (hands_off). Under load_owner::caller the group's rules apply unchanged;
//   * refreshes: flights the cache owns, run on flight.executor or on the cache's own
//     threads (worker_threads), never on the reader's; they run the cache-wide loader
//     when there is one (wide_), else a copy of the call's loader; a loader (load or refresh)
//     that calls the cache for its own key on such a thread gets std::logic_error
//     (refresh_runs), as it would from the group on the caller's thread;
//   * close(): from one of the cache's threads it stops and rejects, and waits for nothing;
//   * compile time: a body that keeps a copy of the loader (a load on the cache's threads or
//     flight.executor, an asynchronous load, a refresh) keeps it type-erased (with_erased), so
//     the group's paths for it are instantiated once per cache type, not once per loader
//     type (two bodies: owned_fn for a synchronous loader on flight.executor, hand_off for
//     the rest); a synchronous loader reaches everything past the hit path borrowed as a
//     loader_ref (slow_ref, fresh_ref; slow_shared, fresh_shared for the cache-wide loader,
//     whichever its form), so the inline leader's body is one type per cache
//     type too, and the slow path one function per cache type, defined out of line with the
//     constructors, the destructor and close(): SINGLEFLIGHT_EXTERN_CACHE (cache.hpp) then
//     compiles it in one TU of the program. The callback path likewise: a synchronous loader
//     borrowed and the callback type-erased (outcome_callback), async_path is one function
//     per cache type (async_ref; async_shared for the cache-wide loader, whichever its form),
//     and so is get_many (many_ref, many_shared), all defined out of line. Per loader type:
//     loader_ref's thunks; per callback type: outcome_callback's three (call, move,
//     destroy); per asynchronous loader passed to a call: get_slow's and async_path's paths.
// The facade (cache.hpp) holds one and forwards to it.
//
// Locking: none of its own. The group's and the core's locks are taken inside their calls;
// no lock is held while user code runs here (the loader, the callback, Hash, copies of Key
// and T). `closed_` is a relaxed flag: a call that misses a concurrent close() is rejected
// by the group, or finds the entry close() leaves intact.
#pragma once

#include <atomic>
#include <concepts>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../errors.hpp"
#include "../../group.hpp"
#include "../../hash.hpp"
#include "../../outcome.hpp"
#include "../../stats.hpp"
#include "../../stop_token.hpp"
#include "../../wait_bound.hpp"
#include "../after.hpp"
#include "../chrono.hpp"
#include "../functional.hpp"
#include "../group/placement.hpp"
#include "../kept.hpp"
#include "../outcome_slot.hpp"
#include "../resume_gate.hpp"
#include "../unwind.hpp"
#include "../worker_threads.hpp"
#include "cache_core.hpp"
#include "loader_ref.hpp"
#include "outcome_callback.hpp"
#include "refresh_runs.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash = default_hash, class KeyEqual = std::equal_to<>,
          class Clock = std::chrono::steady_clock>
class cache_calls {
 public:
  using core = cache_core<Key, T, KeyEqual, Clock>;
  using loaded_t = typename core::loaded_t;
  using group_t = group<Key, loaded_t, Hash, KeyEqual>;
  using time_point = typename Clock::time_point;
  // A caller's wait_bound, when it gave one.
  using bound_t = std::optional<wait_bound>;

  // Throws std::invalid_argument for invalid options, and what group's constructor throws.
  // (The constructors, the destructor, close() and the slow path's entries are defined
  // below the class, out of line: an extern template declaration of a cache_calls type,
  // SINGLEFLIGHT_EXTERN_CACHE, then keeps a TU from instantiating them and everything only
  // they reach.)
  explicit cache_calls(const cache_options& opts);
  // With a cache-wide loader (shared_loader::of), used by the facade's get(key) family and
  // by every refresh.
  cache_calls(const cache_options& opts, shared_loader<Key, T> wide);
  cache_calls(const cache_calls&) = delete;
  cache_calls& operator=(const cache_calls&) = delete;
  ~cache_calls();

  // The cache-wide loader. Throws std::logic_error when the cache was built without one.
  const shared_loader<Key, T>& wide_loader() const {
    if (!wide_) {
      throw std::logic_error(
          "singleflight::cache: get(key) without a loader needs a cache-wide loader "
          "(cache(options, loader))");
    }
    return wide_;
  }

  // ---- keys ------------------------------------------------------------------------------

  // Whether K probes the table as it is (hash.hpp); otherwise it is converted to Key once,
  // before any lock.
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

  // ---- the blocking path -----------------------------------------------------------------

  // get(key, loader, caller, bound): the value itself (get's path: no cached<T> on a fresh
  // hit). A hit answers whatever the bound; only a wait on a load is bounded.
  template <class P, class L>
  T get(const P& key, L&& loader, stop_token caller, const bound_t& bound) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const std::uint64_t mixed = hash_of(key);
    const time_point now = Clock::now();
    bool fired = false;
    std::optional<T> hit;  // not a kept<T>: 3 instructions fewer a hit, and cached<T> has one
    if (try_fresh(key, mixed, now, fired, hit)) return std::move(*hit);
    cached<T> e = slow(key, std::forward<L>(loader), std::move(caller), bound, mixed, now, fired);
    if (!e.value) throw not_found_error();
    return std::move(*e.value);
  }

  // get_entry(key, loader, caller, bound, fresh): get_entry's path, and get_fresh's (fresh: a
  // load that started after this call, never the cache).
  template <class P, class L>
  cached<T> get_entry(const P& key, L&& loader, stop_token caller, const bound_t& bound,
                      bool fresh) {
    if (closed_.load(std::memory_order_relaxed)) throw closed_error();
    const std::uint64_t mixed = hash_of(key);
    if (fresh) {
      if constexpr (is_shared_loader<L, Key, T>) {
        return as_key(key, [&](const Key& k) {
          return fresh_shared(k, loader, std::move(caller), bound, mixed);
        });
      } else if constexpr (borrows<L>) {
        return as_key(key, [&](const Key& k) {
          return fresh_ref(k, loader_ref<Key, T>(loader), std::move(caller), bound, mixed);
        });
      } else {
        return load_fresh(key, std::forward<L>(loader), std::move(caller), bound, mixed);
      }
    }
    const time_point now = Clock::now();
    bool fired = false;
    kept<cached<T>> hit;
    if (try_fresh(key, mixed, now, fired, hit)) return std::move(*hit);
    return slow(key, std::forward<L>(loader), std::move(caller), bound, mixed, now, fired);
  }

  // ---- the callback path -----------------------------------------------------------------

  // get_async(key, loader, cb, caller, bound): answers from the cache (cb runs here) or starts
  // / joins a load whose outcome reaches cb (timeout_error once `bound` passes). A synchronous
  // loader and the callback reach the callback path borrowed and type-erased (loader_ref,
  // outcome_callback): async_ref, one function per cache type, the key as a Key (converted
  // once when the call probed with another type). An asynchronous loader takes async_path for
  // its own types.
  template <class P, class L, class Cb>
  void get_async(const P& key, L&& loader, Cb cb, stop_token caller, const bound_t& bound) {
    if constexpr (is_shared_loader<L, Key, T>) {
      as_key(key, [&](const Key& k) {
        async_shared(k, loader, outcome_callback<T>(std::move(cb)), std::move(caller), bound);
      });
    } else if constexpr (borrows<L>) {
      as_key(key, [&](const Key& k) {
        async_ref(k, loader_ref<Key, T>(loader), outcome_callback<T>(std::move(cb)),
                  std::move(caller), bound);
      });
    } else {
      async_path(key, std::forward<L>(loader), std::move(cb), std::move(caller), bound);
    }
  }

  // get_many(keys, loader, caller, bound): every key's lookup, and its load when it needs one,
  // through the callback path, all started before this thread waits on any; then one wait
  // for every outcome, in the keys' order. Each key is one async caller (its own copy of the
  // value; the same key twice joins one load). `caller` and `bound` apply to each key; a key
  // still loading when they fire gets cancelled_error / timeout_error from the group while
  // its load goes on and publishes. The wait itself ends when the last outcome arrives,
  // which the group delivers by the bound. Throws only what allocation throws. A synchronous
  // loader is borrowed (many_ref: one function per cache type).
  template <class L>
  std::vector<outcome<T>> get_many(std::span<const Key> keys, L&& loader, stop_token caller,
                                   const bound_t& bound) {
    if constexpr (is_shared_loader<L, Key, T>) {
      return many_shared(keys, loader, std::move(caller), bound);
    } else if constexpr (borrows<L>) {
      return many_ref(keys, loader_ref<Key, T>(loader), std::move(caller), bound);
    } else {
      return many_of(keys, [&](std::size_t i, const std::shared_ptr<many_outcomes>& st) {
        get_async(
            keys[i], loader, [st, i](outcome<T>&& o) noexcept { st->set(i, std::move(o)); }, caller,
            bound);
      });
    }
  }

  // The awaitable co_get returns: async_get on await_suspend, resumed through a resume_gate.
  template <class Facade, class K, class L>
  class get_awaitable {
   public:
    get_awaitable(Facade* c, const K& key, L& loader, stop_token caller, bound_t bound) noexcept
        : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)), bound_(bound) {}
    get_awaitable(const get_awaitable&) = delete;
    get_awaitable& operator=(const get_awaitable&) = delete;
    ~get_awaitable() = default;

    class awaiter {
     public:
      awaiter(Facade* c, const K& key, L& loader, stop_token caller, bound_t bound) noexcept
          : c_(c), key_(&key), loader_(&loader), caller_(std::move(caller)), bound_(bound) {}
      awaiter(const awaiter&) = delete;
      awaiter& operator=(const awaiter&) = delete;
      ~awaiter() = default;

      // Starts the lookup (and the load if needed); does not suspend when the outcome is
      // already there.
      bool await_ready() const noexcept { return false; }
      bool await_suspend(std::coroutine_handle<> h) {
        gate_.arm(h);
        auto on_done = [this](outcome<T>&& o) noexcept {
          put_outcome(result_, std::move(o));  // T's move: a throw is this caller's outcome
          gate_.complete();
        };
        if (bound_) {
          c_->async_get(*key_, *loader_, on_done, std::move(caller_), *bound_);
        } else {
          c_->async_get(*key_, *loader_, on_done, std::move(caller_));
        }
        return gate_.suspend();
      }
      T await_resume() { return std::move(*result_).value(); }

     private:
      Facade* c_;
      const K* key_;
      L* loader_;
      stop_token caller_;
      bound_t bound_;
      std::optional<outcome<T>> result_;
      detail::resume_gate gate_;
    };

    awaiter operator co_await() && {
      return awaiter(c_, *key_, *loader_, std::move(caller_), bound_);
    }

   private:
    Facade* c_;
    const K* key_;
    L* loader_;
    stop_token caller_;
    bound_t bound_;
  };

  // ---- the rest of the facade ------------------------------------------------------------

  core& state() const noexcept { return *core_; }
  singleflight::stats flight_stats() const { return group_.stats(); }

  // close(): see cache::close. On one of the cache's own threads (a loader or callback run
  // there) it stops and rejects without waiting; the destructor waits.
  void close();

 private:
  using node_t = typename core::node_t;
  using duration = typename Clock::duration;
  using decision = typename core::decision;
  static constexpr bool copy_inside = core::copy_inside;

  template <class P>
  static Key key_of(const P& key) {
    if constexpr (std::same_as<P, Key>) {
      return key;
    } else {
      return Key(key);
    }
  }

  // try_fresh(key, mixed, now, fired, out): the hit path: a fresh value that starts nothing,
  // copied out into the empty `out` (a std::optional<T> for get, a kept<cached<T>> with the
  // value's age and version for get_entry: no std::optional<cached<T>> to instantiate). False
  // otherwise, having changed nothing; `fired` then says whether XFetch's draw fired (the
  // lookup must not draw again).
  template <class P, class Out>
  bool try_fresh(const P& key, std::uint64_t mixed, time_point now, bool& fired, Out& out) {
    typename core::copied_t copy;
    value_ref<T> pin;
    duration age{};
    std::uint64_t version = 0;
    if (!core_->fresh_hit(key, mixed, now, copy, pin, age, version, fired)) return false;
    const T& v = [&]() -> const T& {
      if constexpr (copy_inside) {
        return *copy;
      } else {
        return *pin;  // copied below: no lock, no section
      }
    }();
    if constexpr (std::same_as<Out, std::optional<T>>) {
      out.emplace(v);
    } else {
      cached<T>& e = out.emplace();
      e.value.emplace(v);
      e.age = std::chrono::duration_cast<std::chrono::nanoseconds>(age);
      e.version = version;
    }
    return true;
  }

  // answered(key, mixed, loader, d, failed): what a decision that needs no load answers — a
  // value (starting the refresh the decision asks for) or a cached not-found (an entry without
  // a value) — or, in `failed`, the cached failure (an empty entry returned). Not an
  // outcome<cached<T>>: no outcome's or optional's layers to instantiate per T. Throws what
  // T's copy throws.
  template <class P, class L>
  cached<T> answered(const P& key, std::uint64_t mixed, L& loader, decision& d,
                     std::exception_ptr& failed) {
    if (d.what == decision::act::failed) {
      failed = d.error;
      return cached<T>{};
    }
    if (d.refresh != nullptr) {
      // A cache-wide loader runs every refresh: a refresh then never holds a copy of a
      // per-call loader, which may refer to its caller's frame.
      if (wide_ && wide_.is_async()) {
        auto started = wide_.async();
        start_refresh(key, mixed, started, d.refresh, d.refresh_id);
      } else if (wide_) {
        start_refresh(key, mixed, wide_, d.refresh, d.refresh_id);
      } else {
        start_refresh(key, mixed, loader, d.refresh, d.refresh_id);
      }
    }
    return std::move(d).entry();
  }

  // An async caller's value: the entry's, or not_found_error.
  static outcome<T> value_of(cached<T>&& e) {
    if (!e.value) return outcome<T>(std::make_exception_ptr(not_found_error()));
    return outcome<T>(std::in_place, std::move(*e.value));
  }

  // borrows<L>: a loader of type L reaches the slow path as a loader_ref (every synchronous
  // one: the cache-wide loader in its synchronous form too); an asynchronous one always runs
  // as a shared_loader, through get_slow / load_fresh for its type.
  template <class L>
  static constexpr bool borrows = !loader_traits<std::remove_cvref_t<L>, Key, T>::is_async;

  // as_key(key, f): f(k), k the key as a Key (converted once when the call probed with
  // another type: a flight and the loader take a Key anyway).
  template <class P, class F>
  static decltype(auto) as_key(const P& key, F&& f) {
    if constexpr (std::same_as<P, Key>) {
      return std::forward<F>(f)(key);
    } else {
      const Key k(key);
      return std::forward<F>(f)(k);
    }
  }

  // slow(key, loader, ...): a call the hit path did not answer: get_slow, for a synchronous
  // loader through slow_ref (one function per cache type, whatever the loader).
  template <class P, class L>
  cached<T> slow(const P& key, L&& loader, stop_token caller, const bound_t& bound,
                 std::uint64_t mixed, time_point now, bool fired) {
    if constexpr (is_shared_loader<L, Key, T>) {
      return as_key(key, [&](const Key& k) {
        return slow_shared(k, loader, std::move(caller), bound, mixed, now, fired);
      });
    } else if constexpr (borrows<L>) {
      return as_key(key, [&](const Key& k) {
        return slow_ref(k, loader_ref<Key, T>(loader), std::move(caller), bound, mixed, now, fired);
      });
    } else {
      return get_slow(key, std::forward<L>(loader), std::move(caller), bound, mixed, now, fired);
    }
  }

  // slow_ref / fresh_ref: get's and get_entry's slow path and get_fresh's load for a
  // borrowed loader; defined out of line, below the class.
  cached<T> slow_ref(const Key& key, loader_ref<Key, T> loader, stop_token caller,
                     const bound_t& bound, std::uint64_t mixed, time_point now, bool fired);
  cached<T> fresh_ref(const Key& key, loader_ref<Key, T> loader, stop_token caller,
                      const bound_t& bound, std::uint64_t mixed);
  // slow_shared / fresh_shared: the same for the cache-wide loader, synchronous (borrowed) or
  // asynchronous (its async form: one type per cache type); defined out of line, below.
  cached<T> slow_shared(const Key& key, const shared_loader<Key, T>& loader, stop_token caller,
                        const bound_t& bound, std::uint64_t mixed, time_point now, bool fired);
  cached<T> fresh_shared(const Key& key, const shared_loader<Key, T>& loader, stop_token caller,
                         const bound_t& bound, std::uint64_t mixed);

  // async_ref / many_ref: get_async's callback path and get_many for a borrowed loader;
  // async_shared / many_shared: the same for the cache-wide loader, synchronous (borrowed)
  // or asynchronous (its async form: one type per cache type too). Defined out of line,
  // below the class; async_ref and async_shared hash the key themselves.
  void async_ref(const Key& key, loader_ref<Key, T> loader, outcome_callback<T> cb,
                 stop_token caller, const bound_t& bound);
  void async_shared(const Key& key, const shared_loader<Key, T>& loader, outcome_callback<T> cb,
                    stop_token caller, const bound_t& bound);
  std::vector<outcome<T>> many_ref(std::span<const Key> keys, loader_ref<Key, T> loader,
                                   stop_token caller, const bound_t& bound);
  std::vector<outcome<T>> many_shared(std::span<const Key> keys,
                                      const shared_loader<Key, T>& loader, stop_token caller,
                                      const bound_t& bound);

  // async_path(key, loader, cb, caller, bound): get_async past the loader's dispatch: the
  // closed check, the lookup and its answer (delivered here), else the load through
  // group::async_do, its outcome (stale-if-error, soft_timeout, the caller's bound) delivered
  // where the group delivers it. Instantiated once a cache type by async_ref (a loader_ref,
  // an outcome_callback), else once per asynchronous loader and callback type.
  template <class P, class L, class Cb>
  void async_path(const P& key, L&& loader, Cb cb, stop_token caller, const bound_t& bound) {
    if (closed_.load(std::memory_order_relaxed)) {
      deliver(cb, outcome<T>(std::make_exception_ptr(closed_error())));
      return;
    }
    const std::uint64_t mixed = hash_of(key);
    core* c = core_.get();
    decision d = c->lookup(key, mixed, Clock::now(), false);
    if (d.what != decision::act::load && d.what != decision::act::load_fresh) {
      std::optional<outcome<T>> o;
      try {
        std::exception_ptr failed;
        cached<T> a = answered(key, mixed, loader, d, failed);
        o.emplace(failed ? outcome<T>(failed) : value_of(std::move(a)));
      } catch (...) {
        o.emplace(std::current_exception());
      }
      deliver(cb, std::move(*o));
      return;
    }
    node_t* pinned = d.pinned;
    const std::uint64_t seen = d.seen;
    try {
      using traits = detail::loader_traits<std::decay_t<L>, Key, T>;
      const bool off = !traits::is_async && hands_off();
      const waits w = waits_of(c, pinned, bound, false, true);
      // group has no asynchronous do_fresh: on act::load_fresh (a load that started before an
      // invalidation is still running) an async caller may join that load (docs/cache.md,
      // "Choices").
      with_erased(std::forward<L>(loader), [&](const shared_loader<Key, T>& e) {
        async_wait<Cb> on_done{this, core_, pinned, seen, w, std::move(cb), {}};
        if (w.soft) {
          // A caller that may leave at the soft timeout and find no old value left waits on
          // (ending::rejoin): it keeps what it needs to join the load again.
          on_done.again = std::make_unique<rejoin_state>(
              rejoin_state{key_of(key), mixed, e, caller, !traits::is_async && !off});
        }
        if constexpr (!traits::is_async) {
          if (!off) {
            async_flight(key, owned_fn(key_of(key), mixed, e, true), std::move(on_done),
                         std::move(caller), w.wait);
            return;
          }
        }
        async_flight(key, hand_off(key_of(key), mixed, e, true), std::move(on_done),
                     std::move(caller), w.wait);
      });
    } catch (...) {
      if (pinned != nullptr) c->unpin(pinned);
      throw;
    }
  }

  // get_many's outcomes: slot i for keys[i], filled by its callback on any thread. T's move
  // (user code) runs outside `m`: a slot is written once, by its key's callback alone, and read
  // by the waiter only after `left`, under m, says every slot is written. A move that throws
  // fills the slot with its exception (detail/outcome_slot.hpp), counted all the same.
  struct many_outcomes {
    std::mutex m;
    std::condition_variable cv;
    std::size_t left = 0;                        // m
    std::vector<std::optional<outcome<T>>> out;  // slot i: its callback's, then the waiter's
    void set(std::size_t i, outcome<T>&& o) noexcept {
      put_outcome(out[i], std::move(o));
      const std::lock_guard<std::mutex> lk(m);
      if (--left == 0) cv.notify_all();  // under m: the waiter may free it after
    }
  };

  // many_of(keys, start): start(i, st) for every key (an async caller whose callback fills
  // slot i of st), then one wait for every outcome, in the keys' order.
  template <class Start>
  static std::vector<outcome<T>> many_of(std::span<const Key> keys, Start&& start) {
    auto st = std::make_shared<many_outcomes>();
    st->out.resize(keys.size());
    st->left = keys.size();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      try {
        start(i, st);
      } catch (...) {  // Hash, KeyEqual, a copy or allocation threw: on_done never runs
        st->set(i, outcome<T>(std::current_exception()));
      }
    }
    std::vector<outcome<T>> res;
    res.reserve(keys.size());
    {
      std::unique_lock<std::mutex> lk(st->m);
      st->cv.wait(lk, [&] { return st->left == 0; });
    }
    for (auto& o : st->out) append_outcome(res, std::move(*o));  // T's moves: no lock
    return res;
  }

  // load_fresh(key, loader, ...): get_fresh's load: counted as a miss, announced to the
  // writers (fresh_waiter), never answered from the cache.
  template <class P, class L>
  cached<T> load_fresh(const P& key, L&& loader, stop_token caller, const bound_t& bound,
                       std::uint64_t mixed) {
    core* c = core_.get();
    auto& sc = c->table.stripe(c->table.gate().my_stripe());
    sc.add(sc.misses);
    const typename core::fresh_waiter announced(c, key, mixed);
    return load_blocking(key, mixed, std::forward<L>(loader), nullptr, std::move(caller), bound,
                         true, 0);
  }

  template <class P, class L>
  cached<T> get_slow(const P& key, L&& loader, stop_token caller, const bound_t& bound,
                     std::uint64_t mixed, time_point now, bool fired) {
    core* c = core_.get();
    decision d = c->lookup(key, mixed, now, fired);
    if (d.what != decision::act::load && d.what != decision::act::load_fresh) {
      std::exception_ptr failed;
      cached<T> a = answered(key, mixed, loader, d, failed);
      if (failed) std::rethrow_exception(failed);
      return a;
    }
    const typename core::pin held(c, d.pinned);
    return load_blocking(key, mixed, std::forward<L>(loader), d.pinned, std::move(caller), bound,
                         d.what == decision::act::load_fresh, d.seen);
  }

  // A flight body that owns copies of the key and the loader (executor flights, async
  // callers, refreshes: it may outlive the caller's frame).
  template <class L>
  auto owned_fn(const Key& key, std::uint64_t mixed, L&& loader, bool foreground) {
    using Ld = std::decay_t<L>;
    core* c = core_.get();
    if constexpr (detail::loader_traits<Ld, Key, T>::is_async) {
      return [c, key, mixed, foreground, loader = Ld(std::forward<L>(loader))](
                 stop_token st, completion<loaded_t> done) mutable {
        c->run_async(key, mixed, loader, st, done, foreground);
      };
    } else {
      // task_only (placement.hpp): a sync owned_fn runs on flight.executor (load_blocking,
      // start_erased_refresh) or is started by async_do, never inline by a blocked leader.
      auto body = [c, key, mixed, foreground,
                   loader = Ld(std::forward<L>(loader))](stop_token st) mutable -> loaded_t {
        return c->run_sync(key, mixed, loader, st, foreground);
      };
      return task_only<decltype(body)>{std::move(body)};
    }
  }

  using steady = std::chrono::steady_clock;

  // waits: how long one caller waits on a load — its own bound, or the sooner soft_timeout
  // when the key has an old value within stale_if_error — and what it gets when that passes.
  struct waits {
    bound_t wait;                            // what the group is given
    bound_t bound;                           // the caller's own bound, as given
    std::optional<steady::time_point> own;   // the caller's own bound
    std::optional<steady::time_point> soft;  // soft_timeout's bound, when it is the sooner

    // How a wait on the group that ended in an exception ends for this caller (left()).
    enum class ending {
      load,    // not this caller's bound passing (an origin failure, flight.timeout, ...)
      bound,   // its own bound passed: the timeout_error is the answer (no stale, no throttle)
      stale,   // the soft bound passed: the old value is the answer
      rejoin,  // the soft bound passed with no old value left (removed or run out during the
               // wait): the caller waits on for the same load under its own bound (rejoined())
    };

    // left(e, c, n, out): how a load that ended in `e` for this caller ends; on
    // ending::stale, n's old value as stale_on_timeout in `out` (an empty cached<T>).
    ending left(const std::exception_ptr& e, core* c, node_t* n, cached<T>& out) const {
      if (!own && !soft) return ending::load;
      const steady::time_point now = steady::now();
      const bool own_passed = own && now >= *own;
      const bool soft_passed = soft && now >= *soft;
      if (!own_passed && !soft_passed) return ending::load;
      if (!is_timeout(e)) return ending::load;
      if (own_passed) return ending::bound;
      return c->serve_on_timeout(n, out) ? ending::stale : ending::rejoin;
    }

    // rejoined(): the waits of a caller that goes on waiting after ending::rejoin: its own
    // bound alone (none: until the load settles), as a caller without an old value waits.
    waits rejoined() const {
      waits w;
      w.wait = bound;
      w.bound = bound;
      w.own = own;
      return w;
    }
  };

  static bool is_timeout(const std::exception_ptr& e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const timeout_error&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  // waits_of(c, n, bound, fresh, may_leave): a caller's waits. soft_timeout applies to a
  // caller that can leave before the loader returns (not an inline leader), not to get_fresh,
  // and only when n holds a value within stale_if_error now.
  waits waits_of(core* c, node_t* n, const bound_t& bound, bool fresh, bool may_leave) const {
    waits w;
    w.wait = bound;
    w.bound = bound;
    if (bound) w.own = bound->deadline();
    if (soft_timeout_ > std::chrono::nanoseconds::zero() && may_leave && !fresh &&
        c->usable_old(n)) {
      const steady::time_point at = detail::after(steady::now(), soft_timeout_);
      if (!w.own || at < *w.own) {
        w.soft = at;
        w.wait = wait_bound(at);
      }
    }
    return w;
  }

  // rejoin_state: what an async caller with a soft bound keeps to join its load again
  // (waits::ending::rejoin): the key, the erased loader, the caller's token, and whether a
  // synchronous loader runs on flight.executor (owned_fn) rather than through hand_off.
  struct rejoin_state {
    Key key;
    std::uint64_t mixed;
    shared_loader<Key, T> loader;
    stop_token caller;
    bool owned_body;
  };

  // async_wait<Cb>: the group callback of one async_path caller. Maps the load's outcome to
  // the caller's (its copy of the value, not_found_error, a stale-if-error or soft-timeout
  // answer, the exception) and delivers it to `cb`, unpinning the node. On
  // waits::ending::rejoin it joins the load again under the caller's own bound with itself as
  // the callback (once: the rejoined waits have no soft bound), the pin and `cb` moving along.
  // Runs where the group delivers; `self` outlives it (close() waits for async callers).
  template <class Cb>
  struct async_wait {
    cache_calls* self;
    counted_ptr<core> owner;
    node_t* pinned;
    std::uint64_t seen;
    waits w;
    Cb cb;
    std::unique_ptr<rejoin_state> again;  // set when w has a soft bound

    void operator()(outcome<loaded_t> o) noexcept {
      std::optional<outcome<T>> out;
      {
        typename core::pin held(owner.get(), pinned);
        try {
          if (o.has_value()) {
            const loaded_t& r = o.value();
            if (r.value) {
              out.emplace(std::in_place, *r.value);  // this caller's copy
            } else {
              out.emplace(std::make_exception_ptr(not_found_error()));
            }
          } else {
            cached<T> e;
            switch (w.left(o.error(), owner.get(), pinned, e)) {
              case waits::ending::bound:  // its own bound: the timeout_error is the answer
                out.emplace(o.error());
                break;
              case waits::ending::stale:  // serve_on_timeout gave a value
                out.emplace(std::in_place, std::move(*e.value));
                break;
              case waits::ending::rejoin:
                (void)held.release();  // the pin moves to the rejoined wait
                rejoin();
                return;
              case waits::ending::load:
                if (owner->serve_on_error(pinned, seen, o.error(), e)) {  // gives a value
                  out.emplace(std::in_place, std::move(*e.value));
                } else {
                  out.emplace(o.error());
                }
                break;
            }
          }
        } catch (...) {
          out.emplace(std::current_exception());
        }
      }
      deliver(cb, std::move(*out));
    }

    // rejoin(): joins the load again (a new one if it settled meanwhile), this callback moved
    // into the new wait; what async_do throws before attaching is delivered to `cb`.
    void rejoin() noexcept {
      const std::unique_ptr<rejoin_state> st = std::move(again);
      cache_calls* s = self;
      node_t* n = pinned;
      counted_ptr<core> keep = owner;
      try {
        w = w.rejoined();
        if (st->owned_body) {
          s->async_flight(st->key, s->owned_fn(st->key, st->mixed, st->loader, true),
                          std::move(*this), st->caller, w.wait);
        } else {
          s->async_flight(st->key, s->hand_off(st->key, st->mixed, st->loader, true),
                          std::move(*this), st->caller, w.wait);
        }
      } catch (...) {
        if (n != nullptr) keep->unpin(n);
        deliver(cb, outcome<T>(std::current_exception()));
      }
    }
  };

  // The group's options: under load_owner::cache the cache owns every load (no caller
  // leaving stops one).
  static options group_options(const cache_options& o) {
    options f = o.flight;
    if (o.loads == load_owner::cache) f.owner = ownership::group;
    return f;
  }

  // Whether a synchronous loader of a caller's load runs on the cache's own threads: under
  // load_owner::cache without flight.executor, unless this thread is one of them (a loader
  // loading another key: a bounded pool must not wait on itself, so it runs here).
  bool hands_off() const { return owned_ && !group_has_executor_ && !threads_.on_own_thread(); }

  template <class P, class Fn, class Cb>
  void async_flight(const P& key, Fn&& body, Cb&& on_done, stop_token caller,
                    const bound_t& bound) {
    if (bound) {
      group_.async_do(key, std::forward<Fn>(body), std::forward<Cb>(on_done), std::move(caller),
                      *bound);
    } else {
      group_.async_do(key, std::forward<Fn>(body), std::forward<Cb>(on_done), std::move(caller));
    }
  }

  // hand_off(key, mixed, loader, foreground): a flight body (asynchronous) holding a copy of
  // the erased loader (with_erased). A synchronous loader is posted to the cache's own threads
  // and the body returns; the job completes the flight. After close() the job dies unrun and
  // its completion breaks (the flight's waiters get closed_error from the group's close). An
  // asynchronous loader is started on the calling thread, as owned_fn starts it. One type per
  // cache type: every asynchronous body that keeps a loader is this one.
  auto hand_off(Key key, std::uint64_t mixed, const shared_loader<Key, T>& loader,
                bool foreground) {
    return [this, k = std::move(key), mixed, foreground, ld = loader](
               stop_token st, completion<loaded_t> d) mutable {
      if (ld.is_async()) {
        auto started = ld.async();
        core_->run_async(k, mixed, started, st, d, foreground);
        return;
      }
      // Owned as a job from the start: no unique_ptr<load_job<...>> is instantiated.
      std::unique_ptr<detail::worker_threads::job> j(new load_job<shared_loader<Key, T>>(
          core_.get(), &runs_, std::move(k), mixed, std::move(ld), std::move(st), std::move(d),
          foreground));
      (void)threads_.post(j);  // after close(): j dies here, unrun (its completion breaks)
    };
  }

  template <class P, class L>
  cached<T> load_blocking(const P& key, std::uint64_t mixed, L&& loader, node_t* pinned,
                          stop_token caller, const bound_t& bound, bool fresh, std::uint64_t seen) {
    using Ld = std::remove_reference_t<L>;
    core* c = core_.get();
    if (runs_.running_here(key, mixed, c->eq)) {
      throw std::logic_error(
          "singleflight::cache: a loader called the cache for its own key on the cache's "
          "thread running it; it would wait for itself forever");
    }
    call_info info;
    loaded_t r{};
    using traits = detail::loader_traits<std::decay_t<L>, Key, T>;
    const bool off = !traits::is_async && hands_off();
    const bool may_leave = traits::is_async || off || group_has_executor_;
    waits w = waits_of(c, pinned, bound, fresh, may_leave);
    bool fresh_flight = fresh;
    for (;;) {
      try {
        const auto run = [&](bool new_flight) -> loaded_t {
          if constexpr (!traits::is_async) {
            if (!off && !group_has_executor_) {
              // Inline: the leader runs the loader on this thread and cannot leave before it
              // returns, so the body may refer to this frame.
              const auto run_inline = [&](const auto& k) {
                // inline_only (placement.hpp): the group has no executor here; it compiles no task.
                auto body = [c, &k, mixed, &loader, new_flight](stop_token st) -> loaded_t {
                  return c->run_sync(k, mixed, static_cast<Ld&>(loader), st, !new_flight);
                };
                return flight(key, inline_only<decltype(body)>{body}, caller, w.wait, new_flight,
                              info);
              };
              if constexpr (traits::takes_key && !std::same_as<P, Key>) {
                return run_inline(key_of(key));  // the loader receives a Key
              } else {
                return run_inline(key);
              }
            }
          }
          // A body that keeps a copy of the loader (the cache's threads, flight.executor, an
          // asynchronous loader): through the erased loader.
          return with_erased(loader, [&](const shared_loader<Key, T>& e) -> loaded_t {
            if constexpr (!traits::is_async) {
              if (!off) {
                return flight(key, owned_fn(key_of(key), mixed, e, !new_flight), caller, w.wait,
                              new_flight, info);
              }
            }
            return flight(key, hand_off(key_of(key), mixed, e, !new_flight), caller, w.wait,
                          new_flight, info);
          });
        };
        r = run(fresh_flight);
        // A load that started before a write this call saw (it joined a flight that was still
        // settling when the call looked): take a newer one.
        if (fresh_flight || r.version >= seen) break;
        fresh_flight = true;
      } catch (...) {
        const std::exception_ptr ep = std::current_exception();
        cached<T> e;
        switch (w.left(ep, c, pinned, e)) {
          case waits::ending::bound:
            throw;  // its own bound: not an origin failure (no stale, no throttle)
          case waits::ending::stale:
            e.taken_as = info.role;
            return e;
          case waits::ending::rejoin:
            // No old value left at the soft timeout: wait on for the load under the caller's
            // own bound (the group joins the flight still running).
            w = w.rejoined();
            continue;
          case waits::ending::load:
            break;
        }
        if (c->serve_on_error(pinned, seen, ep, e)) {
          e.taken_as = info.role;
          return e;
        }
        throw;
      }
    }
    // Outside the try: the load succeeded, so a throwing copy of T is this caller's error,
    // never an origin failure (no stale-if-error answer, no throttle).
    return core::entry_of(r, info.role);
  }

  // flight(key, body, caller, bound, fresh, info): one blocking wait on the group, bounded by
  // `bound` when the caller gave one.
  template <class P, class F>
  loaded_t flight(const P& key, F&& body, const stop_token& caller, const bound_t& bound,
                  bool fresh, call_info& info) {
    if (bound) {
      return fresh ? group_.do_fresh(key, std::forward<F>(body), caller, *bound, info)
                   : group_.do_(key, std::forward<F>(body), caller, *bound, info);
    }
    return fresh ? group_.do_fresh(key, std::forward<F>(body), caller, info)
                 : group_.do_(key, std::forward<F>(body), caller, info);
  }

  // A background refresh: a flight the cache owns (no caller token). A synchronous loader
  // runs on flight.executor or on the cache's threads, never on this thread; an asynchronous
  // one is started here (it returns at once) and holds no thread while it is pending.
  template <class P, class L>
  void start_refresh(const P& key, std::uint64_t mixed, L& loader, node_t* n,
                     std::uint32_t id) noexcept {
    try {
      with_erased(loader, [&](const shared_loader<Key, T>& e) {
        start_erased_refresh(key, mixed, e, n, id);
      });
    } catch (...) {
      // The loader's copy or async_do threw before attaching: on_done never runs.
      core_->refresh_done(n, id);
    }
  }

  // start_refresh's flight, for an erased loader (with_erased): one instantiation per cache
  // type. Throws what async_do throws before attaching.
  template <class P>
  void start_erased_refresh(const P& key, std::uint64_t mixed, const shared_loader<Key, T>& loader,
                            node_t* n, std::uint32_t id) {
    if (group_has_executor_ && !loader.is_async()) {
      group_.async_do(key, owned_fn(key_of(key), mixed, loader, false), refresh_end(n, id));
    } else {
      group_.async_do(key, hand_off(key_of(key), mixed, loader, false), refresh_end(n, id));
    }
  }

  // refresh_end(n, id): a refresh's on_done: the refresh of n numbered id is over.
  auto refresh_end(node_t* n, std::uint32_t id) const {
    return [owner = core_, n, id](outcome<loaded_t>&&) noexcept { owner->refresh_done(n, id); };
  }

  // with_erased(loader, f): f(e), e the loader type-erased as a shared_loader (synchronous or
  // asynchronous; the cache-wide loader as it is). A body that keeps a copy of the loader
  // (owned_fn for a synchronous one, hand_off, load_job) is then one type per cache type
  // whatever the loader, and so is what the group instantiates for it: each loader type
  // instantiates only its inline path. Copies (or moves, from an rvalue) the loader once, as
  // the body would have; throws what that copy throws.
  template <class L, class F>
  static decltype(auto) with_erased(L&& loader, F&& f) {
    using Ld = std::remove_cvref_t<L>;
    if constexpr (is_shared_loader<Ld, Key, T>) {
      return std::forward<F>(f)(std::as_const(loader));
    } else if constexpr (std::same_as<Ld, loader_ref<Key, T>>) {
      const shared_loader<Key, T> erased = loader.share();
      return std::forward<F>(f)(erased);
    } else if constexpr (std::same_as<Ld, typename shared_loader<Key, T>::async_form>) {
      const shared_loader<Key, T> erased = loader.loader();
      return std::forward<F>(f)(erased);
    } else {
      const shared_loader<Key, T> erased = shared_loader<Key, T>::of(std::forward<L>(loader));
      return std::forward<F>(f)(erased);
    }
  }

  // A load or a refresh on the cache's own threads (hand_off): runs the loader with its key
  // marked as running on this thread (refresh_runs), and completes the flight.
  template <class Ld>
  struct load_job final : detail::worker_threads::job {
    load_job(core* c_in, refresh_runs<Key, KeyEqual>* runs_in, Key k, std::uint64_t mixed_in, Ld ld,
             stop_token st_in, completion<loaded_t> d, bool foreground_in)
        : c(c_in),
          runs(runs_in),
          key(std::move(k)),
          mixed(mixed_in),
          loader(std::move(ld)),
          st(std::move(st_in)),
          done(std::move(d)),
          foreground(foreground_in) {}
    void run() override {  // throws only a forced unwind (the thread then ends)
      try {
        if (st.stop_requested()) throw cancelled_error();
        const typename refresh_runs<Key, KeyEqual>::scope running(*runs, key, mixed);
        if constexpr (detail::loader_traits<Ld, Key, T>::is_async) {
          c->run_async(key, mixed, loader, st, done, foreground);
        } else {
          done.set_value(c->run_sync(key, mixed, loader, st, foreground));
        }
      } catch (...) {
        SINGLEFLIGHT_RETHROW_FOREIGN();
        if (done) done.set_exception(std::current_exception());
      }
    }
    core* c;
    refresh_runs<Key, KeyEqual>* runs;  // the cache's: the job runs on its threads, joined first
    Key key;
    std::uint64_t mixed;
    Ld loader;
    stop_token st;
    completion<loaded_t> done;
    bool foreground;
  };

  template <class Cb>
  static void deliver(Cb& cb, outcome<T>&& o) noexcept {
    ::singleflight::detail::invoke(cb, std::move(o));  // a throw terminates (noexcept)
  }

  [[no_unique_address]] Hash hash_{};
  shared_loader<Key, T> wide_;  // set at construction, read-only after
  counted_ptr<core> core_;      // shared with pending callbacks (counted.hpp)
  std::atomic<bool> closed_{false};
  bool owned_ = true;  // load_owner::cache
  std::chrono::nanoseconds soft_timeout_{0};
  bool group_has_executor_ = false;
  group_t group_;
  refresh_runs<Key, KeyEqual> runs_;  // the loads and refreshes on threads_ now
  detail::worker_threads threads_;    // declared after group_: destroyed (joined) first
};

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cache_calls<Key, T, Hash, KeyEqual, Clock>::cache_calls(const cache_options& opts)
    // Counted by counted_ptr (the core derives from counted_box), not std::shared_ptr:
    // no control block to instantiate for each cache type.
    : core_(new core(opts)),
      owned_(opts.loads == load_owner::cache),
      soft_timeout_(opts.soft_timeout),
      group_has_executor_(static_cast<bool>(opts.flight.executor)),
      group_(group_options(opts)),
      threads_(detail::worker_threads::default_idle_for, opts.max_threads) {}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cache_calls<Key, T, Hash, KeyEqual, Clock>::cache_calls(const cache_options& opts,
                                                        shared_loader<Key, T> wide)
    : cache_calls(opts) {
  wide_ = std::move(wide);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cache_calls<Key, T, Hash, KeyEqual, Clock>::~cache_calls() {
  close();
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
void cache_calls<Key, T, Hash, KeyEqual, Clock>::close() {
  closed_.store(true, std::memory_order_relaxed);
  if (threads_.on_own_thread()) {
    (void)group_.close_for(std::chrono::nanoseconds::zero());
    threads_.close();
    return;
  }
  if (core_->publishing_here()) {
    // A destructor run by an asynchronous load's publication, on the thread that resolves the
    // load: its flight settles only after this returns. Stop and reject, wait for nothing.
    (void)group_.close_for(std::chrono::nanoseconds::zero());
    threads_.stop();
    return;
  }
  group_.close();
  threads_.close();
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cached<T> cache_calls<Key, T, Hash, KeyEqual, Clock>::slow_ref(
    const Key& key, loader_ref<Key, T> loader, stop_token caller, const bound_t& bound,
    std::uint64_t mixed, time_point now, bool fired) {
  return get_slow(key, loader, std::move(caller), bound, mixed, now, fired);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cached<T> cache_calls<Key, T, Hash, KeyEqual, Clock>::fresh_ref(const Key& key,
                                                                loader_ref<Key, T> loader,
                                                                stop_token caller,
                                                                const bound_t& bound,
                                                                std::uint64_t mixed) {
  return load_fresh(key, loader, std::move(caller), bound, mixed);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cached<T> cache_calls<Key, T, Hash, KeyEqual, Clock>::slow_shared(
    const Key& key, const shared_loader<Key, T>& loader, stop_token caller, const bound_t& bound,
    std::uint64_t mixed, time_point now, bool fired) {
  if (loader.is_async()) {
    auto started = loader.async();
    return get_slow(key, started, std::move(caller), bound, mixed, now, fired);
  }
  return slow_ref(key, loader_ref<Key, T>(loader), std::move(caller), bound, mixed, now, fired);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
cached<T> cache_calls<Key, T, Hash, KeyEqual, Clock>::fresh_shared(
    const Key& key, const shared_loader<Key, T>& loader, stop_token caller, const bound_t& bound,
    std::uint64_t mixed) {
  if (loader.is_async()) {
    auto started = loader.async();
    return load_fresh(key, started, std::move(caller), bound, mixed);
  }
  return fresh_ref(key, loader_ref<Key, T>(loader), std::move(caller), bound, mixed);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
void cache_calls<Key, T, Hash, KeyEqual, Clock>::async_ref(const Key& key,
                                                           loader_ref<Key, T> loader,
                                                           outcome_callback<T> cb,
                                                           stop_token caller,
                                                           const bound_t& bound) {
  async_path(key, loader, std::move(cb), std::move(caller), bound);
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
void cache_calls<Key, T, Hash, KeyEqual, Clock>::async_shared(const Key& key,
                                                              const shared_loader<Key, T>& loader,
                                                              outcome_callback<T> cb,
                                                              stop_token caller,
                                                              const bound_t& bound) {
  if (loader.is_async()) {
    auto started = loader.async();
    async_path(key, started, std::move(cb), std::move(caller), bound);
  } else {
    async_ref(key, loader_ref<Key, T>(loader), std::move(cb), std::move(caller), bound);
  }
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
std::vector<outcome<T>> cache_calls<Key, T, Hash, KeyEqual, Clock>::many_shared(
    std::span<const Key> keys, const shared_loader<Key, T>& loader, stop_token caller,
    const bound_t& bound) {
  return many_of(keys, [&](std::size_t i, const std::shared_ptr<many_outcomes>& st) {
    async_shared(keys[i], loader, outcome_callback<T>([st, i](outcome<T>&& o) noexcept {
                   st->set(i, std::move(o));
                 }),
                 caller, bound);
  });
}

template <class Key, class T, class Hash, class KeyEqual, class Clock>
std::vector<outcome<T>> cache_calls<Key, T, Hash, KeyEqual, Clock>::many_ref(
    std::span<const Key> keys, loader_ref<Key, T> loader, stop_token caller, const bound_t& bound) {
  return many_of(keys, [&](std::size_t i, const std::shared_ptr<many_outcomes>& st) {
    async_ref(keys[i], loader,
              outcome_callback<T>([st, i](outcome<T>&& o) noexcept { st->set(i, std::move(o)); }),
              caller, bound);
  });
}

}  // namespace singleflight::detail
