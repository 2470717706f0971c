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

  fleet_t f(defaults(uri, prefix));
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
