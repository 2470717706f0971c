// tests/support/redis.hpp: Redis for the fleet tests.
//
//  * need_redis(): the shared server's URI from SINGLEFLIGHT_TEST_REDIS
//    (tcp://127.0.0.1:PORT; .ci/run starts one). Unset: the test case prints
//    why and exits with 77, which ctest reports as *skipped*
//    (SKIP_RETURN_CODE, tests/CMakeLists.txt). Set but unreachable: the test
//    fails.
//  * cluster_node(): a node of the test Redis Cluster (SINGLEFLIGHT_TEST_REDIS_CLUSTER, or
//    the ctest fixture fleet_redis_cluster's), "" when there is none.
//  * unique_prefix(): a key prefix of this test case's own, so that test
//    cases sharing the server never see each other's keys.
//  * redis_client: a tiny synchronous client (the tests' own channel to the
//    server, independent of the library: seeding values, reading them back,
//    CLIENT PAUSE, CLIENT KILL, PUBSUB NUMSUB, INFO).
//  * poll_until(pred, what): a bounded wait (sync.hpp's must) on a condition read from a
//    server, asked every 2 ms rather than in a tight loop.
//  * private_redis: a redis-server of the test's own (free loopback port,
//    temporary directory, pidfile, --save '' --appendonly no), for tests that
//    stop, freeze or pause the server or kill its clients, which must not
//    disturb the shared one. Started as a child (fork/exec, killed if the test
//    process dies: PR_SET_PDEATHSIG), stopped by pid.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#else
#include <hiredis.h>
#endif

#include "sync.hpp"

namespace sftest {

inline constexpr int skip_code = 77;

// poll_until(pred, what): must(pred, what) for a condition read from a server (PUBSUB, INFO):
// asked every 2 ms, not in a tight loop that would keep the server busy answering.
template <class Pred>
void poll_until(Pred pred, const char* what) {
  must(
      [&] {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling pace, not sync
        return false;
      },
      what);
}

// The shared server, or skip: SINGLEFLIGHT_TEST_REDIS, else the URI the ctest fixture
// fleet_redis wrote (tests/CMakeLists.txt: the server it started for this run).
inline std::string need_redis() {
  const char* uri = std::getenv("SINGLEFLIGHT_TEST_REDIS");
#ifdef SINGLEFLIGHT_TEST_REDIS_FILE
  static const std::string from_fixture = [] {
    std::string line;
    if (std::FILE* f = std::fopen(SINGLEFLIGHT_TEST_REDIS_FILE, "r")) {
      char buf[256];
      if (std::fgets(buf, sizeof buf, f) != nullptr) line = buf;
      std::fclose(f);
    }
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return line;
  }();
  if ((uri == nullptr || *uri == '\0') && !from_fixture.empty()) return from_fixture;
#endif
  if (uri == nullptr || *uri == '\0') {
    std::fprintf(stderr,
                 "SKIPPED: this test needs a Redis server: set SINGLEFLIGHT_TEST_REDIS="
                 "tcp://127.0.0.1:PORT (see docs/fleet.md: running the fleet tests locally)\n");
    std::fflush(stderr);
    std::exit(skip_code);
  }
  return uri;
}

// A node of the Redis Cluster of the cluster tests (tcp://127.0.0.1:PORT), or "" when there is
// none: SINGLEFLIGHT_TEST_REDIS_CLUSTER, else the URI the ctest fixture fleet_redis_cluster
// wrote (tests/support/redis_cluster.sh). With "" a test WARNs loudly and passes without
// running (cluster.hpp's need_cluster_or_warn).
inline std::string cluster_node() {
  const char* uri = std::getenv("SINGLEFLIGHT_TEST_REDIS_CLUSTER");
  if (uri != nullptr && *uri != '\0') return uri;
#ifdef SINGLEFLIGHT_TEST_REDIS_CLUSTER_FILE
  std::string line;
  if (std::FILE* f = std::fopen(SINGLEFLIGHT_TEST_REDIS_CLUSTER_FILE, "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, f) != nullptr) line = buf;
    std::fclose(f);
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
#else
  return {};
#endif
}

inline std::string unique_prefix(std::string_view what = "t") {
  static std::atomic<int> n{0};
  std::random_device rd;
  return "sftest:" + std::string(what) + ":" + std::to_string(::getpid()) + ":" +
         std::to_string(n.fetch_add(1)) + ":" + std::to_string(rd());
}

// ---------------------------------------------------------------------------------------------
// redis_client

class redis_client {
 public:
  explicit redis_client(const std::string& uri, const std::string& password = {}) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      if (uri.rfind("unix://", 0) == 0) {
        ctx_ = redisConnectUnix(uri.substr(7).c_str());
      } else {
        const std::string rest = uri.substr(uri.find("://") + 3);
        const auto colon = rest.rfind(':');
        ctx_ = redisConnect(rest.substr(0, colon).c_str(), std::stoi(rest.substr(colon + 1)));
      }
      if (ctx_ != nullptr && ctx_->err == 0) break;
      if (ctx_ != nullptr) redisFree(ctx_);
      ctx_ = nullptr;
      if (std::chrono::steady_clock::now() > deadline) hang("redis_client: connect");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // retry pacing, not sync
    }
    if (!password.empty()) command({"AUTH", password});
  }
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;
  ~redis_client() {
    if (ctx_ != nullptr) redisFree(ctx_);
  }

  struct reply {
    int type = 0;
    long long integer = 0;
    std::string str;
    std::vector<reply> elements;
    bool nil() const { return type == REDIS_REPLY_NIL; }
    bool error() const { return type == REDIS_REPLY_ERROR; }
  };

  reply command(std::initializer_list<std::string> args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) throw std::runtime_error(std::string("redis_client: ") + ctx_->errstr);
    reply out = convert(r);
    freeReplyObject(r);
    return out;
  }

  std::optional<std::string> get(const std::string& key) {
    reply r = command({"GET", key});
    if (r.nil()) return std::nullopt;
    return r.str;
  }

  // The number of subscribers of `channel` (PUBSUB NUMSUB).
  long long numsub(const std::string& channel) {
    const reply r = command({"PUBSUB", "NUMSUB", channel});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  }

  // The number of subscribers of the shard channel `channel` on this cluster node (PUBSUB
  // SHARDNUMSUB, Redis 7.0).
  long long shardnumsub(const std::string& channel) {
    const reply r = command({"PUBSUB", "SHARDNUMSUB", channel});
    return r.elements.size() == 2 ? r.elements[1].integer : -1;
  }

  // A field of INFO's output (e.g. INFO commandstats: "cmdstat_get"), as text.
  std::string info_field(const std::string& section, const std::string& field) {
    const reply r = command({"INFO", section});
    const auto at = r.str.find(field + ":");
    if (at == std::string::npos) return {};
    const auto end = r.str.find("\r\n", at);
    return r.str.substr(at + field.size() + 1, end - at - field.size() - 1);
  }

  // calls=N of INFO commandstats for a command (0 when never called).
  long long command_calls(const std::string& cmd) {
    const std::string s = info_field("commandstats", "cmdstat_" + cmd);
    const auto at = s.find("calls=");
    if (at == std::string::npos) return 0;
    return std::stoll(s.substr(at + 6));
  }

 private:
  static reply convert(const redisReply* r) {
    reply out;
    out.type = r->type;
    out.integer = r->integer;
    if (r->str != nullptr) out.str.assign(r->str, r->len);
    for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
    return out;
  }

  redisContext* ctx_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// private_redis

// A loopback port nobody listens on right now (bind port 0, read it back).
inline int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("free_port: bind failed");
  }
  const int port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

inline std::string redis_server_binary() {
  const char* env = std::getenv("SINGLEFLIGHT_TEST_REDIS_SERVER");
  if (env != nullptr && *env != '\0') return env;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t from = 0;
  while (from <= dirs.size()) {
    const auto to = dirs.find(':', from);
    const std::string dir =
        dirs.substr(from, to == std::string::npos ? std::string::npos : to - from);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/redis-server";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (to == std::string::npos) break;
    from = to + 1;
  }
  std::fprintf(stderr,
               "FAIL: redis-server not found on PATH (or SINGLEFLIGHT_TEST_REDIS_SERVER)\n");
  std::abort();
}

class private_redis {
 public:
  struct config {
    std::string password;
    bool unix_socket = false;
  };

  private_redis() : private_redis(config{}) {}
  explicit private_redis(config c) : cfg_(std::move(c)) {
    (void)need_redis();  // a test that runs servers runs only where Redis tests are enabled
    std::string tmpl = (std::filesystem::temp_directory_path() / "sftest-redis.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      if (start()) return;
    }
    std::fprintf(stderr, "FAIL: private redis-server did not start; see %s/r.log\n", dir_.c_str());
    std::abort();
  }
  private_redis(const private_redis&) = delete;
  private_redis& operator=(const private_redis&) = delete;
  ~private_redis() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string uri() const {
    return cfg_.unix_socket ? "unix://" + dir_ + "/r.sock"
                            : "tcp://127.0.0.1:" + std::to_string(port_);
  }
  std::string tcp_uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  std::unique_ptr<redis_client> client() const {
    return std::make_unique<redis_client>(uri(), cfg_.password);
  }

  // stop(): SIGTERM by pid, then reap (bounded; SIGKILL after the bound).
  void stop() {
    if (pid_ <= 0) return;
    if (frozen_) thaw();
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + bound;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling the reap
    }
    pid_ = -1;
  }

  // restart(): the same port and password, a fresh (empty) server.
  void restart() {
    stop();
    if (!start()) {
      std::fprintf(stderr, "FAIL: private redis-server did not restart\n");
      std::abort();
    }
  }

  // freeze()/thaw(): SIGSTOP / SIGCONT the server (a hung server: TCP
  // connects still complete in the kernel's backlog, nothing answers).
  void freeze() {
    ::kill(pid_, SIGSTOP);
    frozen_ = true;
  }
  void thaw() {
    ::kill(pid_, SIGCONT);
    frozen_ = false;
  }

 private:
  bool start() {
    const std::string bin = redis_server_binary();
    std::vector<std::string> args = {
        bin,      "--port",    std::to_string(port_), "--bind",    "127.0.0.1",
        "--save", "",          "--appendonly",        "no",        "--daemonize",
        "no",     "--pidfile", dir_ + "/r.pid",       "--logfile", dir_ + "/r.log",
        "--dir",  dir_};
    if (!cfg_.password.empty()) {
      args.insert(args.end(), {"--requirepass", cfg_.password});
    }
    if (cfg_.unix_socket) {
      args.insert(args.end(), {"--unixsocket", dir_ + "/r.sock", "--unixsocketperm", "700"});
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    // Ready when it answers PING (bounded); gone when the port was taken.
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      redisContext* c = cfg_.unix_socket ? redisConnectUnix((dir_ + "/r.sock").c_str())
                                         : redisConnect("127.0.0.1", port_);
      bool up = false;
      if (c != nullptr && c->err == 0) {
        auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
        // NOAUTH also means it is up.
        up = r != nullptr;
        if (r != nullptr) freeReplyObject(r);
      }
      if (c != nullptr) redisFree(c);
      if (up) return true;
      if (std::chrono::steady_clock::now() > deadline) hang("private redis-server: PING");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling readiness
    }
  }

  config cfg_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool frozen_ = false;
};

}  // namespace sftest
