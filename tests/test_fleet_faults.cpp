// The fleet's protocol under what a review found it mishandled: names of two prefixes that
// meet, a value Redis refuses to store, a race reply lost on the way back (a lease nobody
// holds), bad input (a codec tag with '|', an encode that throws, foreign data under the lease
// and the metadata names), an ACL user without channel rights, a generation that restarts.
// Each fleet object is one process of the fleet (its own connections, subscriber, renewer);
// faults come from a private redis-server (CONFIG SET, ACL SETUSER, foreign values written by
// the test) and the loopback fault proxy (tests/support/fault_proxy.hpp). Every wait is
// bounded; a follower that only a message can wake in time uses message_only() settings.
#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>

#include "support/catch.hpp"
#include "support/fault_proxy.hpp"
#include "support/fleet.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;
using sftest::fleet_opts;
using sftest::held_origin;
using sftest::message_only;

d::fleet_names names_of(const std::string& prefix, const std::string& key) {
  return d::fleet_names::of(prefix, key);
}

bool exists(sftest::redis_client& c, const std::string& name) {
  return c.command({"EXISTS", name}).integer == 1;
}

// A loader that counts its calls.
struct counting_origin {
  std::atomic<int> calls{0};
  std::string value;
  explicit counting_origin(std::string v) : value(std::move(v)) {}
  auto loader() {
    return [this] {
      calls.fetch_add(1);
      return value;
    };
  }
};

}  // namespace

// ---- names ----------------------------------------------------------------------------------

TEST_CASE(
    "two prefixes never name one Redis key: prefix 'users' with key 'eu:42' and prefix "
    "'users:eu' with key '42' are two values",
    "[fleet][names]") {
  const std::string uri = sftest::need_redis();
  const std::string base = sftest::unique_prefix("names");
  fleet_t users(fleet_opts(uri, base + ":users"));
  fleet_t users_eu(fleet_opts(uri, base + ":users:eu"));
  CHECK(users.get("eu:42", [] { return std::string("value of fleet 'users', key 'eu:42'"); }) ==
        "value of fleet 'users', key 'eu:42'");
  counting_origin eu("value of fleet 'users:eu', key '42'");
  CHECK(users_eu.get("42", eu.loader()) == "value of fleet 'users:eu', key '42'");
  CHECK(eu.calls.load() == 1);
  CHECK(users_eu.stats().hits == 0);
}

TEST_CASE(
    "two dbs of one server never meet: a load that fails in db 1 does not fail the waiting "
    "followers of the same prefix and key in db 2 (pub/sub channels are server-wide; db 2's "
    "follower threw db 1's remote_load_error)",
    "[fleet][names]") {
  sftest::private_redis server;
  const std::string prefix = "dbs";
  fleet_t in_db1(message_only(server.tcp_uri() + "/1", prefix));
  fleet_t leader(message_only(server.tcp_uri() + "/2", prefix));
  fleet_t follower(message_only(server.tcp_uri() + "/2", prefix));
  sftest::fleet_points pf;
  pf.attach(follower);

  held_origin origin("db 2's value");
  sftest::result<std::string> rl;
  auto tl = sftest::spawn(rl, [&] { return leader.get("k", origin.loader()); });
  origin.started.wait("db 2's leader loads");
  std::atomic<int> ran{0};
  sftest::result<std::string> rf;
  auto tf = sftest::spawn(rf, [&] { return follower.get("k", sftest::must_not_load(ran)); });
  sftest::must([&] { return pf.waiting.load() >= 1; }, "db 2's follower waits");

  // db 1 has no lease for "k": in_db1 leads there, its load fails, and it publishes the failure
  // on the key's channel (when it returns, the message is out).
  CHECK_THROWS_AS(in_db1.get("k", []() -> std::string { throw std::runtime_error("db 1 down"); }),
                  std::runtime_error);
  origin.release.open();
  sftest::finish(tl, rl, "db 2's leader returns");
  sftest::finish(tf, rf, "db 2's follower returns");
  CHECK(rl.value == "db 2's value");
  CHECK_FALSE(rf.threw<sf::remote_load_error>());
  CHECK(rf.value == "db 2's value");
  CHECK(follower.stats().remote_failures == 0);
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

// ---- values Redis will not store --------------------------------------------------------------

TEST_CASE(
    "a value over proto-max-bulk-len: the failed store releases the lease and wakes the "
    "followers, which load for themselves at once (nobody waits for lease_ttl)",
    "[fleet][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  REQUIRE(client->command({"CONFIG", "SET", "proto-max-bulk-len", "1mb"}).str == "OK");
  const std::string prefix = "big";
  sf::fleet_options o = message_only(server.uri(), prefix);
  o.lease_ttl = 60s;  // far beyond every bounded wait: only the release ends the followers' wait
  fleet_t a(o);
  fleet_t b(o);
  sftest::fleet_points pb;
  pb.attach(b);

  held_origin origin(std::string(2 * 1024 * 1024, 'x'));  // 2 MiB, over the server's 1 MB
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  counting_origin own("b's own load");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", own.loader()); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits for a's value");

  origin.release.open();
  sftest::finish(ta, ra, "a returns its value");
  REQUIRE(ra.value);
  CHECK(ra.value->size() == 2 * 1024 * 1024);
  CHECK_FALSE(exists(*client, names_of(prefix, "k").lease));  // released, not left to expire
  sftest::finish(tb, rb, "b loads for itself");
  CHECK(rb.value == "b's own load");
  CHECK(own.calls.load() == 1);
  CHECK(b.stats().local_fallback == 1);
  CHECK_FALSE(exists(*client, names_of(prefix, "k").value));
}

// ---- a store whose connection and reconnect both fail ------------------------------------------

TEST_CASE(
    "store_on_dead_pooled_connection_with_server_gone_does_not_crash: the leader's store finds "
    "its connection closed before the reply and the reconnect refused (a redis-server "
    "restart); the caller gets its value and the failure is counted",
    "[fleet][faults]") {
  sftest::private_redis server;
  sftest::fault_proxy proxy(server.port());
  sf::fleet_options o = message_only(proxy.uri(), "deadstore");
  fleet_t f(o);
  // A round trip leaves the flight's connection idle in the pool.
  CHECK(f.get("warm-up", [] { return std::string("w"); }) == "w");
  const auto errors_before = f.stats().redis_errors;
  // The store reaches the proxy and is held there; then the server goes away: the connection
  // is closed before any byte of the reply (unanswered: the pooled connection reconnects
  // once) and new connections are refused.
  sftest::result<std::string> r;
  auto t = sftest::spawn(r, [&] {
    return f.get("k", [&] {
      proxy.hold_command("EVALSHA", sftest::fault_proxy::until_released);
      return std::string("loaded");
    });
  });
  sftest::must([&] { return proxy.held_commands() == 1; }, "the store held at the proxy");
  proxy.refuse(true);
  proxy.drop_all();
  sftest::finish(t, r, "the leader answered after its store failed");
  CHECK(r.value == "loaded");
  CHECK(f.stats().redis_errors > errors_before);
  proxy.refuse(false);
}

// ---- a race the client gave up on -------------------------------------------------------------

TEST_CASE(
    "phantom lease: a race that timed out on the client and ran on the server later leaves "
    "no lease, the next process loads at once instead of waiting lease_ttl for nobody",
    "[fleet][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  sftest::fault_proxy proxy(server.port());
  const std::string prefix = "phantom";
  sf::fleet_options ob = message_only(proxy.uri(), prefix);
  ob.redis_timeout = 150ms;
  ob.lease_ttl = 60s;  // a lease nobody holds would outlive every bounded wait here
  fleet_t b(ob);
  sf::fleet_options oc = message_only(server.uri(), prefix);
  oc.lease_ttl = 60s;
  fleet_t c(oc);

  // The scripts are cached on the server (the first race of a fresh server is an EVAL).
  CHECK(b.get("warm-up", [] { return std::string("w"); }) == "w");
  const long long scripts_before = client->command_calls("evalsha");

  // b's race reaches the server only after b gave up on it: b loads for itself.
  proxy.hold_command("EVALSHA", sftest::fault_proxy::until_released);
  counting_origin ob_origin("b's own load");
  CHECK(b.get("k", ob_origin.loader()) == "b's own load");
  CHECK(b.stats().local_fallback == 1);
  REQUIRE(proxy.held_commands() == 1);
  proxy.release_commands();
  sftest::must([&] { return client->command_calls("evalsha") > scripts_before; },
               "the held race ran on the server");

  // However the race and what b did after giving up met on the server, no lease is left.
  CHECK(sftest::becomes([&] { return !exists(*client, names_of(prefix, "k").lease); }, 5s));

  counting_origin oc_origin("c's value");
  sftest::result<std::string> rc;
  auto tc = sftest::spawn(rc, [&] { return c.get("k", oc_origin.loader()); });
  sftest::finish(tc, rc, "c answered without waiting for a lease nobody holds");
  CHECK(rc.value == "c's value");
  CHECK(c.stats().leader == 1);
}

TEST_CASE(
    "phantom lease, stalled server: the race and the release that gives it up both time out; "
    "the release is retried off the caller's path, so no lease nobody holds is left",
    "[fleet][faults][stall]") {
  sftest::private_redis server;
  auto client = server.client();
  sftest::fault_proxy proxy(server.port());
  const std::string prefix = "stall-race";
  sf::fleet_options ob = message_only(proxy.uri(), prefix);
  ob.redis_timeout = 150ms;
  ob.lease_ttl = 60s;  // a lease nobody holds would outlive every bounded wait here
  fleet_t b(ob);
  sf::fleet_options oc = message_only(server.uri(), prefix);
  oc.lease_ttl = 60s;
  oc.max_wait = 5s;  // c gives up waiting long before the lease would expire
  fleet_t c(oc);

  CHECK(b.get("warm-up", [] { return std::string("w"); }) == "w");  // the scripts are cached
  const long long scripts_before = client->command_calls("evalsha");

  // b's race is held (its reply never comes in time); the handshake of the connection its
  // release opens is held past b's timeout: the release fails as the race did.
  proxy.hold_command("EVALSHA", sftest::fault_proxy::until_released);
  proxy.hold_command("PING", 10 * ob.redis_timeout);
  counting_origin ob_origin("b's own load");
  CHECK(b.get("k", ob_origin.loader()) == "b's own load");
  CHECK(b.stats().local_fallback == 1);
  sftest::must([&] { return proxy.held_commands() == 2; }, "the race and the release's handshake");
  // The race runs on the server now, before any release could: it takes the lease.
  proxy.release_commands();
  sftest::must([&] { return client->command_calls("evalsha") > scripts_before; },
               "the held race ran on the server");

  // Within a fraction of lease_ttl the lease is released (or the race found its tombstone).
  CHECK(sftest::becomes([&] { return !exists(*client, names_of(prefix, "k").lease); }, 5s));

  counting_origin oc_origin("c's value");
  CHECK(c.get("k", oc_origin.loader()) == "c's value");
  CHECK(c.stats().leader == 1);
  CHECK(c.stats().local_fallback == 0);
}

TEST_CASE(
    "stalled server after a load: the store and the release after it both time out; the "
    "release is retried off the caller's path, the lease does not outlive the stall",
    "[fleet][faults][stall]") {
  sftest::private_redis server;
  auto client = server.client();
  sftest::fault_proxy proxy(server.port());
  const std::string prefix = "stall-store";
  sf::fleet_options oa = message_only(proxy.uri(), prefix);
  oa.redis_timeout = 150ms;
  oa.lease_ttl = 60s;
  fleet_t a(oa);
  sf::fleet_options ob = message_only(server.uri(), prefix);
  ob.lease_ttl = 60s;
  ob.max_wait = 8s;  // b gives up waiting long before the lease would expire
  fleet_t b(ob);
  sftest::fleet_points pb;
  pb.attach(b);
  CHECK(a.get("warm-up", [] { return std::string("w"); }) == "w");  // the scripts are cached

  held_origin origin(std::string("a's value"));
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  counting_origin own("b's own load");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", own.loader()); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits for a's value");

  // a's store never reaches the server; the handshake of its release's connection is held
  // past a's timeout.
  proxy.hold_command("EVALSHA", sftest::fault_proxy::until_released);
  proxy.hold_command("PING", 10 * oa.redis_timeout);
  origin.release.open();
  sftest::finish(ta, ra, "a returns its value");
  CHECK(ra.value == "a's value");
  CHECK(proxy.held_commands() == 2);

  CHECK(sftest::becomes([&] { return !exists(*client, names_of(prefix, "k").lease); }, 5s));
  sftest::finish(tb, rb, "b loads for itself");
  CHECK(rb.value == "b's own load");
  CHECK(own.calls.load() == 1);
  CHECK_FALSE(exists(*client, names_of(prefix, "k").value));
}

// ---- bad input --------------------------------------------------------------------------------

namespace {

struct barred_codec {
  static constexpr std::string_view tag = "a|b";
  std::string encode(const std::string& v) const { return v; }
  std::string decode(std::string_view b) const { return std::string(b); }
};

struct unencodable_codec {
  static constexpr std::string_view tag = "unencodable";
  std::string encode(const std::string&) const {
    throw std::runtime_error("unencodable_codec: cannot encode");
  }
  std::string decode(std::string_view b) const { return std::string(b); }
};

}  // namespace

TEST_CASE("a codec tag with '|' is rejected at construction (it could never read back a record)",
          "[fleet][options]") {
  using barred_fleet = sf::fleet<std::string, std::string, barred_codec>;
  CHECK_THROWS_AS(barred_fleet(sf::fleet_options{}), std::invalid_argument);
}

TEST_CASE(
    "an encode that throws: the leader's callers get the value, the lease is released and "
    "the followers load for themselves at the same time, not one after another",
    "[fleet][faults]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("encode");
  using fleet_u = sf::fleet<std::string, std::string, unencodable_codec>;
  sf::fleet_options o = message_only(uri, prefix);
  o.lease_ttl = 60s;
  fleet_u a(o);
  fleet_u b(o);
  fleet_u c(o);
  sftest::fleet_points pb;
  sftest::fleet_points pc;
  pb.attach(b);
  pc.attach(c);

  held_origin origin("a's value");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");

  // b's and c's loads each wait (bounded) until both have started: loads made one after
  // another (each waiting for the previous one's lease) never meet.
  std::atomic<int> started{0};
  const auto meet = [&started](const char* who) {
    return [&started, who] {
      started.fetch_add(1);
      const bool met = sftest::becomes([&] { return started.load() >= 2; }, 10s);
      return std::string(who) + (met ? " met" : " alone");
    };
  };
  sftest::result<std::string> rb;
  sftest::result<std::string> rc;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", meet("b")); });
  auto tc = sftest::spawn(rc, [&] { return c.get("k", meet("c")); });
  sftest::must([&] { return pb.waiting.load() >= 1 && pc.waiting.load() >= 1; },
               "b and c wait for a's value");

  origin.release.open();
  sftest::finish(ta, ra, "a");
  CHECK(ra.value == "a's value");
  sftest::finish(tb, rb, "b");
  sftest::finish(tc, rc, "c");
  CHECK_FALSE(rb.error);
  CHECK_FALSE(rc.error);
  CHECK(rb.value == "b met");
  CHECK(rc.value == "c met");
}

TEST_CASE(
    "foreign data under the lease name: another type with no expiry does not stall the "
    "key, the race takes the name over, loads once and stores",
    "[fleet][faults]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("lease-foreign");
  sftest::redis_client client(uri);
  const auto n = names_of(prefix, "k");
  client.command({"HSET", n.lease, "not", "a lease"});
  sf::fleet_options o = fleet_opts(uri, prefix);
  o.max_wait = 1s;  // a get that waited for this "lease" would give up after 1 s
  fleet_t f(o);
  counting_origin origin("v");
  CHECK(f.get("k", origin.loader()) == "v");
  CHECK(origin.calls.load() == 1);
  CHECK(f.stats().leader == 1);
  CHECK(f.stats().local_fallback == 0);
  CHECK(sftest::stored(client, prefix, "k") == "v");
  CHECK_FALSE(exists(client, n.lease));
}

TEST_CASE(
    "foreign data under the metadata name: no script fails half-way, no lease is left, the "
    "value is stored, invalidate() works",
    "[fleet][faults]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("meta-foreign");
  sftest::redis_client client(uri);
  const auto n = names_of(prefix, "k");
  client.command({"SET", n.meta, "not a hash"});
  fleet_t f(fleet_opts(uri, prefix));
  counting_origin origin("v");
  CHECK(f.get("k", origin.loader()) == "v");
  CHECK(f.stats().leader == 1);
  CHECK(f.stats().redis_errors == 0);
  CHECK_FALSE(exists(client, n.lease));
  CHECK(sftest::stored(client, prefix, "k") == "v");

  client.command({"SET", n.meta, "not a hash"});
  CHECK_NOTHROW(f.invalidate("k"));
  CHECK_FALSE(exists(client, n.value));
}

// ---- ACLs -------------------------------------------------------------------------------------

TEST_CASE(
    "an ACL user without channel rights: stores that worked are not errors, invalidate() "
    "that was applied does not throw 'unreachable'",
    "[fleet][faults]") {
  sftest::private_redis server;
  auto admin = server.client();
  REQUIRE(admin
              ->command(
                  {"ACL", "SETUSER", "nochannels", "on", ">secret", "~*", "resetchannels", "+@all"})
              .str == "OK");
  const std::string prefix = "acl";
  sf::fleet_options o = fleet_opts(server.uri(), prefix);
  o.username = "nochannels";
  o.password = "secret";
  fleet_t f(o);
  CHECK(f.get("k", [] { return std::string("v"); }) == "v");
  CHECK(f.stats().leader == 1);
  CHECK(f.stats().redis_errors == 0);
  CHECK(sftest::stored(*admin, prefix, "k") == "v");
  CHECK(f.healthy());

  CHECK_NOTHROW(f.invalidate("k"));
  CHECK_FALSE(exists(*admin, names_of(prefix, "k").value));
  CHECK(f.stats().redis_errors == 0);
}

// ---- generations ------------------------------------------------------------------------------

TEST_CASE("invalidate()'s generation only grows, across the metadata's expiry or eviction too",
          "[fleet][faults]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("gen");
  sftest::redis_client client(uri);
  fleet_t f(fleet_opts(uri, prefix));
  const std::uint64_t g1 = f.invalidate("k");
  const std::uint64_t g2 = f.invalidate("k");
  CHECK(g2 > g1);
  client.command({"DEL", names_of(prefix, "k").meta});  // what its expiry or eviction does
  const std::uint64_t g3 = f.invalidate("k");
  CHECK(g3 > g2);
  // Gone again, and then created by a race rather than by invalidate().
  client.command({"DEL", names_of(prefix, "k").meta});
  CHECK(f.get("k", [] { return std::string("v"); }) == "v");
  const std::uint64_t g4 = f.invalidate("k");
  CHECK(g4 > g3);
}

// ---- max_value_bytes --------------------------------------------------------------------------

TEST_CASE(
    "max_value_bytes: a larger value is returned to its callers, not stored, counted; the "
    "lease is released at once and the followers load for themselves",
    "[fleet][options]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("maxbytes");
  sftest::redis_client client(uri);
  sf::fleet_options o = message_only(uri, prefix);
  o.lease_ttl = 60s;
  o.max_value_bytes = 200;
  fleet_t a(o);
  fleet_t b(o);
  sftest::fleet_points pb;
  pb.attach(b);

  held_origin origin(std::string(1000, 'x'));
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("big", origin.loader()); });
  origin.started.wait("a leads");
  counting_origin own("b's own load");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("big", own.loader()); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits for a's value");
  origin.release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b");
  REQUIRE(ra.value);
  CHECK(ra.value->size() == 1000);
  CHECK(rb.value == "b's own load");
  CHECK(a.stats().oversized_values == 1);
  CHECK_FALSE(exists(client, names_of(prefix, "big").value));
  CHECK_FALSE(exists(client, names_of(prefix, "big").lease));

  CHECK(a.get("small", [] { return std::string(100, 'y'); }) == std::string(100, 'y'));
  CHECK(sftest::stored(client, prefix, "small") == std::string(100, 'y'));
  CHECK(a.stats().oversized_values == 1);
}

// ---- replicas ---------------------------------------------------------------------------------

namespace {

// A replica of `primary`, online on the primary's side (bounded): its link is up and the
// primary has its first acknowledgement, so WAIT counts it.
void replicate(sftest::private_redis& replica, const sftest::private_redis& primary) {
  auto c = replica.client();
  REQUIRE(c->command({"REPLICAOF", "127.0.0.1", std::to_string(primary.port())}).str == "OK");
  auto p = primary.client();
  sftest::must(
      [&] {
        return c->info_field("replication", "master_link_status") == "up" &&
               p->info_field("replication", "slave0").find("state=online") != std::string::npos;
      },
      "the replica is online");
}

}  // namespace

TEST_CASE(
    "replicas = 1: invalidate() returns once the replica has it, and throws fleet_error when "
    "no replica acknowledges within replica_timeout (applied on the primary all the same)",
    "[fleet][replicas]") {
  sftest::private_redis primary;
  sftest::private_redis replica;
  replicate(replica, primary);
  auto on_primary = primary.client();
  auto on_replica = replica.client();
  const std::string prefix = "wait";
  sf::fleet_options o = fleet_opts(primary.uri(), prefix);
  o.replicas = 1;
  o.replica_timeout = 10s;  // a healthy replica acknowledges far sooner, even on a loaded machine
  fleet_t f(o);
  const auto n = names_of(prefix, "k");

  CHECK(f.get("k", [] { return std::string("v1"); }) == "v1");
  CHECK(sftest::stored(*on_replica, prefix, "k") == "v1");  // the store waited for it too
  const std::uint64_t g = f.invalidate("k");
  CHECK_FALSE(exists(*on_replica, n.value));
  CHECK(on_replica->command({"HGET", n.meta, "gen"}).str == std::to_string(g));
  CHECK(f.stats().replica_timeouts == 0);

  o.replica_timeout = 300ms;
  fleet_t impatient(o);
  replica.freeze();
  CHECK(impatient.get("k", [] { return std::string("v2"); }) == "v2");  // returned all the same
  CHECK(impatient.stats().replica_timeouts == 1);
  CHECK_THROWS_AS(impatient.invalidate("k"), sf::fleet_error);
  CHECK(impatient.stats().replica_timeouts == 2);
  CHECK_FALSE(exists(*on_primary, n.value));
  replica.thaw();
}

TEST_CASE(
    "replicas = 1 with the default timeouts: a replica that does not acknowledge is a replica "
    "shortfall, not Redis unreachable; the breaker stays closed, healthy keys stay hits",
    "[fleet][replicas]") {
  sftest::private_redis primary;
  sftest::private_redis replica;
  replicate(replica, primary);
  const std::string prefix = "wait-defaults";
  sf::fleet_options o;  // redis_timeout, replica_timeout and the breaker as shipped
  o.redis_uri = primary.uri();
  o.key_prefix = prefix;
  o.replicas = 1;
  fleet_t f(o);
  CHECK(f.get("healthy", [] { return std::string("v"); }) == "v");
  const auto before = f.stats();

  replica.freeze();
  constexpr int tries = 5;  // more than the breaker's threshold
  int shortfalls = 0;
  std::string last;
  for (int i = 0; i < tries; ++i) {
    try {
      (void)f.invalidate("k");
    } catch (const sf::fleet_error& e) {
      last = e.what();
      if (last.find("applied on the primary") != std::string::npos) ++shortfalls;
    }
  }
  replica.thaw();
  INFO(last);
  CHECK(shortfalls == tries);
  const auto after = f.stats();
  CHECK(after.replica_timeouts - before.replica_timeouts == tries);
  CHECK(after.redis_errors == before.redis_errors);
  CHECK(after.breaker_opens == before.breaker_opens);
  counting_origin origin("not wanted");
  CHECK(f.get("healthy", origin.loader()) == "v");
  CHECK(origin.calls.load() == 0);
}

TEST_CASE(
    "replicas = 1: a WAIT that gets no answer names the bound it waited, counts a replica "
    "timeout, not a Redis error",
    "[fleet][replicas]") {
  sftest::private_redis server;
  sftest::fault_proxy proxy(server.port());
  sf::fleet_options o;
  o.redis_uri = proxy.uri();
  o.key_prefix = "wait-lost";
  o.redis_timeout = 200ms;  // the invalidate script's round trip, on a loaded machine too
  o.replicas = 1;
  fleet_t f(o);
  proxy.hold_command("WAIT", sftest::fault_proxy::until_released);
  std::string what;
  try {
    (void)f.invalidate("k");
  } catch (const sf::fleet_error& e) {
    what = e.what();
  }
  proxy.release_commands();
  const auto bound = o.replica_timeout + d::wait_reply_margin + o.redis_timeout;
  INFO(what);
  CHECK(what.find("applied on the primary") != std::string::npos);
  CHECK(what.find("timed out after " + std::to_string(bound.count()) + " ms") != std::string::npos);
  CHECK(f.stats().replica_timeouts == 1);
  CHECK(f.stats().redis_errors == 0);
}

// ---- settings Redis refuses -------------------------------------------------------------------

namespace {

// `tries` gets (more than the breaker's threshold) and one invalidate through a fleet whose
// settings the server refuses: each get loads locally, the breaker never opens, and
// invalidate's error names the refusal (`cause`), not an outage.
void refused_settings(const sf::fleet_options& o, const std::string& cause) {
  fleet_t f(o);
  constexpr int tries = 5;
  counting_origin origin("local");
  for (int i = 0; i < tries; ++i) CHECK(f.get("k", origin.loader()) == "local");
  CHECK(origin.calls.load() == tries);
  std::string what;
  try {
    (void)f.invalidate("k");
  } catch (const sf::fleet_error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("refused the fleet's settings") != std::string::npos);
  CHECK(what.find(cause) != std::string::npos);
  CHECK(what.find("unreachable") == std::string::npos);
  CHECK(f.stats().breaker_opens == 0);
  CHECK(f.stats().local_fallback == tries);
}

}  // namespace

TEST_CASE(
    "settings the server refuses (a wrong password, a user without EVAL rights, a db it does "
    "not have) are named as such, not as Redis unreachable, and do not open the breaker",
    "[fleet][faults][settings]") {
  sftest::private_redis::config pc;
  pc.password = "right";
  sftest::private_redis server(pc);
  auto admin = server.client();
  sf::fleet_options o;  // the breaker as shipped (threshold 3)
  o.redis_uri = server.uri();
  o.key_prefix = "refused";
  o.redis_timeout = 2s;  // only refusals fail here, never a slow machine

  SECTION("a wrong password") {
    o.password = "wrong";
    refused_settings(o, "WRONGPASS");
  }
  SECTION("a user without EVAL and EVALSHA") {
    REQUIRE(admin
                ->command({"ACL", "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval",
                           "-evalsha"})
                .str == "OK");
    o.username = "noeval";
    o.password = "pw";
    refused_settings(o, "NOPERM");
  }
  SECTION("a db number the server does not have") {
    o.password = "right";
    o.redis_uri = server.uri() + "/99";
    refused_settings(o, "SELECT");
  }
}
