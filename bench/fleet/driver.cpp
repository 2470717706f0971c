// bench/fleet/driver.cpp: the fleet measured with real processes against a real redis-server.
//
//   fleet_driver [--quick] [--only coalescing|faults|stores|costs] [--redis-server PATH]
//   fleet_driver --cluster [--quick] [--cluster-script PATH]
//   fleet_driver --cluster --trials N [--only reshard|force|kill] [--cluster-script PATH]
//
// Starts its own redis-server (a free loopback port, a temporary directory, a pidfile;
// stopped by pid), then N worker processes (fork/exec of this program with --worker) with T
// threads each, and prints markdown tables:
//   1. origin calls per key per expiry (each round asks every thread of every process for a
//      key nobody has: a cold or expired key, all at once) for: no coalescing (N*T),
//      per-process groups (N), the fleet (1); N x T in {2 x 16, 8 x 16, 32 x 4};
//   2. faults: leader SIGKILLed or SIGSTOPped mid-load, Redis stopped, frozen (SIGSTOP) or
//      CLIENT PAUSEd, subscriptions killed (CLIENT KILL TYPE pubsub): origin calls, errors
//      surfaced, stalls, stale overwrites;
//   3. stores that fail, lost replies, ACLs, foreign data: a value the server refuses
//      (proto-max-bulk-len), one over max_value_bytes, one process's race reply held back
//      past redis_timeout by a loopback proxy (tests/support/fault_proxy.hpp: the race runs
//      later on the server), an ACL user without channel rights, a foreign value under the
//      lease name: origin calls, errors surfaced, the callers' latency;
//   4. cost of a hit and of a miss (leader, follower) in round trips, counted by the server
//      (INFO commandstats), and in time.
// With --cluster, instead: a Redis Cluster of 3 masters (no replicas; started and stopped by
// tests/support/redis_cluster.sh, free loopback ports, a temporary directory, stopped by pid),
// every worker pointed at one node of it (the seed), and
//   5. origin calls per key for 2 x 16, 8 x 16, 32 x 4, the keys spread over the 3 masters;
//      the cost of a hit (against a bare GET on the key's master) and of a miss (leader,
//      follower; round trips seen by MONITOR on every master); a leader SIGKILLed; one master
//      SIGKILLed (no replica): its keys and the other masters'.
// With --cluster --trials N, instead: a Redis Cluster of 3 masters with one replica each, every
// worker given every node as a seed, and
//   6. N trials of each event on the master of a hot key: its slot resharded to another master
//      (SETSLOT IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE on every master),
//      CLUSTER FAILOVER FORCE on its replica, the master SIGKILLed (then restarted: it rejoins
//      as a replica, in sync before the next trial). 8 processes x 4 threads call get() on a
//      cold key in a loop; the event lands 0-210 ms into its first (200 ms) load. Per event:
//      the key's origin calls, errors surfaced, fence rejections, stale overwrites (a watcher
//      polls the key's record on every node every 2 ms: a record with an older fence after a
//      newer one, or a final record older than one seen, is one; each origin call returns a
//      version from a counter every worker shares, so the record names its load), whether every
//      caller ends on the stored record, and the time to coalesce again (probe rounds on fresh
//      keys of the same slot, back to back from the event's start: when the last one that
//      did not coalesce ended). On stderr, per trial; for a trial over 2 calls or with a local
//      load, the workers' fleet_stats over it (leader, local_fallback and its reasons, the
//      failover waits) and the hot key's calls by process.
// Origin calls are counted on a pipe the loader writes to (fd 3 in every worker).
#include <singleflight/fleet.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../../tests/support/fault_proxy.hpp"

namespace {

namespace sf = singleflight;
using clock_t_ = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;
using us = std::chrono::microseconds;

// The command that stops the driver's Redis Cluster (--cluster): run by die() too, so that a
// failed run leaves no cluster behind (its nodes are daemons, not children).
std::string cluster_stop_command;  // NOLINT: set once, before any worker starts

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "fleet_driver: %s\n", why.c_str());
  if (!cluster_stop_command.empty()) (void)std::system(cluster_stop_command.c_str());
  std::exit(1);
}

double ms_since(clock_t_::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_t_::now() - t0).count();
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::map<std::string, std::string> parse_words(const std::string& line, std::size_t skip) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string w;
  for (std::size_t i = 0; in >> w; ++i) {
    if (i < skip) continue;
    const auto eq = w.find('=');
    if (eq != std::string::npos) out[w.substr(0, eq)] = w.substr(eq + 1);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Worker mode: one process of the fleet.

std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1) {
    if (c == '\n') return line;
    line += c;
  }
  return "quit";
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) std::_Exit(3);
    off += static_cast<std::size_t>(n);
  }
}

int worker_main(const std::map<std::string, std::string>& a) {
  const auto num = [&](const char* k, long d) { return a.count(k) ? std::stol(a.at(k)) : d; };
  sf::fleet_options o;
  o.redis_uri = a.at("uri");
  o.key_prefix = a.at("prefix");
  o.lease_ttl = ms(num("lease_ms", 1000));
  o.wait_slice = ms(num("slice_ms", 0));
  o.max_wait = ms(num("max_wait_ms", 0));
  o.redis_timeout = ms(num("timeout_ms", 50));
  o.breaker_threshold = static_cast<std::uint32_t>(num("breaker", 3));
  o.breaker_cooldown = ms(num("cooldown_ms", 1000));
  o.max_value_bytes = static_cast<std::size_t>(num("max_value_bytes", 0));
  if (a.count("user") != 0) o.username = a.at("user");
  if (a.count("password") != 0) o.password = a.at("password");
  const auto value_bytes = static_cast<std::size_t>(num("value_bytes", 0));
  const std::string mode = a.at("mode");
  const int threads = static_cast<int>(num("threads", 4));
  sf::fleet<std::string, std::string> fleet(o);
  sf::group<std::string, std::string> group;
  std::atomic<long> load_ms{100};
  // versions=PATH: every origin call takes the next number of a counter shared by every worker
  // (an 8-byte file each maps), and returns it in its value, "v<version>-<pid>": the later the
  // call, the higher the version (the stale-overwrite check of the cluster trials).
  std::atomic<long long>* versions = nullptr;
  if (a.count("versions") != 0) {
    const int fd = ::open(a.at("versions").c_str(), O_RDWR);
    void* m = fd < 0
                  ? MAP_FAILED
                  : ::mmap(nullptr, sizeof(long long), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) std::_Exit(4);
    ::close(fd);
    versions = static_cast<std::atomic<long long>*>(m);
  }
  // load_of(key, latency): the origin of `key`, taking `latency` ms (the round's load_ms when
  // null).
  const auto load_of = [&](const std::string& key, const std::atomic<long>* latency = nullptr) {
    return [&, key, latency] {
      const long long ver = versions != nullptr ? versions->fetch_add(1) + 1 : 0;
      write_all(3,
                "O " + std::to_string(::getpid()) + " " + std::to_string(ver) + " " + key + "\n");
      // the origin's latency
      std::this_thread::sleep_for(ms(latency != nullptr ? latency->load() : load_ms.load()));
      std::string v = (versions != nullptr ? "v" + std::to_string(ver) : std::string("v")) + "-" +
                      std::to_string(::getpid());
      if (v.size() < value_bytes) v.resize(value_bytes, '.');
      return v;
    };
  };
  // "hammer key=K load_ms=L pause_ms=P": every thread calls fleet.get(K) in a loop (P ms apart)
  // until "stop", which answers "hammered ...", with the lowest and highest version the threads'
  // last calls returned (last_min, last_max: after the event every caller reads the record Redis
  // holds); rounds run meanwhile.
  std::atomic<bool> hammering{false};
  std::atomic<long> h_load_ms{200};
  std::vector<std::jthread> hammer;
  std::atomic<long> h_ok{0};
  std::atomic<long> h_err{0};
  std::vector<std::atomic<long long>> h_last(static_cast<std::size_t>(threads));
  std::atomic<long> h_max_us{0};
  std::mutex h_mu;
  std::string h_first_error;
  write_all(1, "ready\n");
  for (;;) {
    const std::string cmd = read_line(0);
    if (cmd == "quit") break;
    if (cmd.rfind("hammer ", 0) == 0) {
      const auto w = parse_words(cmd, 1);
      const std::string key = w.at("key");
      const long pause = std::stol(w.at("pause_ms"));
      h_load_ms = std::stol(w.at("load_ms"));
      h_ok = 0;
      h_err = 0;
      for (auto& l : h_last) l = 0;
      h_max_us = 0;
      h_first_error.clear();
      hammering = true;
      for (int t = 0; t < threads; ++t) {
        hammer.emplace_back([&, key, pause, t] {
          while (hammering.load()) {
            const auto t0 = clock_t_::now();
            try {
              const std::string v = fleet.get(key, load_of(key, &h_load_ms));
              const long long ver = v.size() > 1 ? std::atoll(v.c_str() + 1) : 0;
              h_last[static_cast<std::size_t>(t)] = ver;
              h_ok.fetch_add(1);
            } catch (const std::exception& e) {
              h_err.fetch_add(1);
              const std::lock_guard<std::mutex> lk(h_mu);
              if (h_first_error.empty()) h_first_error = e.what();
            }
            const long took =
                static_cast<long>(std::chrono::duration_cast<us>(clock_t_::now() - t0).count());
            long m = h_max_us.load();
            while (took > m && !h_max_us.compare_exchange_weak(m, took)) {
            }
            std::this_thread::sleep_for(ms(pause));
          }
        });
      }
      continue;
    }
    if (cmd == "stop") {
      hammering = false;
      hammer.clear();  // joins
      const auto s = fleet.stats();
      long long last_min = LLONG_MAX;
      long long last_max = 0;
      for (const auto& l : h_last) {
        last_min = std::min(last_min, l.load());
        last_max = std::max(last_max, l.load());
      }
      std::string why = h_first_error.substr(0, 80);
      std::replace(why.begin(), why.end(), ' ', '_');
      char line[768];
      const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
      std::snprintf(
          line, sizeof line,
          "hammered ok=%ld err=%ld last_min=%lld last_max=%lld max_ms=%.1f fence_rejections=%llu "
          "redis_errors=%llu local_fallback=%llu leader=%llu failover_waits=%llu "
          "failover_expired=%llu failover_no_replica=%llu local_not_run=%llu "
          "local_unshared=%llu local_max_wait=%llu error=%s\n",
          h_ok.load(), h_err.load(), last_min, last_max, h_max_us.load() / 1000.0,
          u(s.fence_rejections), u(s.redis_errors), u(s.local_fallback), u(s.leader),
          u(s.failover_waits), u(s.failover_expired), u(s.failover_no_replica), u(s.local_not_run),
          u(s.local_unshared), u(s.local_max_wait), why.empty() ? "-" : why.c_str());
      write_all(1, line);
      continue;
    }
    const auto w = parse_words(cmd, 1);  // "round key=K load_ms=L"
    load_ms = std::stol(w.at("load_ms"));
    const std::string key = w.at("key");
    std::mutex mu;
    int ok = 0;
    int err = 0;
    double max_ms = 0;
    std::string value = "-";
    std::latch start(threads);
    const auto load = load_of(key);
    {
      std::vector<std::jthread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&] {
          start.arrive_and_wait();
          const auto t0 = clock_t_::now();
          std::string v;
          bool failed = false;
          try {
            if (mode == "fleet") {
              v = fleet.get(key, load);
            } else if (mode == "group") {
              v = group.do_(key, load);
            } else {
              v = load();
            }
          } catch (...) {
            failed = true;
          }
          const double took = ms_since(t0);
          const std::lock_guard<std::mutex> lk(mu);
          max_ms = std::max(max_ms, took);
          if (failed) {
            err += 1;
          } else {
            ok += 1;
            value = v;
          }
        });
      }
    }
    const auto s = fleet.stats();
    char line[512];
    std::snprintf(line, sizeof line,
                  "done ok=%d err=%d max_ms=%.1f value=%s leader=%llu fence_rejections=%llu "
                  "redis_errors=%llu local_fallback=%llu breaker_opens=%llu "
                  "oversized_values=%llu publish_failures=%llu\n",
                  ok, err, max_ms, value.substr(0, 24).c_str(),
                  static_cast<unsigned long long>(s.leader),
                  static_cast<unsigned long long>(s.fence_rejections),
                  static_cast<unsigned long long>(s.redis_errors),
                  static_cast<unsigned long long>(s.local_fallback),
                  static_cast<unsigned long long>(s.breaker_opens),
                  static_cast<unsigned long long>(s.oversized_values),
                  static_cast<unsigned long long>(s.publish_failures));
    write_all(1, line);
  }
  hammering = false;
  hammer.clear();  // joins
  fleet.close();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The driver's own redis-server and client.

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    die("cannot bind a free port");
  }
  const int port = ntohs(addr.sin_port);
  ::close(s);
  return port;
}

class server {
 public:
  explicit server(std::string bin) : bin_(std::move(bin)) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fleet-driver.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) die("mkdtemp");
    dir_ = tmpl;
    port_ = free_port();
    start();
  }
  ~server() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  void start() {
    std::vector<std::string> args = {
        bin_,     "--port",    std::to_string(port_), "--bind",    "127.0.0.1",
        "--save", "",          "--appendonly",        "no",        "--daemonize",
        "no",     "--pidfile", dir_ + "/r.pid",       "--logfile", dir_ + "/r.log",
        "--dir",  dir_};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    const auto until = clock_t_::now() + std::chrono::seconds(10);
    for (;;) {
      redisContext* c = redisConnect("127.0.0.1", port_);
      const bool up = c != nullptr && c->err == 0;
      if (c != nullptr) redisFree(c);
      if (up) break;
      if (clock_t_::now() > until) die("redis-server did not start; see " + dir_ + "/r.log");
      std::this_thread::sleep_for(ms(5));  // polling readiness
    }
    connect();
  }
  void stop() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void freeze() { ::kill(pid_, SIGSTOP); }
  void thaw() { ::kill(pid_, SIGCONT); }

  redisReply* cmd(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return static_cast<redisReply*>(
        redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()));
  }
  void run(const std::vector<std::string>& args) {
    redisReply* r = cmd(args);
    if (r == nullptr) die("redis command failed");
    freeReplyObject(r);
  }
  long long integer(const std::vector<std::string>& args) {
    redisReply* r = cmd(args);
    long long v = -1;
    if (r != nullptr && r->type == REDIS_REPLY_INTEGER) v = r->integer;
    if (r != nullptr && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
      v = r->element[1]->integer;
    }
    if (r != nullptr) freeReplyObject(r);
    return v;
  }
  std::optional<std::string> get(const std::string& key) {
    redisReply* r = cmd({"GET", key});
    std::optional<std::string> v;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) v.emplace(r->str, r->len);
    if (r != nullptr) freeReplyObject(r);
    return v;
  }
  // INFO commandstats: calls per command, and the total.
  std::map<std::string, long long> commands() {
    redisReply* r = cmd({"INFO", "commandstats"});
    std::map<std::string, long long> out;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      std::istringstream in(std::string(r->str, r->len));
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind("cmdstat_", 0) != 0) continue;
        const auto colon = line.find(':');
        const auto calls = line.find("calls=");
        const long long n = std::stoll(line.substr(calls + 6));
        out[line.substr(8, colon - 8)] = n;
        out["*"] += n;
      }
    }
    if (r != nullptr) freeReplyObject(r);
    return out;
  }

 private:
  void connect() {
    c_ = redisConnect("127.0.0.1", port_);
    if (c_ == nullptr || c_->err != 0) die("cannot connect to the driver's redis-server");
  }
  std::string bin_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  redisContext* c_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Worker processes, from the driver's side.

// One origin call, as the loader reported it on fd 3.
struct origin_call {
  pid_t pid = -1;
  long long version = 0;
  std::string key;
};

struct proc {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
  std::string buf;
  std::vector<std::string> lines;
  bool dead = false;
};

class workers {
 public:
  workers(int n, const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) die("pipe2");
    origin_ = fds[0];
    for (int i = 0; i < n; ++i) procs_.push_back(spawn(args, fds[1]));
    ::close(fds[1]);
    until([&] { return count("ready") == procs_.size(); }, "workers ready");
  }
  workers(const workers&) = delete;
  workers& operator=(const workers&) = delete;
  ~workers() {
    for (auto& p : procs_) {
      if (!p.dead) {
        ::kill(p.pid, SIGCONT);
        (void)::write(p.in, "quit\n", 5);
      }
    }
    for (auto& p : procs_) {
      int status = 0;
      ::waitpid(p.pid, &status, 0);
      ::close(p.in);
      ::close(p.out);
    }
    ::close(origin_);
  }

  std::vector<proc>& procs() { return procs_; }
  proc& of(pid_t pid) {
    for (auto& p : procs_) {
      if (p.pid == pid) return p;
    }
    die("no such worker");
  }
  // Origin calls (pids) since the last reset_origins().
  const std::vector<pid_t>& origins() const { return origins_; }
  void reset_origins() { origins_.clear(); }
  // Every origin call since the workers started, in the order the pipe delivered them.
  const std::vector<origin_call>& calls() const { return calls_; }
  // Origin calls of `key` since the workers started.
  std::size_t calls_of(const std::string& key) const {
    return static_cast<std::size_t>(std::count_if(
        calls_.begin(), calls_.end(), [&](const origin_call& o) { return o.key == key; }));
  }
  // Sends a line to every live worker.
  void tell(const std::string& line) {
    for (auto& p : procs_) {
      if (!p.dead) (void)::write(p.in, (line + "\n").data(), line.size() + 1);
    }
  }
  // The latest line of one worker that starts with `prefix`, its fields.
  std::map<std::string, std::string> last_of(const proc& p, const std::string& prefix) const {
    for (auto it = p.lines.rbegin(); it != p.lines.rend(); ++it) {
      if (it->rfind(prefix, 0) == 0) return parse_words(*it, 1);
    }
    return {};
  }
  std::size_t count_of(const std::string& prefix) const { return count(prefix); }

  void round(const std::string& key, long load_ms) {
    ++round_;
    for (auto& p : procs_) {
      if (p.dead) continue;
      const std::string cmd = "round key=" + key + " load_ms=" + std::to_string(load_ms) + "\n";
      (void)::write(p.in, cmd.data(), cmd.size());
    }
  }
  std::size_t done_count() {
    std::size_t n = 0;
    for (auto& p : procs_) {
      if (!p.dead && dones(p) >= round_) ++n;
    }
    return n;
  }
  std::size_t alive() const {
    return static_cast<std::size_t>(
        std::count_if(procs_.begin(), procs_.end(), [](const proc& p) { return !p.dead; }));
  }
  bool round_done(const proc& p) const { return dones(p) >= round_; }
  // The latest "done" line's fields of one worker.
  std::map<std::string, std::string> last(const proc& p) const {
    for (auto it = p.lines.rbegin(); it != p.lines.rend(); ++it) {
      if (it->rfind("done ", 0) == 0) return parse_words(*it, 1);
    }
    return {};
  }
  void wait_round(const char* what) {
    until([&] { return done_count() == alive(); }, what);
    pump(ms(20));  // origin lines written just before the last load are in the pipe by now
  }
  void kill_hard(proc& p) {
    ::kill(p.pid, SIGKILL);
    p.dead = true;
  }

  template <class Pred>
  void until(Pred pred, const char* what, std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = clock_t_::now() + limit;
    while (!pred()) {
      if (clock_t_::now() > deadline) die(std::string("timed out waiting for ") + what);
      pump(ms(5));
    }
  }

 private:
  std::size_t count(const std::string& prefix) const {
    std::size_t n = 0;
    for (const auto& p : procs_) {
      for (const auto& l : p.lines) n += l.rfind(prefix, 0) == 0 ? 1 : 0;
    }
    return n;
  }
  static std::size_t dones(const proc& p) {
    return static_cast<std::size_t>(std::count_if(
        p.lines.begin(), p.lines.end(), [](const auto& l) { return l.rfind("done ", 0) == 0; }));
  }

  static proc spawn(const std::vector<std::string>& args, int origin_write) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) die("pipe2");
    std::vector<std::string> words = {self_exe(), "--worker"};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(origin_write, 3);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    (void)::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
    proc p;
    p.pid = pid;
    p.in = in[1];
    p.out = out[0];
    return p;
  }

  void pump(ms wait) {
    std::vector<pollfd> fds = {{origin_, POLLIN, 0}};
    for (auto& p : procs_) fds.push_back({p.dead ? -1 : p.out, POLLIN, 0});
    (void)::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    char b[4096];
    if ((fds[0].revents & POLLIN) != 0) {
      const ssize_t n = ::read(origin_, b, sizeof b);
      if (n > 0) origin_buf_.append(b, static_cast<std::size_t>(n));
      std::size_t eol = 0;
      while ((eol = origin_buf_.find('\n')) != std::string::npos) {
        // "O <pid> <version> <key>"
        std::istringstream in(origin_buf_.substr(2, eol - 2));
        origin_call o;
        in >> o.pid >> o.version >> o.key;
        origins_.push_back(o.pid);
        calls_.push_back(std::move(o));
        origin_buf_.erase(0, eol + 1);
      }
    }
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      if ((fds[i + 1].revents & POLLIN) == 0) continue;
      proc& p = procs_[i];
      for (;;) {
        const ssize_t n = ::read(p.out, b, sizeof b);
        if (n <= 0) break;
        p.buf.append(b, static_cast<std::size_t>(n));
      }
      std::size_t eol = 0;
      while ((eol = p.buf.find('\n')) != std::string::npos) {
        p.lines.push_back(p.buf.substr(0, eol));
        p.buf.erase(0, eol + 1);
      }
    }
  }

  std::vector<proc> procs_;
  int origin_ = -1;
  std::string origin_buf_;
  std::vector<pid_t> origins_;
  std::vector<origin_call> calls_;
  std::size_t round_ = 0;
};

std::vector<std::string> worker_args(const std::string& uri, const std::string& prefix,
                                     const std::string& mode, int threads,
                                     std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"uri=" + uri, "prefix=" + prefix, "mode=" + mode,
                                "threads=" + std::to_string(threads)};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
std::vector<std::string> worker_args(const server& s, const std::string& prefix,
                                     const std::string& mode, int threads,
                                     std::vector<std::string> more = {}) {
  return worker_args(s.uri(), prefix, mode, threads, std::move(more));
}

double max_latency(workers& w) {
  double m = 0;
  for (auto& p : w.procs()) {
    if (p.dead) continue;
    m = std::max(m, std::stod(w.last(p)["max_ms"]));
  }
  return m;
}
long errors_surfaced(workers& w) {
  long e = 0;
  for (auto& p : w.procs()) {
    if (!p.dead) e += std::stol(w.last(p)["err"]);
  }
  return e;
}
long sum_field(workers& w, const char* f) {
  long e = 0;
  for (auto& p : w.procs()) {
    if (!p.dead) e += std::stol(w.last(p)[f]);
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// 1. Origin calls per key per expiry.

void coalescing(server& s, bool quick) {
  std::printf("\n### Origin calls per key per expiry (200 ms origin, %d rounds each)\n\n",
              quick ? 2 : 5);
  std::printf(
      "| processes x threads | no coalescing | per-process groups | fleet | "
      "fleet p50 / max caller latency (ms) |\n|---|---:|---:|---:|---:|\n");
  const int rounds = quick ? 2 : 5;
  for (const auto& [n, t] : {std::pair{2, 16}, std::pair{8, 16}, std::pair{32, 4}}) {
    std::string cells[3];
    std::vector<double> lat;
    int mi = 0;
    for (const char* mode : {"naive", "group", "fleet"}) {
      workers w(n, worker_args(s, "coal-" + std::string(mode) + std::to_string(n), mode, t,
                               {"timeout_ms=500"}));
      std::size_t lo = SIZE_MAX;
      std::size_t hi = 0;
      for (int r = 0; r < rounds; ++r) {
        w.reset_origins();
        w.round(std::string("k").append(std::to_string(r)), 200);
        w.wait_round("a coalescing round");
        lo = std::min(lo, w.origins().size());
        hi = std::max(hi, w.origins().size());
        if (std::string(mode) == "fleet") lat.push_back(max_latency(w));
      }
      cells[mi++] = lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
    }
    std::sort(lat.begin(), lat.end());
    std::printf("| %d x %d | %s | %s | **%s** | %.0f / %.0f |\n", n, t, cells[0].c_str(),
                cells[1].c_str(), cells[2].c_str(), lat[lat.size() / 2], lat.back());
    std::fflush(stdout);
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Faults.

void faults(server& s, const std::string& bin) {
  std::printf(
      "\n### Faults (8 processes x 4 threads, lease_ttl 1 s, wait_slice 200 ms, "
      "redis_timeout 50 ms)\n\n");
  std::printf(
      "| scenario | origin calls | errors surfaced | stall / extra latency | notes |\n"
      "|---|---:|---:|---|---|\n");
  const std::vector<std::string> base = {"lease_ms=1000", "slice_ms=200", "max_wait_ms=60000"};
  constexpr int n = 8;
  constexpr int t = 4;
  {  // SIGKILL the leader mid-load
    workers w(n, worker_args(s, "f-kill", "fleet", t, base));
    w.round("k", 500);
    w.until([&] { return !w.origins().empty(); }, "a leader");
    const auto killed_at = clock_t_::now();
    w.kill_hard(w.of(w.origins()[0]));
    w.wait_round("survivors");
    const double stall = ms_since(killed_at);
    std::printf(
        "| leader SIGKILLed 0 ms into a 500 ms load | %zu | %ld | last survivor answered "
        "%.0f ms after the kill (bound: lease 1000 + slice 200 + load 500) | |\n",
        w.origins().size(), errors_surfaced(w), stall);
  }
  {  // SIGSTOP the leader past its lease, then SIGCONT
    workers w(n, worker_args(s, "f-stop", "fleet", t, base));
    w.round("k", 1500);
    w.until([&] { return !w.origins().empty(); }, "a leader");
    const pid_t paused = w.origins()[0];
    proc& p = w.of(paused);
    ::kill(paused, SIGSTOP);
    const auto stopped_at = clock_t_::now();
    w.until([&] { return w.done_count() == w.alive() - 1; }, "the others");
    const double others = ms_since(stopped_at);
    const pid_t second = w.origins().size() > 1 ? w.origins()[1] : 0;
    ::kill(paused, SIGCONT);
    w.wait_round("the paused leader");
    const auto bytes = s.get(sf::detail::fleet_names::of("f-stop", "k").value);
    const auto rec = bytes ? sf::detail::parse_record(*bytes, "string") : std::nullopt;
    const bool stale = rec && rec->payload == "v-" + std::to_string(paused);
    const bool fresh = rec && rec->payload == "v-" + std::to_string(second);
    std::printf(
        "| leader SIGSTOPped for its whole 1500 ms load, SIGCONTed after the others "
        "answered | %zu | %ld | others answered %.0f ms after the stop | stale "
        "overwrites: %d (stored value from the second leader: %s); the paused "
        "leader's fence_rejections: %s |\n",
        w.origins().size(), errors_surfaced(w), others, stale ? 1 : 0, fresh ? "yes" : "no",
        w.last(p)["fence_rejections"].c_str());
  }
  // Redis failing: each process's own calls, round after round (the breaker opens after 3).
  const auto failing = [&](const char* name, auto&& inject, auto&& lift) {
    workers w(n, worker_args(s, std::string("f-") + name, "fleet", t, {}));
    inject();
    std::string per_round;
    std::string extra;
    std::size_t calls = 0;
    long errs = 0;
    for (int r = 0; r < 5; ++r) {
      w.reset_origins();
      w.round("k" + std::to_string(r), 100);
      w.wait_round("a round against failing Redis");
      calls += w.origins().size();
      errs += errors_surfaced(w);
      per_round += (r == 0 ? "" : ", ") + std::to_string(w.origins().size());
      char b[32];
      std::snprintf(b, sizeof b, "%s%.0f", r == 0 ? "" : ", ", std::max(0.0, max_latency(w) - 100));
      extra += b;
    }
    lift();
    long opened = 0;
    for (auto& p : w.procs()) opened += std::stol(w.last(p)["breaker_opens"]) > 0 ? 1 : 0;
    std::printf(
        "| %s, 5 rounds | %s (N = %d; total %zu) | %ld | extra ms per round (max caller "
        "latency - 100 ms load): %s | breaker open in %ld of %d processes; %ld failed "
        "round trips in all |\n",
        name, per_round.c_str(), n, calls, errs, extra.c_str(), opened, n,
        sum_field(w, "redis_errors"));
  };
  failing(
      "Redis stopped", [&] { s.stop(); }, [&] { s.start(); });
  failing(
      "Redis frozen (SIGSTOP)", [&] { s.freeze(); }, [&] { s.thaw(); });
  failing(
      "CLIENT PAUSE ALL",
      [&] {
        s.run({"CLIENT", "PAUSE", "4000", "ALL"});
      },
      [&] { std::this_thread::sleep_for(ms(4000)); });  // UNPAUSE would wait it out too
  failing(
      "CLIENT PAUSE WRITE",
      [&] {
        s.run({"CLIENT", "PAUSE", "4000", "WRITE"});
      },
      [&] {
        s.run({"CLIENT", "UNPAUSE"});
      });
  {  // CLIENT KILL TYPE pubsub while the followers wait
    workers w(n, worker_args(s, "f-sub", "fleet", t, base));
    w.round("k", 800);
    w.until([&] { return !w.origins().empty(); }, "a leader");
    w.until(
        [&] {
          return s.integer({"PUBSUB", "NUMSUB",
                            sf::detail::fleet_names::of("f-sub", "k").channel}) == n - 1;
        },
        "followers subscribed");
    const long long killed = s.integer({"CLIENT", "KILL", "TYPE", "pubsub"});
    w.wait_round("followers after the kill");
    std::printf(
        "| subscriptions killed mid-wait (CLIENT KILL TYPE pubsub: %lld) | %zu | %ld | "
        "max caller latency %.0f ms for an 800 ms load | |\n",
        killed, w.origins().size(), errors_surfaced(w), max_latency(w));
  }
  (void)bin;
}

// ---------------------------------------------------------------------------------------------
// 3. Stores that fail, lost replies, ACLs, foreign data.

void stores(server& s) {
  std::printf(
      "\n### Stores that fail, lost replies, ACLs, foreign data (8 processes x 4 threads, "
      "lease_ttl 1 s, wait_slice 200 ms, redis_timeout 50 ms, 200 ms origin)\n\n");
  std::printf(
      "| scenario | origin calls | errors surfaced | max caller latency | notes |\n"
      "|---|---:|---:|---:|---|\n");
  const std::vector<std::string> base = {"lease_ms=1000", "slice_ms=200", "max_wait_ms=60000"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  constexpr int n = 8;
  constexpr int t = 4;
  {  // a value the server refuses to store
    s.run({"CONFIG", "SET", "proto-max-bulk-len", "1mb"});
    workers w(n, worker_args(s, "s-big", "fleet", t, with({"value_bytes=2097152"})));
    w.round("k", 200);
    w.wait_round("a value the server refuses");
    s.run({"CONFIG", "SET", "proto-max-bulk-len", "512mb"});
    std::printf(
        "| a 2 MiB value, proto-max-bulk-len 1 MB (the store is refused) | %zu | %ld | %.0f ms "
        "| the lease released at once; followers loaded for themselves (local_fallback %ld) "
        "|\n",
        w.origins().size(), errors_surfaced(w), max_latency(w), sum_field(w, "local_fallback"));
  }
  {  // a value over max_value_bytes
    workers w(
        n, worker_args(s, "s-max", "fleet", t, with({"value_bytes=4096", "max_value_bytes=1024"})));
    w.round("k", 200);
    w.wait_round("a value over max_value_bytes");
    std::printf(
        "| a 4 KiB value, max_value_bytes 1 KiB (not sent) | %zu | %ld | %.0f ms | "
        "oversized_values %ld, local_fallback %ld |\n",
        w.origins().size(), errors_surfaced(w), max_latency(w), sum_field(w, "oversized_values"),
        sum_field(w, "local_fallback"));
  }
  {  // one process's race reply held back past redis_timeout: the race runs later
    sftest::fault_proxy proxy(s.port());
    std::vector<std::string> via = worker_args(s, "s-phantom", "fleet", 1, base);
    via[0] = "uri=" + proxy.uri();
    workers a(1, via);
    workers b(n - 1, worker_args(s, "s-phantom", "fleet", t, base));
    a.round("warm", 0);  // the scripts are cached on the server
    a.wait_round("warm-up");
    a.reset_origins();
    proxy.hold_command("EVALSHA", ms(200));
    a.round("k", 200);  // its race times out after 50 ms; it loads for itself
    a.wait_round("the process whose race was held back");
    const bool lease_left =
        s.integer({"EXISTS", sf::detail::fleet_names::of("s-phantom", "k").lease}) == 1;
    b.round("k", 200);
    b.wait_round("the others, after the held race ran");
    std::printf(
        "| one process's race held back 200 ms by a proxy (past redis_timeout: it gives up, "
        "the race runs on the server later) | %zu + %zu | %ld | %.0f ms (the others) | lease "
        "left by the late race: %s |\n",
        a.origins().size(), b.origins().size(), errors_surfaced(a) + errors_surfaced(b),
        max_latency(b), lease_left ? "yes" : "none");
  }
  {  // an ACL user without channel rights
    s.run({"ACL", "SETUSER", "nochannels", "on", ">pw", "~*", "resetchannels", "+@all"});
    workers w(n, worker_args(s, "s-acl", "fleet", t, with({"user=nochannels", "password=pw"})));
    w.round("k", 200);
    w.wait_round("an ACL user without channel rights");
    std::printf(
        "| an ACL user without channel rights (no message wakes a follower) | %zu | %ld | %.0f "
        "ms (load + at most wait_slice) | redis_errors %ld, publish_failures %ld |\n",
        w.origins().size(), errors_surfaced(w), max_latency(w), sum_field(w, "redis_errors"),
        sum_field(w, "publish_failures"));
  }
  {  // a foreign value (a hash, no expiry) under the lease name
    s.run({"HSET", sf::detail::fleet_names::of("s-foreign", "k").lease, "not", "a lease"});
    workers w(n, worker_args(s, "s-foreign", "fleet", t, base));
    w.round("k", 200);
    w.wait_round("a foreign value under the lease name");
    std::printf(
        "| a hash without expiry under the lease name | %zu | %ld | %.0f ms | taken over by the "
        "race |\n",
        w.origins().size(), errors_surfaced(w), max_latency(w));
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Cost of a hit and of a miss.

// Counts the commands clients send (round trips), by name, through MONITOR; commands run
// inside scripts (MONITOR's "[0 lua]" lines) are not round trips and are left out.
class monitor {
 public:
  explicit monitor(int port) {
    c_ = redisConnect("127.0.0.1", port);
    if (c_ == nullptr || c_->err != 0) die("monitor: connect");
    freeReplyObject(redisCommand(c_, "MONITOR"));
    thread_ = std::thread([this] { run(); });
  }
  monitor(const monitor&) = delete;
  monitor& operator=(const monitor&) = delete;
  ~monitor() {
    stop_ = true;
    thread_.join();
    redisFree(c_);
  }
  // Waits until the marker sent through `s` has been seen, then returns the counts so far.
  std::map<std::string, long> counts(server& s) {
    return counts_after([&](const std::string& marker) { s.run({"ECHO", marker}); });
  }
  // The same, the marker sent by echo(marker) to the monitored server.
  template <class Echo>
  std::map<std::string, long> counts_after(Echo echo) {
    const std::string marker = "marker-" + std::to_string(++markers_);
    echo(marker);
    const auto until = clock_t_::now() + std::chrono::seconds(10);
    for (;;) {
      {
        const std::lock_guard<std::mutex> lk(mu_);
        if (seen_.count(marker) != 0) return counts_;
      }
      if (clock_t_::now() > until) die("monitor: marker not seen");
      std::this_thread::sleep_for(ms(1));
    }
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{c_->fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      if (redisBufferRead(c_) != REDIS_OK) return;
      void* r = nullptr;
      while (redisGetReplyFromReader(c_, &r) == REDIS_OK && r != nullptr) {
        const auto* reply = static_cast<redisReply*>(r);
        if (reply->str != nullptr) take(std::string(reply->str, reply->len));
        freeReplyObject(r);
      }
    }
  }
  void take(const std::string& line) {
    if (line.find(" lua] ") != std::string::npos) return;
    const auto q = line.find('"');
    if (q == std::string::npos) return;
    const auto q2 = line.find('"', q + 1);
    std::string cmd = line.substr(q + 1, q2 - q - 1);
    for (char& ch : cmd) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    const std::lock_guard<std::mutex> lk(mu_);
    if (cmd == "ECHO") {
      const auto a = line.find('"', q2 + 1);
      seen_[line.substr(a + 1, line.find('"', a + 1) - a - 1)] = true;
      return;
    }
    counts_[cmd] += 1;
  }
  redisContext* c_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, long> counts_;
  std::map<std::string, bool> seen_;
  int markers_ = 0;
};

// Runs body(pass, i) for i < calls twice: once under MONITOR (the round trips), once without
// it (the time per call, MONITOR slowing the server down). Returns {counts per call, µs}.
template <class Body>
std::pair<std::map<std::string, long>, double> measure(server& s, int port, int calls, Body body) {
  std::map<std::string, long> per;
  {
    monitor m(port);
    const auto before = m.counts(s);
    for (int i = 0; i < calls; ++i) body(0, i);
    const auto after = m.counts(s);
    for (const auto& [k, v] : after) {
      const long d = v - (before.count(k) != 0 ? before.at(k) : 0);
      if (d != 0) per[k] = d;
    }
  }
  const auto t0 = clock_t_::now();
  for (int i = 0; i < calls; ++i) body(1, i);
  return {per, ms_since(t0) * 1000 / calls};
}

std::string show(const std::map<std::string, long>& counts, long calls) {
  std::string out;
  double total = 0;
  for (const auto& [k, v] : counts) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.2f", out.empty() ? "" : ", ", k.c_str(),
                  static_cast<double>(v) / static_cast<double>(calls));
    out += buf;
    total += static_cast<double>(v) / static_cast<double>(calls);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "**%.2f**: ", total);
  std::string head(buf);  // not `buf + out`: GCC 12 -O3 warns (-Wrestrict, a false positive)
  head += out;
  return head;
}

// One leader / follower pair on a key of its own: `leader` loads it for 30 ms; once that load
// runs, `follower` (another fleet: another process's) gets the key. On the measured pass
// (pass 1), how long after the leader's get() returned the follower's did, in µs, into `wakes`.
void follower_pair(sf::fleet<std::string, std::string>& leader,
                   sf::fleet<std::string, std::string>& follower, int pass, int i,
                   std::vector<double>& wakes) {
  const std::string key = "pair" + std::to_string(pass) + ":" + std::to_string(i);
  std::atomic<bool> loading{false};
  clock_t_::time_point leader_done;
  std::jthread a([&] {
    (void)leader.get(key, [&] {
      loading = true;
      std::this_thread::sleep_for(ms(30));
      return std::string("v");
    });
    leader_done = clock_t_::now();
  });
  while (!loading) std::this_thread::yield();
  (void)follower.get(key, [] { return std::string("dup"); });
  const auto follower_done = clock_t_::now();
  a.join();
  if (pass == 1) {
    wakes.push_back(std::chrono::duration<double, std::micro>(follower_done - leader_done).count());
  }
}

void costs(server& s) {
  std::printf(
      "\n### Cost of a hit and of a miss (round trips: the commands clients sent, seen "
      "by MONITOR; times measured in a second pass without it)\n\n"
      "| path | round trips per call | time per call |\n|---|---|---:|\n");
  const int port = std::stoi(s.uri().substr(s.uri().rfind(':') + 1));
  sf::fleet_options o;
  o.redis_uri = s.uri();
  o.key_prefix = "cost";
  o.redis_timeout = ms(500);
  {
    sf::fleet<std::string, std::string> f(o);
    (void)f.get("hot", [] { return std::string(100, 'x'); });
    constexpr int hits = 5000;
    const auto [counts, unused] =
        measure(s, port, hits, [&](int, int) { (void)f.get("hot", [] { return std::string(); }); });
    // Time: the fleet and the floor (the same GET through a bare hiredis connection) in
    // alternating blocks of 100 calls, so that both see the same machine; medians of blocks.
    redisContext* c = redisConnect("127.0.0.1", port);
    std::vector<double> fleet_blocks;
    std::vector<double> raw_blocks;
    for (int b = 0; b < 50; ++b) {
      auto t0 = clock_t_::now();
      for (int i = 0; i < 100; ++i) (void)f.get("hot", [] { return std::string(); });
      fleet_blocks.push_back(ms_since(t0) * 10);  // µs per call
      t0 = clock_t_::now();
      for (int i = 0; i < 100; ++i) freeReplyObject(redisCommand(c, "GET %s", "{cost:hot}:v"));
      raw_blocks.push_back(ms_since(t0) * 10);
    }
    redisFree(c);
    std::sort(fleet_blocks.begin(), fleet_blocks.end());
    std::sort(raw_blocks.begin(), raw_blocks.end());
    const double t = fleet_blocks[fleet_blocks.size() / 2];
    const double raw = raw_blocks[raw_blocks.size() / 2];
    (void)unused;
    std::printf(
        "| hit (fleet.get, 100-byte value) | %s | %.1f µs; a bare hiredis GET %.1f µs "
        "(%.2fx; medians of 50 alternating blocks of 100) |\n",
        show(counts, hits).c_str(), t, raw, t / raw);
  }
  std::map<std::string, long> leader_counts;
  constexpr int misses = 200;
  {
    sf::fleet<std::string, std::string> f(o);
    const auto [counts, t] = measure(s, port, misses, [&](int pass, int i) {
      (void)f.get("cold" + std::to_string(pass) + ":" + std::to_string(i),
                  [] { return std::string("v"); });
    });
    leader_counts = counts;
    std::printf("| miss, leader (origin returns at once) | %s | %.1f µs + the load |\n",
                show(counts, misses).c_str(), t);
  }
  {
    sf::fleet<std::string, std::string> leader(o);
    sf::fleet<std::string, std::string> follower(o);
    constexpr int pairs = 50;
    std::vector<double> wakes;
    const auto [counts, t] = measure(
        s, port, pairs, [&](int pass, int i) { follower_pair(leader, follower, pass, i, wakes); });
    (void)t;
    std::sort(wakes.begin(), wakes.end());
    // The follower's share: the pair's commands minus what one leader alone costs (above).
    auto follower_counts = counts;
    for (const auto& [k, v] : leader_counts) {
      follower_counts[k] -= v / misses * pairs;
      if (follower_counts[k] == 0) follower_counts.erase(k);
    }
    std::printf(
        "| miss, follower in another process (leader loading 30 ms) | %s (SUBSCRIBE and "
        "UNSUBSCRIBE on the subscriber's connection) | returns %.0f µs (median; p90 %.0f "
        "µs) after the leader's get() |\n",
        show(follower_counts, pairs).c_str(), wakes[wakes.size() / 2],
        wakes[wakes.size() * 9 / 10]);
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Redis Cluster (--cluster).

// A redis-server connection of the driver's own (one cluster node).
class node_conn {
 public:
  explicit node_conn(int port) : c_(redisConnectWithTimeout("127.0.0.1", port, timeval{2, 0})) {
    if (c_ == nullptr || c_->err != 0)
      die("cannot connect to cluster node " + std::to_string(port));
    redisSetTimeout(c_, timeval{10, 0});  // MIGRATE's own timeout is 5 s
  }
  node_conn(const node_conn&) = delete;
  node_conn& operator=(const node_conn&) = delete;
  ~node_conn() { redisFree(c_); }
  redisReply* cmd(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return static_cast<redisReply*>(
        redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data()));
  }
  void run(const std::vector<std::string>& args) {
    redisReply* r = cmd(args);
    if (r == nullptr) die("cluster node command failed");
    freeReplyObject(r);
  }
  redisContext* raw() const { return c_; }

 private:
  redisContext* c_;
};

// 3 masters, no replica, started by tests/support/redis_cluster.sh in a temporary directory
// (free loopback ports; cluster-require-full-coverage no: a master that is down costs its own
// slots only) and stopped by the same script, by pid.
class cluster {
 public:
  explicit cluster(const std::string& script, int replicas = 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fleet-cluster.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) die("mkdtemp");
    dir_ = tmpl + "/nodes";
    ::unsetenv("SINGLEFLIGHT_TEST_REDIS_CLUSTER");  // the script would start nothing
    cluster_stop_command = "'" + script + "' stop '" + dir_ + "' >&2; rmdir '" + tmpl + "'";
    if (std::system(("'" + script + "' start '" + dir_ + "' " + std::to_string(replicas) + " >&2")
                        .c_str()) != 0) {
      die("the cluster did not start (" + script + ")");
    }
    std::FILE* f = std::fopen((dir_ + "/uri").c_str(), "r");
    char buf[256] = {};
    if (f == nullptr || std::fgets(buf, sizeof buf, f) == nullptr) {
      die("the cluster script wrote no URI: are redis-server and redis-cli (>= 7.0) on PATH?");
    }
    std::fclose(f);
    uri_ = buf;
    while (!uri_.empty() && (uri_.back() == '\n' || uri_.back() == '\r')) uri_.pop_back();
    seed_ = std::stoi(uri_.substr(uri_.rfind(':') + 1));
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().extension() == ".pid") nodes_.push_back(std::stoi(e.path().stem().string()));
    }
    std::sort(nodes_.begin(), nodes_.end());
    refresh();
    if (masters_.size() != 3) die("expected 3 masters");
  }
  // Reads the slot map again (CLUSTER SLOTS on the first node that answers): owner(),
  // masters() and key_on() follow a reshard or a failover.
  void refresh() {
    for (const int port : nodes_) {
      if (role(port) != "master") continue;
      node_conn c(port);
      redisReply* r = c.cmd({"CLUSTER", "SLOTS"});
      if (r == nullptr || r->type != REDIS_REPLY_ARRAY) {
        if (r != nullptr) freeReplyObject(r);
        continue;
      }
      ranges_.clear();
      masters_.clear();
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        ranges_.push_back({e->element[0]->integer, e->element[1]->integer,
                           static_cast<int>(e->element[2]->element[1]->integer)});
        if (std::find(masters_.begin(), masters_.end(), ranges_.back().port) == masters_.end()) {
          masters_.push_back(ranges_.back().port);
        }
      }
      freeReplyObject(r);
      std::sort(masters_.begin(), masters_.end());
      return;
    }
    die("no master answered CLUSTER SLOTS");
  }
  // Every node's port (masters and replicas), and every node as a seed list.
  const std::vector<int>& nodes() const { return nodes_; }
  std::string seeds() const {
    std::string out = "tcp://";
    for (const int p : nodes_)
      out += (out.size() > 6 ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(p);
    return out;
  }
  // INFO replication of a node: "master", "slave" (in sync with a master: link up, no sync in
  // progress), "syncing" (a replica not in sync yet), "" (no answer within 200 ms).
  static std::string role(int port) {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{0, 200000});
    std::string out;
    if (c != nullptr && c->err == 0) {
      redisSetTimeout(c, timeval{0, 200000});
      auto* r = static_cast<redisReply*>(redisCommand(c, "INFO replication"));
      if (r != nullptr && r->type == REDIS_REPLY_STRING) {
        const std::string info(r->str, r->len);
        if (info.find("role:master") != std::string::npos) {
          out = "master";
        } else {
          out = info.find("master_link_status:up") != std::string::npos &&
                        info.find("master_sync_in_progress:0") != std::string::npos
                    ? "slave"
                    : "syncing";
        }
      }
      if (r != nullptr) freeReplyObject(r);
    }
    if (c != nullptr) redisFree(c);
    return out;
  }
  // The replica of the master at `port` (its INFO replication's slave0), or -1.
  static int replica_of(int port) {
    node_conn c(port);
    redisReply* r = c.cmd({"INFO", "replication"});
    int out = -1;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      const std::string info(r->str, r->len);
      const auto at = info.find("slave0:");
      const auto p = info.find("port=", at);
      if (at != std::string::npos && p != std::string::npos) out = std::stoi(info.substr(p + 5));
    }
    if (r != nullptr) freeReplyObject(r);
    return out;
  }
  // Starts the node at `port` again after kill_node() (its config file, so it rejoins the
  // cluster; a master that was failed over comes back as a replica), as the script does.
  void restart(int port) {
    const std::string p = std::to_string(port);
    const std::string cmd = "redis-server --port " + p +
                            " --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file '" +
                            dir_ + "/nodes-" + p +
                            ".conf' --cluster-node-timeout 1000 --repl-diskless-sync-delay 0 "
                            "--shutdown-timeout 0 --cluster-require-full-coverage no --save '' "
                            "--appendonly no --daemonize yes --pidfile '" +
                            dir_ + "/" + p + ".pid' --logfile '" + dir_ + "/" + p +
                            ".log' --dir '" + dir_ + "' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) die("could not restart node " + p);
  }
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;
  ~cluster() {
    (void)std::system(cluster_stop_command.c_str());
    cluster_stop_command.clear();
  }

  std::string uri() const { return uri_; }
  int seed() const { return seed_; }
  const std::vector<int>& masters() const { return masters_; }
  // A master other than the seed (the n-th).
  int other(int n) const {
    std::vector<int> o;
    for (const int p : masters_) {
      if (p != seed_) o.push_back(p);
    }
    return o[static_cast<std::size_t>(n) % o.size()];
  }
  // The master of a Redis name's slot (the map read at start).
  int owner(const std::string& name) const {
    const auto slot = static_cast<long long>(sf::detail::cluster_slot(name));
    for (const auto& r : ranges_) {
      if (r.first <= slot && slot <= r.last) return r.port;
    }
    die("slot not covered");
  }
  // A fleet key (under `prefix`) whose names live on the master at `port`.
  std::string key_on(const std::string& prefix, int port, const std::string& stem) const {
    for (int i = 0;; ++i) {
      std::string k = stem + std::to_string(i);
      if (owner(sf::detail::fleet_names::of(prefix, k).value) == port) return k;
    }
  }
  // A fleet key (under `prefix`) whose names hash to `slot`.
  static std::string key_in_slot(const std::string& prefix, std::size_t slot,
                                 const std::string& stem) {
    for (int i = 0;; ++i) {
      std::string k = stem + std::to_string(i);
      if (sf::detail::cluster_slot(sf::detail::fleet_names::of(prefix, k).value) == slot) return k;
    }
  }
  // SIGKILL the master at `port` (its pidfile: the script's).
  void kill_node(int port) {
    std::FILE* f = std::fopen((dir_ + "/" + std::to_string(port) + ".pid").c_str(), "r");
    long pid = 0;
    if (f == nullptr || std::fscanf(f, "%ld", &pid) != 1 || pid <= 0) die("no pid for a node");
    std::fclose(f);
    ::kill(static_cast<pid_t>(pid), SIGKILL);
  }

 private:
  struct range {
    long long first;
    long long last;
    int port;
  };
  std::string dir_;
  std::string uri_;
  int seed_ = 0;
  std::vector<int> nodes_;
  std::vector<range> ranges_;
  std::vector<int> masters_;
};

// Round trips of `calls` calls of body(pass, i) as every master's MONITOR sees them (pass 0),
// and the time per call of a second pass without it (pass 1).
template <class Body>
std::pair<std::map<std::string, long>, double> measure_cluster(const cluster& c, int calls,
                                                               Body body) {
  std::map<std::string, long> per;
  {
    std::vector<std::unique_ptr<monitor>> mons;
    std::vector<std::unique_ptr<node_conn>> echo;
    for (const int p : c.masters()) {
      mons.push_back(std::make_unique<monitor>(p));
      echo.push_back(std::make_unique<node_conn>(p));
    }
    const auto all = [&] {
      std::map<std::string, long> sum;
      for (std::size_t i = 0; i < mons.size(); ++i) {
        for (const auto& [k, v] : mons[i]->counts_after([&](const std::string& m) {
               echo[i]->run({"ECHO", m});
             })) {
          sum[k] += v;
        }
      }
      return sum;
    };
    const auto before = all();
    for (int i = 0; i < calls; ++i) body(0, i);
    const auto after = all();
    for (const auto& [k, v] : after) {
      const long d = v - (before.count(k) != 0 ? before.at(k) : 0);
      if (d != 0) per[k] = d;
    }
  }
  const auto t0 = clock_t_::now();
  for (int i = 0; i < calls; ++i) body(1, i);
  return {per, ms_since(t0) * 1000 / calls};
}

void cluster_coalescing(const cluster& c, bool quick) {
  const int rounds = quick ? 3 : 6;
  std::printf(
      "\n### Redis Cluster: origin calls per key per expiry (3 masters, the fleet pointed at one; "
      "200 ms origin, %d rounds each, each round's key on the next master)\n\n",
      rounds);
  std::printf(
      "| processes x threads | fleet origin calls per key | errors surfaced | Redis errors / "
      "local loads | fleet p50 / max caller latency (ms) |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [n, t] : {std::pair{2, 16}, std::pair{8, 16}, std::pair{32, 4}}) {
    const std::string prefix = "ccoal-" + std::to_string(n);
    workers w(n, worker_args(c.uri(), prefix, "fleet", t, {"timeout_ms=500"}));
    std::size_t lo = SIZE_MAX;
    std::size_t hi = 0;
    long errs = 0;
    std::vector<double> lat;
    for (int r = 0; r < rounds; ++r) {
      const int port = c.masters()[static_cast<std::size_t>(r) % 3];
      w.reset_origins();
      w.round(c.key_on(prefix, port, "k" + std::to_string(r) + "-"), 200);
      w.wait_round("a cluster coalescing round");
      lo = std::min(lo, w.origins().size());
      hi = std::max(hi, w.origins().size());
      errs += errors_surfaced(w);
      lat.push_back(max_latency(w));
    }
    std::sort(lat.begin(), lat.end());
    const std::string cell =
        lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
    std::printf("| %d x %d | **%s** | %ld | %ld / %ld | %.0f / %.0f |\n", n, t, cell.c_str(), errs,
                sum_field(w, "redis_errors"), sum_field(w, "local_fallback"), lat[lat.size() / 2],
                lat.back());
    std::fflush(stdout);
  }
}

void cluster_costs(const cluster& c) {
  std::printf(
      "\n### Redis Cluster: cost of a hit and of a miss (round trips seen by MONITOR on every "
      "master; times in a second pass without it)\n\n"
      "| path | round trips per call | time per call |\n|---|---|---:|\n");
  sf::fleet_options o;
  o.redis_uri = c.uri();
  o.key_prefix = "ccost";
  o.redis_timeout = ms(500);
  const int owner = c.other(0);  // a master the fleet is not pointed at
  {
    sf::fleet<std::string, std::string> f(o);
    const std::string key = c.key_on(o.key_prefix, owner, "hot");
    (void)f.get(key, [] { return std::string(100, 'x'); });  // stored; the map learnt
    constexpr int hits = 5000;
    const auto [counts, unused] =
        measure_cluster(c, hits, [&](int, int) { (void)f.get(key, [] { return std::string(); }); });
    (void)unused;
    node_conn bare(owner);
    const std::string name = sf::detail::fleet_names::of(o.key_prefix, key).value;
    std::vector<double> fleet_blocks;
    std::vector<double> raw_blocks;
    for (int b = 0; b < 50; ++b) {
      auto t0 = clock_t_::now();
      for (int i = 0; i < 100; ++i) (void)f.get(key, [] { return std::string(); });
      fleet_blocks.push_back(ms_since(t0) * 10);
      t0 = clock_t_::now();
      for (int i = 0; i < 100; ++i) {
        freeReplyObject(redisCommand(bare.raw(), "GET %b", name.data(), name.size()));
      }
      raw_blocks.push_back(ms_since(t0) * 10);
    }
    std::sort(fleet_blocks.begin(), fleet_blocks.end());
    std::sort(raw_blocks.begin(), raw_blocks.end());
    const double t = fleet_blocks[fleet_blocks.size() / 2];
    const double raw = raw_blocks[raw_blocks.size() / 2];
    std::printf(
        "| hit (fleet.get, 100-byte value on a master the fleet is not pointed at) | %s | %.1f "
        "µs; a bare hiredis GET on that master %.1f µs (%.2fx; medians of 50 alternating blocks "
        "of 100) |\n",
        show(counts, hits).c_str(), t, raw, t / raw);
  }
  std::map<std::string, long> leader_counts;
  constexpr int misses = 200;
  {
    sf::fleet<std::string, std::string> f(o);
    (void)f.get(c.key_on(o.key_prefix, owner, "warm"), [] { return std::string("v"); });
    const auto [counts, t] = measure_cluster(c, misses, [&](int pass, int i) {
      (void)f.get("cold" + std::to_string(pass) + ":" + std::to_string(i),
                  [] { return std::string("v"); });
    });
    leader_counts = counts;
    std::printf(
        "| miss, leader (origin returns at once; keys on all 3 masters) | %s | %.1f µs + the "
        "load |\n",
        show(counts, misses).c_str(), t);
  }
  {
    sf::fleet<std::string, std::string> leader(o);
    sf::fleet<std::string, std::string> follower(o);
    for (auto* f : {&leader, &follower}) {
      (void)f->get(c.key_on(o.key_prefix, owner, "warm"), [] { return std::string("v"); });
    }
    constexpr int pairs = 50;
    std::vector<double> wakes;
    const auto [counts, t] = measure_cluster(
        c, pairs, [&](int pass, int i) { follower_pair(leader, follower, pass, i, wakes); });
    (void)t;
    std::sort(wakes.begin(), wakes.end());
    auto follower_counts = counts;
    for (const auto& [k, v] : leader_counts) {
      follower_counts[k] -= v / misses * pairs;
      if (follower_counts[k] == 0) follower_counts.erase(k);
    }
    std::printf(
        "| miss, follower in another process (leader loading 30 ms) | %s (SSUBSCRIBE and "
        "SUNSUBSCRIBE on the fleet's subscriber connection to the key's master) | "
        "returns %.0f µs (median; p90 %.0f µs) after the leader's get() |\n",
        show(follower_counts, pairs).c_str(), wakes[wakes.size() / 2],
        wakes[wakes.size() * 9 / 10]);
  }
}

void cluster_faults(cluster& c) {
  std::printf(
      "\n### Redis Cluster: faults (8 processes x 4 threads, lease_ttl 1 s, wait_slice 200 ms, "
      "redis_timeout 50 ms)\n\n"
      "| scenario | origin calls | errors surfaced | stall / extra latency | notes |\n"
      "|---|---:|---:|---|---|\n");
  const std::vector<std::string> base = {"lease_ms=1000", "slice_ms=200", "max_wait_ms=60000"};
  constexpr int n = 8;
  constexpr int t = 4;
  {  // SIGKILL the leader mid-load; the key on a master the fleet is not pointed at
    const std::string prefix = "cf-kill";
    workers w(n, worker_args(c.uri(), prefix, "fleet", t, base));
    w.round(c.key_on(prefix, c.other(0), "warm"), 0);  // the map learnt
    w.wait_round("warm-up");
    w.reset_origins();
    w.round(c.key_on(prefix, c.other(0), "k"), 500);
    w.until([&] { return !w.origins().empty(); }, "a leader");
    const auto killed_at = clock_t_::now();
    w.kill_hard(w.of(w.origins()[0]));
    w.wait_round("survivors");
    std::printf(
        "| leader SIGKILLed 0 ms into a 500 ms load (key on a master the fleet is not "
        "pointed at) | **%zu** | %ld | last survivor answered %.0f ms after the kill (bound: "
        "lease 1000 + slice 200 + load 500) | |\n",
        w.origins().size(), errors_surfaced(w), ms_since(killed_at));
  }
  {  // One master SIGKILLed (no replica): its keys load locally, the others' keep coalescing.
    const std::string prefix = "cf-down";
    const int victim = c.other(0);
    const int live = c.other(1);
    workers w(n, worker_args(c.uri(), prefix, "fleet", t, base));
    w.round(c.key_on(prefix, live, "warm"), 0);
    w.wait_round("warm-up");
    c.kill_node(victim);
    std::string dead_calls;
    std::string live_calls;
    std::string dead_extra;
    std::string live_extra;
    long dead_errs = 0;
    long live_errs = 0;
    for (int r = 0; r < 5; ++r) {
      for (const bool dead : {true, false}) {
        w.reset_origins();
        w.round(c.key_on(prefix, dead ? victim : live, "k" + std::to_string(r) + "-"), 100);
        w.wait_round("a round with a master down");
        std::string& calls = dead ? dead_calls : live_calls;
        std::string& extra = dead ? dead_extra : live_extra;
        calls += (r == 0 ? "" : ", ") + std::to_string(w.origins().size());
        char b[32];
        std::snprintf(b, sizeof b, "%s%.0f", r == 0 ? "" : ", ",
                      std::max(0.0, max_latency(w) - 100));
        extra += b;
        (dead ? dead_errs : live_errs) += errors_surfaced(w);
      }
    }
    long opened = 0;
    for (auto& p : w.procs()) opened += std::stol(w.last(p)["breaker_opens"]) > 0 ? 1 : 0;
    std::printf(
        "| one master SIGKILLed (no replica): its keys, 5 rounds | %s (N = %d) | %ld | extra ms "
        "per round (max caller latency - 100 ms load): %s | that node's breaker open in %ld of "
        "%d processes; %ld failed round trips in all |\n",
        dead_calls.c_str(), n, dead_errs, dead_extra.c_str(), opened, n,
        sum_field(w, "redis_errors"));
    std::printf(
        "| the same rounds, keys of another master | **%s** | %ld | extra ms per round: %s | "
        "|\n",
        live_calls.c_str(), live_errs, live_extra.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// 6. Redis Cluster trials (--cluster --trials N): a reshard, a forced failover, a master
// SIGKILLed, each N times, on a cluster of 3 masters with one replica each.

// What the driver's watcher saw of one key's record: every master and replica polled (GET,
// every 2 ms; a node that does not own the slot answers MOVED or ASK, a dead one nothing).
struct record_watch {
  long long max_fence = 0;
  long long max_version = 0;
  long long final_fence = 0;
  long long final_version = 0;
  long went_back = 0;  // a record read after one with a higher fence: a stale overwrite
};

// A record's fence and the origin version in its payload ("SF1|v|tag|fence|gen|sum|v<ver>-pid").
std::optional<std::pair<long long, long long>> parse_record(const std::string& rec) {
  std::size_t at = 0;
  std::vector<std::string> f;
  for (int i = 0; i < 6; ++i) {
    const auto bar = rec.find('|', at);
    if (bar == std::string::npos) return std::nullopt;
    f.push_back(rec.substr(at, bar - at));
    at = bar + 1;
  }
  if (f[0] != "SF1" || f[1] != "v" || at >= rec.size() || rec[at] != 'v') return std::nullopt;
  return std::pair{std::atoll(f[3].c_str()), std::atoll(rec.c_str() + at + 1)};
}

// Polls `name` on every node until stop, then once more (the final record: the one on the
// node that answers the GET with a value).
class watcher {
 public:
  watcher(std::vector<int> ports, std::string name)
      : ports_(std::move(ports)),
        name_(std::move(name)),
        conns_(ports_.size()),
        retry_(ports_.size()),
        thread_([this] { run(); }) {}
  watcher(const watcher&) = delete;
  watcher& operator=(const watcher&) = delete;
  ~watcher() { finish(); }
  record_watch finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (auto* c : conns_) {
      if (c != nullptr) redisFree(c);
    }
    conns_.assign(conns_.size(), nullptr);
    return w_;
  }

 private:
  void pass(bool last) {
    bool found = false;
    for (std::size_t i = 0; i < ports_.size(); ++i) {
      if (conns_[i] == nullptr) {
        if (clock_t_::now() < retry_[i]) continue;
        retry_[i] = clock_t_::now() + ms(200);
        redisContext* c = redisConnectWithTimeout("127.0.0.1", ports_[i], timeval{0, 50000});
        if (c == nullptr || c->err != 0) {
          if (c != nullptr) redisFree(c);
          continue;
        }
        redisSetTimeout(c, timeval{0, 100000});
        conns_[i] = c;
      }
      auto* r =
          static_cast<redisReply*>(redisCommand(conns_[i], "GET %b", name_.data(), name_.size()));
      if (r == nullptr) {
        redisFree(conns_[i]);
        conns_[i] = nullptr;
        continue;
      }
      if (r->type == REDIS_REPLY_STRING) {
        if (const auto rec = parse_record(std::string(r->str, r->len))) {
          if (rec->first < w_.max_fence) ++w_.went_back;
          w_.max_fence = std::max(w_.max_fence, rec->first);
          w_.max_version = std::max(w_.max_version, rec->second);
          if (last && !found) {
            found = true;
            w_.final_fence = rec->first;
            w_.final_version = rec->second;
          }
        }
      }
      freeReplyObject(r);
    }
  }
  void run() {
    while (!stop_.load()) {
      pass(false);
      std::this_thread::sleep_for(ms(2));  // the polling period
    }
    std::fill(retry_.begin(), retry_.end(), clock_t_::time_point{});
    pass(true);
  }
  std::vector<int> ports_;
  std::string name_;
  std::vector<redisContext*> conns_;
  std::vector<clock_t_::time_point> retry_;
  record_watch w_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

enum class cluster_event { reshard, force, kill };

struct trial_result {
  std::size_t calls = 0;  // origin calls of the hot key
  long errors = 0;        // surfaced to callers: hammer and probes
  long fence_rejections = 0;
  long stale = 0;           // records replaced by an older fence (watcher), final included
  bool diverged = false;    // a caller's last read is not the record Redis holds at the end
  double event_ms = 0;      // the event, start to end
  double coalesced_ms = 0;  // the last probe that did not coalesce ended (0: every one did)
  double max_ms = 0;        // the hot key callers' worst latency
  std::string error;        // the first error a caller saw
  long local_loads = 0;     // the workers' local_fallback (hot key and probes)
  std::string why;          // the workers' counters over the trial (hot key and probes): where
                            // its origin calls came from
};

// The fleet_stats counters a trial's "hammered" lines report, summed over the workers as
// deltas: why a trial cost more origin calls than a leader before and one after the event.
constexpr const char* trial_counters[] = {
    "leader",        "local_fallback", "failover_waits", "failover_expired", "failover_no_replica",
    "local_not_run", "local_unshared", "local_max_wait", "redis_errors"};

// Waits (bounded) until `pred`; false on the deadline.
template <class Pred>
bool wait_for(Pred pred, ms limit) {
  const auto deadline = clock_t_::now() + limit;
  while (!pred()) {
    if (clock_t_::now() > deadline) return false;
    std::this_thread::sleep_for(ms(20));  // polling the cluster's state
  }
  return true;
}

// Moves `slot` from the master at `a` to the master at `b` (the steps of redis-cli --cluster
// reshard, one key at a time); "" or what failed.
std::string reshard(const cluster& c, std::size_t slot, int a, int b) {
  node_conn ac(a);
  node_conn bc(b);
  const auto str = [](node_conn& n, const std::vector<std::string>& args) {
    redisReply* r = n.cmd(args);
    std::string out = r == nullptr        ? "(no reply)"
                      : r->str != nullptr ? std::string(r->str, r->len)
                                          : "";
    if (r != nullptr && r->type == REDIS_REPLY_INTEGER) out = std::to_string(r->integer);
    if (r != nullptr) freeReplyObject(r);
    return out;
  };
  const std::string a_id = str(ac, {"CLUSTER", "MYID"});
  const std::string b_id = str(bc, {"CLUSTER", "MYID"});
  const std::string st = std::to_string(slot);
  if (str(bc, {"CLUSTER", "SETSLOT", st, "IMPORTING", a_id}) != "OK") return "IMPORTING";
  if (str(ac, {"CLUSTER", "SETSLOT", st, "MIGRATING", b_id}) != "OK") return "MIGRATING";
  for (int i = 0; i < 1000; ++i) {
    redisReply* r = ac.cmd({"CLUSTER", "GETKEYSINSLOT", st, "100"});
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY) return "GETKEYSINSLOT";
    std::vector<std::string> keys;
    for (std::size_t k = 0; k < r->elements; ++k) {
      keys.emplace_back(r->element[k]->str, r->element[k]->len);
    }
    freeReplyObject(r);
    if (keys.empty()) break;
    for (const auto& k : keys) {
      const std::string m = str(ac, {"MIGRATE", "127.0.0.1", std::to_string(b), k, "0", "5000"});
      if (m != "OK" && m != "NOKEY") return "MIGRATE: " + m;
    }
  }
  std::vector<int> order = {b, a};
  for (const int p : c.masters()) {
    if (p != a && p != b) order.push_back(p);
  }
  for (const int p : order) {
    node_conn m(p);
    if (str(m, {"CLUSTER", "SETSLOT", st, "NODE", b_id}) != "OK") return "SETSLOT NODE";
  }
  return "";
}

trial_result cluster_trial(cluster& c, workers& w, const std::string& prefix, cluster_event ev,
                           int trial) {
  c.refresh();
  const int victim = c.masters()[static_cast<std::size_t>(trial) % 3];
  const int target = c.masters()[static_cast<std::size_t>(trial + 1) % 3];
  const int replica = ev == cluster_event::reshard ? -1 : cluster::replica_of(victim);
  if (ev != cluster_event::reshard && replica < 0) die("a master without a replica");
  const std::string key = c.key_on(prefix, victim, "hot" + std::to_string(trial) + "-");
  const std::string name = sf::detail::fleet_names::of(prefix, key).value;
  const std::size_t slot = sf::detail::cluster_slot(name);
  std::map<pid_t, long> rejections_before;
  std::map<pid_t, std::map<std::string, long>> counters_before;
  const auto field = [](const std::map<std::string, std::string>& l, const std::string& f) {
    return l.count(f) != 0 ? std::stol(l.at(f)) : 0L;
  };
  for (auto& p : w.procs()) {
    const auto l = w.last_of(p, "hammered ");
    rejections_before[p.pid] = field(l, "fence_rejections");
    for (const char* f : trial_counters) counters_before[p.pid][f] = field(l, f);
  }
  const std::size_t hammered_before = w.count_of("hammered ");
  trial_result out;
  watcher watch(c.nodes(), name);
  w.tell("hammer key=" + key + " load_ms=200 pause_ms=2");
  w.until([&] { return w.calls_of(key) >= 1; }, "the hot key's first origin call");
  // The event lands 0..210 ms into the leader's 200 ms load (before, during or after its store).
  const auto fire_at = clock_t_::now() + ms((trial % 8) * 30);
  w.until([&] { return clock_t_::now() >= fire_at; }, "the event's time");
  const auto t0 = clock_t_::now();
  std::atomic<bool> done{false};
  std::string failed;
  clock_t_::time_point ended;
  std::thread event([&] {
    if (ev == cluster_event::reshard) {
      failed = reshard(c, slot, victim, target);
    } else {
      if (ev == cluster_event::force) {
        node_conn r(replica);
        r.run({"CLUSTER", "FAILOVER", "FORCE"});
      } else {
        c.kill_node(victim);
      }
      if (!wait_for([&] { return cluster::role(replica) == "master"; }, ms(20000))) {
        failed = "the replica was not promoted within 20 s";
      }
    }
    ended = clock_t_::now();
    done = true;
  });
  // Probe rounds, back to back, from the event's start until 1 s after its end: each a fresh
  // key of the hot key's slot, 50 ms load, every thread of every process at once.
  std::optional<clock_t_::time_point> settle;
  for (int i = 0;; ++i) {
    if (done.load() && !settle) settle = clock_t_::now() + ms(1000);
    if (settle && clock_t_::now() >= *settle) break;
    if (ms_since(t0) > 30000) break;
    const std::string probe = cluster::key_in_slot(
        prefix, slot, "p" + std::to_string(trial) + "-" + std::to_string(i) + "-");
    w.round(probe, 50);
    w.wait_round("a probe round");
    const long errs = errors_surfaced(w);
    out.errors += errs;
    if (w.calls_of(probe) != 1 || errs != 0) out.coalesced_ms = ms_since(t0);
  }
  event.join();
  if (!failed.empty()) die("the event failed: " + failed);
  out.event_ms = std::chrono::duration<double, std::milli>(ended - t0).count();
  w.tell("stop");
  w.until([&] { return w.count_of("hammered ") == hammered_before + w.alive(); }, "hammer stop");
  const record_watch seen = watch.finish();
  for (auto& p : w.procs()) {
    const auto l = w.last_of(p, "hammered ");
    out.errors += std::stol(l.at("err"));
    if (std::stoll(l.at("last_min")) != seen.final_version ||
        std::stoll(l.at("last_max")) != seen.final_version) {
      out.diverged = true;
    }
    out.max_ms = std::max(out.max_ms, std::stod(l.at("max_ms")));
    out.fence_rejections += std::stol(l.at("fence_rejections")) - rejections_before[p.pid];
    if (out.error.empty() && l.at("error") != "-") out.error = l.at("error");
  }
  out.calls = w.calls_of(key);
  {
    std::map<std::string, long> sum;
    for (auto& p : w.procs()) {
      const auto l = w.last_of(p, "hammered ");
      for (const char* f : trial_counters) sum[f] += field(l, f) - counters_before[p.pid][f];
    }
    for (const char* f : trial_counters) {
      out.why += std::string(f) + "=" + std::to_string(sum[f]) + " ";
    }
    out.local_loads = sum["local_fallback"];
    std::map<pid_t, int> by_pid;  // the hot key's origin calls, by process
    for (const auto& o : w.calls()) {
      if (o.key == key) by_pid[o.pid] += 1;
    }
    out.why += "hot key calls by process:";
    for (const auto& [pid, k] : by_pid) out.why += " " + std::to_string(k);
  }
  out.stale = seen.went_back + (seen.final_fence < seen.max_fence ? 1 : 0);
  if (seen.final_fence == 0) out.error += " (no final record)";
  // The cluster restored for the next trial: a killed master back as a replica, in sync.
  if (ev == cluster_event::kill) c.restart(victim);
  if (ev != cluster_event::reshard &&
      !wait_for([&] { return cluster::role(victim) == "slave"; }, ms(30000))) {
    die("the old master did not come back as a replica in sync within 30 s");
  }
  return out;
}

void cluster_trials(cluster& c, int trials, const std::string& only) {
  constexpr int n = 8;
  constexpr int t = 4;
  std::printf(
      "\n### Redis Cluster trials: the hot key's master resharded or failed over (3 masters + 3 "
      "replicas, %d processes x %d threads hammering one key, every 2 ms per thread, lease_ttl 1 "
      "s, wait_slice 200 ms, max_wait and failover_wait 60 s, redis_timeout 50 ms, 200 ms origin; "
      "the "
      "event 0-210 ms into its "
      "first load)\n\n",
      n, t);
  std::printf(
      "| event | trials | errors surfaced | origin calls of the hot key per event, mean / max "
      "(trials over 2) | fence rejections (the hot key and the probes) | stale overwrites | trials "
      "whose callers did not end on "
      "the stored record | event ms, "
      "median / max | time to coalesce again ms, median / max | callers' max latency ms |\n"
      "|---|---:|---:|---|---:|---:|---:|---|---|---:|\n");
  std::fflush(stdout);
  std::string vdir = (std::filesystem::temp_directory_path() / "fleet-versions.XXXXXX").string();
  if (::mkdtemp(vdir.data()) == nullptr) die("mkdtemp");
  const std::string vfile = vdir + "/v";
  for (const auto& [ev, label, name] :
       {std::tuple{cluster_event::reshard,
                   "slot resharded to another master (SETSLOT "
                   "IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE)",
                   "reshard"},
        std::tuple{cluster_event::force, "CLUSTER FAILOVER FORCE on the master's replica", "force"},
        std::tuple{cluster_event::kill,
                   "master SIGKILLed (its replica promoted after cluster-node-timeout 1 s; the "
                   "node restarted as a replica between trials)",
                   "kill"}}) {
    if (!only.empty() && only != name) continue;
    {
      std::FILE* f = std::fopen(vfile.c_str(), "w");
      const long long zero = 0;
      if (f == nullptr || std::fwrite(&zero, sizeof zero, 1, f) != 1) die("versions file");
      std::fclose(f);
    }
    const std::string prefix = std::string("ct-") + name;
    workers w(n, worker_args(
                     c.seeds(), prefix, "fleet", t,
                     {"lease_ms=1000", "slice_ms=200", "max_wait_ms=60000", "versions=" + vfile}));
    for (const int port : c.masters()) {  // the slot map learnt
      w.round(c.key_on(prefix, port, "warm"), 0);
      w.wait_round("warm-up");
    }
    std::vector<trial_result> rs;
    for (int i = 0; i < trials; ++i) {
      rs.push_back(cluster_trial(c, w, prefix, ev, i));
      const auto& r = rs.back();
      std::fprintf(
          stderr,
          "  %s trial %d: calls %zu, errors %ld, fence rejections %ld, stale %ld, diverged "
          "%ld, event %.0f ms, coalesced again %.0f ms, max %.0f ms %s\n",
          name, i, r.calls, r.errors, r.fence_rejections, r.stale, r.diverged ? 1L : 0L, r.event_ms,
          r.coalesced_ms, r.max_ms, r.error.c_str());
      if (r.calls > 2 || r.local_loads > 0) {
        std::fprintf(stderr, "    %s: %s\n", r.calls > 2 ? "over 2 calls" : "local loads",
                     r.why.c_str());
      }
    }
    double calls = 0;
    std::size_t calls_max = 0;
    long over = 0;
    long errs = 0;
    long rej = 0;
    long stale = 0;
    long diverged = 0;
    double worst = 0;
    std::vector<double> evs;
    std::vector<double> coal;
    std::string first_error;
    for (const auto& r : rs) {
      calls += static_cast<double>(r.calls);
      calls_max = std::max(calls_max, r.calls);
      over += r.calls > 2 ? 1 : 0;
      errs += r.errors;
      rej += r.fence_rejections;
      stale += r.stale;
      diverged += r.diverged ? 1 : 0;
      worst = std::max(worst, r.max_ms);
      evs.push_back(r.event_ms);
      coal.push_back(r.coalesced_ms);
      if (first_error.empty()) first_error = r.error;
    }
    std::sort(evs.begin(), evs.end());
    std::sort(coal.begin(), coal.end());
    std::printf(
        "| %s | %d | **%ld**%s | **%.1f / %zu** (%ld) | %ld | **%ld** | %ld | %.0f / %.0f | "
        "%.0f / %.0f | %.0f |\n",
        label, trials, errs, first_error.empty() ? "" : (" (" + first_error + ")").c_str(),
        calls / trials, calls_max, over, rej, stale, diverged, evs[evs.size() / 2], evs.back(),
        coal[coal.size() / 2], coal.back(), worst);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(vdir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--worker") {
    std::map<std::string, std::string> a;
    for (int i = 2; i < argc; ++i) {
      const std::string w = argv[i];
      a[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
    }
    return worker_main(a);
  }
  bool quick = false;
  bool on_cluster = false;
  int trials = 0;    // --cluster --trials N: the reshard and failover trials instead
  std::string only;  // --only coalescing|faults|stores|costs
  std::string bin = "redis-server";
#ifdef SINGLEFLIGHT_CLUSTER_SCRIPT
  std::string script = SINGLEFLIGHT_CLUSTER_SCRIPT;
#else
  std::string script = "tests/support/redis_cluster.sh";
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    if (a == "--cluster") on_cluster = true;
    if (a == "--trials" && i + 1 < argc) trials = std::stoi(argv[++i]);
    if (a == "--cluster-script" && i + 1 < argc) script = argv[++i];
    if (a == "--only" && i + 1 < argc) only = argv[++i];
    if (a == "--redis-server" && i + 1 < argc) bin = argv[++i];
  }
  if (bin.find('/') == std::string::npos) {
    for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
      if (::access((std::string(dir) + "/" + bin).c_str(), X_OK) == 0) {
        bin = std::string(dir) + "/" + bin;
        break;
      }
    }
  }
  if (on_cluster && trials > 0) {
    cluster c(script, 1);
    std::printf(
        "fleet_driver: a Redis Cluster of 3 masters (ports %d %d %d) with one replica each, "
        "the fleet given every node as a seed; %u hardware threads\n",
        c.masters()[0], c.masters()[1], c.masters()[2], std::thread::hardware_concurrency());
    cluster_trials(c, trials, only);
    return 0;
  }
  if (on_cluster) {
    cluster c(script);
    std::printf(
        "fleet_driver: a Redis Cluster of 3 masters (ports %d %d %d), the fleet pointed "
        "at %s; %u hardware threads\n",
        c.masters()[0], c.masters()[1], c.masters()[2], c.uri().c_str(),
        std::thread::hardware_concurrency());
    cluster_coalescing(c, quick);
    cluster_costs(c);
    cluster_faults(c);  // last: it kills a master
    return 0;
  }
  server s(bin);
  std::printf("fleet_driver: redis-server at %s; %u hardware threads\n", s.uri().c_str(),
              std::thread::hardware_concurrency());
  if (only.empty() || only == "coalescing") coalescing(s, quick);
  if (only.empty() || only == "faults") faults(s, bin);
  if (only.empty() || only == "stores") stores(s);
  if (only.empty() || only == "costs") costs(s);
  return 0;
}
