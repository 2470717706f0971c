// The fleet's Redis connections against a real redis-server, with faults from the loopback
// proxy (tests/support/fault_proxy.hpp) and the server's own settings (CONFIG SET timeout,
// maxclients): what bounds a round trip, what happens to a pooled connection the server
// closed, to a connection the server accepted only to reject, and to the descriptors a
// process starting programs must not leak. Each test runs a private redis-server.
#include <singleflight/fleet.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace d = singleflight::detail;
using namespace std::chrono_literals;
using fleet_t = sf::fleet<std::string, std::string>;
using clock_type = std::chrono::steady_clock;
using sftest::fault_proxy;

sf::fleet_options opts(const std::string& uri, const std::string& prefix) {
  sf::fleet_options o;
  o.redis_uri = uri;
  o.key_prefix = prefix;
  o.lease_ttl = 2000ms;
  o.redis_timeout = 2000ms;
  o.max_wait = 60s;
  return o;
}

long long ms_since(clock_type::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
}

// A loader that counts its calls and returns `value`.
struct counted_origin {
  std::atomic<int> calls{0};
  std::string value;
  explicit counted_origin(std::string v) : value(std::move(v)) {}
  auto loader() {
    return [this] {
      calls.fetch_add(1);
      return value;
    };
  }
};

long long info_number(sftest::redis_client& c, const std::string& section,
                      const std::string& field) {
  const std::string s = c.info_field(section, field);
  return s.empty() ? -1 : std::stoll(s);
}

// The socket descriptors this process has open now.
std::set<int> open_sockets() {
  std::set<int> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    char target[256] = {};
    const std::string link = "/proc/self/fd/" + name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    if (n > 0 && std::string(target, static_cast<std::size_t>(n)).rfind("socket:", 0) == 0) {
      out.insert(std::stoi(name));
    }
  }
  ::closedir(dir);
  return out;
}

}  // namespace

// ---- F5: redis_timeout bounds a round trip, not each read ------------------------------------

TEST_CASE(
    "redis_timeout bounds a whole round trip: a reply trickled one byte every 30 ms under a "
    "50 ms timeout fails within the bound (it took 207 reads x 30 ms)",
    "[fleet][redis]") {
  sftest::private_redis server;
  auto admin = server.client();
  admin->command({"SET", "big", std::string(200, 'x')});
  fault_proxy proxy(server.port());
  const auto ep = d::redis_endpoint::parse(proxy.uri());
  auto conn = d::redis_conn::open(ep, 50ms, "", "");
  REQUIRE(d::text_of(conn->command({"GET", "big"}).get()).size() == 200);

  proxy.trickle(fault_proxy::down, 30ms);
  const auto t0 = clock_type::now();
  CHECK_THROWS_AS(conn->command({"GET", "big"}), d::redis_failure);
  const long long took = ms_since(t0);
  INFO("one GET took " << took << " ms under redis_timeout 50 ms");
  CHECK(took < 1000);
  CHECK(conn->broken());
}

TEST_CASE(
    "a trickling reply costs a get() one redis_timeout, then a local load (not seconds of "
    "reads)",
    "[fleet][redis]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  sf::fleet_options o = opts(proxy.uri(), "trickle");
  o.redis_timeout = 50ms;
  fleet_t f(o);
  counted_origin origin(std::string(200, 'v'));
  REQUIRE(f.get("k", origin.loader()) == origin.value);  // stored; the connection is pooled
  REQUIRE(origin.calls == 1);

  proxy.trickle(fault_proxy::down, 30ms);
  const auto t0 = clock_type::now();
  CHECK(f.get("k", origin.loader()) == origin.value);
  const long long took = ms_since(t0);
  INFO("get() took " << took << " ms under redis_timeout 50 ms");
  CHECK(took < 1000);
  CHECK(origin.calls == 2);  // Redis did not answer in time: a local load
  CHECK(f.stats().local_fallback == 1);
}

// ---- F2: pooled connections the server closed ------------------------------------------------

TEST_CASE(
    "the server's idle timeout closed the pooled connections: the next get reads the value "
    "from Redis, invalidate works, no error is counted, the breaker stays closed",
    "[fleet][redis]") {
  sftest::private_redis server;
  auto admin = server.client();
  admin->command({"CONFIG", "SET", "timeout", "1"});
  fleet_t f(opts(server.uri(), "idle"));
  counted_origin origin("v1");
  REQUIRE(f.get("k", origin.loader()) == "v1");
  REQUIRE(origin.calls == 1);

  // Waits until the server has closed every idle client but the one asking.
  const auto idle_closed = [&] {
    sftest::must(
        [&] {
          auto c = server.client();
          return info_number(*c, "clients", "connected_clients") == 1;
        },
        "the server closed its idle clients", 10s);
  };
  admin.reset();  // closed by the timeout too; a fresh client asks each time
  for (int round = 0; round < 3; ++round) {
    idle_closed();
    CHECK(f.get("k", origin.loader()) == "v1");
  }
  CHECK(origin.calls == 1);  // every get was a hit, none a local load
  idle_closed();
  CHECK_NOTHROW(f.invalidate("k"));
  const sf::fleet_stats s = f.stats();
  CHECK(s.hits == 3);
  CHECK(s.redis_errors == 0);
  CHECK(s.breaker_opens == 0);
  CHECK(f.healthy());
}

// ---- F6: many long loads at a real RTT keep their leases ----------------------------------------

TEST_CASE(
    "64 concurrent loads longer than lease_ttl at 20 ms RTT keep every lease: the renewals go "
    "in one pipelined round trip, not one round trip each (all 64 were lost)",
    "[fleet][redis]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  sf::fleet_options o = opts(proxy.uri(), "renew");
  o.lease_ttl = 600ms;
  o.renew_every = 200ms;
  o.redis_timeout = 2000ms;
  fleet_t f(o);
  proxy.set_delay(fault_proxy::up, 10ms);
  proxy.set_delay(fault_proxy::down, 10ms);

  constexpr int leaders = 64;
  std::atomic<int> leading{0};
  std::promise<void> go;
  const std::shared_future<void> released = go.get_future().share();
  std::deque<sftest::thread> callers;  // sftest::thread does not move
  std::vector<std::string> got(leaders);
  for (int i = 0; i < leaders; ++i) {
    callers.emplace_back([&, i] {
      got[static_cast<std::size_t>(i)] = f.get("k" + std::to_string(i), [&, i] {
        leading.fetch_add(1);
        // The load lasts until the renewer has had four rounds' worth of renewals sent (or
        // the bound runs out: the check below then fails).
        (void)released.wait_for(30s);
        return "v" + std::to_string(i);
      });
    });
  }
  sftest::must([&] { return leading.load() == leaders; }, "every caller leads", 30s);
  // Four rounds of renewals (4 x renew_every = 800 ms, past lease_ttl) from now.
  const std::size_t target = proxy.commands("EVALSHA") + 4 * leaders;
  sftest::must([&] { return proxy.commands("EVALSHA") >= target; }, "four rounds of renewals", 30s);
  go.set_value();
  for (auto& t : callers) t.join("caller");
  for (int i = 0; i < leaders; ++i)
    CHECK(got[static_cast<std::size_t>(i)] == "v" + std::to_string(i));
  const sf::fleet_stats s = f.stats();
  CHECK(s.lease_lost == 0);
  CHECK(s.redis_errors == 0);
  CHECK(s.origin_calls == static_cast<std::uint64_t>(leaders));
}

TEST_CASE(
    "renew_all on a server that knows no script yet: the leases answered NOSCRIPT go again in "
    "one pipelined round trip with the body, not one round trip each (a first renewal of 64 "
    "leases at 20 ms RTT took over a second: most were lost)",
    "[fleet][redis]") {
  sftest::private_redis server;  // fresh: no script cached
  auto admin = server.client();
  fault_proxy proxy(server.port());
  constexpr std::size_t leases = 64;
  constexpr std::size_t not_ours = 5;  // held under another token
  std::vector<d::fleet_names> names;
  for (std::size_t i = 0; i < leases; ++i) {
    names.push_back(d::fleet_names::of("noscript", "k" + std::to_string(i)));
    const std::string token = i == not_ours ? "theirs" : "ours";
    admin->command({"SET", names.back().lease, token, "PX", "10000"});
  }
  std::vector<std::pair<const d::fleet_names*, std::string_view>> args;
  for (const auto& n : names) args.emplace_back(&n, "ours");
  auto conn = d::redis_conn::open(d::redis_endpoint::parse(proxy.uri()), 20000ms, "", "");

  // The first EVAL, and whatever its connection sends after it, waits in the proxy: the EVALs
  // the proxy has read by then are those sent before any of their replies came back.
  proxy.hold_command("EVAL", fault_proxy::until_released);
  std::vector<bool> ours;
  std::atomic<bool> failed{false};
  sftest::thread renewing([&] {
    try {
      ours = d::renew_all(*conn, args, 60000ms, 60000ms);
    } catch (...) {
      failed.store(true);
    }
  });
  sftest::must([&] { return proxy.held_commands() == 1; }, "the first EVAL is held");
  CHECK(sftest::becomes([&] { return proxy.commands("EVAL") == leases; }, 5s));
  CHECK(proxy.commands("EVALSHA") == leases);  // the first try, pipelined; none again
  proxy.release_commands();
  renewing.join("renew_all");
  REQUIRE_FALSE(failed.load());
  REQUIRE(ours.size() == leases);
  for (std::size_t i = 0; i < leases; ++i) {
    CHECK(ours[i] == (i != not_ours));
    const long long ttl = admin->command({"PTTL", names[i].lease}).integer;
    CHECK((i == not_ours ? ttl <= 10000 : ttl > 10000));
  }
}

// subscriber_running: runs a subscriber's loop as the fleet's engine does (one job on a
// worker_threads of its own); on scope exit stops it and joins its thread.
struct subscriber_running {
  explicit subscriber_running(d::fleet_subscriber& s) : sub(s) { sub.start(threads); }
  subscriber_running(const subscriber_running&) = delete;
  subscriber_running& operator=(const subscriber_running&) = delete;
  ~subscriber_running() {
    sub.stop();
    threads.close();
  }
  d::fleet_subscriber& sub;
  d::worker_threads threads{d::worker_threads::default_idle_for, 1};
};

// ---- F8: a late SUBSCRIBE reply does not confirm a new watch -----------------------------------

TEST_CASE(
    "a late reply to an earlier SUBSCRIBE, followed by an UNSUBSCRIBE the server applied, does "
    "not confirm a new watch of the same channel: only the reply to the last request does",
    "[fleet][redis]") {
  sftest::private_redis server;
  auto admin = server.client();
  fault_proxy proxy(server.port());
  d::redis_pool pool(d::redis_endpoint::parse(proxy.uri()), 2000ms, "", "", 2);
  std::atomic<std::uint64_t> errors{0};
  const d::fleet_hook no_hook;
  d::fleet_subscriber sub(pool, errors, no_hook);
  const subscriber_running running(sub);
  const sf::stop_token never;

  // The subscriber's connection first (its handshake needs the replies to flow).
  auto warm = sub.subscribe("warm");
  REQUIRE(warm.wait_confirmed(clock_type::now() + 20s, never));

  const std::size_t warm_subscribes = proxy.commands("SUBSCRIBE");

  proxy.pause(fault_proxy::down);  // the server's replies wait in the proxy
  {
    const auto first = sub.subscribe("ch");
    sftest::must([&] { return proxy.commands("SUBSCRIBE") == warm_subscribes + 1; },
                 "the first SUBSCRIBE");
  }  // the first watch goes: an UNSUBSCRIBE follows
  sftest::must([&] { return proxy.commands("UNSUBSCRIBE") == 1; }, "the UNSUBSCRIBE");
  proxy.hold_command("SUBSCRIBE", fault_proxy::until_released);
  auto second = sub.subscribe("ch");
  sftest::must([&] { return proxy.held_commands() == 1; }, "the second SUBSCRIBE is held");
  sftest::must([&] { return admin->numsub("ch") == 0; }, "the server applied the UNSUBSCRIBE");

  // The replies to the first SUBSCRIBE and to the UNSUBSCRIBE arrive; the server has no
  // subscription on ch, so a confirmation now would be a lie and a message would be lost.
  proxy.resume(fault_proxy::down);
  CHECK_FALSE(second.wait_confirmed(clock_type::now() + 500ms, never));
  CHECK(admin->command({"PUBLISH", "ch", "lost"}).integer == 0);

  proxy.release_commands();  // the second SUBSCRIBE reaches the server
  REQUIRE(second.wait_confirmed(clock_type::now() + 20s, never));
  CHECK(admin->command({"PUBLISH", "ch", "m"}).integer == 1);
  std::string message;
  CHECK(second.wait_event(clock_type::now() + 20s, never, message) ==
        d::fleet_subscriber::event::message);
  CHECK(message == "m");
}

// ---- F7: a connection the server accepted only to reject -------------------------------------

TEST_CASE(
    "maxclients reached, no password: a connection the server accepted only to reject counts "
    "as failed, not opened",
    "[fleet][redis]") {
  sftest::private_redis server;
  auto admin = server.client();
  const long long connected = info_number(*admin, "clients", "connected_clients");
  admin->command({"CONFIG", "SET", "maxclients", std::to_string(connected)});
  const auto ep = d::redis_endpoint::parse(server.uri());
  CHECK_THROWS_AS(d::redis_conn::open(ep, 2000ms, "", ""), d::redis_failure);
  CHECK(info_number(*admin, "stats", "rejected_connections") >= 1);
}

TEST_CASE(
    "maxclients reached: a watched channel's subscriber retries with its backoff, not in a "
    "tight loop (one waiting process made 10-15k rejected connections a second)",
    "[fleet][redis]") {
  sftest::private_redis server;
  auto admin = server.client();
  const d::redis_pool pool(d::redis_endpoint::parse(server.uri()), 2000ms, "", "", 2);
  std::atomic<std::uint64_t> errors{0};
  const d::fleet_hook no_hook;
  d::fleet_subscriber sub(pool, errors, no_hook);
  const subscriber_running running(sub);
  const long long connected = info_number(*admin, "clients", "connected_clients");
  admin->command({"CONFIG", "SET", "maxclients", std::to_string(connected)});
  const long long before = info_number(*admin, "stats", "rejected_connections");
  const auto w = sub.subscribe("ch");
  // The backoff (50 ms doubling to 2 s) allows 6 attempts in 1.5 s; a tight loop thousands.
  const bool hammered = sftest::becomes(
      [&] { return info_number(*admin, "stats", "rejected_connections") - before > 20; }, 1500ms);
  CHECK_FALSE(hammered);
  CHECK(info_number(*admin, "stats", "rejected_connections") - before >= 1);  // it did try
}

// ---- F13: threads per fleet are bounded ---------------------------------------------------------

TEST_CASE(
    "max_async_threads bounds the fleet's workers: 48 concurrent async_get calls on distinct "
    "keys under max_async_threads 4 run at most 4 loaders at once, and every call is answered",
    "[fleet][redis]") {
  sftest::private_redis server;
  sf::fleet_options o = opts(server.uri(), "threads");
  o.max_async_threads = 4;
  fleet_t f(o);
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  std::atomic<int> answered{0};
  sftest::gate release;
  constexpr int calls = 48;
  for (int i = 0; i < calls; ++i) {
    f.async_get(
        "k" + std::to_string(i),
        [&, i] {
          const int now = running.fetch_add(1) + 1;
          int seen = peak.load();
          while (now > seen && !peak.compare_exchange_weak(seen, now)) {
          }
          release.wait("the loaders' gate");
          running.fetch_sub(1);
          return "v" + std::to_string(i);
        },
        [&, i](sf::outcome<std::string> out) {
          if (out.has_value() && out.value() == "v" + std::to_string(i)) answered.fetch_add(1);
        });
  }
  sftest::must([&] { return running.load() == 4; }, "four loaders run");
  // Without the bound the other 44 start too (one thread each).
  CHECK_FALSE(sftest::becomes([&] { return running.load() > 4; }, 300ms));
  release.open();
  sftest::must([&] { return answered.load() == calls; }, "every call answered");
  CHECK(peak.load() == 4);
}

// ---- FD_CLOEXEC from the socket's creation ---------------------------------------------------

TEST_CASE(
    "a connection's socket is close-on-exec from its creation, while it connects (a fork+exec "
    "on another thread must not inherit it)",
    "[fleet][redis]") {
  // A listener whose accept queue is full: a further connect stays in progress until its
  // timeout, which leaves the socket open long enough to look at.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(listener, 0) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int filler = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(::connect(filler, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const int port = ntohs(a.sin_port);

  const std::set<int> before = open_sockets();
  std::atomic<int> seen_flags{-1};
  std::atomic<bool> connecting{true};
  sftest::thread watcher([&] {
    while (connecting.load()) {
      for (const int fd : open_sockets()) {
        if (before.count(fd) != 0) continue;
        const int flags = ::fcntl(fd, F_GETFD);
        if (flags >= 0) {
          seen_flags = flags;
          return;
        }
      }
      std::this_thread::yield();
    }
  });
  const auto ep = d::redis_endpoint::parse("tcp://127.0.0.1:" + std::to_string(port));
  CHECK_THROWS_AS(d::redis_conn::open(ep, 1000ms, "", ""), d::redis_failure);  // timed out
  connecting = false;
  watcher.join("watcher");
  REQUIRE(seen_flags.load() >= 0);  // the socket was seen while it connected
  CHECK((seen_flags.load() & FD_CLOEXEC) != 0);
  ::close(filler);
  ::close(listener);
}

// ---- no SIGPIPE --------------------------------------------------------------------------------

TEST_CASE(
    "a write on a connection the server reset raises no SIGPIPE: the command fails with "
    "redis_failure and the process lives",
    "[fleet][redis]") {
  // A one-connection server of the test's own: answers the handshake's PING, then resets
  // the connection (SO_LINGER 0: an RST, not a FIN).
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  std::atomic<bool> reset{false};
  sftest::thread server([&] {
    const int s = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) return;
    // Answers a PING (the handshake sends one when there is no AUTH or SELECT) until the
    // client has opened; then resets.
    char buf[64];
    std::string got;
    bool answered = false;
    const auto give_up = clock_type::now() + 20s;
    while (!reset.load() && clock_type::now() < give_up) {
      pollfd p{s, POLLIN, 0};
      if (::poll(&p, 1, 10) != 1) continue;
      const ssize_t n = ::recv(s, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
      if (!answered && got.find("PING\r\n") != std::string::npos) {
        (void)::send(s, "+PONG\r\n", 7, MSG_NOSIGNAL);
        answered = true;
      }
    }
    const linger l{1, 0};
    (void)::setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::close(s);
  });
  const auto ep = d::redis_endpoint::parse("tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  auto conn = d::redis_conn::open(ep, 2000ms, "", "");
  reset = true;
  server.join("server");
  const int fd = conn->raw()->fd;
  sftest::must(
      [&] {
        pollfd p{fd, POLLIN, 0};
        return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)) != 0;
      },
      "the reset arrived");
  // The reset's error is taken, as a read would take it: the next write is the one the
  // kernel answers with EPIPE, and SIGPIPE unless the library asked it not to.
  int err = 0;
  socklen_t err_len = sizeof err;
  (void)::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
  CHECK_THROWS_AS(conn->command({"GET", "k"}), d::redis_failure);
  CHECK(conn->broken());
  ::close(listener);
}

// ---- A list of seeds on a single server ---------------------------------------------------

TEST_CASE(
    "a list of seeds whose first is a dead port: a single server is reached through the next, "
    "keys coalesce, no error, and later connections go straight to it",
    "[fleet][redis][seeds]") {
  sftest::private_redis server;
  const int dead = sftest::free_port();  // nothing listens there: connections are refused
  const std::string seeds =
      "tcp://127.0.0.1:" + std::to_string(dead) + ",127.0.0.1:" + std::to_string(server.port());

  // The pool: the first connection falls over to the second seed, which it then keeps.
  d::redis_pool pool(d::redis_endpoint::parse_list(seeds), 2000ms, "", "", 2);
  CHECK(pool.seeds() == 2);
  CHECK(pool.endpoint().port == dead);
  {
    auto c = pool.open();
    CHECK(d::text_of(c->command({"PING"}).get()) == "PONG");
  }
  CHECK(pool.endpoint().port == server.port());

  // Fleets: 2 x 8 threads on one key, 1 origin call, nothing surfaced or counted.
  const std::string prefix = sftest::unique_prefix("seeds");
  fleet_t a(opts(seeds, prefix));
  fleet_t b(opts(seeds, prefix));
  counted_origin origin("value");
  std::atomic<int> wrong{0};
  std::atomic<int> threw{0};
  sftest::gate go;
  std::vector<std::unique_ptr<sftest::thread>> workers;
  for (int i = 0; i < 16; ++i) {
    workers.push_back(std::make_unique<sftest::thread>([&, i] {
      go.wait("start");
      try {
        if ((i % 2 == 0 ? a : b).get("k", origin.loader()) != "value") wrong.fetch_add(1);
      } catch (...) {
        threw.fetch_add(1);
      }
    }));
  }
  go.open();
  for (auto& w : workers) w->join("seed list workers");
  CHECK(origin.calls.load() == 1);
  CHECK(wrong.load() == 0);
  CHECK(threw.load() == 0);
  for (fleet_t* f : {&a, &b}) {
    const sf::fleet_stats s = f->stats();
    CHECK(s.redis_errors == 0);
    CHECK(s.local_fallback == 0);
    CHECK(s.breaker_opens == 0);
    CHECK(f->healthy());
  }
}
