// singleflight::fleet on a Redis Cluster whose masters fail over (3 masters, one replica each,
// tests/support/redis_cluster.sh with replicas 1: the ctest fixture fleet_redis_failover). The
// tests kill masters (SIGKILL by the pid the fixture wrote) and force failovers, so they have a
// cluster of their own; without one (no redis-server / redis-cli, or a cluster named by
// SINGLEFLIGHT_TEST_REDIS_CLUSTER, whose pids the tests do not know) they WARN and pass without
// running.
#include <signal.h>

#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/cluster.hpp"
#include "support/fleet.hpp"
#include "support/jthread.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using sftest::node_uri;
using sftest::port_of;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;

std::string read_line(const std::string& path) {
  std::string line;
  if (std::FILE* f = std::fopen(path.c_str(), "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, f) != nullptr) line = buf;
    std::fclose(f);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

// The fixture's directory (its uri file, one P.pid per node), or "" after a loud warning.
std::string need_failover_cluster_or_warn() {
  std::string dir;
#ifdef SINGLEFLIGHT_TEST_REDIS_FAILOVER_FILE
  const std::string file = SINGLEFLIGHT_TEST_REDIS_FAILOVER_FILE;
  if (!read_line(file).empty()) dir = file.substr(0, file.rfind('/'));
#endif
  if (dir.empty()) {
    WARN(
        "NOT RUN: this test needs the Redis Cluster with replicas that the ctest fixture "
        "fleet_redis_failover starts (redis-server and redis-cli >= 7.0 on PATH, "
        "SINGLEFLIGHT_TEST_REDIS_CLUSTER unset): it kills the cluster's masters");
  }
  return dir;
}

// A shard: a master and its replica (ports), from CLUSTER SLOTS.
struct shard {
  long long first = 0;
  int master = -1;
  int replica = -1;
};

std::vector<shard> shards(sftest::redis_client& c) {
  std::vector<shard> out;
  for (const auto& range : c.command({"CLUSTER", "SLOTS"}).elements) {
    shard s;
    s.first = range.elements.at(0).integer;
    s.master = static_cast<int>(range.elements.at(2).elements.at(1).integer);
    if (range.elements.size() >= 4) {
      s.replica = static_cast<int>(range.elements.at(3).elements.at(1).integer);
    }
    out.push_back(s);
  }
  return out;
}

bool is_master(int port) {
  try {
    sftest::redis_client c(node_uri(port));
    return c.info_field("replication", "role") == "master";
  } catch (const std::exception&) {
    return false;
  }
}

// `replica` is a replica in sync with its master.
bool in_sync(int replica) {
  sftest::redis_client c(node_uri(replica));
  return c.info_field("replication", "role") == "slave" &&
         c.info_field("replication", "master_link_status") == "up" &&
         c.info_field("replication", "master_sync_in_progress") == "0";
}

// Waits (bounded) until `replica` has everything `master` had written when called: its
// replication offset reaches the master's. Not WAIT on a connection of the test's own: WAIT
// waits for that connection's writes, so on one that wrote nothing it answers at once.
void replicated(sftest::redis_client& master, int replica, const char* what) {
  const long long written = std::stoll(master.info_field("replication", "master_repl_offset"));
  sftest::redis_client r(node_uri(replica));
  sftest::must(
      [&] { return std::stoll(r.info_field("replication", "slave_repl_offset")) >= written; },
      what);
}

// A shard whose master is not `avoid_port` and whose replica is in sync (waits, bounded).
shard live_shard(sftest::redis_client& seed, int avoid_port) {
  std::optional<shard> found;
  sftest::must(
      [&] {
        for (const shard& s : shards(seed)) {
          if (s.master != avoid_port && s.replica > 0 && in_sync(s.replica)) {
            found = s;
            return true;
          }
        }
        return false;
      },
      "a shard with a replica in sync");
  return *found;
}

// A key whose fleet names (under `prefix`) hash to a slot the master at `port` owns
// (CLUSTER SLOTS, read once).
std::string key_on(sftest::redis_client& seed, const std::string& prefix, int port,
                   const std::string& stem) {
  std::vector<std::pair<long long, long long>> ranges;
  for (const auto& range : seed.command({"CLUSTER", "SLOTS"}).elements) {
    if (range.elements.at(2).elements.at(1).integer == port) {
      ranges.emplace_back(range.elements.at(0).integer, range.elements.at(1).integer);
    }
  }
  REQUIRE_FALSE(ranges.empty());
  for (int i = 0;; ++i) {
    const std::string k = stem + std::to_string(i);
    const auto slot = static_cast<long long>(d::cluster_slot(d::fleet_names::of(prefix, k).value));
    for (const auto& [first, last] : ranges) {
      if (first <= slot && slot <= last) return k;
    }
    if (i > 100'000) FAIL("no key found on port " << port);
  }
}

int pid_of(const std::string& dir, int port) {
  const std::string pid = read_line(dir + "/" + std::to_string(port) + ".pid");
  return pid.empty() ? -1 : std::stoi(pid);
}

// Starts the node at `port` again after a SIGKILL, with the options of
// tests/support/redis_cluster.sh and its config file: it rejoins the cluster (a master that
// failed over comes back as a replica of the new one).
void restart_node(const std::string& dir, int port) {
  const std::string p = std::to_string(port);
  const std::string cmd = "redis-server --port " + p +
                          " --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file '" + dir +
                          "/nodes-" + p +
                          ".conf' --cluster-node-timeout 1000 --repl-diskless-sync-delay 0 "
                          "--shutdown-timeout 0 --cluster-require-full-coverage no --save '' "
                          "--appendonly no --daemonize yes --pidfile '" +
                          dir + "/" + p + ".pid' --logfile '" + dir + "/" + p + ".log' --dir '" +
                          dir + "' >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
}

}  // namespace

// A master SIGKILLed: no MOVED comes (the dead node does not answer); its replica takes over
// after the cluster's node timeout (1 s). The fleet reads the slot map again when the node's
// connection fails or its breaker is open, so the key reaches Redis again on the new master.
TEST_CASE("a master killed: its keys reach Redis again on the replica that took over",
          "[cluster][failover][slow]") {
  const std::string dir = need_failover_cluster_or_warn();
  if (dir.empty()) return;
  const std::string uri = read_line(dir + "/uri");
  sftest::redis_client seed(uri);
  const shard victim = live_shard(seed, port_of(uri));  // the fleet's seed stays up
  const int victim_pid = pid_of(dir, victim.master);
  REQUIRE(victim_pid > 0);
  const std::string prefix = sftest::unique_prefix("failover");
  const std::string key = key_on(seed, prefix, victim.master, "dies-");
  const std::string fresh = key_on(seed, prefix, victim.master, "fresh-");
  int other_port = -1;
  for (const shard& s : shards(seed)) {
    if (s.master != victim.master && other_port < 0) other_port = s.master;
  }
  const std::string other = key_on(seed, prefix, other_port, "lives-");

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.redis_timeout = 500ms;
  fleet_t f(o);
  std::atomic<int> key_calls{0};
  std::atomic<int> other_calls{0};
  std::atomic<int> fresh_calls{0};
  auto key_origin = [&] {
    key_calls.fetch_add(1);
    return std::string("key value");
  };
  auto other_origin = [&] {
    other_calls.fetch_add(1);
    return std::string("other value");
  };
  auto fresh_origin = [&] {
    fresh_calls.fetch_add(1);
    return std::string("fresh value");
  };
  int threw = 0;
  int wrong = 0;
  const auto get = [&](const std::string& k, auto& origin, const char* want) {
    try {
      if (f.get(k, origin) != want) ++wrong;
    } catch (...) {
      ++threw;
    }
  };
  get(key, key_origin, "key value");
  get(other, other_origin, "other value");
  REQUIRE(key_calls.load() == 1);
  REQUIRE(other_calls.load() == 1);
  REQUIRE(sftest::fleet_engine(f).router.route(d::fleet_names::of(prefix, key).value).ep.port ==
          victim.master);

  REQUIRE(::kill(victim_pid, SIGKILL) == 0);
  // Until the replica is master, the key loads locally; the other master's key stays a hit.
  sftest::must(
      [&] {
        get(key, key_origin, "key value");
        get(other, other_origin, "other value");
        return is_master(victim.replica);
      },
      "the replica promoted");
  // Then the slot's new master is found: a cold key of the slot is stored there, then a hit.
  sftest::redis_client promoted(node_uri(victim.replica));
  const std::string fresh_value = d::fleet_names::of(prefix, fresh).value;
  sftest::must(
      [&] {
        get(fresh, fresh_origin, "fresh value");
        get(other, other_origin, "other value");
        return promoted.get(fresh_value).has_value();
      },
      "a store on the promoted replica");
  const int loads_before_hit = fresh_calls.load();
  std::atomic<int> ran{0};
  CHECK(f.get(fresh, sftest::must_not_load(ran)) == "fresh value");
  CHECK(ran.load() == 0);
  CHECK(fresh_calls.load() == loads_before_hit);
  CHECK(sftest::fleet_engine(f).router.route(fresh_value).ep.port == victim.replica);

  CHECK(threw == 0);
  CHECK(wrong == 0);
  CHECK(other_calls.load() == 1);  // the other master's key kept coalescing: every get a hit
  CHECK(f.healthy());              // the dead master owns no slot any more
  // The killed node back, as its replica: the next test (or this one again, under ctest
  // --repeat) finds every shard with a replica in sync, whatever the order.
  restart_node(dir, victim.master);
  sftest::must([&] { return in_sync(victim.master); }, "the old master a replica in sync", 60s);
}

// A master SIGKILLed while its keys are in demand: until its replica is promoted (after the
// cluster's node timeout, 1 s here, and the election) no node answers for the slot. A flight
// whose master fails, and whose slot map names a replica for it, waits for the promotion
// (failover_wait) and races on the new master: a key stored before the kill (acknowledged by
// the replica) is a hit there, a cold key is loaded once for both fleets. Loading locally
// instead, as a slot without a replica does, costs an origin call per process and per load
// time for as long as the outage lasts.
TEST_CASE("a master killed: calls made before its replica is promoted wait for it, not the origin",
          "[cluster][failover][slow]") {
  const std::string dir = need_failover_cluster_or_warn();
  if (dir.empty()) return;
  const std::string uri = read_line(dir + "/uri");
  sftest::redis_client seed(uri);
  const shard victim = live_shard(seed, port_of(uri));  // the fleets' seed stays up
  const int victim_pid = pid_of(dir, victim.master);
  REQUIRE(victim_pid > 0);
  const std::string prefix = sftest::unique_prefix("failwait");
  const std::string stored_key = key_on(seed, prefix, victim.master, "stored-");
  const std::string cold_key = key_on(seed, prefix, victim.master, "cold-");

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.redis_timeout = 500ms;
  o.failover_wait = 20s;
  fleet_t a(o);
  fleet_t b(o);
  std::atomic<int> stored_calls{0};
  std::atomic<int> cold_calls{0};
  auto stored_origin = [&] {
    stored_calls.fetch_add(1);
    return std::string("stored value");
  };
  auto cold_origin = [&] {
    cold_calls.fetch_add(1);
    return std::string("cold value");
  };
  REQUIRE(a.get(stored_key, stored_origin) == "stored value");
  REQUIRE(stored_calls.load() == 1);
  REQUIRE(b.get(stored_key, sftest::must_not_load(stored_calls)) == "stored value");
  {
    // The record on the replica before the kill (replication is asynchronous), from once it is
    // on the master (b's hit): under load the kill could otherwise beat it there.
    sftest::redis_client m(node_uri(victim.master));
    replicated(m, victim.replica, "the record on the replica");
  }
  REQUIRE(
      sftest::fleet_engine(a).router.route(d::fleet_names::of(prefix, stored_key).value).ep.port ==
      victim.master);
  REQUIRE(sftest::fleet_engine(b).router.cluster());

  REQUIRE(::kill(victim_pid, SIGKILL) == 0);
  REQUIRE_FALSE(is_master(victim.replica));  // the calls below begin before the promotion
  constexpr int per_fleet = 4;
  std::atomic<int> threw{0};
  std::atomic<int> wrong{0};
  std::atomic<int> done{0};
  {
    std::vector<sftest::jthread> callers;
    for (fleet_t* f : {&a, &b}) {
      for (int t = 0; t < per_fleet; ++t) {
        callers.emplace_back([&, f] {
          try {
            if (f->get(stored_key, stored_origin) != "stored value") wrong.fetch_add(1);
            if (f->get(cold_key, cold_origin) != "cold value") wrong.fetch_add(1);
          } catch (...) {
            threw.fetch_add(1);
          }
          done.fetch_add(1);
        });
      }
    }
    // Bounded: failover_wait (20 s) then a local load, per call.
    sftest::must([&] { return done.load() == 2 * per_fleet; }, "every call returned", 60s);
  }
  CHECK(threw.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(stored_calls.load() == 1);  // the first load only: a hit on the promoted replica
  CHECK(cold_calls.load() == 1);    // one load for both fleets, on the promoted replica's lease
  CHECK(is_master(victim.replica));
  CHECK(sftest::fleet_engine(a).router.route(d::fleet_names::of(prefix, cold_key).value).ep.port ==
        victim.replica);
  WARN("local loads: " << a.stats().local_fallback + b.stats().local_fallback
                       << ", stored key calls " << stored_calls.load() << ", cold key calls "
                       << cold_calls.load());
  // The killed node back, as its replica, for the tests after this one.
  sftest::must([&] { return is_master(victim.replica); }, "the replica promoted");
  restart_node(dir, victim.master);
  sftest::must([&] { return in_sync(victim.master); }, "the old master a replica in sync", 60s);
}

// Replication is asynchronous: the race that handed out a fence on a master may never reach
// its replica. Here the replica's link is cut and kept down (CLIENT KILL TYPE replica, the
// master asking a password the replica lacks), a leader wins the race on the master (fence
// F1), and the replica is promoted (CLUSTER FAILOVER FORCE): the new master has not seen that
// race, so the next leader wins there too. Its fence must exceed F1, so that the
// first leader's late store is fenced out (no stale overwrite). With a plain counter (HINCRBY
// alone) the new master hands out F1 again and the late store overwrites the newer leader's.
TEST_CASE("fences stay monotonic across a forced failover that lost the race's write",
          "[cluster][failover][fence][slow]") {
  const std::string dir = need_failover_cluster_or_warn();
  if (dir.empty()) return;
  const std::string uri = read_line(dir + "/uri");
  sftest::redis_client seed(uri);
  constexpr int trials = 3;
  int lost = 0;             // trials where the promoted replica had not seen the race
  int duplicates = 0;       // ... and handed out a fence <= the lost one
  int stale_overwrite = 0;  // ... and then took the first leader's late store
  for (int trial = 0; trial < trials; ++trial) {
    const shard s = live_shard(seed, -1);
    const std::string prefix = sftest::unique_prefix("fence");
    const std::string key = key_on(seed, prefix, s.master, "race-");
    const d::fleet_names names = d::fleet_names::of(prefix, key);
    const auto open = [](int port) {
      return d::redis_conn::open(d::redis_endpoint::parse(node_uri(port)), 2000ms, "", "");
    };
    // The key's metadata, replicated: a finished load.
    const auto m = open(s.master);
    sftest::redis_client mc(node_uri(s.master));
    {
      const d::acquire_result a = d::acquire(*m, names, "s", "t0", 10s, 60s, false, 0);
      REQUIRE(a.kind == d::acquire_result::won);
      bool published = true;
      REQUIRE(d::store(*m, names, "t0", a.fence, a.gen, "", 10s, "r", 60s, published) ==
              d::store_result::stored);
      replicated(mc, s.replica, "the metadata on the replica, before the link is cut");
    }
    // The replication link cut, and kept down: the master now asks a password the replica does
    // not have (connections already open stay authenticated; the cluster bus is unaffected).
    REQUIRE(mc.command({"CONFIG", "SET", "requirepass", "fence-test"}).str == "OK");
    REQUIRE(mc.command({"CLIENT", "KILL", "TYPE", "replica"}).integer >= 1);
    // The race on the master, which the replica does not see, then the replica promoted.
    const d::acquire_result first = d::acquire(*m, names, "s", "t1", 10s, 60s, false, 0);
    REQUIRE(first.kind == d::acquire_result::won);
    sftest::redis_client rc(node_uri(s.replica));
    REQUIRE(rc.command({"CLUSTER", "FAILOVER", "FORCE"}).str == "OK");
    // The promotion, settled: the old master itself turned into a replica (asked on `mc`,
    // authenticated before the password). The replica's own word is not enough: a replica
    // that won an election less than twice the node timeout before (an earlier trial, or run,
    // promoted it) can count that election's votes again, claim the slots under its old
    // config epoch and lose them back to the old master a moment later (Redis 7.0), or not
    // be seen promoted at all. The failover is asked for again when the replica was seen
    // promoted and then not, and whenever 3 s (three node timeouts) pass without it settling.
    bool seen_promoted = false;
    auto asked = std::chrono::steady_clock::now();
    sftest::must(
        [&] {
          if (mc.info_field("replication", "role") == "slave") return true;
          const bool promoted = is_master(s.replica);
          const auto now = std::chrono::steady_clock::now();
          if (!promoted && (seen_promoted || now - asked > 3s)) {
            // (A replica answers OK; a master, if `promoted` was a failed connection, an error.)
            (void)rc.command({"CLUSTER", "FAILOVER", "FORCE"});
            asked = now;
          }
          seen_promoted = promoted;
          return false;
        },
        "the replica promoted, the old master its replica", 60s);
    REQUIRE(mc.command({"CONFIG", "SET", "requirepass", ""}).str == "OK");
    const auto r = open(s.replica);
    const d::acquire_result second = d::acquire(*r, names, "s", "t2", 10s, 60s, false, 0);
    if (second.kind == d::acquire_result::won) {
      ++lost;
      if (std::stoll(second.fence) <= std::stoll(first.fence)) ++duplicates;
      // The first leader's late store reaches the new master, then the second leader's.
      bool published = true;
      const d::store_result late =
          d::store(*r, names, "t1", first.fence, first.gen, "SF1|late", 10s, "v", 60s, published);
      if (late == d::store_result::stored) ++stale_overwrite;
      CHECK(d::store(*r, names, "t2", second.fence, second.gen, "", 10s, "r", 60s, published) ==
            d::store_result::stored);
    }
    // The old master rejoins as the new one's replica, in sync, before the next trial. Bounded
    // at 60 s, not the default 20 s: the cluster's own work (the demotion heard on the bus, a
    // full sync), which once took longer than 20 s in a full -j2 run under ASan next to the
    // spin model; the fences it checks do not depend on it.
    sftest::must([&] { return in_sync(s.master); }, "the old master a replica in sync", 60s);
  }
  WARN("trials " << trials << ", the promoted replica had lost the race: " << lost
                 << ", duplicate fences: " << duplicates
                 << ", stale overwrites: " << stale_overwrite);
  CHECK(lost > 0);  // the write was lost (the link kept down): the case this test is about
  CHECK(duplicates == 0);
  CHECK(stale_overwrite == 0);
}

// The node a fleet is pointed at (its seed, where its classic subscriber listens) SIGKILLed
// while one of its followers waits on a key that another master owns: the follower watches
// that key's shard channel on the key's master, so the leader's store wakes it at once. With
// the classic subscriber on the seed, the kill silenced the notification: the follower woke
// only at its wait_slice poll (10 s here; the test allows 3 s).
TEST_CASE("the seed node killed while a follower waits on another master's key: woken promptly",
          "[cluster][failover][sharded][slow]") {
  const std::string dir = need_failover_cluster_or_warn();
  if (dir.empty()) return;
  const std::string uri = read_line(dir + "/uri");
  sftest::redis_client seed(uri);
  const shard victim = live_shard(seed, port_of(uri));  // the fixture's own node stays up
  const int victim_pid = pid_of(dir, victim.master);
  REQUIRE(victim_pid > 0);
  int owner_port = -1;
  for (const shard& s : shards(seed)) {
    if (s.master != victim.master && owner_port < 0) owner_port = s.master;
  }
  const std::string prefix = sftest::unique_prefix("shardseed");
  const std::string key = key_on(seed, prefix, owner_port, "lives-");
  const d::fleet_names names = d::fleet_names::of(prefix, key);
  sftest::redis_client owner(node_uri(owner_port));

  sf::fleet_options o = sftest::fleet_opts(uri, prefix);
  o.wait_slice = 10s;
  o.redis_timeout = 500ms;
  fleet_t leader_fleet(o);
  sf::fleet_options fo = o;
  fo.redis_uri = node_uri(victim.master);  // the follower's fleet is pointed at the victim
  fleet_t follower_fleet(fo);
  sftest::fleet_points points;
  points.attach(follower_fleet);
  sftest::held_origin origin("owner value");
  std::atomic<int> follower_loads{0};

  sftest::result<std::string> led;
  auto leader = sftest::spawn(led, [&] { return leader_fleet.get(key, origin.loader()); });
  origin.started.wait("leader loading");
  sftest::result<std::string> followed;
  auto follower = sftest::spawn(
      followed, [&] { return follower_fleet.get(key, sftest::must_not_load(follower_loads)); });
  sftest::must([&] { return points.waiting.load() > 0; }, "follower waiting");
  sftest::poll_until([&] { return owner.shardnumsub(names.channel) == 1; },
                     "SSUBSCRIBE on the key's master");
  REQUIRE(sftest::fleet_engine(follower_fleet).router.cluster());

  REQUIRE(::kill(victim_pid, SIGKILL) == 0);
  const auto released = std::chrono::steady_clock::now();
  origin.release.open();
  sftest::finish(leader, led, "leader");
  CHECK(sftest::becomes([&] { return followed.done.load(std::memory_order_acquire); }, 3s));
  sftest::finish(follower, followed, "follower");
  CHECK(std::chrono::steady_clock::now() - released < 3s);

  REQUIRE(followed.value.has_value());
  CHECK(*followed.value == "owner value");
  CHECK(origin.calls.load() == 1);
  CHECK(follower_loads.load() == 0);
  CHECK(follower_fleet.stats().follower_woken == 1);
  // The victim's replica takes over, and the victim comes back as its replica, in sync, before
  // the next test.
  sftest::must(
      [&] {
        if (is_master(victim.replica)) return true;
        std::this_thread::sleep_for(10ms);
        return false;
      },
      "the replica promoted");
  restart_node(dir, victim.master);
  sftest::must([&] { return in_sync(victim.master); }, "the old master a replica in sync", 60s);
}
