// singleflight/detail/fleet/fleet_engine.hpp -- internal; do not include directly.
//
// detail::fleet_engine: everything of a fleet that does not depend on its
// Key and T: the settings, the counters, the command connection pool, the
// circuit breaker, the subscriber thread, the lease renewer thread, the worker
// threads of async flights, and the lease tokens. fleet.hpp drives the
// protocol with it.
//
// Locking: the engine has no lock of its own besides `token_mu_` (the token
// generator). Each part has its own (see its file); no part calls another
// while holding its lock, and none runs user code, so there is no lock order
// to respect. The counters are relaxed atomics: each is exact, a snapshot of
// several is not one instant.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>

#include "../worker_threads.hpp"
#include "circuit_breaker.hpp"
#include "fleet_hooks.hpp"
#include "fleet_protocol.hpp"
#include "fleet_renewer.hpp"
#include "fleet_subscriber.hpp"
#include "redis_conn.hpp"
#include "redis_pool.hpp"

namespace singleflight::detail {

// The settings, validated and with their defaults resolved (fleet.hpp).
struct fleet_config {
  redis_endpoint endpoint;
  std::string username;
  std::string password;
  std::string key_prefix;
  std::chrono::milliseconds lease_ttl{};
  std::chrono::milliseconds renew_every{};
  std::chrono::milliseconds wait_slice{};
  std::chrono::milliseconds max_wait{};
  std::chrono::milliseconds redis_timeout{};
  std::chrono::milliseconds value_ttl{};
  std::chrono::milliseconds error_ttl{};
  std::chrono::milliseconds meta_ttl{};
  std::uint32_t breaker_threshold = 3;
  std::chrono::milliseconds breaker_cooldown{};
  std::size_t max_idle_connections = 8;
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
        pool(cfg.endpoint, cfg.redis_timeout, cfg.username, cfg.password, cfg.max_idle_connections),
        breaker(cfg.breaker_threshold, cfg.breaker_cooldown),
        subscriber(pool, counters.redis_errors, hook),
        renewer(pool, cfg.lease_ttl, cfg.renew_every, cfg.meta_ttl, counters.redis_errors,
                counters.lease_lost),
        rng_(seed()) {}

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

  // close(): stops and joins the subscriber, the renewer and the workers
  // (but the calling thread), then drops the idle connections. Idempotent.
  void close() noexcept {
    workers.close();
    subscriber.close();
    renewer.close();
    pool.close();
  }

  void at(fleet_point p, std::string_view key) const {
    if (hook) hook(p, key);
  }

  const fleet_config cfg;
  fleet_hook hook;  // set only by tests (fleet_test_access), before any call
  fleet_counters counters;
  redis_pool pool;
  circuit_breaker breaker;
  fleet_subscriber subscriber;
  lease_renewer renewer;
  worker_threads workers;

 private:
  static std::uint64_t seed() {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<std::uint64_t>(
               std::chrono::high_resolution_clock::now().time_since_epoch().count());
  }

  std::mutex token_mu_;
  std::mt19937_64 rng_;  // guarded by token_mu_
};

}  // namespace singleflight::detail
