// singleflight/cache_options.hpp
//
// The vocabulary of singleflight::cache (include <singleflight/cache.hpp>):
// `cache_options` (its construction-time settings), `freshness` and
// `cached<T>` (one answer), `load_result<T>` (what a loader may return
// instead of a T), `not_found_error`, `cache_stats` and its metrics table
// `metrics::cache_metrics`. Plain types: no state, no lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "detail/chrono.hpp"
#include "errors.hpp"
#include "metrics.hpp"
#include "options.hpp"
#include "stats.hpp"

namespace singleflight {

// freshness
//
// How a cache's answer relates to its windows.
enum class freshness {
  fresh,             // within ttl, or just loaded
  stale,             // past ttl, within stale_while_revalidate (a refresh is under way)
  stale_on_error,    // past its windows for normal use, served because a load failed
                     // within stale_if_error (no exception reached the caller)
  stale_on_timeout,  // past its windows for normal use, within stale_if_error, served
                     // because the load outlasted soft_timeout (the load goes on)
};

// load_owner
//
// Who runs and owns a load that a caller of get / get_entry / get_fresh /
// async_get / co_get starts (docs/cache.md, "Who runs a load").
enum class load_owner {
  // cache (default): the load belongs to the cache. A synchronous loader runs
  // on flight.executor when set, else on the cache's own threads (at most
  // max_threads), never on the caller's; every caller, the one that started
  // it included, waits as a follower and leaves on its token or wait_bound
  // at once, and no caller leaving stops the load: it runs to its end (or
  // flight.timeout, or close()) and publishes. flight.owner is not used.
  // A load started by a loader running on the cache's own threads runs on
  // that thread (a bounded pool must not wait on itself).
  cache,
  // caller: the group's rules (flight.owner). Without flight.executor the
  // first caller runs a synchronous loader on its own thread and returns
  // only when it does, whatever its token or bound; flight.owner decides
  // whether callers leaving stop the load.
  caller,
};

// cache_options
//
// Construction-time settings of a cache. The cache constructor throws
// std::invalid_argument when ttl <= 0, a duration is negative, jitter is not
// in [0, 1) or early_refresh_beta is negative, infinite or NaN.
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
  // Soft timeout: a caller waiting on a load of a key whose old value is
  // within stale_if_error gets that value (freshness::stale_on_timeout) once
  // it has waited this long, while the load goes on and publishes (under
  // load_owner::cache; under load_owner::caller flight.owner decides). A key
  // without such a value, get_fresh, a caller's own sooner wait_bound and an
  // inline leader (load_owner::caller without flight.executor) wait as
  // before; so does a caller whose old value is gone at the soft timeout
  // (invalidated, or past stale_if_error). Measured on steady_clock, as
  // wait_bound. Counted as a miss; not a failure (nothing is throttled).
  // 0 = off.
  std::chrono::nanoseconds soft_timeout{0};
  // Negative caching of failures: a failed load with no usable old value is
  // stored, and callers within error_ttl receive the same exception object
  // without a load. A failure with a usable old value throttles loads of its
  // key for error_ttl (default_error_throttle when 0). 0 = never stored.
  std::chrono::nanoseconds error_ttl{0};
  // Negative caching of "no such key" (load_result::not_found). 0 = never stored.
  std::chrono::nanoseconds not_found_ttl{0};
  // XFetch: a fresh read refreshes early, in the background, when
  // now - delta * beta * ln(u) >= expiry (u uniform in (0, 1], delta the
  // last load's duration). 1 is the usual value; 0 = off. Finite (an infinite
  // beta would refresh on every read).
  double early_refresh_beta = 0;
  // Bound on entries (values, cached not-founds and cached failures); size()
  // never exceeds it. Eviction: W-TinyLFU per shard. 0 = unbounded.
  std::size_t max_entries = 0;
  // Who runs and owns a caller's load; see load_owner.
  load_owner loads = load_owner::cache;
  // Bound on the cache's own threads (loads under load_owner::cache and
  // background refreshes, when flight.executor is empty): past it a load
  // queues for a free thread (its flight.timeout counts from the start of
  // the flight, queueing included). Threads are started on demand; an idle
  // one exits after 10 s. 0 = unbounded.
  std::size_t max_threads = 64;
  // The inner group's options: timeout (bounds every load, the background
  // refreshes included), max_in_flight, executor (where loads and
  // background refreshes run; the cache's own threads when empty), owner
  // (only under load_owner::caller: under load_owner::cache the cache owns
  // every load, as ownership::group).
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
// not_found_ttl (for not_found) for this write; jitter still applies. A value
// with a ttl <= 0 is handed to the load's callers and not stored: the key
// keeps what it had (an already-dead value would push out a live one). A
// not_found with a ttl <= 0 is not cached, and removes the key's old value.
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
class SINGLEFLIGHT_EXCEPTION_VISIBLE not_found_error : public error {
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
  std::uint64_t stale_on_timeout = 0;      // answers with freshness::stale_on_timeout: an old
                                           // value at soft_timeout (also in misses)
  std::uint64_t size = 0;                  // entries now (same as cache::size())
  // Gauges of the loads whose loader runs now (called and not returned; an asynchronous
  // loader until its completion is resolved), loads and background refreshes alike:
  std::uint64_t loads_running = 0;  // how many
  std::uint64_t loads_stuck = 0;    // of those, still running after their stop was requested
                                    // (flight.timeout passed, or close()): a loader that
                                    // ignores its stop_token holds a thread
  std::chrono::nanoseconds oldest_load_age{0};  // how long the oldest has run (0: none), by
                                                // the cache's Clock
};

}  // namespace singleflight

namespace singleflight::metrics {

namespace detail {
inline double oldest_load_age_seconds(const cache_stats& s) noexcept {
  return std::chrono::duration<double>(s.oldest_load_age).count();
}
}  // namespace detail

// cache_metrics: a cache's `stats()` (cache_stats) as named metrics, for any
// exporter that reads metrics::descriptor tables (metrics.hpp), e.g.
//   collector.add_source({{"cache", "profiles"}}, singleflight::metrics::cache_metrics,
//                        [&] { return profiles.stats(); });
// and the inner group's counters under group_metrics through flight_stats().
// The hit ratio is rate(hits + stale_hits) / rate(hits + stale_hits + misses).
inline constexpr std::array cache_metrics{
    counter<&cache_stats::hits>("singleflight_cache_hits_total",
                                "Lookups answered fresh from the cache"),
    counter<&cache_stats::stale_hits>("singleflight_cache_stale_hits_total",
                                      "Lookups answered stale (revalidating, or a failing origin)"),
    counter<&cache_stats::misses>("singleflight_cache_misses_total",
                                  "Lookups that waited on a load"),
    counter<&cache_stats::loads>("singleflight_cache_loads_total",
                                 "Loader invocations (origin calls)"),
    counter<&cache_stats::load_failures>("singleflight_cache_load_failures_total",
                                         "Loads that threw"),
    counter<&cache_stats::early_refreshes>("singleflight_cache_early_refreshes_total",
                                           "Background refreshes started early (XFetch)"),
    counter<&cache_stats::background_refreshes>(
        "singleflight_cache_background_refreshes_total",
        "Background refreshes started in the stale-while-revalidate window"),
    counter<&cache_stats::negative_hits>("singleflight_cache_negative_hits_total",
                                         "Lookups answered with a cached not-found or failure"),
    counter<&cache_stats::evictions>("singleflight_cache_evictions_total",
                                     "Entries removed to respect max_entries"),
    counter<&cache_stats::rejected_publishes>(
        "singleflight_cache_rejected_publishes_total",
        "Finished loads not stored: they started before a put, invalidate or clear"),
    counter<&cache_stats::stale_on_error>("singleflight_cache_stale_on_error_total",
                                          "Answers served stale because a load failed"),
    counter<&cache_stats::stale_on_timeout>(
        "singleflight_cache_stale_on_timeout_total",
        "Answers served stale because a load outlasted soft_timeout"),
    gauge<&cache_stats::size>("singleflight_cache_entries", "Entries held now"),
    gauge<&cache_stats::loads_running>("singleflight_cache_loads_running",
                                       "Loads whose loader runs now"),
    gauge<&cache_stats::loads_stuck>(
        "singleflight_cache_loads_stuck",
        "Loads still running after their stop was requested (flight.timeout, close)"),
    descriptor<cache_stats>{"singleflight_cache_oldest_load_age_seconds",
                            "How long the oldest running load has run", kind::gauge,
                            &detail::oldest_load_age_seconds},
};

}  // namespace singleflight::metrics
