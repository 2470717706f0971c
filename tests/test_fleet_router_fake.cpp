// The fleet's Redis Cluster routing (redis_router.hpp) against scripted nodes
// (tests/support/fake_redis.hpp): the replies a real cluster cannot easily be made to send. A
// redirect loop, ASK then MOVED, a MOVED naming no address, a slot map that is garbage or an
// error, CLUSTERDOWN, TRYAGAIN forever and TRYAGAIN then an answer, a reply cut in half. Each
// case asserts what the call cost (origin calls, local loads, Redis errors) and the breakers.
// No redis-server needed: each node is a loopback socket of the test's own.
#include <singleflight/fleet.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_redis.hpp"
#include "support/fleet.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;
using fake = sftest::fake_redis;

constexpr const char* prefix = "fake";

// The settings of these cases: a generous redis_timeout (a redirect is answered at once; only
// the TRYAGAIN and silence cases wait it out, and set their own), one failure opens a breaker
// (so that a failure miscounted as a redirect, or the reverse, shows in breaker_opens).
sf::fleet_options opts(const fake& seed) {
  sf::fleet_options o = sftest::fleet_opts(seed.uri(), prefix);
  o.breaker_threshold = 1;
  o.breaker_cooldown = 60s;
  return o;
}

std::string value_name(const std::string& key) { return d::fleet_names::of(prefix, key).value; }
std::size_t slot_of(const std::string& key) { return d::cluster_slot(value_name(key)); }

// "MOVED <slot of key> <node>" (or ASK).
fake::reply redirect(const char* kind, const std::string& key, const fake& to) {
  return fake::error(std::string(kind) + " " + std::to_string(slot_of(key)) + " " + to.address());
}

// A stored record of `payload` (codec "string"): the answer of a GETRANGE that hits.
fake::reply record(const std::string& payload) {
  return fake::bulk(d::make_record('v', "string", "1", "1", payload));
}

// A loader counting its calls.
struct origin {
  int calls = 0;
  auto loader(std::string v) {
    return [this, v] {
      ++calls;
      return v;
    };
  }
};

// The names of the commands a node received, in order.
std::vector<std::string> names(const fake& n) {
  std::vector<std::string> out;
  for (const auto& r : n.log()) out.push_back(r.args.empty() ? "" : r.args[0]);
  return out;
}

std::size_t count(const std::vector<std::string>& v, const std::string& name) {
  std::size_t n = 0;
  for (const auto& s : v) n += s == name ? 1 : 0;
  return n;
}

// Whether every command `n` received is one of `allowed` (nothing unscripted, nothing the
// case did not expect: a subscription, a script, a stray CLUSTER).
bool only(const fake& n, const std::vector<std::string>& allowed) {
  for (const auto& name : names(n)) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == name;
    if (!ok) {
      UNSCOPED_INFO("unexpected command " << name);
      return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("a MOVED to a node that answers MOVED back loads locally once, without a Redis error",
          "[router_fake]") {
  fake a;
  fake b;
  const std::string key = "loop";
  a.always("GETRANGE", redirect("MOVED", key, b));
  b.always("GETRANGE", redirect("MOVED", key, a));
  fleet_t f(opts(a));
  origin o;

  CHECK(f.get(key, o.loader("local")) == "local");
  const auto s = f.stats();
  CHECK(o.calls == 1);
  CHECK(s.origin_calls == 1);
  CHECK(s.local_fallback == 1);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());
  // One redirect followed: the command went to a, then once to b, never back to a.
  CHECK(a.commands("GETRANGE") == 1);
  CHECK(b.commands("GETRANGE") == 1);

  // The next call starts where the MOVED said (b), is sent back to a once, and loads locally.
  CHECK(f.get(key, o.loader("again")) == "again");
  CHECK(f.stats().local_fallback == 2);
  CHECK(f.stats().redis_errors == 0);
  CHECK(b.commands("GETRANGE") == 2);
  CHECK(a.commands("GETRANGE") == 2);
  CHECK(f.healthy());
  CHECK(only(a, {"PING", "GETRANGE", "CLUSTER"}));  // CLUSTER SLOTS: unscripted, an error
  CHECK(only(b, {"PING", "GETRANGE", "CLUSTER"}));
}

TEST_CASE("an ASK whose node answers MOVED loads locally; the ASKING connection is not reused",
          "[router_fake]") {
  fake a;
  fake b;
  const std::string key = "ask-moved";
  a.on("GETRANGE", {redirect("ASK", key, b), record("on-a")});
  b.always("GETRANGE", redirect("MOVED", key, a));
  fleet_t f(opts(a));
  origin o;

  CHECK(f.get(key, o.loader("local")) == "local");
  auto s = f.stats();
  CHECK(o.calls == 1);
  CHECK(s.local_fallback == 1);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  // b was asked with ASKING first, in the same write.
  const auto on_b = names(b);
  REQUIRE(on_b.size() >= 3);  // the handshake's PING, ASKING, GETRANGE
  CHECK(on_b[on_b.size() - 2] == "ASKING");
  CHECK(on_b.back() == "GETRANGE");
  // An ASK learns nothing: the key is still a's (a hit there), and no ASKING goes to a.
  CHECK(f.get(key, o.loader("unused")) == "on-a");
  s = f.stats();
  CHECK(s.hits == 1);
  CHECK(o.calls == 1);
  CHECK(count(names(a), "ASKING") == 0);
  CHECK(only(a, {"PING", "GETRANGE"}));  // an ASK reads no map
  CHECK(only(b, {"PING", "ASKING", "GETRANGE"}));
}

TEST_CASE("a MOVED naming no usable address loads locally, learns no node, counts no error",
          "[router_fake]") {
  const std::string key = "bad-address";
  const std::string slot = std::to_string(slot_of(key));
  const std::vector<std::string> bad = {
      "MOVED " + slot,                       // no address
      "MOVED " + slot + " 127.0.0.1",        // no port
      "MOVED " + slot + " 127.0.0.1:",       // empty port
      "MOVED " + slot + " 127.0.0.1:99999",  // port out of range
      "MOVED " + slot + " 127.0.0.1:0",      // port 0: nobody listens there
      "ASK " + slot + " 127.0.0.1:0",
      "MOVED " + slot + " 127.0.0.1:7x",  // not a number
      "MOVED 16384 127.0.0.1:7000",       // slot out of range
      "MOVED x 127.0.0.1:7000",           // slot not a number
      "MOVED  127.0.0.1:7000",            // empty slot
  };
  for (const std::string& text : bad) {
    CAPTURE(text);
    fake a;
    a.on("GETRANGE", {fake::error(text)});
    fleet_t f(opts(a));
    origin o;
    CHECK(f.get(key, o.loader("local")) == "local");
    const auto s = f.stats();
    CHECK(o.calls == 1);
    CHECK(s.local_fallback == 1);
    CHECK(s.redis_errors == 0);
    CHECK(s.breaker_opens == 0);
    CHECK(f.healthy());
    CHECK_FALSE(sftest::fleet_engine(f).router.cluster());
    CHECK(sftest::fleet_engine(f).router.nodes() == 1);
    CHECK(only(a, {"PING", "GETRANGE"}));
  }
}

TEST_CASE("a slot map that is garbage or an error after a MOVED is not taken; the MOVED is",
          "[router_fake]") {
  const std::string key = "bad-map";
  struct variant {
    const char* what;
    std::vector<fake::reply> map;  // a's answer to CLUSTER SLOTS
  };
  fake other;  // the node a garbage map would name; never asked for the key
  const std::vector<variant> variants = {
      {"an error", {fake::error("ERR This instance has cluster support disabled")}},
      {"nil", {fake::nil()}},
      {"an empty array", {fake::array({})}},
      {"a string", {fake::bulk("garbage")}},
      {"an entry that is not an array", {fake::array({fake::integer(0)})}},
      {"a master that is not an array",
       {fake::array({fake::array({fake::integer(0), fake::integer(16383), fake::bulk("x")})})}},
      {"a range past the last slot",
       {fake::array({fake::slot_range(0, 16384, "127.0.0.1", other.port())})}},
      {"a range backwards", {fake::array({fake::slot_range(100, 99, "127.0.0.1", other.port())})}},
      {"a port out of range", {fake::array({fake::slot_range(0, 16383, "127.0.0.1", 70000)})}},
      {"port 0", {fake::array({fake::slot_range(0, 16383, "127.0.0.1", 0)})}},
      {"a negative port", {fake::array({fake::slot_range(0, 16383, "127.0.0.1", -1)})}},
  };
  for (const variant& v : variants) {
    CAPTURE(v.what);
    fake a;
    fake b;
    a.always("GETRANGE", redirect("MOVED", key, b));
    a.on("CLUSTER", v.map);
    b.on("CLUSTER", v.map);
    b.always("GETRANGE", record("on-b"));
    fleet_t f(opts(a));
    origin o;

    // The MOVED is followed (the slot is b's), the map is not taken: a hit on b.
    CHECK(f.get(key, o.loader("unused")) == "on-b");
    auto s = f.stats();
    CHECK(o.calls == 0);
    CHECK(s.hits == 1);
    CHECK(s.redis_errors == 0);
    CHECK(s.breaker_opens == 0);
    auto& router = sftest::fleet_engine(f).router;
    CHECK(router.cluster());
    CHECK(router.refreshes() == 0);
    CHECK(router.nodes() == 2);  // a and b: no node of a garbage map
    CHECK(a.commands("CLUSTER") + b.commands("CLUSTER") >= 1);
    // Later calls go to b at once, and still hit.
    CHECK(f.get(key, o.loader("unused")) == "on-b");
    s = f.stats();
    CHECK(s.hits == 2);
    CHECK(s.redis_errors == 0);
    CHECK(a.commands("GETRANGE") == 1);
    CHECK(f.healthy());
    CHECK(only(a, {"PING", "GETRANGE", "CLUSTER"}));
    CHECK(only(b, {"PING", "GETRANGE", "CLUSTER"}));
  }
  CHECK(other.accepted() == 0);
}

TEST_CASE("a slot map node that closes the connection instead of answering is a failed read",
          "[router_fake]") {
  fake a;
  fake b;
  const std::string key = "map-cut";
  a.always("GETRANGE", redirect("MOVED", key, b));
  a.on("CLUSTER", {fake::cut("*1\r\n*3\r\n:0\r\n")});
  b.on("CLUSTER", {fake::cut()});
  b.always("GETRANGE", redirect("MOVED", key, a));
  fleet_t f(opts(a));
  origin o;

  CHECK(f.get(key, o.loader("local")) == "local");
  const auto s = f.stats();
  CHECK(o.calls == 1);
  CHECK(s.local_fallback == 1);
  // The map read is the router's own business: not a call's Redis error, not a breaker's.
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(sftest::fleet_engine(f).router.refreshes() == 0);
  CHECK(a.commands("CLUSTER") == 1);
  CHECK(b.commands("CLUSTER") == 1);
}

TEST_CASE("CLUSTERDOWN loads locally and leaves the breaker closed", "[router_fake]") {
  fake a;
  a.always("GETRANGE", fake::error("CLUSTERDOWN The cluster is down"));
  fleet_t f(opts(a));  // breaker_threshold 1: one miscounted failure would open it
  origin o;
  for (int i = 0; i < 3; ++i) CHECK(f.get("down", o.loader("local")) == "local");
  const auto s = f.stats();
  CHECK(o.calls == 3);
  CHECK(s.origin_calls == 3);
  CHECK(s.local_fallback == 3);
  CHECK(s.local_not_run == 3);  // counted as the cluster's refusal, nothing else
  CHECK(s.failover_no_replica == 0);
  CHECK(s.failover_expired == 0);
  CHECK(s.local_unshared == 0);
  CHECK(s.local_max_wait == 0);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());
  CHECK(a.commands("GETRANGE") == 3);    // each call asked (no breaker open in between)
  CHECK(only(a, {"PING", "GETRANGE"}));  // CLUSTERDOWN is no MOVED: no map read
}

TEST_CASE("TRYAGAIN forever loads locally once redis_timeout has passed", "[router_fake]") {
  fake a;
  a.always("GETRANGE", fake::error("TRYAGAIN Multiple keys request during rehashing of slot"));
  sf::fleet_options o = opts(a);
  o.redis_timeout = 300ms;
  fleet_t f(o);
  origin org;

  const auto start = std::chrono::steady_clock::now();
  CHECK(f.get("busy", org.loader("local")) == "local");
  const auto took = std::chrono::steady_clock::now() - start;
  const auto s = f.stats();
  CHECK(org.calls == 1);
  CHECK(s.local_fallback == 1);
  CHECK(s.local_not_run == 1);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());
  // Asked again until redis_timeout (1, 2, 4, 8, 8... ms apart), not past it by much.
  CHECK(took >= 250ms);
  CHECK(took < 300ms + 5s);
  CHECK(a.commands("GETRANGE") >= 5);
  // Always on the same connection.
  int conn = 0;
  for (const auto& r : a.log()) {
    if (r.args.empty() || r.args[0] != "GETRANGE") continue;
    if (conn == 0) conn = r.conn;
    CHECK(r.conn == conn);
  }
  CHECK(only(a, {"PING", "GETRANGE"}));
}

TEST_CASE("TRYAGAIN then an answer: the call gets the answer, no local load", "[router_fake]") {
  fake a;
  a.on("GETRANGE", {fake::error("TRYAGAIN"), fake::error("TRYAGAIN"), record("stored")});
  fleet_t f(opts(a));
  origin o;
  CHECK(f.get("settling", o.loader("unused")) == "stored");
  const auto s = f.stats();
  CHECK(o.calls == 0);
  CHECK(s.origin_calls == 0);
  CHECK(s.local_fallback == 0);
  CHECK(s.hits == 1);
  CHECK(s.redis_errors == 0);
  CHECK(a.commands("GETRANGE") == 3);
  CHECK(only(a, {"PING", "GETRANGE"}));
}

TEST_CASE("a node that closes the connection mid-reply is a connection failure", "[router_fake]") {
  fake a;
  const std::string rec = d::make_record('v', "string", "1", "1", "never-whole");
  // The bulk's header and half its bytes, then the close.
  a.on("GETRANGE",
       {fake::cut("$" + std::to_string(rec.size()) + "\r\n" + rec.substr(0, rec.size() / 2))});
  fleet_t f(opts(a));  // breaker_threshold 1
  origin o;
  CHECK(f.get("cut", o.loader("local")) == "local");
  const auto s = f.stats();
  CHECK(o.calls == 1);
  CHECK(s.local_fallback == 1);
  CHECK(s.redis_errors == 1);
  CHECK(s.breaker_opens == 1);
  CHECK_FALSE(f.healthy());
  CHECK(a.commands("GETRANGE") == 1);  // a reply that began is not sent again
  CHECK(only(a, {"PING", "GETRANGE"}));
}

TEST_CASE("a node that never answers costs one redis_timeout and a breaker failure",
          "[router_fake]") {
  fake a;
  a.on("GETRANGE", {fake::silence()});
  sf::fleet_options o = opts(a);
  o.redis_timeout = 200ms;
  fleet_t f(o);
  origin org;
  CHECK(f.get("stalled", org.loader("local")) == "local");
  const auto s = f.stats();
  CHECK(org.calls == 1);
  CHECK(s.local_fallback == 1);
  CHECK(s.redis_errors == 1);
  CHECK(s.breaker_opens == 1);
  CHECK_FALSE(f.healthy());
}

TEST_CASE("a pooled connection closed before any byte of the reply: sent once more, no failure",
          "[router_fake]") {
  fake a;
  // The first call's connection goes back to the pool; the second call's command on it gets
  // the close (an idle timeout's, a restart's), then the record on a fresh connection.
  a.on("GETRANGE", {record("first"), fake::cut(), record("second")});
  fleet_t f(opts(a));  // breaker_threshold 1
  origin o;
  CHECK(f.get("k1", o.loader("unused")) == "first");
  CHECK(f.get("k2", o.loader("unused")) == "second");
  const auto s = f.stats();
  CHECK(o.calls == 0);
  CHECK(s.hits == 2);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());
  const auto log = a.log();
  std::vector<int> conns;
  for (const auto& r : log) {
    if (r.args[0] == "GETRANGE") conns.push_back(r.conn);
  }
  REQUIRE(conns.size() == 3);
  CHECK(conns[0] == conns[1]);  // pooled
  CHECK(conns[2] != conns[1]);  // fresh
}

// ---- the failover wait (fleet_options::failover_wait) and CLUSTER NODES --------------------

namespace {

// One line of CLUSTER NODES (redis-server 7.0's format) for node `n`.
std::string nodes_line(const fake& n, const std::string& id, const std::string& flags,
                       const std::string& master, const std::string& link,
                       const std::string& slots = "") {
  return id + " " + n.address() + "@1" + std::to_string(n.port() % 10000) + " " + flags + " " +
         master + " 0 0 1 " + link + (slots.empty() ? "" : " " + slots) + "\n";
}

const std::string id_a(40, 'a');
const std::string id_b(40, 'b');
const std::string id_c(40, 'c');

// Whether a command is CLUSTER <sub>.
fake::match cluster_cmd(std::string sub) {
  return [sub](const fake::argv& v) { return v.size() >= 2 && v[0] == "CLUSTER" && v[1] == sub; };
}

// A failover a flight of `key` has to wait for: the key's master b stops answering (every
// connection cut); the seed a's slot map names b twice (the MOVED's read, the failover wait's
// first) and then c; a's CLUSTER NODES still has c as a failed master without slots and the map
// no replica of b; c serves the value once promoted. What c answers to CLUSTER NODES is each
// case's own.
struct failover_to_c {
  fake a;
  fake b;
  fake c;

  explicit failover_to_c(const std::string& key) {
    a.always("GETRANGE", redirect("MOVED", key, b));
    const auto map_b = fake::array({fake::slot_range(0, 16383, "127.0.0.1", b.port())});
    const auto map_c = fake::array({fake::slot_range(0, 16383, "127.0.0.1", c.port())});
    a.on_if(cluster_cmd("SLOTS"), {map_b, map_b, map_c}, true);
    a.on_if(cluster_cmd("NODES"),
            {fake::bulk(nodes_line(a, id_a, "myself,master", "-", "connected") +
                        nodes_line(b, id_b, "master", "-", "connected", "0-16383") +
                        nodes_line(c, id_c, "master,fail", "-", "disconnected"))},
            true);
    b.always("GETRANGE", fake::cut());  // b died: every connection closed
    c.always("GETRANGE", record("on-c"));
  }
};

}  // namespace

TEST_CASE("a master's replica that only its own CLUSTER NODES lists yet: the flight waits for it",
          "[router_fake][failover]") {
  // The key's master b stops answering. Its replica c just came back (a master restarted after
  // its own failover, now b's replica): the seed a's view still has c as a failed master, the
  // slot map lists no replica, and only c's own CLUSTER NODES says "myself,slave <b>". Then c
  // is promoted (a's map names it).
  const std::string key = "rejoined";
  failover_to_c cl(key);
  fake& a = cl.a;
  fake& b = cl.b;
  fake& c = cl.c;
  c.on_if(cluster_cmd("NODES"),
          {fake::bulk(nodes_line(c, id_c, "myself,slave", id_b, "connected") +
                      nodes_line(a, id_a, "master", "-", "connected") +
                      nodes_line(b, id_b, "master,fail?", "-", "disconnected", "0-16383"))},
          true);
  sf::fleet_options o = opts(a);
  o.failover_wait = 20s;  // a bound, never reached: the promotion is seen within 2 map reads
  fleet_t f(o);
  origin org;

  CHECK(f.get(key, org.loader("local")) == "on-c");
  const auto s = f.stats();
  CHECK(org.calls == 0);  // was 1: a's view alone said "no replica", a local load at once
  CHECK(s.local_fallback == 0);
  CHECK(s.failover_no_replica == 0);
  CHECK(s.failover_waits == 1);
  CHECK(s.failover_expired == 0);
  CHECK(s.hits == 1);
  CHECK(a.commands("GETRANGE") == 1);
  CHECK(c.commands("GETRANGE") == 1);
}

TEST_CASE("failover counters: no replica listed anywhere, and an outage past failover_wait",
          "[router_fake][failover]") {
  fake a;
  fake b;
  fake c;
  const std::string key = "no-replica";
  a.always("GETRANGE", redirect("MOVED", key, b));
  a.on_if(cluster_cmd("SLOTS"), {fake::array({fake::slot_range(0, 16383, "127.0.0.1", b.port())})},
          true);
  b.always("GETRANGE", fake::cut());
  sf::fleet_options o = opts(a);
  SECTION("no node lists a replica of b: a local load at once, counted as such") {
    const std::string nodes = nodes_line(a, id_a, "myself,master", "-", "connected") +
                              nodes_line(b, id_b, "master", "-", "connected", "0-16383") +
                              nodes_line(c, id_c, "master", "-", "connected");
    a.on_if(cluster_cmd("NODES"), {fake::bulk(nodes)}, true);
    c.on_if(cluster_cmd("NODES"), {fake::bulk(nodes)}, true);
    o.failover_wait = 20s;
    fleet_t f(o);
    origin org;
    CHECK(f.get(key, org.loader("local")) == "local");
    const auto s = f.stats();
    CHECK(org.calls == 1);
    CHECK(s.local_fallback == 1);
    CHECK(s.failover_no_replica == 1);
    CHECK(s.failover_waits == 0);
    CHECK(s.failover_expired == 0);
    CHECK(s.local_not_run == 0);
    CHECK(c.commands("CLUSTER") == 1);  // the node a's answer named was asked too
  }
  SECTION("a replica listed, never promoted: the wait ends at failover_wait, counted") {
    a.on_if(cluster_cmd("NODES"),
            {fake::bulk(nodes_line(a, id_a, "myself,master", "-", "connected") +
                        nodes_line(b, id_b, "master", "-", "connected", "0-16383") +
                        nodes_line(c, id_c, "slave", id_b, "connected"))},
            true);
    o.failover_wait = 120ms;
    fleet_t f(o);
    origin org;
    CHECK(f.get(key, org.loader("local")) == "local");
    const auto s = f.stats();
    CHECK(org.calls == 1);
    CHECK(s.local_fallback == 1);
    CHECK(s.failover_waits == 1);
    CHECK(s.failover_expired == 1);
    CHECK(s.failover_no_replica == 0);
  }
}

TEST_CASE("a node every view has failed, without slots, that does not answer: a possible replica",
          "[router_fake][failover]") {
  // As above, but no answer lists c at all: a (and b's last view) still has c as a failed,
  // unlinked master without slots, and c itself does not answer CLUSTER NODES yet (a replica
  // restarted moments ago, loading). Its role is unknown: the flight waits, and c is promoted.
  const std::string key = "rejoining";
  failover_to_c cl(key);
  fake& a = cl.a;
  fake& c = cl.c;
  c.on_if(cluster_cmd("NODES"), {fake::error("LOADING Redis is loading the dataset in memory")},
          true);
  sf::fleet_options o = opts(a);
  o.failover_wait = 20s;
  fleet_t f(o);
  origin org;

  CHECK(f.get(key, org.loader("local")) == "on-c");
  const auto s = f.stats();
  CHECK(org.calls == 0);
  CHECK(s.local_fallback == 0);
  CHECK(s.failover_no_replica == 0);
  CHECK(s.failover_waits == 1);
  CHECK(c.commands("CLUSTER") == 1);
  CHECK(c.commands("GETRANGE") == 1);
}
