// singleflight/detail/fleet/fleet_engine.hpp -- internal; do not include directly.
//
// detail::fleet_engine: everything of a fleet that does not depend on its
// Key and T: the settings (validated from fleet_options), the counters and
// their snapshot, the router (redis_router.hpp: the Redis nodes, each with
// its command connection pool and its circuit breaker), the subscriber, the lease renewer (which
// also retries failed releases), the threads (two worker_threads, detail/worker_threads.hpp:
// `services` runs the subscriber's and the renewer's loops, one long-running job each, and on a
// cluster the shard subscribers' (subscriber_for); `workers`
// runs async flights, at most max_async_threads), the lease tokens, and
// invalidate's round trip. fleet_flight.hpp
// runs the protocol's flights with it; fleet.hpp owns one.
//
// Locking: the engine has no lock of its own besides `token_mu_` (the token
// generator). Each part has its own (see its file); no part calls another
// while holding its lock, and none runs user code, so there is no lock order
// to respect. The counters are relaxed atomics: each is exact, a snapshot of
// several is not one instant.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../../fleet_options.hpp"
#include "../chrono.hpp"
#include "../functional.hpp"
#include "../worker_threads.hpp"
#include "circuit_breaker.hpp"
#include "fleet_hooks.hpp"
#include "fleet_protocol.hpp"
#include "fleet_renewer.hpp"
#include "fleet_subscriber.hpp"
#include "read_mark.hpp"
#include "redis_conn.hpp"
#include "redis_pool.hpp"
#include "redis_router.hpp"

namespace singleflight::detail {

// The settings, validated and with their defaults resolved (of()).
struct fleet_config {
  std::vector<redis_endpoint> seeds;  // redis_uri's, at least one
  int db = 0;                         // redis_uri's db, every seed's (fleet_names::of)
  std::string username;
  std::string password;
  std::string key_prefix;
  std::chrono::milliseconds lease_ttl{};
  std::chrono::milliseconds renew_every{};
  std::chrono::milliseconds wait_slice{};
  std::chrono::milliseconds max_wait{};
  std::chrono::milliseconds failover_wait{};
  std::chrono::milliseconds redis_timeout{};
  std::chrono::milliseconds value_ttl{};
  std::chrono::milliseconds error_ttl{};
  std::chrono::milliseconds meta_ttl{};
  std::uint32_t breaker_threshold = 3;
  std::chrono::milliseconds breaker_cooldown{};
  std::size_t max_idle_connections = 8;
  std::size_t max_async_threads = 64;
  std::size_t max_value_bytes = 0;
  std::uint32_t replicas = 0;
  std::chrono::milliseconds replica_timeout{};

  // of(o, tag): o's settings with their defaults resolved, for a codec whose
  // tag is `tag`. Throws std::invalid_argument for settings that cannot work
  // (fleet_options), and for a tag with '|' (a record's field separator: no
  // record with it would ever read back).
  static fleet_config of(const fleet_options& o, std::string_view tag) {
    using ms = std::chrono::milliseconds;
    const auto need = [](bool ok, const char* what) {
      if (!ok) throw std::invalid_argument(std::string("singleflight::fleet_options: ") + what);
    };
    need(o.lease_ttl > ms(0), "lease_ttl must be positive");
    need(o.renew_every >= ms(0), "renew_every must not be negative");
    need(o.wait_slice >= ms(0), "wait_slice must not be negative");
    need(o.max_wait >= ms(0), "max_wait must not be negative");
    need(o.failover_wait >= ms(0), "failover_wait must not be negative");
    need(o.redis_timeout > ms(0), "redis_timeout must be positive");
    need(o.value_ttl > ms(0), "value_ttl must be positive (the shared value needs a lifetime)");
    need(o.error_ttl >= ms(0), "error_ttl must not be negative");
    need(o.breaker_cooldown >= ms(0), "breaker_cooldown must not be negative");
    need(o.replicas == 0 || o.replica_timeout > ms(0),
         "replica_timeout must be positive when replicas > 0");
    if (tag.find('|') != std::string_view::npos) {
      throw std::invalid_argument("singleflight::fleet: the codec's tag \"" + std::string(tag) +
                                  "\" holds '|', the record's field separator");
    }
    fleet_config c;
    c.seeds = redis_endpoint::parse_list(o.redis_uri);
    c.db = c.seeds.front().db;
    c.username = o.username;
    c.password = o.password;
    c.key_prefix = o.key_prefix;
    c.lease_ttl = o.lease_ttl;
    c.renew_every = o.renew_every > ms(0) ? o.renew_every : std::max(ms(1), o.lease_ttl / 3);
    need(c.renew_every < c.lease_ttl, "renew_every must be less than lease_ttl");
    c.wait_slice = o.wait_slice > ms(0) ? o.wait_slice : std::max(ms(1), o.lease_ttl / 5);
    c.max_wait = o.max_wait > ms(0) ? o.max_wait : 3 * o.lease_ttl;
    c.failover_wait = o.failover_wait > ms(0) ? o.failover_wait : c.max_wait;
    c.redis_timeout = o.redis_timeout;
    c.value_ttl = o.value_ttl;
    c.error_ttl = o.error_ttl;
    // The metadata (fence, generation) outlives any wait and any lease by far;
    // see fleet_protocol.hpp for why its expiry is safe anyway.
    c.meta_ttl = std::max({ms(60000), 10 * c.lease_ttl, 2 * c.max_wait});
    c.breaker_threshold = o.breaker_threshold;
    c.breaker_cooldown = o.breaker_cooldown;
    c.max_idle_connections = o.max_idle_connections;
    c.max_async_threads = o.max_async_threads;
    c.max_value_bytes = o.max_value_bytes;
    c.replicas = o.replicas;
    c.replica_timeout = o.replica_timeout;
    return c;
  }
};

struct fleet_counters {
  std::atomic<std::uint64_t> gets{0};
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> leader{0};
  std::atomic<std::uint64_t> follower_woken{0};
  std::atomic<std::uint64_t> late_hit{0};
  std::atomic<std::uint64_t> local_fallback{0};
  std::atomic<std::uint64_t> lease_lost{0};
  std::atomic<std::uint64_t> fence_rejections{0};
  std::atomic<std::uint64_t> invalidated_stores{0};
  std::atomic<std::uint64_t> decode_failures{0};
  std::atomic<std::uint64_t> redis_errors{0};
  std::atomic<std::uint64_t> remote_failures{0};
  std::atomic<std::uint64_t> origin_calls{0};
  std::atomic<std::uint64_t> oversized_values{0};
  std::atomic<std::uint64_t> oversized_skipped{0};
  std::atomic<std::uint64_t> publish_failures{0};
  std::atomic<std::uint64_t> replica_timeouts{0};
  std::atomic<std::uint64_t> failover_waits{0};
  std::atomic<std::uint64_t> failover_expired{0};
  std::atomic<std::uint64_t> failover_no_replica{0};
  std::atomic<std::uint64_t> local_not_run{0};
  std::atomic<std::uint64_t> local_unshared{0};
  std::atomic<std::uint64_t> local_max_wait{0};

  static void bump(std::atomic<std::uint64_t>& c) noexcept {
    // Relaxed: a counter orders nothing; readers want its value, not what
    // happened before it.
    c.fetch_add(1, std::memory_order_relaxed);
  }
};

class fleet_engine {
 public:
  explicit fleet_engine(fleet_config c)
      : cfg(std::move(c)),
        router(cfg.seeds, cfg.redis_timeout, cfg.username, cfg.password, cfg.max_idle_connections,
               cfg.breaker_threshold, cfg.breaker_cooldown),
        subscriber(router.seed().pool, counters.redis_errors, hook),
        renewer(router, cfg.lease_ttl, cfg.renew_every, cfg.meta_ttl,
                std::min(cfg.renew_every, cfg.redis_timeout), counters.redis_errors,
                counters.lease_lost, counters.publish_failures),
        workers(worker_threads::default_idle_for, cfg.max_async_threads),
        services(worker_threads::default_idle_for, 0),
        rng_(seed()) {
    try {
      subscriber.start(services);
      renewer.start(services);
    } catch (...) {
      stop_services();  // ~worker_threads then joins what started
      throw;
    }
  }

  fleet_engine(const fleet_engine&) = delete;
  fleet_engine& operator=(const fleet_engine&) = delete;
  ~fleet_engine() { close(); }

  // new_token(): 128 random bits, hex; unique across processes and leases.
  std::string new_token() {
    std::uint64_t a = 0;
    std::uint64_t b = 0;
    {
      const std::lock_guard<std::mutex> lk(token_mu_);
      a = rng_();
      b = rng_();
    }
    return hex16(a) + hex16(b);
  }

  // close(): closes the workers (no async flight starts after it), stops the
  // subscriber and the renewer, drops the idle connections. From outside the
  // library's threads it returns once every thread of the fleet is joined (the
  // workers first: their flights use the renewer and the subscriber); from a
  // library thread it waits for nothing (worker_threads' protocol) and the
  // destructor joins. Idempotent, thread-safe: concurrent closers all wait.
  void close() noexcept {
    workers.close();
    stop_services();
    services.close();
    router.close();
  }

  void at(fleet_point p, std::string_view key) const {
    if (hook) hook(p, key);
  }

  // invalidate(text): the invalidate script for the key whose codec text is
  // `text` (and, with cfg.replicas, WAIT for them); the key's new generation.
  // Throws fleet_error when Redis cannot be reached (counted as a Redis error
  // and a breaker failure), refuses the fleet's settings (a Redis error, not a
  // breaker failure; the message names the refusal), or fewer replicas than cfg.replicas
  // acknowledged in time, or WAIT got no answer (counted: replica_timeouts; not a Redis failure:
  // the primary applied it), std::bad_alloc. A refused PUBLISH (an ACL without channel rights) is
  // counted, not thrown: the invalidation applied.
  std::uint64_t invalidate(std::string_view text) {
    const fleet_names names = fleet_names::of(cfg.key_prefix, text, cfg.db);
    return written("invalidate", names.value, [&](redis_conn& rc) {
      bool published = true;
      const std::uint64_t gen =
          detail::invalidate(rc, names, cfg.meta_ttl, published, router.cluster());
      if (!published) fleet_counters::bump(counters.publish_failures);
      return gen;
    });
  }

  // write(text, rec, bus, message): fleet_cache's put (`rec`: a record to store for
  // value_ttl) or invalidate (`rec` empty) of the key whose codec text is `text`, with
  // invalidate's effects on loads and waiters, and `message` PUBLISHed on `bus` by the same
  // script. The key's new generation. Throws as invalidate, and fleet_error when the server
  // refused the bus PUBLISH (an ACL without that channel: the write applied, but no other
  // process hears of it).
  std::uint64_t write(std::string_view text, std::string_view rec, std::string_view bus,
                      std::string_view message) {
    const fleet_names names = fleet_names::of(cfg.key_prefix, text, cfg.db);
    bool broadcast = true;
    const std::uint64_t gen = written("put/invalidate", names.value, [&](redis_conn& rc) {
      bool published = true;
      const std::uint64_t g = detail::write(rc, names, rec, cfg.value_ttl, cfg.meta_ttl, bus,
                                            message, published, broadcast, router.cluster());
      if (!published) fleet_counters::bump(counters.publish_failures);
      return g;
    });
    if (!broadcast) {
      fleet_counters::bump(counters.publish_failures);
      throw fleet_error(
          "singleflight::fleet_cache: applied in Redis, but the server refused "
          "the PUBLISH on " +
          std::string(bus) +
          " (the fleet's ACL user needs that channel): other processes' local "
          "caches were not told");
    }
    return gen;
  }

  // give_up(names, token): a race sent with `token` got no answer (it may
  // still run on the server, later): writes its tombstone, so that it takes
  // no lease when it runs, and releases the lease if it already took one
  // ("r": the followers race again). On the renewer's thread, so that the
  // caller that gave up loads at once, and retried there while Redis fails
  // (lease_renewer::release_later): a server that stalled must not keep a
  // lease nobody holds. Failures are not counted: the failed race was (the
  // same outage, and redis_errors stays one per failed call).
  void give_up(const fleet_names& names, const std::string& token) noexcept {
    renewer.release_later(names, token, cfg.meta_ttl, "r");
  }

  // stats(): a snapshot of the counters (each exact; not one instant).
  fleet_stats stats() const {
    const auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);  // counters order nothing
    };
    fleet_stats s;
    s.gets = get(counters.gets);
    s.hits = get(counters.hits);
    s.leader = get(counters.leader);
    s.follower_woken = get(counters.follower_woken);
    s.late_hit = get(counters.late_hit);
    s.local_fallback = get(counters.local_fallback);
    s.lease_lost = get(counters.lease_lost);
    s.fence_rejections = get(counters.fence_rejections);
    s.invalidated_stores = get(counters.invalidated_stores);
    s.decode_failures = get(counters.decode_failures);
    s.redis_errors = get(counters.redis_errors);
    s.remote_failures = get(counters.remote_failures);
    s.origin_calls = get(counters.origin_calls);
    s.breaker_opens = router.breaker_opens();
    s.oversized_values = get(counters.oversized_values);
    s.oversized_skipped = get(counters.oversized_skipped);
    s.publish_failures = get(counters.publish_failures);
    s.replica_timeouts = get(counters.replica_timeouts);
    s.failover_waits = get(counters.failover_waits);
    s.failover_expired = get(counters.failover_expired);
    s.failover_no_replica = get(counters.failover_no_replica);
    s.local_not_run = get(counters.local_not_run);
    s.local_unshared = get(counters.local_unshared);
    s.local_max_wait = get(counters.local_max_wait);
    return s;
  }

  const fleet_config cfg;
  fleet_hook hook;  // set only by tests (fleet_test_access), before any call
  // reports: under fleet_cache's client tracking, its inbox (read_mark.hpp: the count of the
  // reports it posted); null otherwise. Set by fleet_cache's constructor, before any call.
  report_source* reports = nullptr;
  fleet_counters counters;
  // subscriber_for(n): the subscriber whose watches hear the leaders of node `n`'s keys: on a
  // single server, `subscriber`; on a Redis Cluster, `n`'s shard subscriber (sharded pub/sub:
  // fleet_subscriber.hpp), created and started on `services` the first time. Thread-safe.
  // Throws closed_error (the fleet is closing), std::system_error (no thread), std::bad_alloc.
  fleet_subscriber& subscriber_for(redis_node& n) {
    if (!router.cluster()) return subscriber;
    const std::lock_guard<std::mutex> lk(shards_mu_);
    if (shards_closed_) throw closed_error();
    for (const auto& [node, sub] : shards_) {
      if (node == &n) return *sub;
    }
    shards_.reserve(shards_.size() + 1);  // no throw after the job starts
    auto sub = std::make_unique<fleet_subscriber>(n.pool, counters.redis_errors, hook, true);
    sub->start(services);
    shards_.emplace_back(&n, std::move(sub));
    return *shards_.back().second;
  }

  // The Redis nodes, their pools and breakers. `subscriber` listens on the seed: on a single
  // server for every key; on a cluster for fleet_cache's bus and expire channels (classic
  // PUBLISH, which a cluster propagates to every node), the keys' waiters watching their
  // node's shard subscriber (subscriber_for).
  redis_router router;
  fleet_subscriber subscriber;
  lease_renewer renewer;

 private:
  // The shard subscribers (subscriber_for), one per node; each lives as long as the engine
  // (its job runs on `services`, declared after them: joined before they are destroyed).
  std::mutex shards_mu_;
  std::vector<std::pair<const redis_node*, std::unique_ptr<fleet_subscriber>>>
      shards_;                  // guarded by shards_mu_
  bool shards_closed_ = false;  // guarded by shards_mu_

 public:
  // Declared after what their jobs use: destroyed (joined) first.
  worker_threads workers;
  worker_threads services;

 private:
  // written(what, step): one write step (a script returning the key's new generation) on a
  // pooled connection, then, with cfg.replicas, WAIT for them. Throws fleet_error when Redis
  // cannot be reached (counted as a Redis error and a breaker failure), refuses the fleet's
  // settings (a Redis error, not a breaker failure; the message names the refusal), or fewer
  // replicas than cfg.replicas acknowledged in time, or WAIT got no answer (counted:
  // replica_timeouts; not a Redis failure: the primary applied it), std::bad_alloc.
  template <class Step>
  std::uint64_t written(const char* what, std::string_view name, Step step) {
    router.probe();  // the script wakes the key's waiters: PUBLISH or SPUBLISH
    std::uint64_t gen = 0;
    long long acked = 0;
    std::string wait_failure;
    const std::string who = std::string("singleflight::fleet::") + what;
    redis_node* node = &router.route(name);
    try {
      std::optional<pooled> c;
      // A second run (pooled::run) bumps the generation once more: harmless. A
      // redirected one did not run where it was sent (redis_router::run).
      gen = router.run(node, c, step);
      node->answered();
      if (cfg.replicas > 0) {
        try {
          acked = wait_replicas(**c, cfg.replicas, cfg.replica_timeout, cfg.redis_timeout);
        } catch (const redis_failure& e) {
          wait_failure = e.what();  // the connection is broken: it is not pooled again
        }
      }
    } catch (const redis_failure& e) {
      if (e.redirected()) {
        // TRYAGAIN for longer than redis_timeout, CLUSTERDOWN, or a slot that moved twice: the
        // cluster did not run it; no failure of the node.
        throw fleet_error(who + ": the Redis Cluster did not run it (" + e.what() + "); try again");
      }
      fleet_counters::bump(counters.redis_errors);
      if (e.refused()) {
        throw fleet_error(who +
                          ": Redis refused the fleet's settings "
                          "(password, username and its ACL rights, db number): " +
                          e.what());
      }
      (void)node->breaker.failure();
      router.node_failed(*node);  // a cluster master may have died: read the map again
      throw fleet_error(who + ": Redis unreachable: " + e.what());
    }
    if (cfg.replicas > 0 && acked < static_cast<long long>(cfg.replicas)) {
      fleet_counters::bump(counters.replica_timeouts);
      throw fleet_error(who + ": applied on the primary, but " +
                        (wait_failure.empty()
                             ? std::to_string(acked) + " of " + std::to_string(cfg.replicas) +
                                   " replicas acknowledged it within " +
                                   std::to_string(cfg.replica_timeout.count()) + " ms"
                             : "WAIT for " + std::to_string(cfg.replicas) +
                                   " replicas got no answer (" + wait_failure + ")") +
                        ": a failover now may undo it");
    }
    return gen;
  }

  static std::uint64_t seed() {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<std::uint64_t>(
               std::chrono::high_resolution_clock::now().time_since_epoch().count());
  }

  void stop_services() noexcept {
    subscriber.stop();
    renewer.stop();
    const std::lock_guard<std::mutex> lk(shards_mu_);
    shards_closed_ = true;  // no shard subscriber starts after this
    for (const auto& [node, sub] : shards_) sub->stop();
  }

  std::mutex token_mu_;
  std::mt19937_64 rng_;  // guarded by token_mu_
};

}  // namespace singleflight::detail
