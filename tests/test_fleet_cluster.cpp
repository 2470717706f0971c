// singleflight::fleet on a Redis Cluster (3 masters, tests/support/redis_cluster.sh): fleets
// pointed at ONE node coalesce the keys of every slot, wherever the slot lives. Without a
// cluster (no redis-server / redis-cli, no SINGLEFLIGHT_TEST_REDIS_CLUSTER) the cluster cases
// WARN and pass without running.
#include <singleflight/fleet.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/cluster.hpp"
#include "support/fleet.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using sftest::need_cluster_or_warn;
using sftest::node_uri;
using sftest::owner_port;
using sftest::port_of;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;

// The ports of the cluster's masters (CLUSTER SLOTS).
std::set<int> master_ports(sftest::redis_client& c) {
  std::set<int> out;
  for (const auto& range : c.command({"CLUSTER", "SLOTS"}).elements) {
    out.insert(static_cast<int>(range.elements.at(2).elements.at(1).integer));
  }
  return out;
}

// A key whose fleet names (under `prefix`) hash to `slot`: found by trying names.
std::string key_in_slot(const std::string& prefix, std::size_t slot, const std::string& stem) {
  for (int i = 0;; ++i) {
    const std::string k = stem + std::to_string(i);
    if (d::cluster_slot(d::fleet_names::of(prefix, k).value) == slot) return k;
    if (i > 10'000'000) FAIL("no key found in slot " << slot);
  }
}

// Every thread of `fleet.size() x threads_per_fleet` gets each key once, starting at a different
// key, so that every key is contended; each origin call counts in `calls[k]`. Then, on the test
// thread: every value right, nothing thrown, one origin call per key, and no fleet saw a Redis
// error, opened a breaker or loaded locally.
template <std::size_t N>
void coalesce_every_key(std::vector<std::unique_ptr<fleet_t>>& fleet, int threads_per_fleet,
                        const std::vector<std::string>& key, std::array<std::atomic<int>, N>& calls,
                        const char* name) {
  const int fleets = static_cast<int>(fleet.size());
  const int keys = static_cast<int>(key.size());
  sftest::gate go;
  std::atomic<int> wrong{0};
  std::atomic<int> threw{0};
  std::vector<std::unique_ptr<sftest::thread>> workers;
  for (int i = 0; i < fleets * threads_per_fleet; ++i) {
    workers.push_back(std::make_unique<sftest::thread>([&, i] {
      go.wait("start");
      fleet_t& f = *fleet[static_cast<std::size_t>(i % fleets)];
      for (int n = 0; n < keys; ++n) {
        const int k = (n + i) % keys;  // each thread starts elsewhere: every key is contended
        try {
          const std::string v = f.get(key[k], [&calls, &key, k] {
            calls[k].fetch_add(1);
            return "v:" + key[k];
          });
          if (v != "v:" + key[k]) wrong.fetch_add(1);
        } catch (...) {
          threw.fetch_add(1);
        }
      }
    }));
  }
  go.open();
  for (auto& w : workers) w->join(name);

  CHECK(wrong.load() == 0);
  CHECK(threw.load() == 0);
  for (int k = 0; k < keys; ++k) {
    INFO("key " << key[k]);
    CHECK(calls[k].load() == 1);
  }
  for (auto& f : fleet) {
    const sf::fleet_stats s = f->stats();
    CHECK(s.redis_errors == 0);
    CHECK(s.breaker_opens == 0);
    CHECK(s.local_fallback == 0);
    CHECK(f->healthy());
  }
}

}  // namespace

TEST_CASE("fleets pointed at one cluster node coalesce the keys of every slot", "[cluster]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("cluster");
  constexpr int fleets = 4;
  constexpr int threads_per_fleet = 4;
  constexpr int keys = 24;

  std::vector<std::string> key(keys);
  for (int k = 0; k < keys; ++k) key[k] = "key-" + std::to_string(k);
  {
    // The keys live on every master, most of them not on the one the fleets are pointed at.
    sftest::redis_client c(uri);
    std::set<int> owners;
    int elsewhere = 0;
    for (const auto& k : key) {
      const int p = owner_port(c, d::fleet_names::of(prefix, k).value);
      owners.insert(p);
      if (p != port_of(uri)) ++elsewhere;
    }
    REQUIRE(owners.size() == 3);
    REQUIRE(elsewhere > 0);
  }

  std::array<std::atomic<int>, keys> calls{};
  std::vector<std::unique_ptr<fleet_t>> fleet;
  for (int i = 0; i < fleets; ++i) {
    fleet.push_back(std::make_unique<fleet_t>(sftest::fleet_opts(uri, prefix)));
  }
  coalesce_every_key(fleet, threads_per_fleet, key, calls, "cluster workers");
}

TEST_CASE("cluster_slot hashes the hash tag with CRC16-XMODEM as Redis does", "[cluster][slots]") {
  // Vectors: the CRC16 check value, and slots Redis gives (CLUSTER KEYSLOT).
  STATIC_REQUIRE(d::crc16("123456789") == 0x31C3);
  STATIC_REQUIRE(d::cluster_slot("123456789") == 12739);
  CHECK(d::cluster_slot("foo") == 12182);
  CHECK(d::cluster_slot("") == 0);
  // A hash tag: only what is between the first '{' and the first '}' after it.
  CHECK(d::cluster_slot("{user1000}.following") == d::cluster_slot("user1000"));
  CHECK(d::cluster_slot("{user1000}.followers") == d::cluster_slot("{user1000}.following"));
  CHECK(d::cluster_slot("foo{}{bar}") == d::cluster_slot("foo{}{bar}"));  // "{}": whole name
  CHECK(d::cluster_slot("foo{}{bar}") != d::cluster_slot("bar"));
  CHECK(d::cluster_slot("foo{{bar}}zap") == d::cluster_slot("{bar"));
  CHECK(d::cluster_slot("foo{bar}{zap}") == d::cluster_slot("bar"));
  CHECK(d::cluster_slot("no tag}{") == d::cluster_slot("no tag}{"));
  // Every name of one fleet key is in one slot, whatever the key holds.
  for (const std::string key : {"plain", "with}brace", "{braced}", "a:b:c", ""}) {
    const auto n = d::fleet_names::of("pre{fix", key);
    const std::size_t slot = d::cluster_slot(n.value);
    CHECK(d::cluster_slot(n.lease) == slot);
    CHECK(d::cluster_slot(n.meta) == slot);
    CHECK(d::cluster_slot(n.tomb("0123")) == slot);
  }
}

// A master's replicas, as CLUSTER NODES lists them (redis-server 7.0's format): the failover
// wait's question when the slot map lists none (CLUSTER SLOTS leaves out a replica whose offset
// the node asked has not heard of).
TEST_CASE("lists_replica finds a master's replicas in CLUSTER NODES, failed ones left out",
          "[cluster][slots]") {
  const std::string nodes =
      "57f3 127.0.0.1:35495@45495 slave fa09 0 1796441935871 1 connected\n"
      "3b30 127.0.0.1:55091@65091 master - 0 1796441935867 2 connected 5461-10922\n"
      "2fec 127.0.0.1:41515@51515 slave,fail b86f 0 1796441935867 3 connected\n"
      "fa09 127.0.0.1:54797@64797 myself,master - 0 1796441935000 1 connected 0-5460\n"
      "b86f 127.0.0.1:33649@43649 master,fail? - 0 1796441936083 3 connected 10923-16383\n";
  using r = d::redis_router;
  CHECK(r::lists_replica(nodes, "127.0.0.1", 54797));        // its replica 57f3 (myself)
  CHECK_FALSE(r::lists_replica(nodes, "127.0.0.1", 55091));  // no replica
  CHECK_FALSE(r::lists_replica(nodes, "127.0.0.1", 33649));  // its only replica failed
  CHECK_FALSE(r::lists_replica(nodes, "127.0.0.1", 4444));   // not in the list
  CHECK_FALSE(r::lists_replica("", "127.0.0.1", 54797));
  CHECK_FALSE(r::lists_replica("garbage", "127.0.0.1", 54797));
  // A replica in PFAIL ("fail?") is still a candidate: only "fail" leaves it out.
  CHECK(
      r::lists_replica("aa 10.0.0.1:7000@17000 master - 0 0 1 connected 0-16383\n"
                       "bb 10.0.0.2:7000@17000 slave,fail? aa 0 0 1 connected",
                       "10.0.0.1", 7000));
}

TEST_CASE("cluster_redirect parses MOVED, ASK, TRYAGAIN and CLUSTERDOWN", "[cluster][slots]") {
  using r = d::cluster_redirect;
  const r moved = r::parse("MOVED 3999 127.0.0.1:6381");
  CHECK(moved.kind == r::moved);
  CHECK(moved.slot == 3999);
  CHECK(moved.host == "127.0.0.1");
  CHECK(moved.port == 6381);
  const r ask = r::parse("ASK 16383 ::1:7000");
  CHECK(ask.kind == r::ask);
  CHECK(ask.slot == 16383);
  CHECK(ask.host == "::1");
  CHECK(ask.port == 7000);
  CHECK(r::parse("MOVED 12 :6380").host.empty());  // a node without a known address
  CHECK(r::parse("TRYAGAIN Multiple keys request during rehashing of slot").kind == r::tryagain);
  CHECK(r::parse("CLUSTERDOWN The cluster is down").kind == r::clusterdown);
  CHECK(r::parse("MOVED 16384 127.0.0.1:1").kind == r::none);  // no such slot
  CHECK(r::parse("MOVED x 127.0.0.1:1").kind == r::none);
  CHECK(r::parse("MOVED 12 127.0.0.1:0").kind == r::none);  // no server listens on port 0
  CHECK(r::parse("ASK 12 127.0.0.1:65536").kind == r::none);
  CHECK(r::parse("ERR unknown command").kind == r::none);
}

TEST_CASE("a single Redis server is never asked about a cluster", "[cluster]") {
  sftest::private_redis server;
  const std::string prefix = sftest::unique_prefix("single");
  fleet_t f(sftest::fleet_opts(server.uri(), prefix));
  for (int k = 0; k < 20; ++k) {
    const std::string key = "k" + std::to_string(k);
    CHECK(f.get(key, [&] { return "v" + key; }) == "v" + key);  // a miss: GET, race, store
    CHECK(f.get(key, [] { return std::string("not loaded"); }) == "v" + key);  // a hit
  }
  const d::fleet_engine& e = sftest::fleet_engine(f);
  CHECK_FALSE(e.router.cluster());
  CHECK(e.router.nodes() == 1);
  CHECK(server.client()->command_calls("cluster") == 0);
  CHECK(f.stats().redis_errors == 0);
}

TEST_CASE("a fleet on a cluster learns the slot map and renews leases on their owners",
          "[cluster]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("renew");
  sftest::redis_client seed(uri);
  // A key whose slot is on another master.
  std::string key;
  for (int k = 0; key.empty(); ++k) {
    const std::string candidate = "far-" + std::to_string(k);
    if (owner_port(seed, d::fleet_names::of(prefix, candidate).value) != port_of(uri)) {
      key = candidate;
    }
  }
  const std::string lease = d::fleet_names::of(prefix, key).lease;
  sftest::redis_client owner("tcp://127.0.0.1:" + std::to_string(owner_port(seed, lease)));

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.lease_ttl = 600ms;  // renewed every 200 ms
  fleet_t f(o);
  sftest::held_origin origin("far value");
  sftest::result<std::string> r;
  auto t = sftest::spawn(r, [&] { return f.get(key, origin.loader()); });
  origin.started.wait("leader loading");
  CHECK(sftest::fleet_engine(f).router.cluster());
  // The lease lives on the key's master; three lease_ttl later it is still there: renewed there.
  REQUIRE(owner.get(lease).has_value());
  const auto until = std::chrono::steady_clock::now() + 3 * o.lease_ttl;
  sftest::must([&] { return std::chrono::steady_clock::now() >= until; }, "three lease_ttl");
  CHECK(owner.get(lease).has_value());
  origin.release.open();
  sftest::finish(t, r, "leader");
  REQUIRE(r.value.has_value());
  CHECK(*r.value == "far value");
  const sf::fleet_stats s = f.stats();
  CHECK(s.lease_lost == 0);
  CHECK(s.redis_errors == 0);
  CHECK(s.origin_calls == 1);
  CHECK(f.healthy());
}

// A slot migrated from its master A to another master B (CLUSTER SETSLOT IMPORTING/MIGRATING,
// MIGRATE, SETSLOT NODE) while a fleet pointed at one node uses it:
//  * mid-migration, a value already moved to B is read there: A answers ASK, the fleet sends
//    ASKING + GET to B (a hit, no load);
//  * mid-migration, a cold key of that slot: ASK, then B cannot run the race's script with
//    keys missing (TRYAGAIN, asked again until redis_timeout while the migration stays as it
//    is): the key loads locally, no Redis error, breaker closed;
//  * after the migration, A answers MOVED: the fleet learns the slot's new owner, reads the
//    slot map again and reads the value on B (a hit, no load).
TEST_CASE("a slot migrated between two gets: ASK, TRYAGAIN and MOVED are followed",
          "[cluster][migrate]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("migrate");
  sftest::redis_client seed(uri);
  const std::string key = "hot";
  const d::fleet_names names = d::fleet_names::of(prefix, key);
  const std::size_t slot = d::cluster_slot(names.value);
  const int a_port = owner_port(seed, names.value);
  const std::set<int> masters = master_ports(seed);
  REQUIRE(masters.size() == 3);
  int b_port = -1;
  for (const int p : masters) {
    if (p != a_port && b_port < 0) b_port = p;
  }
  sftest::redis_client a(node_uri(a_port));
  sftest::redis_client b(node_uri(b_port));
  const std::string a_id = a.command({"CLUSTER", "MYID"}).str;
  const std::string b_id = b.command({"CLUSTER", "MYID"}).str;
  const std::string slot_text = std::to_string(slot);

  fleet_t f(sftest::fleet_opts(uri, prefix));
  std::atomic<int> calls{0};
  auto origin = [&] {
    calls.fetch_add(1);
    return std::string("hot value");
  };
  std::atomic<int> ran{0};
  REQUIRE(f.get(key, origin) == "hot value");  // stored on A
  REQUIRE(calls.load() == 1);
  REQUIRE(a.get(names.value).has_value());

  // Migration begins; the value (only) moves to B.
  REQUIRE(b.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", a_id}).str == "OK");
  REQUIRE(a.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", b_id}).str == "OK");
  REQUIRE(
      a.command({"MIGRATE", "127.0.0.1", std::to_string(b_port), names.value, "0", "5000"}).str ==
      "OK");
  REQUIRE(a.command({"GET", names.value}).str.rfind("ASK ", 0) == 0);  // gone from A: ASK

  // ASK: read on B.
  CHECK(f.get(key, sftest::must_not_load(ran)) == "hot value");
  CHECK(ran.load() == 0);

  // TRYAGAIN: a cold key of the migrating slot loads locally.
  const std::string cold = key_in_slot(prefix, slot, "cold-");
  std::atomic<int> cold_calls{0};
  CHECK(f.get(cold, [&] {
    cold_calls.fetch_add(1);
    return std::string("cold value");
  }) == "cold value");
  CHECK(cold_calls.load() == 1);
  sf::fleet_stats s = f.stats();
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());

  // The migration ends: every key of the slot on B, the slot B's on every master.
  for (;;) {
    const auto keys = a.command({"CLUSTER", "GETKEYSINSLOT", slot_text, "100"});
    if (keys.elements.empty()) break;
    for (const auto& k : keys.elements) {
      REQUIRE(a.command({"MIGRATE", "127.0.0.1", std::to_string(b_port), k.str, "0", "5000"}).str ==
              "OK");
    }
  }
  for (const int p : masters) {
    sftest::redis_client m(node_uri(p));
    REQUIRE(m.command({"CLUSTER", "SETSLOT", slot_text, "NODE", b_id}).str == "OK");
  }
  REQUIRE(b.get(names.value).has_value());

  // MOVED: the fleet learns B, and reads the value there.
  CHECK(f.get(key, sftest::must_not_load(ran)) == "hot value");
  CHECK(ran.load() == 0);
  CHECK(calls.load() == 1);
  const d::fleet_engine& e = sftest::fleet_engine(f);
  CHECK(e.router.cluster());
  CHECK(e.router.route(names.value).ep.port == b_port);
  s = f.stats();
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(s.local_fallback == 1);  // the cold key's TRYAGAIN, nothing else
  CHECK(f.healthy());
}

// TRYAGAIN counted by a node (INFO errorstats: errorstat_TRYAGAIN:count=N; 0 before any).
long long tryagain_count(sftest::redis_client& c) {
  const std::string info = c.command({"INFO", "errorstats"}).str;
  const auto at = info.find("errorstat_TRYAGAIN:count=");
  return at == std::string::npos ? 0 : std::stoll(info.substr(at + 25));
}

// A slot being migrated answers TRYAGAIN for a cold key's race (the importing node cannot run a
// script whose names it does not all have), for as long as the migration lasts: a few
// milliseconds per slot in redis-cli --cluster reshard. A flight that loaded locally at the
// first TRYAGAIN cost every process of the fleet an origin call for a hot key that went cold
// just then (8 calls instead of 1 for 8 processes, in fleet_driver --cluster --trials). The
// race is asked again until redis_timeout: here the migration ends after the first TRYAGAIN
// (seen in the importing node's errorstats), and the race then runs on the new owner.
TEST_CASE("a cold key's race that gets TRYAGAIN mid-migration runs once the migration ends",
          "[cluster][migrate]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("tryagain");
  sftest::redis_client seed(uri);
  const std::string key = "cold";
  const d::fleet_names names = d::fleet_names::of(prefix, key);
  const std::size_t slot = d::cluster_slot(names.value);
  const int a_port = owner_port(seed, names.value);
  const std::set<int> masters = master_ports(seed);
  REQUIRE(masters.size() == 3);
  int b_port = -1;
  for (const int p : masters) {
    if (p != a_port && b_port < 0) b_port = p;
  }
  sftest::redis_client a(node_uri(a_port));
  sftest::redis_client b(node_uri(b_port));
  const std::string a_id = a.command({"CLUSTER", "MYID"}).str;
  const std::string b_id = b.command({"CLUSTER", "MYID"}).str;
  const std::string slot_text = std::to_string(slot);

  fleet_t f(sftest::fleet_opts(uri, prefix));
  std::atomic<int> ran{0};
  // The fleet learns the slot map: a key on a master other than the seed (a MOVED), of another
  // slot (nothing to migrate).
  std::string warm;
  for (int i = 0; warm.empty(); ++i) {
    const std::string k = "warm-" + std::to_string(i);
    const std::string n = d::fleet_names::of(prefix, k).value;
    if (d::cluster_slot(n) != slot && owner_port(seed, n) != port_of(uri)) warm = k;
  }
  (void)f.get(warm, [] { return std::string("warm"); });
  REQUIRE(sftest::fleet_engine(f).router.cluster());

  REQUIRE(b.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", a_id}).str == "OK");
  REQUIRE(a.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", b_id}).str == "OK");
  const long long tryagain_before = tryagain_count(b);
  std::atomic<int> calls{0};
  sftest::result<std::string> got;
  auto t = sftest::spawn(got, [&] {
    return f.get(key, [&] {
      calls.fetch_add(1);
      return std::string("cold value");
    });
  });
  sftest::must([&] { return tryagain_count(b) > tryagain_before; }, "B's first TRYAGAIN");
  for (const int p : masters) {  // the migration ends: the (empty) slot is B's
    sftest::redis_client m(node_uri(p));
    REQUIRE(m.command({"CLUSTER", "SETSLOT", slot_text, "NODE", b_id}).str == "OK");
  }
  sftest::finish(t, got, "the cold key's get");

  REQUIRE(got.value.has_value());
  CHECK(*got.value == "cold value");
  CHECK(calls.load() == 1);
  const sf::fleet_stats s = f.stats();
  CHECK(s.local_fallback == 0);  // the race ran: no local load
  CHECK(s.redis_errors == 0);
  CHECK(b.get(names.value).has_value());  // stored on the slot's new owner
  CHECK(f.get(key, sftest::must_not_load(ran)) == "cold value");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "a list of seeds whose first is a dead port: the fleets learn the cluster from the next "
    "seed and coalesce every key",
    "[cluster][seeds]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("seeds");
  constexpr int fleets = 2;
  constexpr int threads_per_fleet = 8;
  constexpr int keys = 12;
  const int dead = sftest::free_port();  // nothing listens there: connections are refused
  const std::string seeds =
      "tcp://127.0.0.1:" + std::to_string(dead) + "," + uri.substr(uri.find("://") + 3);

  std::vector<std::string> key(keys);
  for (int k = 0; k < keys; ++k) key[k] = "key-" + std::to_string(k);
  std::array<std::atomic<int>, keys> calls{};
  std::vector<std::unique_ptr<fleet_t>> fleet;
  for (int i = 0; i < fleets; ++i) {
    fleet.push_back(std::make_unique<fleet_t>(sftest::fleet_opts(seeds, prefix)));
  }
  coalesce_every_key(fleet, threads_per_fleet, key, calls, "seed list workers");
  for (auto& f : fleet) {
    const d::fleet_engine& e = sftest::fleet_engine(*f);
    CHECK(e.router.cluster());
    CHECK(e.router.seed().pool.endpoint().port == port_of(uri));
    // No key is routed to the dead seed: the masters are nodes of their own.
    for (const auto& k : key)
      CHECK(e.router.route(d::fleet_names::of(prefix, k).value).ep.port != dead);
  }
}

namespace {

// The first master that is neither `a` nor `b`.
int other_master(const std::set<int>& masters, int a, int b = -1) {
  for (const int p : masters) {
    if (p != a && p != b) return p;
  }
  return -1;
}

// A key (under `prefix`) whose slot a master other than `avoid` owns.
std::string key_off(sftest::redis_client& seed, const std::string& prefix, int avoid,
                    const std::string& stem) {
  for (int i = 0;; ++i) {
    const std::string k = stem + std::to_string(i);
    if (owner_port(seed, d::fleet_names::of(prefix, k).value) != avoid) return k;
    if (i > 100'000) FAIL("no key found off port " << avoid);
  }
}

using sftest::poll_until;

}  // namespace

// On a cluster a follower watches its key's shard channel (SSUBSCRIBE) on the key's master,
// where the leader's store script SPUBLISHes: nothing travels over the cluster bus, and the
// node the fleets are pointed at hears nothing. wait_slice is 10 s, so a follower woken
// within 3 s of the store was woken by the message, not by its poll.
TEST_CASE("a follower in another fleet is woken by the shard notification on the key's master",
          "[cluster][sharded]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("sharded");
  sftest::redis_client seed(uri);
  const std::string key = key_off(seed, prefix, port_of(uri), "far-");
  const d::fleet_names names = d::fleet_names::of(prefix, key);
  sftest::redis_client owner(node_uri(owner_port(seed, names.value)));

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.wait_slice = 10s;
  fleet_t leader_fleet(o);
  fleet_t follower_fleet(o);
  sftest::fleet_points points;
  points.attach(follower_fleet);
  sftest::held_origin origin("shard value");
  std::atomic<int> follower_loads{0};

  const long long ssubscribes = owner.command_calls("ssubscribe");
  const long long sunsubscribes = owner.command_calls("sunsubscribe");
  sftest::result<std::string> led;
  auto leader = sftest::spawn(led, [&] { return leader_fleet.get(key, origin.loader()); });
  origin.started.wait("leader loading");
  sftest::result<std::string> followed;
  auto follower = sftest::spawn(
      followed, [&] { return follower_fleet.get(key, sftest::must_not_load(follower_loads)); });
  sftest::must([&] { return points.waiting.load() > 0; }, "follower waiting");
  // Its watch is a shard subscription on the key's master; the seed has no classic one.
  poll_until([&] { return owner.shardnumsub(names.channel) == 1; }, "SSUBSCRIBE on the owner");
  CHECK(seed.numsub(names.channel) == 0);
  CHECK(owner.numsub(names.channel) == 0);

  const auto released = std::chrono::steady_clock::now();
  origin.release.open();
  sftest::finish(leader, led, "leader");
  CHECK(sftest::becomes([&] { return followed.done.load(std::memory_order_acquire); }, 3s));
  sftest::finish(follower, followed, "follower");
  const auto took = std::chrono::steady_clock::now() - released;
  CHECK(took < 3s);

  REQUIRE(followed.value.has_value());
  CHECK(*followed.value == "shard value");
  CHECK(origin.calls.load() == 1);
  CHECK(follower_loads.load() == 0);
  const sf::fleet_stats s = follower_fleet.stats();
  CHECK(s.follower_woken == 1);
  CHECK(s.redis_errors == 0);
  CHECK(leader_fleet.stats().publish_failures == 0);
  // Unwatched once the follower returned: SUNSUBSCRIBE.
  poll_until([&] { return owner.shardnumsub(names.channel) == 0; }, "SUNSUBSCRIBE on the owner");
  // The wait cost one SSUBSCRIBE and one SUNSUBSCRIBE, on the owner's shard subscriber.
  CHECK(owner.command_calls("ssubscribe") - ssubscribes == 1);
  CHECK(owner.command_calls("sunsubscribe") - sunsubscribes == 1);
}

// A slot migrated while a follower waits on its shard channel: the old owner pushes
// `sunsubscribe`; the follower races again (on the new owner: MOVED), loses to the lease that
// migrated with the slot, watches the shard channel there and is woken by the leader's store
// (which follows the slot too). One origin call; wait_slice is 10 s, the follower is woken
// within 3 s of the store.
TEST_CASE("a slot migrated while a follower waits: it races again and watches the new owner",
          "[cluster][sharded][migrate]") {
  const std::string uri = need_cluster_or_warn();
  if (uri.empty()) return;
  const std::string prefix = sftest::unique_prefix("shardmove");
  sftest::redis_client seed(uri);
  const std::string key = "moving";
  const d::fleet_names names = d::fleet_names::of(prefix, key);
  const std::string slot_text = std::to_string(d::cluster_slot(names.value));
  const int a_port = owner_port(seed, names.value);
  const std::set<int> masters = master_ports(seed);
  REQUIRE(masters.size() == 3);
  const int b_port = other_master(masters, a_port);
  sftest::redis_client a(node_uri(a_port));
  sftest::redis_client b(node_uri(b_port));
  const std::string a_id = a.command({"CLUSTER", "MYID"}).str;
  const std::string b_id = b.command({"CLUSTER", "MYID"}).str;

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.wait_slice = 10s;
  fleet_t leader_fleet(o);
  fleet_t follower_fleet(o);
  // Both fleets learn the slot map first (a key of another master than the seed's: MOVED).
  const std::string warm = key_off(seed, prefix, port_of(uri), "warm-");
  (void)leader_fleet.get(warm, [] { return std::string("warm"); });
  (void)follower_fleet.get(warm, [] { return std::string("warm"); });
  REQUIRE(sftest::fleet_engine(follower_fleet).router.cluster());
  sftest::fleet_points points;
  points.attach(follower_fleet);
  sftest::held_origin origin("moved value");
  std::atomic<int> follower_loads{0};

  sftest::result<std::string> led;
  auto leader = sftest::spawn(led, [&] { return leader_fleet.get(key, origin.loader()); });
  origin.started.wait("leader loading");
  sftest::result<std::string> followed;
  auto follower = sftest::spawn(
      followed, [&] { return follower_fleet.get(key, sftest::must_not_load(follower_loads)); });
  sftest::must([&] { return points.waiting.load() > 0; }, "follower waiting");
  poll_until([&] { return a.shardnumsub(names.channel) == 1; }, "SSUBSCRIBE on A");
  const int lost_before = points.lost.load();

  // The slot moves from A to B with its keys (the lease, the metadata).
  REQUIRE(b.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", a_id}).str == "OK");
  REQUIRE(a.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", b_id}).str == "OK");
  for (;;) {
    const auto keys = a.command({"CLUSTER", "GETKEYSINSLOT", slot_text, "100"});
    if (keys.elements.empty()) break;
    for (const auto& k : keys.elements) {
      REQUIRE(a.command({"MIGRATE", "127.0.0.1", std::to_string(b_port), k.str, "0", "5000"}).str ==
              "OK");
    }
  }
  // As redis-cli --cluster reshard ends a migration: the importing node first (from then on
  // it serves the slot), then the migrating one (which then pushes `sunsubscribe`), then the
  // rest.
  REQUIRE(b.command({"CLUSTER", "SETSLOT", slot_text, "NODE", b_id}).str == "OK");
  REQUIRE(a.command({"CLUSTER", "SETSLOT", slot_text, "NODE", b_id}).str == "OK");
  sftest::redis_client third(node_uri(other_master(masters, a_port, b_port)));
  REQUIRE(third.command({"CLUSTER", "SETSLOT", slot_text, "NODE", b_id}).str == "OK");
  // A pushed sunsubscribe: the follower raced again (lost: the lease moved with the slot) and
  // watches on B.
  poll_until([&] { return b.shardnumsub(names.channel) == 1; }, "SSUBSCRIBE on B");
  CHECK(points.lost.load() > lost_before);
  CHECK(a.shardnumsub(names.channel) == 0);
  CHECK_FALSE(followed.done.load());

  const auto released = std::chrono::steady_clock::now();
  origin.release.open();
  sftest::finish(leader, led, "leader");
  CHECK(sftest::becomes([&] { return followed.done.load(std::memory_order_acquire); }, 3s));
  sftest::finish(follower, followed, "follower");
  CHECK(std::chrono::steady_clock::now() - released < 3s);

  REQUIRE(led.value.has_value());
  REQUIRE(followed.value.has_value());
  CHECK(*followed.value == "moved value");
  CHECK(origin.calls.load() == 1);
  CHECK(follower_loads.load() == 0);
  CHECK(b.get(names.value).has_value());  // stored on the slot's new owner
  const sf::fleet_stats s = follower_fleet.stats();
  CHECK(s.follower_woken == 1);
  CHECK(s.redis_errors == 0);
  CHECK(s.local_fallback == 0);
  CHECK(leader_fleet.stats().local_fallback == 0);
}
