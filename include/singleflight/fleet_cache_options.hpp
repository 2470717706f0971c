// singleflight/fleet_cache_options.hpp
//
// What configures and reports a `singleflight::fleet_cache` (fleet_cache.hpp):
// `fleet_coherence`, `fleet_cache_options`, `fleet_cache_stats`, and the
// metrics table of fleet_cache's own counters, `metrics::fleet_cache_metrics`.
// Plain types: no state, no lock, no hiredis (fleet_cache.hpp needs it; this
// header does not, so an exporter can name the table without linking the
// fleet).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "cache_options.hpp"
#include "detail/chrono.hpp"
#include "fleet_options.hpp"
#include "metrics.hpp"

namespace singleflight {

// fleet_coherence: how a fleet_cache hears of writes it did not make.
enum class fleet_coherence {
  // Redis's client tracking (CLIENT TRACKING on REDIRECT BCAST PREFIX, Redis
  // 6+): every change of a value under the fleet's prefix, by anyone (another
  // fleet_cache, a DEL or SET from redis-cli, expiry, FLUSHALL, this process's
  // own stores too).
  tracking,
  // The bus: only other fleet_caches' put and invalidate (for servers that
  // refuse CLIENT TRACKING REDIRECT). Under `tracking`, a process whose
  // server refuses CLIENT TRACKING falls back to it by itself.
  publish,
};

// fleet_cache_options
struct fleet_cache_options {
  // The local cache in front (ttl, jitter, stale_while_revalidate,
  // max_entries, threads...). Its ttl bounds how long a process may serve a
  // value while it hears nothing from the bus (a gap).
  cache_options local;
  // The fleet behind it (redis_uri, key_prefix, value_ttl, lease_ttl...).
  fleet_options fleet;
  // Keys heard on the bus and not yet dropped from the local cache (they
  // are dropped by the next call); beyond this, which keys changed is lost,
  // as in a gap: every local entry is marked stale (cache::expire_all), and
  // the keys recorded are still dropped. At least 1.
  std::size_t max_pending_invalidations = 4096;
  // How long, at most, a gap's mark (or an overflow's) may be answered stale:
  // from the moment it is posted (the confirmations are all in, or the
  // overflow happened; the first call after it applies it), a local value stored before it is
  // returned (freshness::stale, while one refresh reads it again through the fleet) for at most
  // this long, and never past the local stale_while_revalidate; after that a get of the key waits
  // on that refresh (joins it), as on a miss, within its stop_token and wait_bound. Zero: no stale
  // answer after a gap (the mark is a clear of the fresh windows, as with stale_while_revalidate at
  // zero). The local cache's stale_if_error, measured from the same point, is cut by as much
  // (cache::expire_all(stale_for)). Not negative.
  std::chrono::nanoseconds gap_stale_bound = std::chrono::milliseconds(20);
  // What the local cache hears (see fleet_coherence and docs/fleet_cache.md).
  fleet_coherence coherence = fleet_coherence::tracking;
};

// fleet_cache_stats: counters since construction (each exact; a snapshot is
// not one instant).
struct fleet_cache_stats {
  cache_stats local;                      // the local cache's
  fleet_stats fleet;                      // the fleet's (Redis, leases, origin calls)
  std::uint64_t broadcasts = 0;           // put / invalidate calls that reached the bus
  std::uint64_t invalidations_heard = 0;  // bus messages from other processes
  std::uint64_t resyncs = 0;    // channel subscriptions (re)confirmed; those of one connection,
                                // together: every local entry marked stale
  std::uint64_t overflows = 0;  // max_pending_invalidations passed: every local entry marked stale
  std::uint64_t expires_heard = 0;  // expire messages from other processes
  // 1 once the server refused CLIENT TRACKING (an ACL, a renamed command, no
  // REDIRECT; or a Redis Cluster: tracking_refused_on_cluster) and the process
  // fell back to the bus; else 0.
  std::uint64_t tracking_refused = 0;
  // 1 when the refusal is the fleet_cache's own: the server is a node of a Redis
  // Cluster, where a tracker reports only its own node's keys (docs/fleet_cache.md,
  // "Redis Cluster"): the bus is in use, and writes by anyone but a fleet_cache of
  // the prefix are not heard. Else 0.
  std::uint64_t tracking_refused_on_cluster = 0;
  // The coherence in use: the option's, or publish after a refusal.
  fleet_coherence coherence = fleet_coherence::tracking;
};

namespace metrics {

// fleet_cache_metrics: a fleet_cache's own counters (fleet_cache_stats
// without its `local` and `fleet` parts), for any exporter that reads
// metrics::descriptor tables (metrics.hpp). The local cache's and the fleet's
// counters go under their own tables, from the same stats():
//   collector.add_source({{"fleet_cache", "profiles"}},
//                        singleflight::metrics::fleet_cache_metrics,
//                        [&] { return profiles.stats(); });
//   collector.add_source({{"cache", "profiles"}}, singleflight::metrics::cache_metrics,
//                        [&] { return profiles.stats().local; });
//   collector.add_source({{"fleet", "profiles"}}, singleflight::metrics::fleet_metrics,
//                        [&] { return profiles.stats().fleet; });
// A rate of resyncs above zero in steady state means the subscription or the
// tracker keeps dropping (the two of each connection mark every local entry
// stale, once: one read through the fleet per key read after it); overflows mean
// max_pending_invalidations is too small for the write rate; tracking_refused
// at 1 means the server (an ACL, a renamed command, no REDIRECT; or a Redis
// Cluster, where the fleet_cache does not track) refused client tracking: only
// fleet_caches' own writes are heard, through the bus.
inline constexpr std::array fleet_cache_metrics{
    counter<&fleet_cache_stats::broadcasts>(
        "singleflight_fleet_cache_broadcasts_total",
        "put, invalidate and expire calls whose message reached the bus"),
    counter<&fleet_cache_stats::invalidations_heard>(
        "singleflight_fleet_cache_invalidations_heard_total",
        "Keys heard invalidated: other processes' bus messages, or tracking reports"),
    counter<&fleet_cache_stats::expires_heard>("singleflight_fleet_cache_expires_heard_total",
                                               "Expire messages heard from other processes"),
    counter<&fleet_cache_stats::resyncs>(
        "singleflight_fleet_cache_resyncs_total",
        "Subscriptions (re)confirmed; those of one connection mark every local entry stale"),
    counter<&fleet_cache_stats::overflows>(
        "singleflight_fleet_cache_overflows_total",
        "Times max_pending_invalidations was passed, each marking every local entry stale"),
    gauge<&fleet_cache_stats::tracking_refused>(
        "singleflight_fleet_cache_tracking_refused",
        "1 once the server refused client tracking and the process fell back to the bus"),
};

}  // namespace metrics

}  // namespace singleflight
