// singleflight/fleet_options.hpp
//
// The vocabulary of singleflight::fleet (include <singleflight/fleet.hpp>):
// `fleet_options` (its construction-time settings), `fleet_stats` (its
// counters) and their metrics table `metrics::fleet_metrics`, and the two
// exceptions only a fleet throws, `remote_load_error` and `fleet_error`. Plain
// types: no state, no lock, no hiredis (a translation unit that only fills in
// a fleet's settings, or exports its stats, needs neither hiredis nor
// fleet.hpp). One header for the four, as cache_options.hpp is for the cache:
// they are read together (a setting, the counter that shows it at work, the
// error it can cause) and none is useful without the others.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "detail/chrono.hpp"
#include "errors.hpp"
#include "metrics.hpp"
#include "options.hpp"

namespace singleflight {

// fleet_options
//
// Construction-time settings of a fleet. Durations of 0 where a default is
// derived take that default; the constructor throws std::invalid_argument
// for settings that cannot work (a negative duration, renew_every >=
// lease_ttl, a malformed URI).
struct fleet_options {
  // Where Redis is: "tcp://host:port[/db]" (or "redis://..."), or
  // "unix:///path/to/redis.sock[?db=N]". A single server, or any master of a
  // Redis Cluster: the first MOVED reply makes the fleet read the cluster's
  // slot map (CLUSTER SLOTS) and send each key to the master of its slot,
  // following MOVED and ASK (docs/fleet.md, "Redis Cluster"; db must be 0
  // there). Behind Sentinel, name the primary, or a proxy that follows it:
  // the fleet does not ask Sentinel.
  //
  // A list of seeds: "tcp://h1:p1,h2:p2,h3:p3[/db]" (the scheme once, the db
  // for all; "[::1]:7000" for IPv6): nodes of one cluster (or addresses of
  // one server). The fleet connects to the first that answers, and stays
  // with it until it stops answering (a seed that does not answer delays the
  // connection that tries it by redis_timeout; one that refuses, by nothing
  // worth counting). One seed: exactly the single-node behaviour.
  std::string redis_uri = "tcp://127.0.0.1:6379";

  // AUTH: `AUTH password` when only the password is set, `AUTH username
  // password` (Redis 6 ACL) when both are. Sent in clear (no TLS in hiredis 0.14).
  std::string username;
  std::string password;

  // Prefix of every Redis name this fleet uses: a key's names are
  // "{<length of key_prefix>:<key_prefix>:<key text>}:v" (the value), ":l"
  // (the lease), ":m", ":c" (docs/fleet.md has them all). Fleets that must
  // not share values need different prefixes; put the value format's
  // version in it.
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

  // Redis Cluster: how long a flight whose slot's master stopped answering
  // (refused, reset, timed out, its breaker open) waits for that master's
  // replica to take over, when it has one (the slot map or CLUSTER NODES
  // lists it), looking for the slot's new owner every 50 ms; it then races
  // there (a value stored before the failure is a hit; a cold key is loaded
  // once for the fleet). Past it, and at once for a master without a
  // replica, the flight loads locally, as when Redis is down. The bound is
  // per outage of a master, not per call: flights that begin after it has
  // passed load at once, until that master or a new owner answers. Nothing
  // on a single server. The callers' stop_token and wait_bound apply as to
  // any wait (a caller leaving never cancels the flight). Cover the
  // cluster's cluster-node-timeout plus its election (docs/fleet.md, "A
  // master that fails over"), or set 1 ms to keep local loads. 0: max_wait.
  std::chrono::milliseconds failover_wait{0};

  // Bound on every wait for Redis: the connect, the handshake, and each
  // command's round trip (its writes and reads together) as long as it moves
  // less than about a MiB. A larger round trip fails once no byte has moved
  // for redis_timeout (plus 10 ms per MiB sent, for the server's work on the
  // request, until the reply's first byte), and at the latest redis_timeout
  // plus 10 ms per MiB it moves (2 x sent + received) after it began: a
  // large value is not a timeout by its size alone, a stalled server is
  // found out in about redis_timeout all the same (docs/fleet.md, "Large
  // values").
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

  // The most worker threads a fleet runs at once for async_get / co_get
  // flights (and for releasing the lease of a race whose reply was lost);
  // more flights queue until one is free, and an idle worker exits after
  // 10 s. Bounds the threads, and the command connections they hold, however
  // many asynchronous calls arrive at once (2,000 concurrent async_get
  // calls ran 2,000 threads). A loader on a worker that blocks on another
  // asynchronous call of the same fleet may then wait for a free worker.
  // 0: no bound.
  std::size_t max_async_threads = 64;

  // The largest value (the codec's bytes) a leader stores, and, with the
  // record's header (about 60 bytes more), the largest record a get reads.
  // A larger value is returned to its callers but not stored (counted:
  // oversized_values); the lease is released at once and the followers load
  // for themselves. A larger record found in Redis (another program's value
  // under a fleet's name, or one stored by a fleet with a larger limit) is
  // not transferred: the get counts it (oversized_skipped) and takes it for a
  // miss, and its leader's store replaces it (a get reads at most 64 KiB of
  // a value that is not a record of this fleet, and at most this limit of
  // one that is). 32 MiB (the default): a 32 MiB value takes ~100 ms per
  // store on loopback, most of it the server's, which serves no other client
  // meanwhile, and each reader holds it several times over in memory while
  // it decodes. 0: no limit but the server's (proto-max-bulk-len, 512 MB by
  // default; a store the server refuses ends as an oversized one). Give
  // every fleet of one key_prefix the same limit.
  std::size_t max_value_bytes = std::size_t{32} << 20;

  // Replication: with replicas > 0, invalidate() returns only once that many
  // replicas acknowledged it (WAIT, at most replica_timeout; its round trip
  // is bounded by replica_timeout + 250 ms + redis_timeout, as the server
  // answers on its own timer), and throws
  // fleet_error when fewer did (the invalidation is applied on the primary,
  // but a failover to a replica that missed it would undo it); a leader's
  // store waits the same way (a store fewer replicas acknowledged is counted:
  // replica_timeouts; its callers get their value either way). 0 (the
  // default): no WAIT, a failover may lose the latest invalidations and
  // stores (docs/fleet.md, "Replicas and failover").
  std::uint32_t replicas = 0;
  std::chrono::milliseconds replica_timeout{100};

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
  std::uint64_t oversized_values = 0;    // values over max_value_bytes: returned, not stored
  std::uint64_t oversized_skipped = 0;   // records over max_value_bytes found in Redis
                                         // (foreign, or a larger limit's): not read, a miss
  std::uint64_t publish_failures = 0;    // scripts that wrote but could not PUBLISH (ACL
                                         // without channel rights): followers wait wait_slice
  std::uint64_t replica_timeouts = 0;    // invalidations and stores fewer than `replicas`
                                         // replicas acknowledged within replica_timeout
  // Redis Cluster: why flights loaded locally (each also counts in local_fallback), and the
  // failover waits (fleet_options::failover_wait).
  std::uint64_t failover_waits = 0;       // flights that waited for a master's replica to
                                          // take over (once per wait)
  std::uint64_t failover_expired = 0;     // ... that then loaded locally: the master's outage
                                          // had lasted failover_wait
  std::uint64_t failover_no_replica = 0;  // flights whose master stopped answering and that
                                          // loaded locally: no replica known to take over
  std::uint64_t local_not_run = 0;        // loads after the cluster did not run a command
                                          // (TRYAGAIN past redis_timeout, CLUSTERDOWN, a slot
                                          // that moved twice)
  std::uint64_t local_unshared = 0;       // loads after the leader's value could not be stored
                                          // (its message "n"), any server
  std::uint64_t local_max_wait = 0;       // loads after max_wait passed, any server
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
// Thrown by invalidate() when Redis cannot be reached, or when fewer than
// fleet_options::replicas replicas acknowledged the invalidation in time (it
// is applied on the primary; a failover may undo it): an invalidation must
// not be silently lost. get() never throws it.
class SINGLEFLIGHT_EXCEPTION_VISIBLE fleet_error : public error {
 public:
  using error::error;
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
    counter<&fleet_stats::oversized_values>(
        "singleflight_fleet_oversized_values_total",
        "Values over max_value_bytes: returned to their callers, not stored"),
    counter<&fleet_stats::oversized_skipped>(
        "singleflight_fleet_oversized_skipped_total",
        "Records over max_value_bytes found in Redis: not read, taken for a miss"),
    counter<&fleet_stats::publish_failures>(
        "singleflight_fleet_publish_failures_total",
        "Scripts that wrote but could not publish (no channel rights)"),
    counter<&fleet_stats::replica_timeouts>(
        "singleflight_fleet_replica_timeouts_total",
        "Invalidations and stores fewer replicas than configured acknowledged in time"),
    counter<&fleet_stats::failover_waits>(
        "singleflight_fleet_failover_waits_total",
        "Flights that waited for a failed master's replica to take over (Redis Cluster)"),
    counter<&fleet_stats::failover_expired>(
        "singleflight_fleet_failover_expired_total",
        "Failover waits that ended in a local load: the outage outlasted failover_wait"),
    counter<&fleet_stats::failover_no_replica>(
        "singleflight_fleet_failover_no_replica_total",
        "Local loads for a failed master without a known replica (Redis Cluster)"),
    counter<&fleet_stats::local_not_run>(
        "singleflight_fleet_local_not_run_total",
        "Local loads after the cluster did not run a command (TRYAGAIN, CLUSTERDOWN)"),
    counter<&fleet_stats::local_unshared>(
        "singleflight_fleet_local_unshared_total",
        "Local loads after the leader's value could not be stored"),
    counter<&fleet_stats::local_max_wait>("singleflight_fleet_local_max_wait_total",
                                          "Local loads after max_wait passed"),
};

}  // namespace metrics

}  // namespace singleflight
