// The fleet's parts that need no Redis server: codecs and key codecs, the record format (a
// corrupt or foreign value is a miss, never a wrong T), the Redis URI and option checks, the
// script SHAs, the circuit breaker, and a fleet whose Redis cannot be reached (it loads
// locally and never reports an error to its callers).
#include <singleflight/fleet.hpp>

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;

template <class T>
T round_trip(const T& v) {
  const sf::codec<T> c;
  return c.decode(c.encode(v));
}

}  // namespace

TEST_CASE("codec round-trips strings and every arithmetic type, extremes included",
          "[fleet][codec]") {
  CHECK(round_trip(std::string()) == "");
  CHECK(round_trip(std::string("a|b\0c", 5)) == std::string("a|b\0c", 5));
  CHECK(round_trip(true) == true);
  CHECK(round_trip(false) == false);
  CHECK(round_trip(std::numeric_limits<std::int64_t>::min()) ==
        std::numeric_limits<std::int64_t>::min());
  CHECK(round_trip(std::numeric_limits<std::uint64_t>::max()) ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK(round_trip(static_cast<signed char>(-128)) == -128);
  CHECK(round_trip('x') == 'x');
  CHECK(round_trip(0.1) == 0.1);  // shortest round-trip form, exact
  CHECK(round_trip(-1.5e300) == -1.5e300);
  CHECK(round_trip(3.25f) == 3.25f);
  CHECK(round_trip(std::numeric_limits<double>::denorm_min()) ==
        std::numeric_limits<double>::denorm_min());
  CHECK(round_trip(std::numeric_limits<double>::max()) == std::numeric_limits<double>::max());
}

TEST_CASE("codec decode rejects what is not an encoding of the type (no wrong T)",
          "[fleet][codec]") {
  CHECK_THROWS_AS(sf::codec<int>{}.decode(""), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<int>{}.decode("12abc"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<int>{}.decode(" 12"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<int>{}.decode("5000000000"), sf::decode_error);  // out of range
  CHECK_THROWS_AS(sf::codec<unsigned>{}.decode("-1"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<bool>{}.decode("true"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<double>{}.decode("1.0x"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<double>{}.decode("1e99999"), sf::decode_error);  // out of range
  CHECK_THROWS_AS(sf::codec<double>{}.decode("+1"), sf::decode_error);
  CHECK_THROWS_AS(sf::codec<char>{}.decode("300"), sf::decode_error);
}

TEST_CASE(
    "key_codec: strings as they are, integers in decimal, tuples length-prefixed so "
    "that no two keys collide",
    "[fleet][codec]") {
  CHECK(sf::key_codec<std::string>{}.encode("tenant-7|user-42") == "tenant-7|user-42");
  CHECK(sf::key_codec<std::string>{}.encode(std::string_view("sv")) == "sv");
  CHECK(sf::key_codec<int>{}.encode(-42) == "-42");
  CHECK(sf::key_codec<std::uint64_t>{}.encode(18446744073709551615ULL) == "18446744073709551615");
  using k2 = std::tuple<std::string, std::string>;
  const sf::key_codec<k2> kc;
  CHECK(kc.encode({"a|b", "c"}) != kc.encode({"a", "b|c"}));
  CHECK(kc.encode({"a", ""}) != kc.encode({"", "a"}));
  CHECK(sf::key_codec<std::tuple<std::string, int>>{}.encode({"tenant-7", 42}) ==
        "8:tenant-7|2:42");
  CHECK(sf::key_codec<std::pair<std::string, int>>{}.encode({"tenant-7", 42}) == "8:tenant-7|2:42");
}

TEST_CASE("every Redis name of one key shares one hash tag (the names of one slot)",
          "[fleet][protocol]") {
  for (const auto& [prefix, key] : {std::pair<std::string, std::string>{"app:v3", "tenant-7|u"},
                                    {"p", "key with } and { in it"},
                                    {"", ""}}) {
    const auto n = d::fleet_names::of(prefix, key);
    // Redis's hash tag: from the first '{' to the first '}' after it.
    const auto tag = [](const std::string& name) {
      const auto open = name.find('{');
      return name.substr(open, name.find('}', open + 1) - open);
    };
    CAPTURE(prefix, key, n.value);
    CHECK(n.value.front() == '{');
    for (const std::string* name : {&n.lease, &n.meta, &n.channel}) {
      CHECK(tag(*name) == tag(n.value));
    }
    CHECK(n.value != n.lease);
    CHECK(n.meta != n.channel);
    // In db 3 only the channel differs (channels are the server's, the other names a db's).
    const auto in3 = d::fleet_names::of(prefix, key, 3);
    CHECK(in3.channel == n.channel + ":3");
    CHECK(tag(in3.channel) == tag(n.value));
    CHECK(in3.value == n.value);
    CHECK(in3.lease == n.lease);
    CHECK(in3.meta == n.meta);
  }
}

TEST_CASE(
    "Redis names are injective in (prefix, key text): no two (prefix, key) pairs share a "
    "name, whatever separators either holds",
    "[fleet][protocol]") {
  // Every string of up to 3 characters over the separators the encodings use.
  const std::string alphabet = "a:{}1|";
  std::vector<std::string> words{""};
  for (std::size_t from = 0, len = 1; len <= 3; ++len) {
    const std::size_t to = words.size();
    for (std::size_t i = from; i < to; ++i) {
      for (const char c : alphabet) words.push_back(words[i] + c);
    }
    from = to;
  }
  std::set<std::string> names;
  std::size_t collisions = 0;
  for (const auto& prefix : words) {
    for (const auto& key : words) {
      const auto n = d::fleet_names::of(prefix, key);
      for (const std::string* name : {&n.value, &n.lease, &n.meta, &n.channel}) {
        if (!names.insert(*name).second) ++collisions;
      }
    }
  }
  CHECK(names.size() == words.size() * words.size() * 4);
  CHECK(collisions == 0);
  // The review's pair, by name.
  CHECK(d::fleet_names::of("users", "eu:42").value != d::fleet_names::of("users:eu", "42").value);
}

TEST_CASE(
    "a record reads back only with its codec tag and an intact checksum: corrupt, "
    "truncated, foreign and other-codec bytes are misses",
    "[fleet][protocol]") {
  const std::string rec = d::make_record('v', "i32", "17", "3", "42");
  const auto r = d::parse_record(rec, "i32");
  REQUIRE(r);
  CHECK(r->kind == 'v');
  CHECK(r->payload == "42");
  CHECK(r->fence == "17");
  CHECK(r->gen == "3");

  CHECK_FALSE(d::parse_record(rec, "string"));  // another codec's value
  CHECK_FALSE(d::parse_record("42", "i32"));    // a foreign value
  CHECK_FALSE(d::parse_record("", "i32"));
  CHECK_FALSE(d::parse_record(rec.substr(0, rec.size() - 1), "i32"));  // truncated
  for (std::size_t i = 0; i < rec.size(); ++i) {                       // any flipped byte
    std::string bad = rec;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    CHECK_FALSE(d::parse_record(bad, "i32"));
  }
  const std::string payload_with_bars = d::make_record('e', "string", "1", "0", "a|b|c");
  const auto e = d::parse_record(payload_with_bars, "string");
  REQUIRE(e);
  CHECK(e->kind == 'e');
  CHECK(e->payload == "a|b|c");
}

TEST_CASE("script SHAs are the SHA-1 that EVALSHA expects", "[fleet][protocol]") {
  CHECK(d::sha1_hex("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  CHECK(d::sha1_hex("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d");
  CHECK(d::sha1_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
  CHECK(d::sha1_hex(std::string(1000, 'a')) == "291e9a6c66994949b57ba5e650361e98fc36b1ba");
}

TEST_CASE(
    "redis_uri: tcp, redis, IPv6, unix with db; malformed ones are rejected with a "
    "readable message",
    "[fleet][options]") {
  auto ep = d::redis_endpoint::parse("tcp://127.0.0.1:6380/2");
  CHECK_FALSE(ep.unix_socket);
  CHECK(ep.host == "127.0.0.1");
  CHECK(ep.port == 6380);
  CHECK(ep.db == 2);
  ep = d::redis_endpoint::parse("redis://cache.internal");
  CHECK(ep.host == "cache.internal");
  CHECK(ep.port == 6379);
  ep = d::redis_endpoint::parse("tcp://[::1]:7000");
  CHECK(ep.host == "::1");
  CHECK(ep.port == 7000);
  ep = d::redis_endpoint::parse("unix:///run/redis/redis.sock?db=3");
  CHECK(ep.unix_socket);
  CHECK(ep.host == "/run/redis/redis.sock");
  CHECK(ep.db == 3);
  for (const char* bad :
       {"", "127.0.0.1:6379", "http://x:1", "tcp://", "tcp://h:0", "tcp://h:70000", "tcp://h:12x",
        "tcp://user:pw@h:1", "unix://rel.sock", "tcp://[::1", "unix:///s?db=x"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(d::redis_endpoint::parse(bad), std::invalid_argument);
  }
}

TEST_CASE("redis_uri: a list of seeds, the scheme once and the db for all; one seed is parse()'s",
          "[fleet][options]") {
  auto seeds = d::redis_endpoint::parse_list("tcp://10.0.0.1:7000,10.0.0.2,[::1]:7002/3");
  REQUIRE(seeds.size() == 3);
  CHECK(seeds[0].host == "10.0.0.1");
  CHECK(seeds[0].port == 7000);
  CHECK(seeds[1].host == "10.0.0.2");
  CHECK(seeds[1].port == 6379);
  CHECK(seeds[2].host == "::1");
  CHECK(seeds[2].port == 7002);
  for (const auto& s : seeds) CHECK(s.db == 3);
  seeds = d::redis_endpoint::parse_list("redis://a:1,b:2");
  REQUIRE(seeds.size() == 2);
  CHECK(seeds[1].host == "b");
  CHECK(seeds[1].db == 0);
  seeds = d::redis_endpoint::parse_list("tcp://127.0.0.1:6380/2");
  REQUIRE(seeds.size() == 1);
  CHECK(seeds[0].port == 6380);
  CHECK(seeds[0].db == 2);
  seeds = d::redis_endpoint::parse_list("unix:///run/a,b.sock");  // a path may hold a comma
  REQUIRE(seeds.size() == 1);
  CHECK(seeds[0].host == "/run/a,b.sock");
  for (const char* bad : {"tcp://a:1,", "tcp://,a:1", "tcp://a:1,,b:2", "tcp://a:1,b:x",
                          "tcp://a:1,tcp://b:2", "a:1,b:2", "tcp://a:1,u:p@b:2"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(d::redis_endpoint::parse_list(bad), std::invalid_argument);
  }
  try {
    (void)d::redis_endpoint::parse_list("tcp://a:1,b:99999");
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("tcp://a:1,b:99999") != std::string::npos);   // the whole list
    CHECK(what.find("seed tcp://b:99999") != std::string::npos);  // and the seed
  }
  sf::fleet_options o;
  o.redis_uri = "tcp://a:1,,b:2";
  using fleet_t = sf::fleet<std::string, std::string>;
  CHECK_THROWS_AS(fleet_t(o), std::invalid_argument);
}

TEST_CASE("fleet_options that cannot work are rejected at construction", "[fleet][options]") {
  using fleet_t = sf::fleet<std::string, std::string>;
  const auto with = [](auto change) {
    sf::fleet_options o;
    change(o);
    return o;
  };
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.lease_ttl = 0ms; })), std::invalid_argument);
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.renew_every = 5000ms; })), std::invalid_argument);
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.redis_timeout = 0ms; })), std::invalid_argument);
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.value_ttl = 0ms; })), std::invalid_argument);
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.error_ttl = -1ms; })), std::invalid_argument);
  CHECK_THROWS_AS(fleet_t(with([](auto& o) { o.redis_uri = "localhost"; })), std::invalid_argument);
  fleet_t ok(with([](auto& o) { o.lease_ttl = 300ms; }));  // constructs without connecting
  CHECK(ok.healthy());
}

TEST_CASE(
    "circuit breaker: opens after `threshold` consecutive failures, lets one probe "
    "through after the cooldown, closes on its success, reopens on its failure",
    "[fleet][breaker]") {
  d::circuit_breaker b(3, 50ms);
  CHECK(b.allow());
  CHECK_FALSE(b.failure());
  b.success();  // resets the run
  CHECK_FALSE(b.failure());
  CHECK_FALSE(b.failure());
  CHECK(b.failure());  // third in a row
  CHECK_FALSE(b.closed());
  CHECK_FALSE(b.allow());
  sftest::must([&] { return b.allow(); }, "breaker lets a probe through after its cooldown");
  CHECK_FALSE(b.allow());  // one probe at a time
  CHECK(b.failure());      // the probe failed: open again
  CHECK_FALSE(b.allow());
  sftest::must([&] { return b.allow(); }, "second probe");
  b.success();
  CHECK(b.closed());
  CHECK(b.allow());
  CHECK(b.opens() == 2);
}

TEST_CASE(
    "circuit breaker: a probe that never reports is replaced after another cooldown "
    "(the breaker cannot stay open forever)",
    "[fleet][breaker]") {
  d::circuit_breaker b(1, 30ms);
  CHECK(b.failure());
  sftest::must([&] { return b.allow(); }, "first probe");
  // ... which never reports.
  sftest::must([&] { return b.allow(); }, "a second probe once the first one's time is up");
}

TEST_CASE(
    "Redis unreachable: get() loads locally, coalesces this process's callers, surfaces "
    "no error, and the breaker stops the fleet from trying after `threshold` failures",
    "[fleet][faults]") {
  // A loopback port where nobody listens: connect is refused at once.
  const int port = sftest::free_port();
  sf::fleet_options o;
  o.redis_uri = "tcp://127.0.0.1:" + std::to_string(port);
  o.breaker_threshold = 2;
  o.breaker_cooldown = 60s;
  sf::fleet<std::string, int> f(o);
  std::atomic<int> loads{0};
  sftest::gate release;
  std::vector<sftest::result<int>> r(4);
  std::vector<sftest::jthread> callers;
  for (auto& slot : r) {
    callers.push_back(sftest::spawn(slot, [&] {
      return f.get("k", [&] {
        loads.fetch_add(1);
        release.wait("loader released");
        return 7;
      });
    }));
  }
  sftest::must([&] { return f.local_stats().calls == 4 && loads.load() == 1; },
               "four callers, one local load");
  release.open();
  for (std::size_t i = 0; i < r.size(); ++i) sftest::finish(callers[i], r[i], "caller");
  for (auto& slot : r) {
    REQUIRE(slot.value);
    CHECK(*slot.value == 7);
  }
  CHECK(loads.load() == 1);
  CHECK(f.stats().local_fallback == 1);
  CHECK(f.stats().redis_errors == 1);

  CHECK(f.get("k2", [] { return 8; }) == 8);  // second failure: the breaker opens
  CHECK_FALSE(f.healthy());
  CHECK(f.stats().breaker_opens == 1);
  const auto errors = f.stats().redis_errors;
  for (int i = 0; i < 20; ++i) CHECK(f.get("k3", [i] { return i; }) == i);
  CHECK(f.stats().redis_errors == errors);  // no more attempts while open
  CHECK(f.stats().local_fallback == 22);
  CHECK(f.stats().origin_calls == 22);
}

TEST_CASE(
    "invalidate() with Redis unreachable throws fleet_error (an invalidation is never "
    "lost silently); after close() closed_error, and the fleet is no longer healthy",
    "[fleet][faults]") {
  sf::fleet_options o;
  o.redis_uri = "tcp://127.0.0.1:" + std::to_string(sftest::free_port());
  sf::fleet<std::string, int> f(o);
  CHECK_THROWS_AS(f.invalidate("k"), sf::fleet_error);
  CHECK(f.healthy());  // one failure: the breaker is still closed
  f.close();
  CHECK_FALSE(f.healthy());
  CHECK_THROWS_AS(f.invalidate("k"), sf::closed_error);
  CHECK_THROWS_AS(f.get("k", [] { return 1; }), sf::closed_error);
}

TEST_CASE("metrics::fleet_metrics exports every fleet_stats field once, under its own name",
          "[fleet][metrics]") {
  sf::fleet_stats s;
  std::uint64_t v = 100;
  for (std::uint64_t* f : {&s.gets,
                           &s.hits,
                           &s.leader,
                           &s.follower_woken,
                           &s.late_hit,
                           &s.local_fallback,
                           &s.lease_lost,
                           &s.fence_rejections,
                           &s.invalidated_stores,
                           &s.decode_failures,
                           &s.redis_errors,
                           &s.remote_failures,
                           &s.origin_calls,
                           &s.breaker_opens,
                           &s.oversized_values,
                           &s.oversized_skipped,
                           &s.publish_failures,
                           &s.replica_timeouts,
                           &s.failover_waits,
                           &s.failover_expired,
                           &s.failover_no_replica,
                           &s.local_not_run,
                           &s.local_unshared,
                           &s.local_max_wait}) {
    *f = ++v;
  }
  static_assert(sizeof(sf::fleet_stats) == 24 * sizeof(std::uint64_t),
                "a new fleet_stats field needs a line in metrics::fleet_metrics");
  std::set<std::string_view> names;
  std::set<double> values;
  for (const auto& d : sf::metrics::fleet_metrics) {
    CHECK(d.name.rfind("singleflight_fleet_", 0) == 0);
    CHECK(d.name.substr(d.name.size() - 6) == "_total");
    CHECK(d.kind == sf::metrics::kind::counter);
    names.insert(d.name);
    values.insert(d.read(s));
  }
  CHECK(names.size() == sf::metrics::fleet_metrics.size());
  CHECK(values.size() == 24);  // every field read, none twice
  CHECK(*values.begin() == 101);
  CHECK(*values.rbegin() == 124);
}
