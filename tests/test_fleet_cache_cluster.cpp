// singleflight::fleet_cache on a Redis Cluster (3 masters, tests/support/redis_cluster.sh): two
// fleet_caches, each standing for a process, pointed at ONE node, and a key whose slot lives on
// ANOTHER master. Client tracking reports only the writes of the node the tracker is connected
// to, so a fleet_cache on a cluster must not promise it: what it does instead is asserted here.
// A fleet_cache there falls back to the bus: its own writes still reach every process.
// Without a cluster (no redis-server / redis-cli, no SINGLEFLIGHT_TEST_REDIS_CLUSTER) the cases
// WARN and pass without running.
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <utility>

#include "support/catch.hpp"
#include "support/cluster.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using sftest::need_cluster_or_warn;
using sftest::owner_port;
using sftest::port_of;
using namespace std::chrono_literals;
using fc_t = sf::fleet_cache<std::string, std::string>;

// A key of `prefix` whose names live on a master other than the one at `seed_port`, and that
// master's port.
std::pair<std::string, int> key_elsewhere(sftest::redis_client& c, const std::string& prefix,
                                          int seed_port) {
  for (int i = 0; i < 1000; ++i) {
    const std::string k = "k" + std::to_string(i);
    const int port = owner_port(c, d::fleet_names::of(prefix, k).value);
    if (port > 0 && port != seed_port) return {k, port};
  }
  FAIL("no key found on another master");
  return {};
}

// c fell back to the bus on the cluster (the refusal seen, its three channels confirmed: the
// tracking channel, kept and silent, the expire channel and the bus), and the stale marks of
// their confirmation applied.
void until_on_the_bus(fc_t& c, const char* name) {
  sftest::must([&] { return c.stats().tracking_refused == 1; }, name);
  sftest::must([&] { return sftest::fleet_cache_engine(c).subscriber.confirmed_channels() == 3; },
               name);
  sftest::must([&] { return c.stats().resyncs >= 3; }, name);
}

}  // namespace

// Client tracking from the seed reports only the seed's keys: a raw DEL of a value on another
// master was never heard, and the process served its old local copy up to the local ttl while
// stats() said tracking was in use. On a cluster the fleet_cache does not track: it uses the bus
// and says so, and what the bus cannot hear (a write by anyone but a fleet_cache) is documented.
TEST_CASE(
    "fleet_cache_on_a_cluster_does_not_track_only_the_seed: it falls back to the bus and says "
    "so in stats()",
    "[fleet][fleet_cache][cluster]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("fccluster");
  sftest::redis_client seed(uri);
  const auto [key, port] = key_elsewhere(seed, prefix, port_of(uri));
  sftest::redis_client owner("tcp://127.0.0.1:" + std::to_string(port));

  fc_t a(sftest::fleet_cache_opts(uri, prefix));
  fc_t b(sftest::fleet_cache_opts(uri, prefix));
  until_on_the_bus(a, "a falls back to the bus");
  until_on_the_bus(b, "b falls back to the bus");
  for (fc_t* c : {&a, &b}) {
    const sf::fleet_cache_stats s = c->stats();
    CHECK(s.tracking_refused == 1);
    CHECK(s.tracking_refused_on_cluster == 1);
    CHECK(s.coherence == sf::fleet_coherence::publish);
  }
  sftest::versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get(key, origin.loader()) == "v1");
  CHECK(b.get(key, sftest::must_not_load(ran)) == "v1");  // a's value, from Redis
  CHECK(b.get(key, sftest::must_not_load(ran)) == "v1");  // now a local hit

  // What the bus cannot hear, as documented: a write by anyone but a fleet_cache of the prefix
  // (here a raw DEL on the key's master) leaves b's local copy in place, up to its ttl.
  REQUIRE(owner.command({"DEL", d::fleet_names::of(prefix, key).value}).integer == 1);
  CHECK(b.get(key, sftest::must_not_load(ran)) == "v1");
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "fleet_cache_on_a_cluster_hears_another_process_write_a_key_of_another_master: invalidate "
    "and put reach the other process's local cache",
    "[fleet][fleet_cache][cluster]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("fccluster");
  sftest::redis_client seed(uri);
  const std::string key = key_elsewhere(seed, prefix, port_of(uri)).first;

  fc_t a(sftest::fleet_cache_opts(uri, prefix));
  fc_t b(sftest::fleet_cache_opts(uri, prefix));
  until_on_the_bus(a, "a falls back to the bus");
  until_on_the_bus(b, "b falls back to the bus");
  sftest::versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get(key, origin.loader()) == "v1");
  CHECK(b.get(key, sftest::must_not_load(ran)) == "v1");  // a's value, from Redis
  CHECK(b.get(key, sftest::must_not_load(ran)) == "v1");  // now a local hit

  origin.version = 2;
  a.invalidate(key);
  sftest::must([&] { return b.get(key, origin.loader()) == "v2"; }, "b hears a's invalidate", 5s);
  CHECK(a.get(key, sftest::must_not_load(ran)) == "v2");  // b's value, from Redis

  b.put(key, "v3");
  sftest::must([&] { return a.get(key, sftest::must_not_load(ran)) == "v3"; }, "a hears b's put",
               5s);
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 2);
}
