// singleflight::fleet_cache (fleet_cache.hpp): the local cache in front of the fleet, coherent
// across processes, each case in both coherence modes (client tracking, the bus). Two fleet_cache
// objects stand for two processes, each over its own fleet (its own connections, subscriber and
// renewer), with a local ttl of 60 s: nothing but the bus can make a process drop a local entry
// within a test. "Once B has heard it" is B's stats().invalidations_heard (or resyncs) having
// grown: the inbox counts a message after recording it. Under client tracking a process hears the
// other's stores, and its own writes made by a script (a put's), not a leader's store (made on its
// tracker): a case waits for those reports (heard_echo) where a local entry must stay put for
// what it checks next. Tests that kill clients run a private redis-server;
// the others the shared one (skipped without it).
#include <singleflight/fleet_cache.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fault_proxy.hpp"
#include "support/fleet.hpp"
#include "support/fleet_cache.hpp"
#include "support/jthread.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fc_t = sf::fleet_cache<std::string, std::string>;
using point = d::fleet_point;
using mode = sf::fleet_coherence;

sf::fleet_cache_options opts(const std::string& uri, const std::string& prefix, mode m) {
  return sftest::fleet_cache_opts(uri, prefix, m);
}

using sftest::fleet_cache_engine;
using sftest::heard_echo;
using sftest::until_listening;

// An origin whose answer is "v<version>", counting its calls.
using sftest::versioned_origin;

using sftest::must_not_load;

// A process's subscriber held at its reconnect (set before the process's first until_listening,
// which orders the hook before the subscriber's thread reads it): `down` opens when it has lost
// its connection and is about to subscribe again; it subscribes once the test opens `back`.
struct held_reconnect {
  sftest::gate down;
  sftest::gate back;
  void attach(fc_t& c) {
    fleet_cache_engine(c).hook = [this](point p, std::string_view) {
      if (p != point::resubscribing) return;
      down.open();
      back.wait("the test lets the subscriber subscribe again");
    };
  }
};

}  // namespace

TEST_CASE(
    "invalidate on one process: once another has heard it, its get never returns the old "
    "value, though its local entry had 60 s to live; before, its reads are local hits",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-inval");
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  heard_echo(b, m, 1, "b hears a's store");
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // b's miss: a's value, from Redis
  const std::uint64_t b_redis_gets = b.stats().fleet.gets;
  for (int i = 0; i < 5; ++i) CHECK(b.get("k", must_not_load(ran)) == "v1");
  CHECK(b.stats().local.hits == 5);
  CHECK(b.stats().fleet.gets == b_redis_gets);  // local hits: no Redis round trip
  // peek: b's local entry, without a Redis round trip and without counting a hit.
  const auto seen = b.peek("k");
  REQUIRE(seen.has_value());
  CHECK(seen->value == "v1");
  CHECK(b.stats().local.hits == 5);
  CHECK(b.stats().fleet.gets == b_redis_gets);

  origin.version = 2;
  const std::uint64_t heard = b.stats().invalidations_heard;
  (void)a.invalidate("k");
  CHECK(a.stats().broadcasts == 1);
  sftest::must([&] { return b.stats().invalidations_heard > heard; }, "b hears the invalidation");
  CHECK_FALSE(b.peek("k").has_value());  // peek applies what b heard: its copy is gone
  CHECK(b.get("k", origin.loader()) == "v2");
  CHECK(a.get("k", must_not_load(ran)) == "v2");  // b's load is in Redis: a reads it there
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 2);
  // On the bus, a does not apply its own message (its invalidate already did): its second read
  // was a Redis hit after its own local invalidate, not after hearing itself.
  if (m == mode::publish) CHECK(a.stats().invalidations_heard == 0);
}

TEST_CASE("put on one process is what another reads once it has heard it", "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-put");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  // Each confirmation marks the local cache stale (what was stored before it may have missed a
  // message): a's first one must not make its put stale.
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(b.get("k", origin.loader()) == "v1");  // b caches v1 for 60 s (its store not reported)
  const std::uint64_t heard = b.stats().invalidations_heard;

  (void)a.put("k", std::string("p1"));
  CHECK(sftest::stored(redis, prefix, "k") == "p1");
  CHECK(a.get("k", must_not_load(ran)) == "p1");  // a's local copy (or, tracking, Redis's)
  if (m == mode::publish) CHECK(a.stats().fleet.gets == 0);
  sftest::must([&] { return b.stats().invalidations_heard > heard; }, "b hears the put");
  CHECK(b.get("k", must_not_load(ran)) == "p1");  // from Redis, no origin call
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "put_superseded_before_its_local_step_is_not_kept: another process's put of the same key "
    "lands in Redis after this put's and is heard before this put stores locally; this process "
    "then reads the newer value, not its own older one (it kept p1 for its ttl)",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-put-race");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  const std::uint64_t heard = a.stats().invalidations_heard;
  // Under tracking a hears its own put's report and b's; on the bus only b's.
  const std::uint64_t reports = m == mode::tracking ? 2 : 1;
  std::atomic<bool> once{false};
  // Between a's write in Redis and its local step: b's put, heard by a.
  fleet_cache_engine(a).hook = [&](point p, std::string_view) {
    if (p != point::written || once.exchange(true)) return;
    (void)b.put("k", std::string("p2"));
    sftest::must([&] { return a.stats().invalidations_heard >= heard + reports; },
                 "a hears b's put");
  };
  (void)a.put("k", std::string("p1"));
  REQUIRE(once.load());
  CHECK(sftest::stored(redis, prefix, "k") == "p2");
  std::atomic<int> ran{0};
  CHECK(a.get("k", must_not_load(ran)) == "p2");
  CHECK(b.get("k", must_not_load(ran)) == "p2");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "put_superseded_applied_by_another_caller_is_not_kept: another process's put of the same "
    "key lands in Redis after this put's, is heard, and is applied by another caller's peek "
    "before this put's local step (which then found nothing left to apply); this process then "
    "reads the newer value, not its own older one (it kept p1 for its ttl)",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-put-race-other");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  const std::uint64_t heard = a.stats().invalidations_heard;
  // Under tracking a hears its own put's report and b's; on the bus only b's.
  const std::uint64_t reports = m == mode::tracking ? 2 : 1;
  std::atomic<bool> once{false};
  // Between a's write in Redis and its local step: b's put, heard by a, and applied to a's
  // local cache by another of a's callers (a peek of another key applies everything heard).
  fleet_cache_engine(a).hook = [&](point p, std::string_view) {
    if (p != point::written || once.exchange(true)) return;
    (void)b.put("k", std::string("p2"));
    sftest::must([&] { return a.stats().invalidations_heard >= heard + reports; },
                 "a hears b's put");
    sftest::result<bool> other;
    sftest::jthread t = sftest::spawn(other, [&] { return a.peek("other").has_value(); });
    sftest::finish(t, other, "another caller of a applies what a heard");
  };
  (void)a.put("k", std::string("p1"));
  REQUIRE(once.load());
  CHECK(sftest::stored(redis, prefix, "k") == "p2");
  std::atomic<int> ran{0};
  CHECK(a.get("k", must_not_load(ran)) == "p2");
  CHECK(b.get("k", must_not_load(ran)) == "p2");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "key texts that hold the names' separators, begin with 32 hex digits (a writer id's "
    "length) or are empty: another process's put of each reaches this process's local cache",
    "[fleet][fleet_cache][names]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-key-texts");
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  const std::vector<std::string> keys = {"",
                                         "0123456789abcdef0123456789abcdef",
                                         "0123456789abcdef0123456789abcdefk",
                                         "}:v",
                                         "k}:v}:v",
                                         "{1:a:k}:v",
                                         "k}:i"};
  for (const std::string& k : keys) CHECK(b.get(k, [] { return std::string("old"); }) == "old");
  const std::uint64_t heard = b.stats().invalidations_heard;
  for (const std::string& k : keys) (void)a.put(k, "new:" + k);
  sftest::must([&] { return b.stats().invalidations_heard >= heard + keys.size(); },
               "b hears every put");
  std::atomic<int> ran{0};
  for (const std::string& k : keys) {
    INFO("key text <" << k << ">");
    CHECK(b.get(k, must_not_load(ran)) == "new:" + k);
  }
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "a Redis restart (an empty server on the same port): once both processes have subscribed "
    "again, a put after it reaches the process that held the value from before it",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  sftest::private_redis server;
  fc_t a(opts(server.uri(), "restart", m));
  fc_t b(opts(server.uri(), "restart", m));
  until_listening(a, "a listens");
  until_listening(b, "b listens");
  CHECK(b.get("k", [] { return std::string("v1"); }) == "v1");
  const std::uint64_t resyncs_a = a.stats().resyncs;
  const std::uint64_t resyncs_b = b.stats().resyncs;
  server.restart();
  sftest::must(
      [&] { return a.stats().resyncs >= resyncs_a + 2 && b.stats().resyncs >= resyncs_b + 2; },
      "both subscribe again");
  until_listening(b, "b listens again");
  (void)a.put("k", std::string("v2"));
  // b's entry from before the restart was marked stale by its resubscription, and the put's
  // report or message drops it: its next reads go to Redis, none to the origin.
  std::atomic<int> ran{0};
  sftest::must([&] { return b.get("k", must_not_load(ran)) == "v2"; }, "b reads the put");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "a load under way in another process when invalidate runs: its callers get what it "
    "loaded, but it is not kept, neither locally nor in Redis; the next read loads again",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const std::string uri = sftest::need_redis();
  const std::string prefix = sftest::unique_prefix("fc-inflight");
  sftest::redis_client redis(uri);
  fc_t a(opts(uri, prefix, m));
  fc_t b(opts(uri, prefix, m));
  until_listening(b, "b listens");
  sftest::held_origin old_origin("old");
  sftest::result<std::string> first;
  sftest::jthread reader = sftest::spawn(first, [&] { return b.get("k", old_origin.loader()); });
  old_origin.started.wait("b's load runs");
  (void)a.invalidate("k");
  sftest::must([&] { return b.stats().invalidations_heard >= 1; }, "b hears the invalidation");
  old_origin.release.open();
  sftest::finish(reader, first, "b's first read");
  REQUIRE(first.value);
  CHECK(*first.value == "old");
  CHECK(sftest::stored(redis, prefix, "k").empty());  // the fleet refused the store
  versioned_origin origin;
  origin.version = 2;
  CHECK(b.get("k", origin.loader()) == "v2");
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "bus subscriptions killed: an invalidate while a process is disconnected (CLIENT KILL "
    "TYPE pubsub) is not lost; once it has resubscribed it does not serve the old value",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  sftest::private_redis server;
  auto client = server.client();
  const std::string prefix = "killed";
  held_reconnect b_held;  // before b: its subscriber's hook waits on its gates
  fc_t a(opts(server.uri(), prefix, m));
  fc_t b(opts(server.uri(), prefix, m));
  b_held.attach(b);
  until_listening(a, "a listens");
  until_listening(b, "b listens");  // after the hook: orders it before the thread reads it
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  heard_echo(b, m, 1, "b hears a's store");
  CHECK(b.get("k", must_not_load(ran)) == "v1");
  const std::uint64_t heard = b.stats().invalidations_heard;

  const auto killed = client->command({"CLIENT", "KILL", "TYPE", "pubsub"});
  CHECK(killed.integer == 2);
  b_held.down.wait("b's subscriber reconnects");
  origin.version = 2;
  (void)a.invalidate("k");
  // The message is lost to b: during the gap it serves its local entry (the bound says so).
  CHECK(b.get("k", must_not_load(ran)) == "v1");
  CHECK(b.stats().invalidations_heard == heard);
  const std::uint64_t resyncs = b.stats().resyncs;
  b_held.back.open();
  sftest::must([&] { return b.stats().resyncs > resyncs; }, "b resubscribed");
  // Its local entry was marked stale by the resubscription, and without stale_while_revalidate
  // a stale entry is not served: b reads through the fleet (a's invalidate deleted the Redis
  // copy, so b loads).
  CHECK(b.get("k", origin.loader()) == "v2");
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "reconnect_is_one_stale_mark: a get between the two channels' confirmations (the replies "
    "slowed down) starts no refresh the second would waste: one read through the fleet per key "
    "per gap",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  sftest::private_redis server;
  auto client = server.client();
  sftest::fault_proxy proxy(server.port());
  sf::fleet_cache_options o = opts(proxy.uri(), "gap-once", m);
  o.local.stale_while_revalidate = 60s;
  fc_t b(o);
  std::atomic<bool> slow{false};
  // On the reconnect, once the tracker (if any) is in place: the server's replies, the two
  // SUBSCRIBE confirmations included, come one byte every 10 ms, so the first is heard about
  // half a second before the second.
  fleet_cache_engine(b).hook = [&](point p, std::string_view) {
    if (p == point::resubscribing && slow.load()) proxy.trickle(sftest::fault_proxy::down, 10ms);
  };
  until_listening(b, "b listens");  // after the hook: orders it before the thread reads it
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(b.get("k", origin.loader()) == "v1");
  CHECK(b.get("k", must_not_load(ran)) == "v1");
  REQUIRE(b.peek("k"));
  CHECK(b.peek("k")->state == sf::freshness::fresh);
  const sf::fleet_cache_stats before = b.stats();

  slow = true;
  CHECK(client->command({"CLIENT", "KILL", "TYPE", "pubsub"}).integer == 1);
  sftest::must([&] { return b.stats().resyncs > before.resyncs; }, "a confirmation");
  // Between the confirmations (or after both): the old value, at once.
  const sf::cached<std::string> between = b.get_entry("k", must_not_load(ran));
  REQUIRE(between.value);
  CHECK(*between.value == "v1");
  sftest::must([&] { return b.stats().resyncs >= before.resyncs + 2; }, "both confirmed");
  proxy.clear();
  sftest::must([&] { return fleet_cache_engine(b).subscriber.confirmed_channels() == 2; },
               "b listens again");
  sftest::must(
      [&] {
        const sf::cached<std::string> e = b.get_entry("k", must_not_load(ran));
        CHECK((e.value && *e.value == "v1"));
        return e.state == sf::freshness::fresh;
      },
      "k refreshed");
  const sf::fleet_cache_stats after = b.stats();
  CHECK(after.fleet.gets - before.fleet.gets == 1);
  CHECK(after.local.background_refreshes - before.local.background_refreshes == 1);
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 1);
}

TEST_CASE(
    "gap_marks_local_entries_stale_not_gone: after CLIENT KILL TYPE pubsub and the resubscribe, "
    "each key stored before the gap is served stale at once and read again through the fleet "
    "once; a key written or invalidated elsewhere during the gap is not served once its refresh "
    "completed",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  sftest::private_redis server;
  auto client = server.client();
  const std::string prefix = "gap-stale";
  sf::fleet_cache_options o = opts(server.uri(), prefix, m);
  o.local.stale_while_revalidate = 60s;
  o.gap_stale_bound = 60s;  // this case is about the stale answers (see gap_stale_answers_end...)
  fc_t a(o);
  until_listening(a, "a listens");
  const std::vector<std::string> keys{"kept", "put", "gone"};
  versioned_origin origin;
  std::atomic<int> ran{0};
  for (const auto& k : keys) CHECK(a.get(k, origin.loader()) == "v1");
  // b starts after a's stores: it has nothing to hear of them (under tracking, their reports
  // went out before b's tracker was there).
  held_reconnect b_held;  // before b: its subscriber's hook waits on its gates
  fc_t b(o);
  b_held.attach(b);
  until_listening(b, "b listens");  // after the hook: orders it before the thread reads it
  for (const auto& k : keys) CHECK(b.get(k, must_not_load(ran)) == "v1");  // from Redis
  const std::uint64_t heard = b.stats().invalidations_heard;

  CHECK(client->command({"CLIENT", "KILL", "TYPE", "pubsub"}).integer == 2);
  b_held.down.wait("b's subscriber reconnects");
  (void)a.put("put", std::string("p2"));
  origin.version = 2;
  (void)a.invalidate("gone");
  for (const auto& k : keys) CHECK(b.get(k, must_not_load(ran)) == "v1");  // the gap
  CHECK(b.stats().invalidations_heard == heard);
  const sf::fleet_cache_stats before = b.stats();
  b_held.back.open();
  // Both channels (the coherence one and the expire one) confirm again, each a resync.
  sftest::must([&] { return b.stats().resyncs >= before.resyncs + 2; }, "b resubscribed");
  sftest::must([&] { return fleet_cache_engine(b).subscriber.confirmed_channels() == 2; },
               "b listens again");

  // Every key: the old value at once, stale (not a miss), and its one refresh starts.
  for (const auto& k : keys) {
    const sf::cached<std::string> e = b.get_entry(k, origin.loader());
    REQUIRE(e.value);
    CHECK(*e.value == "v1");
    CHECK(e.state == sf::freshness::stale);
  }
  CHECK(b.stats().local.misses == before.local.misses);
  const auto now_is = [&](const std::string& k, const char* want) {
    const sf::cached<std::string> e = b.get_entry(k, origin.loader());
    CHECK((e.state == sf::freshness::fresh || (e.value && *e.value == "v1")));
    return e.state == sf::freshness::fresh && e.value && *e.value == want;
  };
  sftest::must([&] { return now_is("kept", "v1"); }, "kept refreshed");
  sftest::must([&] { return now_is("put", "p2"); }, "put refreshed: a's value");
  sftest::must([&] { return now_is("gone", "v2"); }, "gone refreshed: loaded again");
  const sf::fleet_cache_stats after = b.stats();
  CHECK(after.local.background_refreshes - before.local.background_refreshes == keys.size());
  // One read through the fleet per key, in both modes: under client tracking b's refresh of
  // "gone" (from the origin: Redis held nothing) stored on b's tracker, not reported to b, so it
  // keeps the value.
  CHECK(b.get("gone", must_not_load(ran)) == "v2");
  CHECK(b.stats().fleet.gets - before.fleet.gets == keys.size());
  CHECK(ran.load() == 0);
  CHECK(origin.calls.load() == 4);  // a's three loads, b's refresh of "gone"
}

TEST_CASE(
    "gap_stale_answers_end_at_the_bound: after CLIENT KILL TYPE pubsub and the resubscribe, a key "
    "whose refresh is held (Redis lost its value: the refresh loads from the origin) is answered "
    "stale for at most gap_stale_bound; a get past it waits on that refresh (no second load) "
    "and does not return the value from before the gap; the bound runs from the confirmations: a "
    "first get only after it has passed is not answered stale either",
    "[fleet][fleet_cache]") {
  const mode m = GENERATE(mode::tracking, mode::publish);
  const bool late = GENERATE(false, true);  // the first get past the bound (applies the mark)
  sftest::private_redis server;
  auto client = server.client();
  sf::fleet_cache_options o = opts(server.uri(), "gap-bound", m);
  o.local.stale_while_revalidate = 60s;
  o.gap_stale_bound = 200ms;  // far above one get's own time, on a loaded machine too
  fc_t a(o);
  until_listening(a, "a listens");
  versioned_origin origin;
  std::atomic<int> ran{0};
  CHECK(a.get("k", origin.loader()) == "v1");
  held_reconnect b_held;  // before b: its subscriber's hook waits on its gates
  fc_t b(o);
  b_held.attach(b);
  until_listening(b, "b listens");  // after the hook: orders it before the thread reads it
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // from Redis

  CHECK(client->command({"CLIENT", "KILL", "TYPE", "pubsub"}).integer == 2);
  b_held.down.wait("b's subscriber reconnects");
  origin.version = 2;
  (void)a.invalidate("k");                        // lost to b; Redis's copy is gone
  CHECK(b.get("k", must_not_load(ran)) == "v1");  // the gap
  const sf::fleet_cache_stats before = b.stats();
  b_held.back.open();
  sftest::must([&] { return b.stats().resyncs >= before.resyncs + 2; }, "b resubscribed");
  sftest::must([&] { return fleet_cache_engine(b).subscriber.confirmed_channels() == 2; },
               "b listens again");
  const auto confirmed = std::chrono::steady_clock::now();  // the mark was posted before this

  sftest::gate release;
  std::atomic<int> held_calls{0};
  const auto held = [&] {
    held_calls.fetch_add(1);
    release.wait("the refresh's origin call");
    return "v" + std::to_string(origin.version.load());
  };
  if (!late) {
    // The first get applies the mark: the old value at once, and one refresh starts.
    const sf::cached<std::string> first = b.get_entry("k", held);
    REQUIRE(first.value);
    CHECK(*first.value == "v1");
    CHECK(first.state == sf::freshness::stale);
    sftest::must([&] { return held_calls.load() == 1; }, "the refresh calls the origin");
  }
  // The bound passing is what is tested: time, not an interleaving. Late: the first get comes
  // only now and applies the mark (before: it opened a window of its own, answered "v1").
  std::this_thread::sleep_until(confirmed + o.gap_stale_bound + 1ms);
  const std::uint64_t misses = b.stats().local.misses;
  sftest::result<sf::cached<std::string>> past;
  sftest::jthread t = sftest::spawn(past, [&] { return b.get_entry("k", held); });
  sftest::must([&] { return past.done.load() || b.stats().local.misses > misses; },
               "the get past the bound looks");
  CHECK(!past.done.load());  // it waits on the held refresh, not answered with the old value
  release.open();
  sftest::finish(t, past, "the get past the bound");
  REQUIRE(past.value);
  REQUIRE(past.value->value);
  CHECK(*past.value->value == "v2");
  CHECK(held_calls.load() == 1);  // it joined the refresh: no second load
  CHECK(ran.load() == 0);
}

TEST_CASE(
    "Redis down: concurrent gets of one key make one origin call in the process, no error; "
    "later gets are local hits; invalidate throws fleet_error and still drops the local entry",
    "[fleet][fleet_cache]") {
  const std::string uri = "tcp://127.0.0.1:" + std::to_string(sftest::free_port());
  const mode m = GENERATE(mode::tracking, mode::publish);
  sf::fleet_cache_options o = opts(uri, "down", m);
  o.fleet.redis_timeout = 200ms;
  fc_t c(o);
  sftest::held_origin origin("v");
  constexpr int readers = 4;
  std::vector<sftest::result<std::string>> results(readers);
  std::vector<sftest::jthread> threads;
  for (int i = 0; i < readers; ++i) {
    threads.push_back(sftest::spawn(results[i], [&] { return c.get("k", origin.loader()); }));
  }
  origin.started.wait("one load runs");
  sftest::must([&] { return c.flight_stats().joins == readers - 1; }, "every reader waits");
  origin.release.open();
  for (int i = 0; i < readers; ++i) sftest::finish(threads[i], results[i], "reader");
  for (const auto& r : results) {
    REQUIRE(r.value);
    CHECK(*r.value == "v");
  }
  CHECK(origin.calls.load() == 1);
  std::atomic<int> ran{0};
  CHECK(c.get("k", must_not_load(ran)) == "v");
  CHECK(c.stats().local.hits == 1);
  CHECK_THROWS_AS(c.invalidate("k"), sf::fleet_error);
  versioned_origin fresh;
  CHECK(c.get("k", fresh.loader()) == "v1");
  CHECK(ran.load() == 0);
}
