// singleflight::fleet_cache under client tracking (fleet_coherence::tracking, the default):
// writes the library did not make reach the local cache. A plain hiredis client stands for
// redis-cli; one fleet_cache with a local ttl of 60 s stands for a process, so nothing but a
// tracking message can make it drop a local entry within a test. "Once it has heard it" is its
// stats().invalidations_heard having grown (the inbox counts a message after recording it); its
// own store goes on its tracker connection and is never reported to it (heard_own_store), so a
// later growth is the write under test. FLUSHALL and client kills run on a private redis-server;
// the rest on the shared one.
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>

#include "support/catch.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fc_t = sf::fleet_cache<std::string, std::string>;
using point = d::fleet_point;

sf::fleet_cache_options opts(const std::string& uri, const std::string& prefix) {
  return sftest::fleet_cache_opts(uri, prefix);  // coherence: tracking, the default
}

using sftest::fleet_cache_engine;
using sftest::until_listening;

// c's load of `key` stored `value` in Redis, on c's tracker (BCAST NOLOOP): the server does not
// report that store to c, so its next get is a local hit, with no Redis read, and the local entry
// stays until something else is reported. Returns c's reports heard (as before the store).
std::uint64_t heard_own_store(fc_t& c, std::uint64_t before, const std::string& key,
                              const std::string& value) {
  const std::uint64_t gets = c.stats().fleet.gets;
  std::atomic<int> ran{0};
  CHECK(c.get(key, [&ran] {
    ran.fetch_add(1);
    return std::string("must not be loaded");
  }) == value);
  CHECK(ran.load() == 0);
  CHECK(c.stats().fleet.gets == gets);
  CHECK(c.stats().invalidations_heard == before);
  return c.stats().invalidations_heard;
}

std::string value_name(const std::string& prefix, const std::string& key) {
  return d::fleet_names::of(prefix, key).value;
}

using sftest::versioned_origin;

using sftest::must_not_load;

// The CLIENT ID of the one connection with tracking on (flag 't' in CLIENT LIST).
std::string tracking_client_id(sftest::redis_client& r) {
  std::istringstream lines(r.command({"CLIENT", "LIST"}).str);
  std::string line;
  std::string found;
  int count = 0;
  while (std::getline(lines, line)) {
    const auto f = line.find(" flags=");
    if (f == std::string::npos) continue;
    const std::string flags = line.substr(f + 7, line.find(' ', f + 7) - f - 7);
    if (flags.find('t') == std::string::npos) continue;
    found = line.substr(3, line.find(' ') - 3);  // "id=N ..."
    ++count;
  }
  REQUIRE(count == 1);
  return found;
}

}  // namespace

TEST_CASE(
    "a DEL by a plain client on the value's name reaches the local cache: the next get after "
    "it was heard loads again, though the local entry had 60 s to live",
    "[fleet][fleet_cache][tracking]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fct-del");
  sftest::redis_client redis(uri);
  fc_t c(opts(uri, prefix));
  until_listening(c, "c listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(c.get("k", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "k", "v1");
  const std::uint64_t hits = c.stats().local.hits;
  const std::uint64_t redis_gets = c.stats().fleet.gets;
  CHECK(c.get("k", must_not_load(ran)) == "v1");  // a local hit
  CHECK(c.stats().local.hits == hits + 1);
  CHECK(c.stats().fleet.gets == redis_gets);

  origin.version = 2;
  CHECK(redis.command({"DEL", value_name(prefix, "k")}).integer == 1);
  sftest::must([&] { return c.stats().invalidations_heard > heard; }, "c hears the DEL");
  CHECK(c.get("k", origin.loader()) == "v2");
  CHECK(origin.calls.load() == 2);
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "a SET by an outside writer on the value's name reaches the local cache: the next get "
    "after it was heard returns the written value, from Redis, with no origin call",
    "[fleet][fleet_cache][tracking]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fct-set");
  sftest::redis_client redis(uri);
  fc_t c(opts(uri, prefix));
  until_listening(c, "c listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(c.get("k", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "k", "v1");
  const std::string rec =
      d::make_record('v', d::codec_tag<sf::codec<std::string>>(), "0", "0", "written outside");
  CHECK(redis.command({"SET", value_name(prefix, "k"), rec}).str == "OK");
  sftest::must([&] { return c.stats().invalidations_heard > heard; }, "c hears the SET");
  CHECK(c.get("k", must_not_load(ran)) == "written outside");
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "the value's expiry in Redis reaches the local cache: once heard, the next get loads again",
    "[fleet][fleet_cache][tracking]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fct-exp");
  sf::fleet_cache_options o = opts(uri, prefix);
  o.fleet.value_ttl = 200ms;  // Redis expires it; the local entry has 60 s
  fc_t c(o);
  until_listening(c, "c listens");
  versioned_origin origin;
  CHECK(c.get("k", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "k", "v1");  // its store is not reported
  origin.version = 2;
  sftest::must([&] { return c.stats().invalidations_heard > heard; }, "c hears the expiry");
  CHECK(c.get("k", origin.loader()) == "v2");
  CHECK(origin.calls.load() == 2);
}

TEST_CASE("FLUSHALL reaches the local cache as one clear: every key loads again",
          "[fleet][fleet_cache][tracking]") {
  sftest::private_redis server;
  auto client = server.client();
  fc_t c(opts(server.uri(), "flushed"));
  until_listening(c, "c listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(c.get("a", origin.loader()) == "v1");
  CHECK(c.get("b", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "a", "v1");
  CHECK(c.get("b", must_not_load(ran)) == "v1");
  origin.version = 2;
  CHECK(client->command({"FLUSHALL"}).str == "OK");
  sftest::must([&] { return c.stats().invalidations_heard > heard; }, "c hears the FLUSHALL");
  CHECK(c.get("a", origin.loader()) == "v2");
  CHECK(c.get("b", origin.loader()) == "v2");
  CHECK(origin.calls.load() == 4);
}

TEST_CASE(
    "the tracking connection killed: a DEL while tracking is down is not lost; the subscriber "
    "reconnects and re-tracks, its confirmation marks the local cache stale, later DELs are heard",
    "[fleet][fleet_cache][tracking]") {
  sftest::private_redis server;
  auto client = server.client();
  const std::string prefix = "tracker";
  fc_t c(opts(server.uri(), prefix));
  sftest::gate down;
  sftest::gate back;
  fleet_cache_engine(c).hook = [&](point p, std::string_view) {
    if (p != point::resubscribing) return;
    down.open();
    back.wait("the test lets c resubscribe");
  };
  until_listening(c, "c listens");  // after the hook: orders it before the thread reads it
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(c.get("k", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "k", "v1");

  const std::string id = tracking_client_id(*client);
  CHECK(client->command({"CLIENT", "KILL", "ID", id}).integer == 1);
  down.wait("c's subscriber sees the tracker gone and reconnects");
  origin.version = 2;
  CHECK(client->command({"DEL", value_name(prefix, "k")}).integer == 1);
  CHECK(c.get("k", must_not_load(ran)) == "v1");  // the gap: the local entry is served
  CHECK(c.stats().invalidations_heard == heard);
  const std::uint64_t resyncs = c.stats().resyncs;
  back.open();
  sftest::must([&] { return c.stats().resyncs > resyncs; }, "c re-tracked and resubscribed");
  // Marked stale, and without stale_while_revalidate not served: loads (the DEL emptied Redis).
  CHECK(c.get("k", origin.loader()) == "v2");
  CHECK(ran.load() == 0);

  // Tracking works again, through the new tracker.
  const std::uint64_t again = heard_own_store(c, heard, "k", "v2");
  origin.version = 3;
  CHECK(client->command({"DEL", value_name(prefix, "k")}).integer == 1);
  sftest::must([&] { return c.stats().invalidations_heard > again; }, "c hears the next DEL");
  CHECK(c.get("k", origin.loader()) == "v3");
}

// A managed server whose ACL denies `client` (or that renamed it, or has no REDIRECT): CLIENT ID
// and CLIENT TRACKING come back as errors. The process must not be left without coherence: it
// falls back to the bus, where every fleet_cache's put / invalidate / expire is published in both
// modes, so another process's invalidate still reaches it.
TEST_CASE(
    "tracking_refused_by_acl_falls_back_to_the_bus: another process's invalidate still reaches "
    "the local cache, and stats() say the bus is in use",
    "[fleet][fleet_cache][tracking]") {
  sftest::private_redis server;
  auto client = server.client();
  REQUIRE(client->command({"ACL", "SETUSER", "default", "-client"}).str == "OK");
  const std::string prefix = "refused";
  fc_t a(opts(server.uri(), prefix));
  fc_t b(opts(server.uri(), prefix));
  for (fc_t* c : {&a, &b}) {
    sftest::must([&] { return c->stats().tracking_refused == 1; }, "the refusal is seen");
    // The tracking channel (kept, silent), the expire channel and the bus.
    sftest::must([&] { return fleet_cache_engine(*c).subscriber.confirmed_channels() == 3; },
                 "subscribed to the bus");
    CHECK(c->stats().coherence == sf::fleet_coherence::publish);
  }
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // a's value, from Redis
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // now a local hit
  const std::uint64_t heard = b.stats().invalidations_heard;

  origin.version = 2;
  a.invalidate("k");
  sftest::must([&] { return b.stats().invalidations_heard > heard; }, "b hears a's invalidate");
  CHECK(b.get("k", origin.loader()) == "v2");
  CHECK(a.get("k", must_not_load(ran)) == "v2");  // b's value, from Redis

  // The other way round, through put.
  const std::uint64_t heard_a = a.stats().invalidations_heard;
  b.put("k", "v3");
  sftest::must([&] { return a.stats().invalidations_heard > heard_a; }, "a hears b's put");
  CHECK(a.get("k", must_not_load(ran)) == "v3");
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 2);
  CHECK(a.stats().tracking_refused == 1);
  CHECK(b.stats().coherence == sf::fleet_coherence::publish);
}

TEST_CASE("a server that tracks: tracking_refused stays 0 and the bus is not subscribed",
          "[fleet][fleet_cache][tracking]") {
  sftest::private_redis server;
  fc_t c(opts(server.uri(), "tracked"));
  until_listening(c, "c listens");
  CHECK(c.stats().tracking_refused == 0);
  CHECK(c.stats().tracking_refused_on_cluster == 0);
  CHECK(c.stats().coherence == sf::fleet_coherence::tracking);
  CHECK(server.client()->numsub(d::bus_channel("tracked")) == 0);
}

// Before it tracks, the subscriber asks `INFO cluster` (a Redis Cluster node is not tracked:
// test_fleet_cache_cluster.cpp). An ACL that denies INFO must not cost a single server its
// tracking: the error is taken for "not a cluster", and a DEL by another program is heard.
TEST_CASE(
    "a server whose ACL denies INFO is still tracked: the cluster check's error is a single "
    "server",
    "[fleet][fleet_cache][tracking]") {
  sftest::private_redis server;
  auto client = server.client();
  REQUIRE(client->command({"ACL", "SETUSER", "default", "-info"}).str == "OK");
  const std::string prefix = "noinfo";
  fc_t c(opts(server.uri(), prefix));
  until_listening(c, "c listens");
  CHECK(c.stats().tracking_refused == 0);
  CHECK(c.stats().tracking_refused_on_cluster == 0);
  CHECK(c.stats().coherence == sf::fleet_coherence::tracking);
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(c.get("k", origin.loader()) == "v1");
  const std::uint64_t heard = heard_own_store(c, 0, "k", "v1");
  origin.version = 2;
  CHECK(client->command({"DEL", value_name(prefix, "k")}).integer == 1);
  sftest::must([&] { return c.stats().invalidations_heard > heard; }, "c hears the DEL");
  CHECK(c.get("k", origin.loader()) == "v2");
  CHECK(ran.load() == 0);
}
