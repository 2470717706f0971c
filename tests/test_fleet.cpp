// The fleet protocol against a real redis-server, in one test process: each fleet object is
// one "process" of the fleet (its own connections, subscriber and renewer), so schedules can
// be forced with gates and the protocol's test hooks (detail::fleet_point). The shared server
// comes from SINGLEFLIGHT_TEST_REDIS (skipped without it); tests that count the server's
// commands, kill its clients, flush its scripts, freeze, stop or restart it run a private
// redis-server. Multi-process tests with real child processes: test_fleet_procs.cpp.
#include <singleflight/fleet.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/fleet.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;
using point = d::fleet_point;

using sftest::held_origin;
using sftest::message_only;
using sftest::stored;
using points = sftest::fleet_points;

sf::fleet_options opts(const std::string& uri, const std::string& prefix) {
  return sftest::fleet_opts(uri, prefix);
}

d::fleet_engine& engine(fleet_t& f) { return d::fleet_test_access::engine(f); }

// "k<i>", "v<i>". Not `"k" + std::to_string(i)`: GCC 12 at -O3 reports a -Wrestrict false
// positive inside std::string's operator+ for a one-character literal (an error with -Werror).
std::string numbered(const char* stem, int i) {
  return std::string(stem).append(std::to_string(i));
}

}  // namespace

// ---- the hit path ---------------------------------------------------------------------------

TEST_CASE(
    "a hit is exactly one round trip (one GETRANGE, counted by the server); a record over "
    "64 KiB costs a second one",
    "[fleet]") {
  sftest::private_redis server;
  auto client = server.client();
  fleet_t f(opts(server.uri(), "hit"));
  CHECK(f.get("k", [] { return std::string("v"); }) == "v");  // the miss stores it

  const long long gets_before = client->command_calls("getrange");
  const long long total_before =
      std::stoll(client->info_field("stats", "total_commands_processed"));
  for (int i = 0; i < 100; ++i) {
    CHECK(f.get("k", [] { return std::string("loaded again"); }) == "v");
  }
  const long long gets_after = client->command_calls("getrange");
  const long long total_after = std::stoll(client->info_field("stats", "total_commands_processed"));
  CHECK(gets_after - gets_before == 100);
  // 100 GETRANGEs and the two INFO commands of this test in between, nothing else.
  CHECK(total_after - total_before == 100 + 2);
  CHECK(f.stats().hits == 100);
  CHECK(f.stats().origin_calls == 1);

  // A record longer than 64 KiB: its first 64 KiB, then the rest.
  const std::string big(100 * 1024, 'b');
  CHECK(f.get("big", [&] { return big; }) == big);
  const long long big_before = std::stoll(client->info_field("stats", "total_commands_processed"));
  CHECK(f.get("big", [] { return std::string("loaded again"); }) == big);
  const long long big_after = std::stoll(client->info_field("stats", "total_commands_processed"));
  CHECK(big_after - big_before == 2 + 1);  // two GETRANGEs and one INFO
  CHECK(f.stats().hits == 101);
  CHECK(f.stats().origin_calls == 2);
  CHECK(f.stats().decode_failures == 0);
}

// ---- coalescing across processes --------------------------------------------------------------

TEST_CASE(
    "two processes asking at once make one origin call; the follower is woken by the "
    "leader's message",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("pair");
  fleet_t a(message_only(uri, prefix));
  fleet_t b(message_only(uri, prefix));
  points pb;
  pb.attach(b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  sftest::result<std::string> rb;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  std::atomic<int> b_loads{0};
  auto tb = sftest::spawn(rb, [&] {
    return b.get("k", [&] {
      b_loads.fetch_add(1);
      return std::string("from-b");
    });
  });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits for a's message");
  origin.release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b");
  REQUIRE(ra.value);
  REQUIRE(rb.value);
  CHECK(*ra.value == "from-a");
  CHECK(*rb.value == "from-a");
  CHECK(origin.calls.load() == 1);
  CHECK(b_loads.load() == 0);
  CHECK(a.stats().leader == 1);
  CHECK(b.stats().follower_woken == 1);
  CHECK(b.stats().origin_calls == 0);
}

TEST_CASE(
    "publish before the follower's subscription is confirmed is not lost: the follower "
    "re-reads once subscribed (pub/sub is at-most-once)",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("race");
  fleet_t a(message_only(uri, prefix));
  fleet_t b(message_only(uri, prefix));
  points pa;
  pa.attach(a);
  held_origin origin("from-a");
  // When b has lost the race and before it subscribes, a finishes: stores and publishes
  // to nobody.
  engine(b).hook = [&](point p, std::string_view) {
    if (p != point::lost_race) return;
    origin.release.open();
    sftest::must([&] { return pa.stored.load() >= 1; }, "a stored and published");
  };
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  // Without the re-read after the confirmation b would wait for a message already gone
  // (its wait_slice is 120 s: the bound of finish() fails first).
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", [] { return std::string("from-b"); }); });
  sftest::finish(tb, rb, "b served by the re-read after subscribing");
  sftest::finish(ta, ra, "a");
  REQUIRE(rb.value);
  CHECK(*rb.value == "from-a");
  CHECK(b.stats().late_hit == 1);
  CHECK(b.stats().origin_calls == 0);
}

TEST_CASE(
    "subscriptions killed mid-wait (CLIENT KILL TYPE pubsub) while the leader publishes: "
    "the follower resubscribes, re-reads and is served without a second origin call",
    "[fleet][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  const std::string prefix = "kill";
  fleet_t a(message_only(server.uri(), prefix));
  fleet_t b(message_only(server.uri(), prefix));
  points pa;
  pa.attach(a);
  held_origin origin("from-a");
  std::atomic<int> waiting{0};
  std::atomic<int> resubscribing{0};
  engine(b).hook = [&](point p, std::string_view) {
    if (p == point::waiting) waiting.fetch_add(1);
    if (p == point::resubscribing) {
      // b's subscriber reconnected; before it subscribes again, a publishes (lost for b).
      resubscribing.fetch_add(1);
      origin.release.open();
      sftest::must([&] { return pa.stored.load() >= 1; }, "a stored while b was unsubscribed");
    }
  };
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", [] { return std::string("from-b"); }); });
  sftest::must([&] { return waiting.load() >= 1; }, "b waits");
  const auto killed = client->command({"CLIENT", "KILL", "TYPE", "pubsub"});
  CHECK(killed.integer == 1);
  sftest::finish(tb, rb, "b served after resubscribing");
  sftest::finish(ta, ra, "a");
  REQUIRE(rb.value);
  CHECK(*rb.value == "from-a");
  CHECK(resubscribing.load() == 1);
  CHECK(origin.calls.load() == 1);
  CHECK(b.stats().origin_calls == 0);
  CHECK(b.stats().late_hit == 1);
}

TEST_CASE(
    "the lease is renewed while the loader runs: a load three times longer than "
    "lease_ttl is not duplicated",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("renew");
  sf::fleet_options o = opts(uri, prefix);
  // Renewed every 500 ms: a renewal may be a second late (a loaded, sanitized machine)
  // before the lease lapses.
  o.lease_ttl = 1500ms;
  o.wait_slice = 100ms;  // b races again every 100 ms
  fleet_t a(o);
  fleet_t b(o);
  points pb;
  pb.attach(b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", [] { return std::string("from-b"); }); });
  // b loses a race at least every 100 ms; 45 lost races span three lease_ttls.
  sftest::must([&] { return pb.lost.load() >= 45; }, "b lost 45 races against a live lease");
  origin.release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b");
  REQUIRE(rb.value);
  CHECK(*rb.value == "from-a");
  CHECK(b.stats().leader == 0);
  CHECK(a.stats().lease_lost == 0);
}

// ---- fencing and invalidation ---------------------------------------------------------------

TEST_CASE(
    "a leader whose lease expired cannot overwrite its successor's value: its store is "
    "fenced out (also after the key's metadata expired)",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fence");
  sftest::redis_client client(uri);
  const auto names = d::fleet_names::of(prefix, "k");
  fleet_t a(opts(uri, prefix));
  fleet_t b(opts(uri, prefix));
  held_origin origin("stale-from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  // a is "paused": its lease disappears as if it had expired (and, in the second section,
  // the fencing counter with it, as if the metadata had expired too).
  SECTION("lease expired") { client.command({"DEL", names.lease}); }
  SECTION("lease and metadata expired") { client.command({"DEL", names.lease, names.meta}); }
  CHECK(b.get("k", [] { return std::string("fresh-from-b"); }) == "fresh-from-b");
  CHECK(b.stats().leader == 1);
  CHECK(stored(client, prefix, "k") == "fresh-from-b");
  origin.release.open();  // a resumes and tries to store
  sftest::finish(ta, ra, "a");
  REQUIRE(ra.value);
  CHECK(*ra.value == "stale-from-a");  // a's own callers get a's load
  CHECK(a.stats().fence_rejections == 1);
  CHECK(stored(client, prefix, "k") == "fresh-from-b");  // no stale overwrite
}

TEST_CASE(
    "invalidate() during a load: that load never stores, and waiting followers race "
    "again",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("inval");
  sftest::redis_client client(uri);
  fleet_t a(message_only(uri, prefix));
  fleet_t b(message_only(uri, prefix));
  fleet_t admin(opts(uri, prefix));
  points pb;
  pb.attach(b);
  held_origin origin("loaded-before-invalidate");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", [] { return std::string("after"); }); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits for a");
  // a's lease read this generation; invalidate() bumps it by one.
  const auto seen = client.command({"HGET", d::fleet_names::of(prefix, "k").meta, "gen"});
  REQUIRE_FALSE(seen.nil());
  CHECK(admin.invalidate("k") == std::stoull(seen.str) + 1);
  origin.release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b");
  CHECK(a.stats().invalidated_stores == 1);
  REQUIRE(rb.value);
  CHECK(*rb.value == "after");  // b raced again after a's refused store and loaded
  CHECK(b.stats().leader == 1);
  CHECK(stored(client, prefix, "k") == "after");
}

TEST_CASE("once invalidate() returned, no process reads the value stored before it", "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("inval2");
  fleet_t a(opts(uri, prefix));
  fleet_t b(opts(uri, prefix));
  CHECK(a.get("k", [] { return std::string("v1"); }) == "v1");
  CHECK(b.get("k", [] { return std::string("unused"); }) == "v1");  // a hit in b
  const std::uint64_t g1 = a.invalidate("k");
  CHECK(b.get("k", [] { return std::string("v2"); }) == "v2");
  CHECK(a.get("k", [] { return std::string("unused"); }) == "v2");
  CHECK(a.invalidate("k") == g1 + 1);
}

TEST_CASE(
    "after invalidate() returns, later callers in the same process do not join the "
    "flight that was loading; its lease, released before they subscribed, is not waited on",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("inval3");
  fleet_t a(message_only(uri, prefix));
  held_origin origin("loaded-before");
  std::atomic<int> stores{0};
  engine(a).hook = [&](point p, std::string_view) {
    if (p == point::stored) stores.fetch_add(1);
    if (p == point::lost_race) {
      // The second flight lost the race against the first; before it subscribes, the first
      // one's store is refused (invalidated), its lease released and "r" published to nobody.
      origin.release.open();
      sftest::must([&] { return stores.load() >= 1; }, "the first flight's store ran");
    }
  };
  sftest::result<std::string> r1;
  auto t1 = sftest::spawn(r1, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("first flight loads");
  (void)a.invalidate("k");
  // A new local flight (not a join), which races again once subscribed (its wait_slice is
  // 120 s: waiting for a message would fail the bound).
  sftest::result<std::string> r2;
  auto t2 = sftest::spawn(r2, [&] { return a.get("k", [] { return std::string("after"); }); });
  sftest::finish(t2, r2, "second flight raced again after subscribing");
  REQUIRE(r2.value);
  CHECK(*r2.value == "after");
  sftest::finish(t1, r1, "first");
  REQUIRE(r1.value);
  CHECK(*r1.value == "loaded-before");
  CHECK(a.local_stats().flights == 2);
  CHECK(a.stats().invalidated_stores == 1);
  CHECK(a.stats().leader == 2);
}

// ---- values that are not ours -----------------------------------------------------------------

TEST_CASE(
    "a corrupt, truncated, foreign or other-codec value under the key is a miss "
    "(counted), never a crash or a wrong T; the load overwrites it",
    "[fleet][faults]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("corrupt");
  sftest::redis_client client(uri);
  const auto names = d::fleet_names::of(prefix, "k");
  const std::string good = d::make_record('v', "i32", "1", "0", "41");
  std::string flipped = good;
  flipped.back() = '2';  // "42" with the checksum of "41"
  SECTION("not a record") { client.command({"SET", names.value, "hello"}); }
  SECTION("truncated") { client.command({"SET", names.value, good.substr(0, good.size() - 1)}); }
  SECTION("payload flipped") { client.command({"SET", names.value, flipped}); }
  SECTION("another codec's record") {
    client.command({"SET", names.value, d::make_record('v', "string", "1", "0", "41")});
  }
  SECTION("a record the codec cannot decode") {
    client.command({"SET", names.value, d::make_record('v', "i32", "1", "0", "forty-one")});
  }
  SECTION("another Redis type (WRONGTYPE)") { client.command({"RPUSH", names.value, "x"}); }
  sf::fleet_options o = opts(uri, prefix);
  sf::fleet<std::string, int> f(o);
  CHECK(f.get("k", [] { return 7; }) == 7);
  CHECK(f.stats().decode_failures >= 1);
  CHECK(f.stats().leader == 1);
  CHECK(stored(client, prefix, "k", "i32") == "7");
  CHECK(f.get("k", [] { return 8; }) == 7);  // now a hit
}

// ---- failures ----------------------------------------------------------------------------------

TEST_CASE(
    "a failed load fails the followers in other processes at once (remote_load_error), "
    "and the next call loads again (no poisoned key)",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fail");
  fleet_t a(message_only(uri, prefix));
  fleet_t b(message_only(uri, prefix));
  points pb;
  pb.attach(b);
  sftest::gate release;
  sftest::gate started;
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] {
    return a.get("k", [&]() -> std::string {
      started.open();
      release.wait("failing origin released");
      throw std::runtime_error("origin is down");
    });
  });
  started.wait("a leads");
  std::atomic<int> b_loads{0};
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] {
    return b.get("k", [&] {
      b_loads.fetch_add(1);
      return std::string("from-b");
    });
  });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits");
  release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b");
  CHECK(ra.threw<std::runtime_error>());
  CHECK_FALSE(ra.threw<sf::remote_load_error>());  // a's own callers: the original exception
  REQUIRE(rb.threw<sf::remote_load_error>());
  try {
    std::rethrow_exception(rb.error);
  } catch (const sf::remote_load_error& e) {
    CHECK(std::string(e.what()).find("origin is down") != std::string::npos);
  }
  CHECK(b_loads.load() == 0);
  CHECK(b.stats().remote_failures == 1);
  // error_ttl is 0: nothing was stored; the next call loads.
  CHECK(b.get("k", [] { return std::string("recovered"); }) == "recovered");
}

TEST_CASE("with error_ttl, a failure is stored: every process fails fast until it expires",
          "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("errttl");
  sf::fleet_options o = opts(uri, prefix);
  o.error_ttl = 60s;
  fleet_t a(o);
  fleet_t b(o);
  CHECK_THROWS_AS(a.get("k", []() -> std::string { throw std::runtime_error("boom"); }),
                  std::runtime_error);
  std::atomic<int> b_loads{0};
  CHECK_THROWS_AS(b.get("k",
                        [&] {
                          b_loads.fetch_add(1);
                          return std::string("v");
                        }),
                  sf::remote_load_error);
  CHECK(b_loads.load() == 0);
  (void)b.invalidate("k");  // lifts it
  CHECK(b.get("k", [] { return std::string("v"); }) == "v");
}

TEST_CASE(
    "a leader abandoned by its callers releases its lease at once: a follower elsewhere "
    "takes over without waiting for the lease to expire",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("abandon");
  sf::fleet_options o = message_only(uri, prefix);
  o.lease_ttl = 120s;  // only an explicit release frees it in time
  sf::fleet_options threads_o = o;
  threads_o.local.executor = sf::thread_executor{};  // a's caller can leave at once
  fleet_t a(threads_o);
  fleet_t b(o);
  points pb;
  pb.attach(b);
  sftest::gate started;
  sf::stop_source leave;
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] {
    return a.get(
        "k",
        [&](sf::stop_token st) -> std::string {
          started.open();
          sftest::must([&] { return st.stop_requested(); }, "a's load is stopped");
          throw sf::cancelled_error();
        },
        leave.get_token());
  });
  started.wait("a leads");
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] { return b.get("k", [] { return std::string("from-b"); }); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits");
  leave.request_stop();  // a's only caller leaves: a's flight is stopped
  sftest::finish(ta, ra, "a");
  sftest::finish(tb, rb, "b takes over");
  CHECK(ra.threw<sf::cancelled_error>());
  REQUIRE(rb.value);
  CHECK(*rb.value == "from-b");
  CHECK(b.stats().leader == 1);
  CHECK(b.stats().remote_failures == 0);  // an abandoned load is not an origin failure
}

TEST_CASE("a caller waiting for another process leaves at once on its own stop token", "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("leave");
  fleet_t a(message_only(uri, prefix));
  sf::fleet_options ob = message_only(uri, prefix);
  ob.local.executor = sf::thread_executor{};
  fleet_t b(ob);
  points pb;
  pb.attach(b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  sf::stop_source leave;
  sftest::result<std::string> rb;
  auto tb = sftest::spawn(rb, [&] {
    return b.get(
        "k", [] { return std::string("from-b"); }, leave.get_token());
  });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits");
  leave.request_stop();
  sftest::finish(tb, rb, "b leaves");
  CHECK(rb.threw<sf::cancelled_error>());
  sftest::must([&] { return b.local_stats().in_flight == 0; }, "b's flight ended too");
  origin.release.open();
  sftest::finish(ta, ra, "a");
}

// Without an executor the first caller runs the flight on its own thread; while that flight
// waits for another process's lease, the caller's token must still free it at once, and the
// flight must go on for the other callers here (fleet::get's contract, as group's).
TEST_CASE(
    "an inline first caller waiting for another process leaves at once on its own token; "
    "the flight goes on for the callers that joined it",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("inline_leave");
  fleet_t a(message_only(uri, prefix));
  sf::fleet_options ob = message_only(uri, prefix);
  ob.max_wait = 10s;  // the old code held the leaving caller until this passed
  fleet_t b(ob);      // no executor: b's first caller runs the flight inline
  points pb;
  pb.attach(b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  std::atomic<int> b_loads{0};
  const auto b_loader = [&] {
    b_loads.fetch_add(1);
    return std::string("from-b");
  };
  sf::stop_source leave;
  sftest::result<std::string> r1;
  auto t1 = sftest::spawn(r1, [&] { return b.get("k", b_loader, leave.get_token()); });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b's first caller waits for a's lease");
  sftest::result<std::string> r2;
  auto t2 = sftest::spawn(r2, [&] { return b.get("k", b_loader); });
  sftest::must([&] { return b.local_stats().joins >= 1; }, "b's second caller joins");
  leave.request_stop();
  CHECK(sftest::becomes([&] { return r1.done.load(std::memory_order_acquire); }, 2s));
  sftest::finish(t1, r1, "b's first caller");
  CHECK(r1.threw<sf::cancelled_error>());
  CHECK_FALSE(r2.done.load(std::memory_order_acquire));  // still waiting for a's value
  origin.release.open();
  sftest::finish(ta, ra, "a");
  sftest::finish(t2, r2, "b's second caller");
  REQUIRE(r2.value);
  CHECK(*r2.value == "from-a");
  CHECK(b_loads.load() == 0);
  CHECK(origin.calls.load() == 1);
  sftest::must([&] { return b.local_stats().in_flight == 0; }, "b's flight ended");
}

TEST_CASE("an inline caller alone waiting for another process leaves at once on its own token",
          "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("inline_leave_alone");
  fleet_t a(message_only(uri, prefix));
  sf::fleet_options ob = message_only(uri, prefix);
  ob.max_wait = 10s;
  fleet_t b(ob);
  points pb;
  pb.attach(b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  std::atomic<int> b_loads{0};
  sf::stop_source leave;
  sftest::result<std::string> r1;
  auto t1 = sftest::spawn(r1, [&] {
    return b.get(
        "k",
        [&] {
          b_loads.fetch_add(1);
          return std::string("from-b");
        },
        leave.get_token());
  });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b's caller waits for a's lease");
  leave.request_stop();
  CHECK(sftest::becomes([&] { return r1.done.load(std::memory_order_acquire); }, 2s));
  sftest::finish(t1, r1, "b's caller");
  CHECK(r1.threw<sf::cancelled_error>());
  sftest::must([&] { return b.local_stats().in_flight == 0; }, "b's flight ended too");
  CHECK(b_loads.load() == 0);
  origin.release.open();
  sftest::finish(ta, ra, "a");
}

TEST_CASE(
    "an inline first caller alone that leaves while its loader runs stops the loader's token "
    "at once (ownership::waiters), as a group's inline leader does",
    "[fleet]") {
  const std::string uri = sftest::need_redis();
  fleet_t b(opts(uri, sftest::unique_prefix("inline_leave_load")));
  sftest::gate started;
  std::atomic<bool> saw_stop{false};
  sf::stop_source leave;
  sftest::result<std::string> r1;
  auto t1 = sftest::spawn(r1, [&] {
    return b.get(
        "k",
        [&](sf::stop_token st) -> std::string {
          started.open();
          saw_stop = sftest::becomes([&] { return st.stop_requested(); }, 5s);
          return "v";
        },
        leave.get_token());
  });
  started.wait("b's loader runs");
  leave.request_stop();
  sftest::finish(t1, r1, "b's caller");
  CHECK(saw_stop.load());
  CHECK(r1.threw<sf::cancelled_error>());
}

TEST_CASE("max_wait: a follower whose leader takes longer loads for itself", "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("maxwait");
  fleet_t a(message_only(uri, prefix));
  sf::fleet_options ob = opts(uri, prefix);
  ob.wait_slice = 50ms;
  ob.max_wait = 300ms;
  fleet_t b(ob);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  CHECK(b.get("k", [] { return std::string("from-b"); }) == "from-b");
  CHECK(b.stats().local_fallback == 1);
  origin.release.open();
  sftest::finish(ta, ra, "a");
}

// ---- async ------------------------------------------------------------------------------------

TEST_CASE("async_get never blocks its caller: the flight runs on a fleet worker, on_done too",
          "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("async");
  sftest::gate release;
  std::atomic<int> loads{0};
  std::atomic<int> calls{0};
  std::atomic<bool> on_caller_thread{false};
  std::optional<std::string> v1;
  std::optional<std::string> v2;
  {
    fleet_t f(opts(uri, prefix));
    const auto me = std::this_thread::get_id();
    const auto loader = [&] {
      loads.fetch_add(1);
      release.wait("async loader released");
      return std::string("v");
    };
    f.async_get(std::string("k"), loader, [&](sf::outcome<std::string> o) {
      if (std::this_thread::get_id() == me) on_caller_thread = true;
      v1 = o.value();
      calls.fetch_add(1);
    });
    f.async_get(std::string("k"), loader, [&](sf::outcome<std::string> o) {
      if (std::this_thread::get_id() == me) on_caller_thread = true;
      v2 = o.value();
      calls.fetch_add(1);
    });
    // Both returned while the load is still held.
    CHECK(calls.load() == 0);
    release.open();
    sftest::must([&] { return calls.load() == 2; }, "both callbacks");
    CHECK(loads.load() == 1);
    f.close();
    // After close: an immediate outcome, on this thread, before async_get returns.
    bool closed = false;
    f.async_get(std::string("k"), loader,
                [&](sf::outcome<std::string> o) { closed = !o.has_value(); });
    CHECK(closed);
  }
  CHECK_FALSE(on_caller_thread.load());
  CHECK(v1 == "v");
  CHECK(v2 == "v");
}

namespace {
sftest::fire_task<std::string> co_read(fleet_t& f, std::string key) {
  auto loader = [] { return std::string("co-value"); };  // named: GCC 12 (README)
  co_return co_await f.co_get(key, loader);
}
}  // namespace

TEST_CASE("co_get yields the value; the coroutine resumes on a fleet worker", "[fleet][async]") {
  const std::string uri = sftest::need_redis();
  fleet_t f(opts(uri, sftest::unique_prefix("co")));
  auto t = co_read(f, "k");
  t.wait("coroutine done");
  REQUIRE(t.get().value);
  CHECK(*t.get().value == "co-value");
  CHECK(t.get().finished_on != std::this_thread::get_id());
  auto hit = co_read(f, "k");
  hit.wait("second coroutine done");
  REQUIRE(hit.get().value);
  CHECK(f.stats().hits == 1);
}

// ---- close -------------------------------------------------------------------------------------

TEST_CASE("close() from inside a loader or an async callback does not deadlock", "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  SECTION("a loader on the caller's thread") {
    fleet_t f(opts(uri, sftest::unique_prefix("close1")));
    // As with a group: the flight's callers, the inline leader included, get closed_error.
    CHECK_THROWS_AS(f.get("k",
                          [&] {
                            f.close();
                            return std::string("v");
                          }),
                    sf::closed_error);
    CHECK_THROWS_AS(f.get("k", [] { return std::string("x"); }), sf::closed_error);
  }
  SECTION("an async callback on a fleet worker") {
    std::atomic<bool> returned{false};
    {
      fleet_t f(opts(uri, sftest::unique_prefix("close2")));
      f.async_get(
          std::string("k"), [] { return std::string("v"); },
          [&](sf::outcome<std::string>) {
            f.close();
            returned = true;
          });
      sftest::must([&] { return returned.load(); }, "close() inside on_done returned");
    }  // the destructor joins the worker
  }
}

TEST_CASE(
    "close() while a follower waits for another process: the caller gets closed_error and "
    "close() returns without waiting for the other process",
    "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("close3");
  fleet_t a(message_only(uri, prefix));
  auto b = std::make_unique<fleet_t>(message_only(uri, prefix));
  points pb;
  pb.attach(*b);
  held_origin origin("from-a");
  sftest::result<std::string> ra;
  auto ta = sftest::spawn(ra, [&] { return a.get("k", origin.loader()); });
  origin.started.wait("a leads");
  std::atomic<bool> done{false};
  std::optional<sf::outcome<std::string>> out;
  b->async_get(
      std::string("k"), [] { return std::string("from-b"); },
      [&](sf::outcome<std::string> o) {
        out.emplace(std::move(o));
        done = true;
      });
  sftest::must([&] { return pb.waiting.load() >= 1; }, "b waits");
  b->close();
  CHECK(done.load());
  REQUIRE(out);
  CHECK_FALSE(out->has_value());
  CHECK(sftest::holds<sf::closed_error>(out->error()));
  b.reset();
  origin.release.open();
  sftest::finish(ta, ra, "a");
}

// The close protocol (detail/worker_threads.hpp): from a thread of the library it stops and
// rejects without waiting or joining; from outside it waits for every thread, concurrent closers
// all wait.

TEST_CASE("two close() calls from outside at once both wait for the fleet's threads and return",
          "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  // Rounds: each joins the subscriber's and the renewer's threads from two closers at once.
  for (int round = 0; round < 20; ++round) {
    fleet_t f(opts(uri, sftest::unique_prefix("close4")));
    sftest::gate held;
    std::atomic<bool> loader_in{false};
    std::atomic<bool> loader_out{false};
    std::atomic<bool> done{false};
    f.async_get(
        std::string("k"),
        [&] {
          loader_in = true;
          held.wait("the test releases the loader");
          loader_out = true;
          return std::string("v");
        },
        [&](sf::outcome<std::string>) { done = true; });
    sftest::must([&] { return loader_in.load(); }, "the loader runs on a fleet worker");
    std::atomic<int> entered{0};
    std::atomic<int> returned{0};
    std::atomic<int> returned_early{0};  // a closer that returned before the loader had
    const auto closer = [&] {
      entered.fetch_add(1);
      while (entered.load() < 2) std::this_thread::yield();  // bounded: both start at once
      f.close();
      if (!loader_out.load()) returned_early.fetch_add(1);
      returned.fetch_add(1);
    };
    sftest::jthread a(closer);
    sftest::jthread b(closer);
    sftest::must([&] { return entered.load() == 2; }, "both closers start");
    CHECK(returned.load() == 0);  // the loader is held: neither may return yet
    held.open();
    sftest::must([&] { return returned.load() == 2; }, "both close() calls return");
    a.join();
    b.join();
    CHECK(returned_early.load() == 0);
    CHECK(done.load());
    CHECK(engine(f).services.threads() == 0);
    CHECK(engine(f).workers.threads() == 0);
  }
}

TEST_CASE("two async loaders that both call close() both return; the destructor then waits",
          "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  std::atomic<int> in{0};
  std::atomic<int> returned{0};
  std::atomic<int> delivered{0};
  {
    fleet_t f(opts(uri, sftest::unique_prefix("close5")));
    const auto loader = [&] {
      in.fetch_add(1);
      sftest::must([&] { return in.load() == 2; }, "both loaders run");
      f.close();
      returned.fetch_add(1);
      return std::string("v");
    };
    const auto on_done = [&](sf::outcome<std::string>) { delivered.fetch_add(1); };
    f.async_get(std::string("k1"), loader, on_done);
    f.async_get(std::string("k2"), loader, on_done);
    sftest::must([&] { return returned.load() == 2; }, "both close() calls return");
  }  // the destructor joins the workers
  CHECK(delivered.load() == 2);
}

TEST_CASE(
    "close() from an async loader returns at once although another loader of the fleet is "
    "still held",
    "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  sftest::gate held;
  std::atomic<bool> other_in{false};
  std::atomic<bool> closed_while_held{false};
  std::atomic<bool> close_returned{false};
  std::atomic<int> delivered{0};
  {
    fleet_t f(opts(uri, sftest::unique_prefix("close6")));
    const auto on_done = [&](sf::outcome<std::string>) { delivered.fetch_add(1); };
    f.async_get(
        std::string("held"),
        [&] {
          other_in = true;
          held.wait("the test releases the held loader");
          return std::string("h");
        },
        on_done);
    sftest::must([&] { return other_in.load(); }, "the held loader runs");
    f.async_get(
        std::string("closer"),
        [&] {
          f.close();
          closed_while_held = !held.is_open();
          close_returned = true;
          return std::string("c");
        },
        on_done);
    // Wait for the closing loader itself: close() settles the held flight at once, so its
    // delivery may come first and says nothing about this close() having returned.
    sftest::must([&] { return close_returned.load(); }, "close() in the closing loader returns");
    CHECK(closed_while_held.load());
    held.open();
  }
  CHECK(delivered.load() == 2);
}

TEST_CASE("async loaders of two fleets that close each other's fleet both return",
          "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  std::atomic<int> in{0};
  std::atomic<int> returned{0};
  std::atomic<int> delivered{0};
  {
    fleet_t a(opts(uri, sftest::unique_prefix("close7a")));
    fleet_t b(opts(uri, sftest::unique_prefix("close7b")));
    const auto closes = [&](fleet_t& other) {
      return [&] {
        in.fetch_add(1);
        sftest::must([&] { return in.load() == 2; }, "both loaders run");
        other.close();  // a library thread: stops and rejects, waits for nothing
        returned.fetch_add(1);
        return std::string("v");
      };
    };
    const auto on_done = [&](sf::outcome<std::string>) { delivered.fetch_add(1); };
    a.async_get(std::string("k"), closes(b), on_done);
    b.async_get(std::string("k"), closes(a), on_done);
    sftest::must([&] { return returned.load() == 2; }, "both close() calls return");
  }
  CHECK(delivered.load() == 2);
}

// ---- Redis itself failing ---------------------------------------------------------------------

TEST_CASE(
    "Redis frozen (SIGSTOP): one bounded round trip per call, no error surfaced, then the "
    "breaker skips Redis; after thawing a probe closes it",
    "[fleet][faults]") {
  sftest::private_redis server;
  sf::fleet_options o = opts(server.uri(), "frozen");
  o.redis_timeout = 200ms;
  o.breaker_threshold = 2;
  o.breaker_cooldown = 100ms;
  sf::fleet<std::string, int> f(o);
  CHECK(f.get("warm", [] { return 1; }) == 1);  // a pooled connection exists
  server.freeze();
  std::vector<std::chrono::milliseconds> took;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(f.get(numbered("k", i), [i] { return 10 + i; }) == 10 + i);
    took.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - t0));
  }
  // Each call gave up after one timed-out round trip (counted), then loaded at once; the
  // time bound only catches a call that waits far longer (loose: a loaded machine).
  CHECK(f.stats().redis_errors == 2);
  for (const auto t : took) CHECK(t < o.redis_timeout + 3s);
  CHECK_FALSE(f.healthy());
  CHECK(f.get("k9", [] { return 19; }) == 19);  // open: no round trip at all
  CHECK(f.stats().redis_errors == 2);
  CHECK(f.stats().local_fallback == 3);
  server.thaw();
  sftest::must(
      [&] {
        (void)f.get("probe", [] { return 0; });
        return f.healthy();
      },
      "a probe closes the breaker once Redis answers again");
}

TEST_CASE(
    "writes stalled (CLIENT PAUSE WRITE: GET works, the race times out): the breaker "
    "still opens; a working GET does not keep it closed for calls that then fail",
    "[fleet][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  sf::fleet_options o = opts(server.uri(), "wpause");
  o.redis_timeout = 100ms;
  o.breaker_threshold = 2;
  o.breaker_cooldown = 60s;
  sf::fleet<std::string, int> f(o);
  client->command({"CLIENT", "PAUSE", "10000", "WRITE"});
  for (int i = 0; i < 4; ++i) CHECK(f.get(numbered("k", i), [i] { return i; }) == i);
  CHECK(f.stats().redis_errors == 2);  // the third and fourth calls skipped Redis
  CHECK_FALSE(f.healthy());
  CHECK(f.stats().local_fallback == 4);
}

TEST_CASE(
    "Redis stopped and restarted: calls in between load locally without error; after the "
    "restart the fleet coordinates again",
    "[fleet][faults]") {
  sftest::private_redis server;
  sf::fleet_options o = opts(server.uri(), "restart");
  o.breaker_threshold = 1;
  o.breaker_cooldown = 50ms;
  fleet_t f(o);
  CHECK(f.get("k", [] { return std::string("before"); }) == "before");
  server.stop();
  CHECK(f.get("k", [] { return std::string("during"); }) == "during");
  CHECK(f.stats().local_fallback == 1);
  server.restart();  // empty, scripts not cached: EVALSHA gets NOSCRIPT, EVAL follows
  sftest::must(
      [&] {
        (void)f.get("k2", [] { return std::string("after"); });
        return f.stats().leader == 2;
      },
      "a leader again after the restart");
  auto client = server.client();
  CHECK(stored(*client, "restart", "k2") == "after");
}

TEST_CASE("SCRIPT FLUSH: the next race loads the scripts again (NOSCRIPT, then EVAL), no error",
          "[fleet]") {
  sftest::private_redis server;
  auto client = server.client();
  fleet_t f(opts(server.uri(), "flush"));
  CHECK(f.get("a", [] { return std::string("1"); }) == "1");
  client->command({"SCRIPT", "FLUSH"});
  CHECK(f.get("b", [] { return std::string("2"); }) == "2");
  CHECK(f.stats().leader == 2);
  CHECK(f.stats().redis_errors == 0);
  CHECK(stored(*client, "flush", "b") == "2");
}

// ---- connection settings -----------------------------------------------------------------------

TEST_CASE(
    "AUTH: with the right password the fleet coordinates; with a wrong one it loads "
    "locally and reports no error to callers",
    "[fleet]") {
  sftest::private_redis server(sftest::private_redis::config{.password = "s3cret"});
  sf::fleet_options o = opts(server.uri(), "auth");
  o.password = "s3cret";
  fleet_t good(o);
  CHECK(good.get("k", [] { return std::string("v"); }) == "v");
  CHECK(good.stats().leader == 1);
  CHECK(good.get("k", [] { return std::string("x"); }) == "v");
  o.password = "wrong";
  fleet_t bad(o);
  CHECK(bad.get("k", [] { return std::string("local"); }) == "local");
  CHECK(bad.stats().local_fallback == 1);
  CHECK(bad.stats().redis_errors == 1);
}

TEST_CASE("unix:// URIs work like tcp://", "[fleet]") {
  sftest::private_redis server(sftest::private_redis::config{.password = "", .unix_socket = true});
  fleet_t a(opts(server.uri(), "unix"));
  fleet_t b(opts(server.uri(), "unix"));
  CHECK(a.get("k", [] { return std::string("v"); }) == "v");
  CHECK(b.get("k", [] { return std::string("x"); }) == "v");
  CHECK(b.stats().hits == 1);
}

TEST_CASE("many keys at once from two processes: one origin call per key", "[fleet]") {
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("many");
  sf::fleet_options o = opts(uri, prefix);
  o.local.executor = sf::thread_executor{};
  fleet_t a(o);
  fleet_t b(o);
  constexpr int keys = 40;
  std::atomic<int> loads{0};
  sftest::gate release;
  std::atomic<int> answered{0};
  std::atomic<int> wrong{0};
  const auto loader = [&](int k) {
    return [&, k] {
      loads.fetch_add(1);
      release.wait("many keys released");
      return numbered("v", k);
    };
  };
  for (int k = 0; k < keys; ++k) {
    for (fleet_t* f : {&a, &b}) {
      f->async_get(numbered("k", k), loader(k), [&, k](sf::outcome<std::string> o2) {
        if (!o2.has_value() || o2.value() != numbered("v", k)) wrong.fetch_add(1);
        answered.fetch_add(1);
      });
    }
  }
  sftest::must([&] { return loads.load() == keys; }, "one load per key started");
  release.open();
  sftest::must([&] { return answered.load() == 2 * keys; }, "every caller answered");
  CHECK(wrong.load() == 0);
  CHECK(loads.load() == keys);
  CHECK(a.stats().origin_calls + b.stats().origin_calls == static_cast<std::uint64_t>(keys));
}

TEST_CASE(
    "close() from a loader on the local group's thread_executor (a library thread) returns at "
    "once although an async loader is still held",
    "[fleet][close]") {
  const std::string uri = sftest::need_redis();
  sftest::gate held;
  std::atomic<bool> held_in{false};
  std::atomic<bool> close_returned{false};
  std::atomic<bool> closed_while_held{false};
  std::atomic<int> delivered{0};
  {
    sf::fleet_options o = opts(uri, sftest::unique_prefix("close8"));
    o.local.executor = sf::thread_executor{};
    fleet_t f(o);
    f.async_get(
        std::string("held"),
        [&] {
          held_in = true;
          held.wait("the test releases the held loader");
          return std::string("h");
        },
        [&](sf::outcome<std::string>) { delivered.fetch_add(1); });
    sftest::must([&] { return held_in.load(); }, "the async loader runs on a fleet worker");
    sftest::result<std::string> r;
    auto t = sftest::spawn(r, [&] {
      return f.get("closer", [&] {
        f.close();  // on a thread the local group owns
        closed_while_held = !held.is_open();
        close_returned = true;
        return std::string("c");
      });
    });
    sftest::must([&] { return close_returned.load(); }, "close() on the executor's thread returns");
    CHECK(closed_while_held.load());
    held.open();
    sftest::finish(t, r, "the caller returns");
    CHECK(r.threw<sf::closed_error>());
  }
  CHECK(delivered.load() == 1);
}
