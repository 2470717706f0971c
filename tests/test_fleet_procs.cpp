// The fleet across real processes: N child processes of tests/support/fleet_worker.cpp
// (fork/exec), each with T threads asking for one key, against a real redis-server, with the
// faults the issue lists injected from here: SIGKILL and SIGSTOP/SIGCONT of the leader, the
// server stopped, CLIENT PAUSE, CLIENT KILL TYPE pubsub, a failing origin. Origin calls are
// counted on a pipe the loader itself writes to (support/procs.hpp), not from what the
// children report about themselves. Tests that touch the server run a private one.
#include <singleflight/fleet.hpp>

#include <signal.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/procs.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace d = singleflight::detail;
using namespace std::chrono_literals;

// The worker arguments every test starts from. redis_timeout is generous (a loaded, sanitized
// machine must not turn into a fault) except in the tests about timeouts.
std::vector<std::string> base_args(const std::string& uri, const std::string& prefix, int threads) {
  return {
      "uri=" + uri,  "prefix=" + prefix, "key=k",           "threads=" + std::to_string(threads),
      "load_ms=300", "lease_ms=2000",    "timeout_ms=2000", "max_wait_ms=60000"};
}

std::vector<std::string> with(std::vector<std::string> args,
                              std::initializer_list<std::string> more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The payload of the value stored under the worker's key, "" when none is readable.
std::string stored_value(sftest::redis_client& c, const std::string& prefix) {
  const auto bytes = c.get(d::fleet_names::of(prefix, "k").value);
  if (!bytes) return {};
  const auto r = d::parse_record(*bytes, "string");
  return r ? std::string(r->payload) : std::string();
}

std::string value_of(pid_t pid) { return "v-" + std::to_string(pid); }

}  // namespace

TEST_CASE("N processes x T threads on a cold key make one origin call between them",
          "[fleet][procs]") {
  const std::string uri = sftest::need_redis();
  constexpr int n = 4;
  constexpr int t = 4;
  sftest::worker_fleet procs(n, base_args(uri, sftest::unique_prefix("cold"), t));
  procs.wait_ready();
  procs.send_all("go");
  procs.wait_done();
  REQUIRE(procs.origins().size() == 1);
  const std::string expected = value_of(procs.origins()[0]);
  long leaders = 0;
  long served_by_fleet = 0;
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == t);
    CHECK(p.field("err") == 0);
    CHECK(p.text("value") == expected);
    leaders += p.field("leader");
    served_by_fleet += p.field("follower_woken") + p.field("late_hit") + p.field("hits");
  }
  CHECK(leaders == 1);
  CHECK(served_by_fleet == n - 1);
}

TEST_CASE(
    "without the fleet layer the origin pipe sees every process's call (per-process "
    "groups: N; no coalescing: N x T)",
    "[fleet][procs]") {
  // The counting channel itself: if it missed calls, the fleet tests would pass for nothing.
  const std::string uri = sftest::need_redis();
  constexpr int n = 3;
  constexpr int t = 3;
  SECTION("group") {
    sftest::worker_fleet procs(
        n, with(base_args(uri, sftest::unique_prefix("grp"), t), {"mode=group"}));
    procs.wait_ready();
    procs.send_all("go");
    procs.wait_done();
    CHECK(procs.origins().size() == n);
  }
  SECTION("naive") {
    sftest::worker_fleet procs(
        n, with(base_args(uri, sftest::unique_prefix("naive"), t), {"mode=naive", "load_ms=50"}));
    procs.wait_ready();
    procs.send_all("go");
    procs.wait_done();
    CHECK(procs.origins().size() == n * t);
  }
}

TEST_CASE(
    "leader SIGKILLed mid-load: at most 2 origin calls, every surviving caller answered, "
    "the stall bounded by lease_ttl + wait_slice + load time",
    "[fleet][procs][faults]") {
  const std::string uri = sftest::need_redis();
  constexpr int n = 4;
  constexpr int t = 3;
  const std::string prefix = sftest::unique_prefix("kill9");
  // max_wait is 60 s: only the dead leader's lease expiring can free the survivors in time.
  sftest::worker_fleet procs(
      n, with(base_args(uri, prefix, t), {"lease_ms=1000", "slice_ms=200", "load_ms=500"}));
  procs.wait_ready();
  procs.send_all("go");
  procs.until([&] { return !procs.origins().empty(); }, "a leader loads");
  const pid_t dead = procs.origins()[0];
  procs.kill_hard(procs.proc_of(dead));
  const auto killed_at = std::chrono::steady_clock::now();
  procs.wait_done("survivors answered");
  const auto stall = std::chrono::steady_clock::now() - killed_at;
  REQUIRE(procs.origins().size() == 2);
  const pid_t second = procs.origins()[1];
  CHECK(second != dead);
  for (auto& p : procs.procs()) {
    if (p.pid == dead) continue;
    CHECK(p.field("ok") == t);
    CHECK(p.field("err") == 0);
    CHECK(p.text("value") == value_of(second));
  }
  // 1000 + 200 + 500 ms, plus generous slack for a loaded machine: the bound only has to tell
  // the lease's expiry from max_wait (60 s).
  CHECK(stall < 1700ms + 8s);
}

TEST_CASE(
    "leader SIGSTOPped past its lease, then SIGCONTed: 2 origin calls, and its late store "
    "is fenced out (no stale overwrite)",
    "[fleet][procs][faults]") {
  const std::string uri = sftest::need_redis();
  sftest::redis_client client(uri);
  constexpr int n = 3;
  constexpr int t = 2;
  const std::string prefix = sftest::unique_prefix("stop");
  sftest::worker_fleet procs(n, with(base_args(uri, prefix, t), {"lease_ms=1000", "slice_ms=150",
                                                                 "load_ms=1500", "gather=1"}));
  procs.wait_ready();
  procs.send_all("go");
  // gather=1: the loader announces itself only once the process's other callers have joined
  // its flight, so all t of them are stopped with it (none can come later and read the
  // second leader's value).
  procs.until([&] { return !procs.origins().empty(); }, "a leader loads");
  const pid_t paused = procs.origins()[0];
  auto& stopped = procs.proc_of(paused);
  procs.signal(stopped, SIGSTOP);
  // Its lease expires unrenewed; another process takes over, loads and stores.
  procs.until([&] { return procs.origins().size() >= 2; }, "a second leader loads");
  const pid_t second = procs.origins()[1];
  procs.until(
      [&] {
        for (auto& p : procs.procs()) {
          if (p.pid != paused && !p.done()) return false;
        }
        return true;
      },
      "the others answered");
  CHECK(stored_value(client, prefix) == value_of(second));
  procs.signal(stopped, SIGCONT);  // it finishes its load and tries to store
  procs.wait_done("the paused leader finished");
  CHECK(procs.origins().size() == 2);
  CHECK(stopped.field("ok") == t);
  CHECK(stopped.text("value") == value_of(paused));  // its own callers get its load
  CHECK(stopped.field("fence_rejections") == 1);
  CHECK(stored_value(client, prefix) == value_of(second));  // 0 stale overwrites
  for (auto& p : procs.procs()) {
    if (p.pid == paused) continue;
    CHECK(p.field("ok") == t);
    CHECK(p.text("value") == value_of(second));
  }
}

TEST_CASE(
    "Redis stopped: exactly N origin calls (one per process, never more) and no error "
    "surfaced",
    "[fleet][procs][faults]") {
  sftest::private_redis server;
  constexpr int n = 4;
  constexpr int t = 4;
  sftest::worker_fleet procs(n, with(base_args(server.uri(), "down", t), {"timeout_ms=100"}));
  procs.wait_ready();
  server.stop();
  procs.send_all("go");
  procs.wait_done();
  CHECK(procs.origins().size() == n);
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == t);
    CHECK(p.field("err") == 0);
    CHECK(p.field("local_fallback") == 1);
  }
}

TEST_CASE(
    "Redis stopped while followers wait: each process loads for itself, N origin calls, no "
    "error surfaced",
    "[fleet][procs][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  constexpr int n = 3;
  constexpr int t = 2;
  sftest::worker_fleet procs(
      n, with(base_args(server.uri(), "gone", t), {"timeout_ms=200", "slice_ms=100", "hold=1"}));
  procs.wait_ready();
  procs.send_all("go");
  procs.until([&] { return !procs.origins().empty(); }, "a leader loads");
  const std::string channel = d::fleet_names::of("gone", "k").channel;
  procs.until([&] { return client->numsub(channel) == n - 1; }, "the followers subscribed");
  client.reset();
  server.stop();
  procs.until([&] { return procs.origins().size() == n; }, "every process loads for itself");
  procs.send_all("release");
  procs.wait_done();
  CHECK(procs.origins().size() == n);
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == t);
    CHECK(p.field("err") == 0);
  }
}

TEST_CASE(
    "Redis paused (CLIENT PAUSE, ALL or WRITE): exactly N origin calls, no error surfaced, "
    "each call waits at most about one redis_timeout",
    "[fleet][procs][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  constexpr int n = 4;
  constexpr int t = 3;
  std::string mode;
  SECTION("ALL") { mode = "ALL"; }
  SECTION("WRITE") { mode = "WRITE"; }
  sftest::worker_fleet procs(
      n, with(base_args(server.uri(), "paused", t), {"timeout_ms=200", "load_ms=100"}));
  procs.wait_ready();
  // Long enough for every process's first round trip (they start at once); not lifted early:
  // under PAUSE ALL, CLIENT UNPAUSE itself waits for the pause to end (Redis 7.0).
  client->command({"CLIENT", "PAUSE", "5000", mode});
  procs.send_all("go");
  procs.wait_done();
  CHECK(procs.origins().size() == n);
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == t);
    CHECK(p.field("err") == 0);
    CHECK(p.field("local_fallback") == 1);
    // One timed-out round trip per process (the local group coalesced its callers).
    CHECK(p.field("redis_errors") == 1);
    // load (100 ms) + one redis_timeout (200 ms) + a connect and a GET; loose (a loaded
    // machine): redis_errors above is the exact count.
    CHECK(p.field("ms") < 100 + 200 + 4000);
  }
}

TEST_CASE("subscriptions killed mid-wait (CLIENT KILL TYPE pubsub): still one origin call",
          "[fleet][procs][faults]") {
  sftest::private_redis server;
  auto client = server.client();
  constexpr int n = 4;
  constexpr int t = 2;
  // A wait_slice of 60 s: the followers are served by a message or by the re-read after
  // they resubscribed, not by a timer.
  sftest::worker_fleet procs(n, with(base_args(server.uri(), "killsub", t),
                                     {"slice_ms=60000", "max_wait_ms=120000", "hold=1"}));
  procs.wait_ready();
  procs.send_all("go");
  procs.until([&] { return !procs.origins().empty(); }, "a leader loads");
  const std::string channel = d::fleet_names::of("killsub", "k").channel;
  procs.until([&] { return client->numsub(channel) == n - 1; }, "the followers subscribed");
  const auto killed = client->command({"CLIENT", "KILL", "TYPE", "pubsub"});
  CHECK(killed.integer == n - 1);
  procs.send(procs.proc_of(procs.origins()[0]), "release");
  procs.wait_done();
  CHECK(procs.origins().size() == 1);
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == t);
    CHECK(p.text("value") == value_of(procs.origins()[0]));
  }
}

TEST_CASE("a failing origin: one call, the other processes fail fast with the leader's error",
          "[fleet][procs]") {
  const std::string uri = sftest::need_redis();
  constexpr int n = 3;
  constexpr int t = 2;
  sftest::worker_fleet procs(
      n, with(base_args(uri, sftest::unique_prefix("fail"), t), {"fail=1", "slice_ms=60000"}));
  procs.wait_ready();
  procs.send_all("go");
  procs.wait_done();
  REQUIRE(procs.origins().size() == 1);
  const pid_t leader = procs.origins()[0];
  for (auto& p : procs.procs()) {
    CHECK(p.field("ok") == 0);
    CHECK(p.field("err") == t);
    const std::string error = p.text("error");
    CHECK(error.find("origin_failed_in_" + std::to_string(leader)) != std::string::npos);
    if (p.pid != leader) {
      CHECK(error.find("another_process") != std::string::npos);
      CHECK(p.field("remote_failures") == 1);
    }
  }
}
