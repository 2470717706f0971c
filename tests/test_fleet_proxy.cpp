// tests/support/fault_proxy.hpp, tested on its own against a private redis-server: each fault
// does what the fleet tests and the soak rely on. Raw sockets on the client side, so that what
// is observed is the proxy, not a client library's buffering.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis.hpp"
#include "support/sync.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using sftest::fault_proxy;

// A blocking loopback client socket (-1 when the connect failed).
int dial(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

std::string resp(std::initializer_list<std::string> words) {
  std::string out = "*" + std::to_string(words.size()) + "\r\n";
  for (const auto& w : words) out += "$" + std::to_string(w.size()) + "\r\n" + w + "\r\n";
  return out;
}

void send_all(int s, const std::string& bytes) {
  REQUIRE(::send(s, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(bytes.size()));
}

// Reads until `n` bytes arrived (bounded), counting the reads it took.
std::string receive(int s, std::size_t n, int* reads = nullptr) {
  std::string out;
  const auto until = clock_type::now() + sftest::bound;
  while (out.size() < n) {
    pollfd p{s, POLLIN, 0};
    if (clock_type::now() > until) sftest::hang("proxy test: receive");
    if (::poll(&p, 1, 100) != 1) continue;
    char buf[4096];
    const ssize_t got = ::recv(s, buf, std::min(sizeof buf, n - out.size()), 0);
    if (got <= 0) break;  // closed: the caller checks the size
    out.append(buf, static_cast<std::size_t>(got));
    if (reads != nullptr) ++*reads;
  }
  return out;
}

long long ms_since(clock_type::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
}

}  // namespace

TEST_CASE("fault_proxy forwards commands and replies both ways and counts commands",
          "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int s = dial(proxy.port());
  REQUIRE(s >= 0);
  send_all(s, resp({"SET", "k", "v"}) + resp({"GET", "k"}));
  CHECK(receive(s, 5 + 7) == "+OK\r\n$1\r\nv\r\n");
  CHECK(proxy.commands("set") == 1);
  CHECK(proxy.commands("GET") == 1);
  CHECK(proxy.accepted() == 1);
  CHECK(proxy.open_connections() == 1);
  ::close(s);
  sftest::must([&] { return proxy.open_connections() == 0; }, "proxy: connection gone");
}

TEST_CASE("fault_proxy: a delay in one direction adds to every round trip, order kept",
          "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int s = dial(proxy.port());
  REQUIRE(s >= 0);
  SECTION("fixed") {
    proxy.set_delay(fault_proxy::up, 40ms);
    const auto t0 = clock_type::now();
    send_all(s, resp({"PING"}));
    CHECK(receive(s, 7) == "+PONG\r\n");
    CHECK(ms_since(t0) >= 40);
  }
  SECTION("random, both directions: 50 pipelined replies arrive in order") {
    proxy.set_random_delay(fault_proxy::up, 0ms, 5ms);
    proxy.set_random_delay(fault_proxy::down, 0ms, 5ms);
    std::string expect;
    for (int i = 0; i < 50; ++i) {
      const std::string w = std::to_string(i);
      send_all(s, resp({"ECHO", w}));  // one write each: many chunks, many delays
      expect += "$" + std::to_string(w.size()) + "\r\n" + w + "\r\n";
    }
    CHECK(receive(s, expect.size()) == expect);
  }
  ::close(s);
}

TEST_CASE("fault_proxy: hold_command holds that command and what follows it, not other clients",
          "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int a = dial(proxy.port());
  const int b = dial(proxy.port());
  REQUIRE((a >= 0 && b >= 0));
  proxy.hold_command("GET", fault_proxy::until_released);
  send_all(a, resp({"GET", "k"}) + resp({"PING"}));
  sftest::must([&] { return proxy.held_commands() == 1; }, "proxy: GET caught");
  // Nothing of a's comes back while its GET is held (checked without waiting: the PING behind
  // it is queued at the proxy, not at the server).
  CHECK(proxy.queued(fault_proxy::up) == resp({"GET", "k"}).size() + resp({"PING"}).size());
  char byte = 0;
  CHECK(::recv(a, &byte, 1, MSG_DONTWAIT) == -1);
  // Another connection is not held.
  send_all(b, resp({"GET", "k"}));
  CHECK(receive(b, 5) == "$-1\r\n");
  proxy.release_commands();
  CHECK(receive(a, 5 + 7) == "$-1\r\n+PONG\r\n");
  SECTION("for a time") {
    proxy.hold_command("PING", 100ms);
    const auto t0 = clock_type::now();
    send_all(b, resp({"PING"}));
    CHECK(receive(b, 7) == "+PONG\r\n");
    CHECK(ms_since(t0) >= 100);
  }
  ::close(a);
  ::close(b);
}

TEST_CASE("fault_proxy: a command its client gave up on still reaches the server",
          "[fleet][proxy]") {
  sftest::private_redis server;
  auto check = server.client();
  fault_proxy proxy(server.port());
  const int s = dial(proxy.port());
  REQUIRE(s >= 0);
  proxy.hold_command("SET", fault_proxy::until_released);
  send_all(s, resp({"SET", "late", "yes"}));
  sftest::must([&] { return proxy.held_commands() == 1; }, "proxy: SET caught");
  ::close(s);  // the client gave up
  CHECK_FALSE(check->get("late").has_value());
  proxy.release_commands();
  sftest::must([&] { return check->get("late") == std::optional<std::string>("yes"); },
               "proxy: the late SET applied");
  sftest::must([&] { return proxy.open_connections() == 0; }, "proxy: connection gone");
}

TEST_CASE("fault_proxy: trickle forwards one byte per interval; hold_bytes holds N bytes",
          "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int s = dial(proxy.port());
  REQUIRE(s >= 0);
  SECTION("trickle") {
    proxy.trickle(fault_proxy::down, 20ms);
    const auto t0 = clock_type::now();
    send_all(s, resp({"PING"}));
    int reads = 0;
    CHECK(receive(s, 7, &reads) == "+PONG\r\n");
    CHECK(ms_since(t0) >= 6 * 20);  // 7 bytes, 6 intervals between them at least
    CHECK(reads >= 2);
  }
  SECTION("hold_bytes") {
    proxy.hold_bytes(fault_proxy::down, 3, 100ms);
    const auto t0 = clock_type::now();
    send_all(s, resp({"PING"}));
    CHECK(receive(s, 7) == "+PONG\r\n");
    CHECK(ms_since(t0) >= 100);
  }
  ::close(s);
}

TEST_CASE("fault_proxy: pause holds a direction until resume", "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int s = dial(proxy.port());
  REQUIRE(s >= 0);
  proxy.pause(fault_proxy::down);
  send_all(s, resp({"PING"}));
  sftest::must([&] { return proxy.queued(fault_proxy::down) == 7; }, "proxy: reply queued");
  char byte = 0;
  CHECK(::recv(s, &byte, 1, MSG_DONTWAIT) == -1);
  proxy.resume(fault_proxy::down);
  CHECK(receive(s, 7) == "+PONG\r\n");
  ::close(s);
}

TEST_CASE("fault_proxy: drop_all closes every connection; refuse makes connects fail",
          "[fleet][proxy]") {
  sftest::private_redis server;
  fault_proxy proxy(server.port());
  const int a = dial(proxy.port());
  const int b = dial(proxy.port());
  REQUIRE((a >= 0 && b >= 0));
  sftest::must([&] { return proxy.open_connections() == 2; }, "proxy: both accepted");
  CHECK(proxy.peak_connections() == 2);
  proxy.drop_all(GENERATE(false, true));
  CHECK(proxy.open_connections() == 0);
  CHECK(receive(a, 1).empty());  // end of file (or reset): nothing more comes
  ::close(a);
  ::close(b);

  proxy.refuse(true);
  CHECK(dial(proxy.port()) == -1);
  proxy.refuse(false);
  const int c = dial(proxy.port());
  REQUIRE(c >= 0);
  send_all(c, resp({"PING"}));
  CHECK(receive(c, 7) == "+PONG\r\n");
  ::close(c);
}
