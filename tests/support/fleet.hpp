// tests/support/fleet.hpp: what the fleet tests share (test_fleet*.cpp).
//
//  * fleet_opts(uri, prefix): settings for tests that are not about timeouts (a generous
//    redis_timeout, so that a slow, sanitized, shared machine never turns into a fault);
//    message_only(uri, prefix): the same, with a wait_slice far beyond every bounded wait, so
//    that only a message (or a re-read the protocol makes on its own) wakes a follower in time;
//  * fleet_engine(f): the fleet's engine (its hook, its parts), through fleet_test_access;
//  * stored(client, prefix, key): the payload of the record stored under a key;
//  * held_origin: a loader that blocks until released, counting its calls;
//  * versioned_origin: a loader that answers "v<version>" for the version the test sets;
//  * must_not_load: a loader that must not run (the answer has to come from a layer in front);
//  * fleet_points: counts the protocol points one fleet passes (its hook).
#pragma once

#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include "redis.hpp"
#include "sync.hpp"

namespace sftest {

inline singleflight::fleet_options fleet_opts(const std::string& uri, const std::string& prefix) {
  using namespace std::chrono_literals;
  singleflight::fleet_options o;
  o.redis_uri = uri;
  o.key_prefix = prefix;
  o.lease_ttl = 2000ms;
  o.redis_timeout = 2000ms;
  o.max_wait = 60s;
  return o;
}

inline singleflight::fleet_options message_only(const std::string& uri, const std::string& prefix) {
  using namespace std::chrono_literals;
  singleflight::fleet_options o = fleet_opts(uri, prefix);
  o.wait_slice = 120s;
  o.max_wait = 600s;
  return o;
}

template <class Fleet>
singleflight::detail::fleet_engine& fleet_engine(Fleet& f) {
  return singleflight::detail::fleet_test_access::engine(f);
}

// The payload of the record stored under `key`, or "" when none is readable.
inline std::string stored(redis_client& c, const std::string& prefix, const std::string& key,
                          std::string_view tag = "string") {
  namespace d = singleflight::detail;
  const auto bytes = c.get(d::fleet_names::of(prefix, key).value);
  if (!bytes) return {};
  const auto r = d::parse_record(*bytes, tag);
  return r ? std::string(r->payload) : std::string();
}

// A loader that blocks until released (the origin call in progress), counting its calls.
struct held_origin {
  std::atomic<int> calls{0};
  gate started;
  gate release;
  std::string value;
  explicit held_origin(std::string v) : value(std::move(v)) {}
  auto loader() {
    return [this] {
      calls.fetch_add(1);
      started.open();
      release.wait("held origin released");
      return value;
    };
  }
};

// Counts the protocol points one fleet passes.
struct fleet_points {
  std::atomic<int> lost{0};
  std::atomic<int> subscribed{0};
  std::atomic<int> waiting{0};
  std::atomic<int> stored{0};
  template <class Fleet>
  void attach(Fleet& f) {
    fleet_engine(f).hook = [this](singleflight::detail::fleet_point p, std::string_view) {
      count(p);
    };
  }
  void count(singleflight::detail::fleet_point p) {
    using point = singleflight::detail::fleet_point;
    if (p == point::lost_race) lost.fetch_add(1);
    if (p == point::subscribed) subscribed.fetch_add(1);
    if (p == point::waiting) waiting.fetch_add(1);
    if (p == point::stored) stored.fetch_add(1);
  }
};

// An origin whose answer is "v" followed by the version the test sets, counting its calls.
struct versioned_origin {
  std::atomic<int> version{1};
  std::atomic<int> calls{0};
  auto loader() {
    return [this] {
      calls.fetch_add(1);
      return "v" + std::to_string(version.load());
    };
  }
};

// A loader that must not run (the answer has to come from a layer in front of it): it counts
// in `ran` and answers a value no test expects.
inline auto must_not_load(std::atomic<int>& ran) {
  return [&ran] {
    ran.fetch_add(1);
    return std::string("must not be loaded");
  };
}

}  // namespace sftest
