// tests/support/cluster.hpp: what the Redis Cluster tests share (test_fleet_cluster.cpp,
// test_fleet_cluster_failover.cpp, test_fleet_cache_cluster.cpp).
//
//  * need_cluster_or_warn(): cluster_node(), or "" after a loud warning (the case then passes
//    without running).
//  * owner_port(c, name): the port of the master that owns `name`'s slot, asked of the cluster.
//  * port_of(uri), node_uri(port): a tcp://127.0.0.1:PORT URI's port, and back.
#pragma once

#include <string>

#include "catch.hpp"
#include "redis.hpp"

namespace sftest {

// The cluster node's URI, or "" after a loud warning (the case then passes without running).
inline std::string need_cluster_or_warn() {
  std::string uri = cluster_node();
  if (uri.empty()) {
    WARN(
        "NOT RUN: this test needs a Redis Cluster: redis-server and redis-cli >= 7.0 on PATH "
        "(the ctest fixture fleet_redis_cluster starts one), or "
        "SINGLEFLIGHT_TEST_REDIS_CLUSTER=tcp://HOST:PORT naming one node");
  }
  return uri;
}

// The port of the master that owns `name`'s slot (CLUSTER KEYSLOT, CLUSTER SLOTS), -1 when
// no range holds it.
inline int owner_port(redis_client& c, const std::string& name) {
  const long long slot = c.command({"CLUSTER", "KEYSLOT", name}).integer;
  const auto slots = c.command({"CLUSTER", "SLOTS"});
  for (const auto& range : slots.elements) {
    if (range.elements.size() >= 3 && range.elements[0].integer <= slot &&
        slot <= range.elements[1].integer) {
      return static_cast<int>(range.elements[2].elements.at(1).integer);
    }
  }
  return -1;
}

inline int port_of(const std::string& uri) { return std::stoi(uri.substr(uri.rfind(':') + 1)); }

inline std::string node_uri(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

}  // namespace sftest
