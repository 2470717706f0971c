// Large values through the fleet with its default settings: a round trip is bounded by
// progress and size, not by one redis_timeout for the whole transfer (a 32 MiB value is
// stored and read back by another fleet object, with its own connections, on loopback); a
// foreign value over max_value_bytes under a value name is not read, counted, and replaced
// by the leader's store, not loaded from the origin on every get; and the size allowance is
// no hole: a server that stops in the middle of a large transfer is found out by the idle
// bound, long before the size allowance would end it.
//
// Each value is moved a few times at most (the suite runs under sanitizers on 2 cores), and
// every name a test writes is deleted at its end.
#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
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

constexpr std::size_t mib = std::size_t{1} << 20;

// Default settings but where Redis is and the prefix (a test's own names).
sf::fleet_options defaults(const std::string& uri, const std::string& prefix) {
  sf::fleet_options o;
  o.redis_uri = uri;
  o.key_prefix = prefix;
  return o;
}

// A loader that counts its calls and answers `value`.
struct counting_origin {
  std::atomic<int> calls{0};
  const std::string& value;
  explicit counting_origin(const std::string& v) : value(v) {}
  auto loader() {
    return [this] {
      calls.fetch_add(1);
      return value;
    };
  }
};

}  // namespace

TEST_CASE(
    "a 32 MiB value, default options: stored by one fleet, read back by another with one "
    "origin call in all and no Redis error",
    "[fleet][large]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("large32");
  sftest::redis_client client(uri);
  const std::string big(32 * mib, 'v');
  REQUIRE(sf::fleet_options{}.max_value_bytes == 32 * mib);  // the documented default

  counting_origin origin(big);
  {
    fleet_t writer(defaults(uri, prefix));
    CHECK(writer.get("big", origin.loader()) == big);
    const sf::fleet_stats s = writer.stats();
    CHECK(s.origin_calls == 1);
    CHECK(s.redis_errors == 0);
    CHECK(s.oversized_values == 0);
    CHECK(s.breaker_opens == 0);
  }
  const std::string name = d::fleet_names::of(prefix, "big").value;
  CHECK(client.command({"STRLEN", name}).integer > static_cast<long long>(big.size()));

  fleet_t reader(defaults(uri, prefix));  // another process: its own connections
  std::string got;
  got = reader.get("big", origin.loader());
  CHECK(got.size() == big.size());
  CHECK(got == big);
  const sf::fleet_stats s = reader.stats();
  CHECK(s.hits == 1);
  CHECK(s.origin_calls == 0);
  CHECK(s.redis_errors == 0);
  CHECK(s.oversized_skipped == 0);
  CHECK(origin.calls.load() == 1);
  client.command({"DEL", name});
}

TEST_CASE(
    "a foreign 64 MiB value without TTL under a value name: not read, counted, replaced by "
    "the leader's store; one origin call over 5 gets, no Redis error, the breaker closed",
    "[fleet][large]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("foreign64");
  sftest::redis_client client(uri);
  const std::string name = d::fleet_names::of(prefix, "k").value;
  REQUIRE(client.command({"SET", name, std::string(64 * mib, 'f')}).str == "OK");
  REQUIRE(client.command({"PTTL", name}).integer == -1);  // no TTL: it would stay forever

  // Generous (the default is 50 ms): replacing a 64 MiB value blocks the server while it frees
  // it, and on a loaded machine that alone can pass the default and count as Redis failing;
  // latency is not what this case is about.
  sf::fleet_options o = defaults(uri, prefix);
  o.redis_timeout = std::chrono::seconds(2);
  fleet_t f(o);
  const std::string value = "the origin's value";
  counting_origin origin(value);
  for (int i = 0; i < 5; ++i) CHECK(f.get("k", origin.loader()) == value);
  const sf::fleet_stats s = f.stats();
  CHECK(origin.calls.load() <= 1);
  CHECK(s.origin_calls <= 1);
  CHECK(s.oversized_skipped == 1);  // seen once, then replaced
  CHECK(s.hits == 4);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(sftest::stored(client, prefix, "k") == value);  // the fleet's record replaced it
  CHECK(client.command({"PTTL", name}).integer > 0);    // with the fleet's TTL
  client.command({"DEL", name});
}

TEST_CASE(
    "no get asks the server for a value whole: with replies over 4 MiB refused "
    "(client-output-buffer-limit), a foreign 64 MiB value and a foreign 8 MiB one are misses "
    "replaced by the leader's store, without a Redis error",
    "[fleet][large]") {
  // redis-server builds a whole reply before it sends a byte, and closes a connection whose
  // reply would pass the limit without sending any of it: a GET of either value is a Redis
  // error (the connection closed), as a GET that outlasts redis_timeout is on a loaded machine.
  // The fleet reads 64 KiB of the first bytes and the value's length (STRLEN): no reply passes
  // 64 KiB here.
  sftest::private_redis server;
  auto client = server.client();
  REQUIRE(
      client->command({"CONFIG", "SET", "client-output-buffer-limit", "normal 4mb 4mb 0"}).str ==
      "OK");
  const std::string prefix = "bounded";
  const std::string huge_name = d::fleet_names::of(prefix, "huge").value;
  const std::string over_name = d::fleet_names::of(prefix, "over64k").value;
  REQUIRE(client->command({"SET", huge_name, std::string(64 * mib, 'f')}).str == "OK");
  REQUIRE(client->command({"SET", over_name, std::string(8 * mib, 'g')}).str == "OK");

  fleet_t f(defaults(server.uri(), prefix));
  const std::string value = "the origin's value";
  counting_origin origin(value);
  for (int i = 0; i < 5; ++i) CHECK(f.get("huge", origin.loader()) == value);
  for (int i = 0; i < 5; ++i) CHECK(f.get("over64k", origin.loader()) == value);
  const sf::fleet_stats s = f.stats();
  CHECK(origin.calls.load() == 2);  // one per key, then hits
  CHECK(s.oversized_skipped == 1);  // 64 MiB: over max_value_bytes
  CHECK(s.decode_failures == 1);    // 8 MiB: under it, but no record of this fleet
  CHECK(s.hits == 8);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(sftest::stored(*client, prefix, "huge") == value);
  CHECK(sftest::stored(*client, prefix, "over64k") == value);
}

TEST_CASE(
    "get_value: bounded reads of any record length around 64 KiB and the limit; a miss, an "
    "empty string, another type, a foreign value under and over the limit",
    "[fleet][large]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("getrange");
  sftest::redis_client client(uri);
  const auto ep = d::redis_endpoint::parse(uri);
  auto conn = d::redis_conn::open(ep, 2000ms, "", "");
  const auto n = d::fleet_names::of(prefix, "k");
  constexpr std::string_view tag = "t";
  constexpr std::size_t limit = 256 * 1024;
  // A record of exactly `length` bytes.
  const auto record_of = [&](std::size_t length) {
    const std::size_t header = d::make_record('v', tag, "1", "1", "").size();
    return d::make_record('v', tag, "1", "1", std::string(length - header, 'r'));
  };
  const auto get = [&](std::size_t lim) { return d::get_value(*conn, n, tag, lim); };

  SECTION("a missing name and an empty string are misses; another Redis type is foreign") {
    CHECK(get(limit).kind == d::get_result::miss);
    client.command({"SET", n.value, ""});
    CHECK(get(limit).kind == d::get_result::miss);
    client.command({"DEL", n.value});
    client.command({"HSET", n.value, "a", "b"});
    CHECK(get(limit).kind == d::get_result::foreign);
  }
  SECTION("records up to the limit are read whole, in one or two reads") {
    for (const std::size_t length : {std::size_t{100}, d::script_read_max - 1, d::script_read_max,
                                     d::script_read_max + 1, std::size_t{200 * 1024}, limit}) {
      INFO("record of " << length << " bytes");
      const std::string rec = record_of(length);
      REQUIRE(rec.size() == length);
      client.command({"SET", n.value, rec});
      const d::get_result g = get(limit);
      CHECK(g.kind == d::get_result::found);
      CHECK(g.bytes == rec);
      CHECK(d::parse_record(g.bytes, tag).has_value());
      CHECK_FALSE(conn->broken());
    }
  }
  SECTION("a record one byte over the limit is oversized, its rest not read") {
    client.command({"SET", n.value, record_of(limit + 1)});
    const d::get_result g = get(limit);
    CHECK(g.kind == d::get_result::oversized);
    CHECK(g.length > static_cast<long long>(limit));
    CHECK(g.bytes.empty());
  }
  SECTION("a limit under 64 KiB: a longer record is oversized after the first read") {
    client.command({"SET", n.value, record_of(10 * 1024)});
    CHECK(get(5 * 1024).kind == d::get_result::oversized);
    CHECK(get(10 * 1024).kind == d::get_result::found);
    CHECK_FALSE(conn->broken());
  }
  SECTION("a foreign value over 64 KiB: foreign under the limit, oversized over it, not read") {
    client.command({"SET", n.value, std::string(limit, 'f')});
    CHECK(get(limit).kind == d::get_result::foreign);
    client.command({"SET", n.value, std::string(limit + 1, 'f')});
    const d::get_result g = get(limit);
    CHECK(g.kind == d::get_result::oversized);
    CHECK(g.length == static_cast<long long>(limit + 1));  // STRLEN: the exact length
    CHECK_FALSE(conn->broken());
  }
  SECTION("the race reads a record over 64 KiB the same way; a foreign one takes no lease") {
    const std::string rec = record_of(100 * 1024);
    client.command({"SET", n.value, rec});
    d::acquire_result a = d::acquire(*conn, n, tag, "tok", 2000ms, 2000ms, true, limit);
    CHECK(a.kind == d::acquire_result::found);
    CHECK(a.bytes == rec);
    client.command({"SET", n.value, std::string(100 * 1024, 'f')});
    a = d::acquire(*conn, n, tag, "tok", 2000ms, 2000ms, true, limit);
    CHECK(a.kind == d::acquire_result::foreign);
    CHECK(client.command({"EXISTS", n.lease}).integer == 0);  // nothing written
  }
  client.command({"DEL", n.value, n.lease, n.meta});
}

TEST_CASE(
    "the size allowance is no hole: a 32 MiB write to a server that stops is reported by the "
    "idle bound, well before the bound for its size",
    "[fleet][large][stall]") {
  sftest::private_redis server;
  const auto ep = d::redis_endpoint::parse(server.uri());
  constexpr auto timeout = 50ms;  // the default redis_timeout
  const auto conn = d::redis_conn::open(ep, timeout, "", "");
  const std::string big(32 * mib, 's');
  server.freeze();  // the server stops reading: its socket buffers fill, then nothing moves
  std::string what;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)conn->command({"SET", "k", big});
  } catch (const d::redis_failure& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  server.thaw();
  INFO(what);
  REQUIRE_FALSE(what.empty());
  CHECK(conn->broken());
  // The idle bound ended it (nothing moved for redis_timeout), not the bound for the size.
  CHECK(what.find("nothing moved for 50 ms") != std::string::npos);
  const auto size_bound = timeout + d::redis_conn::allowance(2 * (big.size() + 64));
  INFO("took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  CHECK(took < size_bound);
}

TEST_CASE(
    "a server that trickles its reply cannot hold a round trip past the bound for the bytes it "
    "moved",
    "[fleet][large][stall]") {
  sftest::private_redis server;
  {
    const auto c = server.client();
    REQUIRE(c->command({"SET", "k", std::string(4096, 't')}).str == "OK");
  }
  sftest::fault_proxy proxy(server.port());
  const auto ep = d::redis_endpoint::parse(proxy.uri());
  constexpr auto timeout = 50ms;
  const auto conn = d::redis_conn::open(ep, timeout, "", "");
  // One byte of the reply every 5 ms: progress far more often than every redis_timeout, so
  // the idle bound never ends it; the bound for the bytes moved (a few: ~redis_timeout) must.
  proxy.trickle(sftest::fault_proxy::down, 5ms);
  std::string what;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)conn->command({"GET", "k"});
  } catch (const d::redis_failure& e) {
    what = e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  proxy.clear();
  INFO(what);
  INFO("took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  REQUIRE_FALSE(what.empty());
  CHECK(what.find("timed out after 50 ms") != std::string::npos);
  CHECK(took < 4096 * 5ms);  // not the whole trickle: it was cut off at the bound
}
