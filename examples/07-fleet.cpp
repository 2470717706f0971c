// 07-fleet: one origin call per key across a fleet of processes, each reading through a
// singleflight::fleet_cache (a local cache whose loads go through the fleet).
//
//   07-fleet [--redis tcp://host:port] [--processes N] [--threads T] [--keys K] [--expiries E]
//
// Starts N worker processes (fork/exec of this program). Each has T threads asking for K hot
// keys at once (thread t for key t % K) through two layers:
//
//   fleet_cache's local cache (in-process: ttl 1 s ±10%, stale-while-revalidate 2 s)
//     └─ the fleet (Redis: value_ttl 3.1 s, lease, fencing, pub/sub)
//          └─ loader: the origin (200 ms)
//
// The local cache answers most reads from memory and, once its copy is stale, hands the reader
// the old value at once while one background refresh per process asks the fleet; the fleet
// turns the refreshes of all processes into one origin call per key when the value in Redis
// has expired, and into a Redis hit (no origin call) while it lives. value_ttl is at least the
// local cache's longest window (ttl·(1 + jitter) + stale_while_revalidate): see docs/fleet.md.
//
// The parent runs rounds on a schedule: a cold start, then E times a round where the caches
// are stale but the Redis value lives, and a round where the caches are stale and the Redis
// value has expired. It runs everything twice: without the fleet layer (a plain cache with the
// same options, whose loader is the origin: each process loads for itself) and with it, and prints
// the origin calls per key of each round across the fleet, which every origin call reports on a
// pipe the parent reads, and the readers that waited on a load (after the cold start: none).
//
// Without --redis it starts its own redis-server on a free loopback port (a temporary
// directory, a pidfile) and stops it by pid at the end: one command on a machine with
// redis-server installed. Exits 77 (ctest: skipped) when there is none, 1 if a count is not
// the expected one: N per round without the fleet; with it 1 per key per Redis expiry and 0
// while the Redis value lives; no reader waiting after the cold start (or if a round could not
// be run inside its window: a machine too slow for this schedule).
#include <singleflight/cache.hpp>
#include <singleflight/fleet_cache.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// The two layers' windows. The cache's longest window (the latest a process refreshes a value
// it took from Redis, if a reader comes) is ttl·(1 + jitter) + stale_while_revalidate; the
// value lives in Redis at least that long (docs/fleet.md: which ttl goes where).
constexpr auto origin_time = 200ms;
constexpr auto cache_ttl = 1000ms;
constexpr double cache_jitter = 0.1;
constexpr auto min_fresh = cache_ttl - cache_ttl / 10;  // ttl·(1 - jitter)
constexpr auto max_fresh = cache_ttl + cache_ttl / 10;  // ttl·(1 + jitter)
constexpr auto stale_window = 2000ms;
constexpr auto value_ttl = 3100ms;
static_assert(value_ttl >= max_fresh + stale_window,
              "the Redis value must outlive the cache's longest window");
// Slack of the schedule on each side of a window edge (process and pipe latency).
constexpr auto margin = 200ms;

enum class round_kind { cold, redis_alive, redis_expired };

// --- the worker: one process of the fleet ---------------------------------------------------

std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

// Origin calls: one line each on the parent's pipe (fd 3).
std::string origin(const std::string& key) {
  (void)!::write(3, "O\n", 2);
  std::this_thread::sleep_for(origin_time);
  return "profile for " + key;
}

std::string key_of(int k) { return "tenant-7|user-" + std::to_string(k) + "|en-GB"; }

// Runs the parent's rounds on `c` (a fleet_cache, or a plain cache): T threads read K keys at
// once, and the round ends when every key is fresh again.
template <class Cache>
int serve(Cache& c, int threads, int keys) {
  while (read_line(0).rfind("round ", 0) == 0) {
    std::atomic<int> waited{0};
    {
      std::vector<std::thread> readers;  // not std::jthread: libc++ 14 has none
      for (int t = 0; t < threads; ++t) {
        readers.emplace_back([&, t] {
          const std::string key = key_of(t % keys);
          const auto e = c.get_entry(key, [key] { return origin(key); });
          // none: answered from the cache (fresh, or stale while a refresh runs).
          if (e.taken_as != singleflight::role::none) waited.fetch_add(1);
        });
      }
      for (std::thread& r : readers) r.join();
    }
    // A stale read started one background refresh per key: the round is over when each has
    // stored its value (the entry is fresh again). Bounded: a refresh that never ends is a bug.
    const auto until = steady::now() + 30s;
    for (int k = 0; k < keys; ++k) {
      for (;;) {
        const auto e = c.peek(key_of(k));
        if (e && e->state == singleflight::freshness::fresh) break;
        if (steady::now() > until) return 2;
        std::this_thread::sleep_for(1ms);  // polling a demo's progress
      }
    }
    // Loads this process made without the fleet's lease (Redis failing, too slow): 0 normally.
    std::uint64_t fallbacks = 0;
    if constexpr (requires { c.stats().fleet; }) fallbacks = c.stats().fleet.local_fallback;
    const std::string done =
        "done " + std::to_string(fallbacks) + " " + std::to_string(waited.load()) + "\n";
    (void)!::write(1, done.data(), done.size());
  }
  return 0;
}

int worker(const std::string& uri, const std::string& prefix, bool use_fleet, int threads,
           int keys) {
  // --- snippet: fleet-cache-options ---
  singleflight::fleet_cache_options o;
  o.local = {
      .ttl = cache_ttl,                        // 1 s: how often this process asks Redis
      .jitter = cache_jitter,                  // ±10 %
      .stale_while_revalidate = stale_window,  // 2 s: the old value at once, one refresh
  };
  o.fleet.redis_uri = uri;
  o.fleet.key_prefix = prefix;
  o.fleet.value_ttl = value_ttl;  // 3.1 s: at least the local cache's longest window, 1.1 s + 2 s
  // --- end snippet ---
  o.fleet.lease_ttl = 2s;
  // Generous (the default is 50 ms): this demo also runs on busy, sanitized CI machines, where
  // a slower round trip would count as Redis failing and make a process load for itself.
  o.fleet.redis_timeout = 1s;
  // The bus: only put and invalidate reach the other processes. Under client tracking (the
  // default) the server also reports each value a load stores in Redis, and every process then
  // drops its copy and reads Redis once more on its next call: after each expiry in Redis its
  // readers would wait one round trip, which this demo counts as waiting on a load.
  o.coherence = singleflight::fleet_coherence::publish;

  if (!use_fleet) {
    // Without the fleet: a plain cache with the same local options, whose loader is the
    // origin; each process loads for itself.
    singleflight::cache<std::string, std::string> alone(o.local);
    return serve(alone, threads, keys);
  }
  // --- snippet: fleet-cache ---
  // A read: profiles.get(key, loader, request_token) (or get_entry, async_get, co_get) answers
  // from this process's copy (fresh, or stale while one background refresh asks the fleet),
  // else from Redis, else by one call of `loader` across the processes. The loader is kept
  // for a background refresh: capture the key by value.
  singleflight::fleet_cache<std::string, std::string> profiles(o);
  // --- end snippet ---
  // Each confirmation of the bus subscription marks what the local cache holds stale (nothing
  // is missed while a process is not listening): wait for the first ones before the cold start,
  // so that they cannot make what it loads stale. Bounded.
  const auto until = steady::now() + 30s;
  while (profiles.stats().resyncs < 2) {
    if (steady::now() > until) return 3;
    std::this_thread::sleep_for(1ms);  // polling a demo's progress
  }
  return serve(profiles, threads, keys);
}

// --- the parent -------------------------------------------------------------------------------

struct redis_server {
  pid_t pid = -1;
  std::filesystem::path dir;
  int port = 0;

  bool start() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "example-07.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return false;
    dir = tmpl;
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);  // a free port: bind 0, read it back
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::close(s);
    const std::string p = std::to_string(port);
    const std::string pidfile = (dir / "redis.pid").string();
    const std::string logfile = (dir / "redis.log").string();
    const std::string d = dir.string();
    pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--pidfile", pidfile.c_str(), "--logfile", logfile.c_str(),
               "--dir", d.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 1000; ++i) {  // up to 10 s for it to answer
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // not installed, or failed
      redisContext* c = redisConnect("127.0.0.1", port);
      const bool up = c != nullptr && c->err == 0;
      if (c != nullptr) redisFree(c);
      if (up) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);  // by pid, never by name
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

struct round_result {
  round_kind kind;
  int origin_calls;  // across the fleet
  int waited;        // readers that waited on a load, across the fleet
};

// Runs N workers through a cold start and E times (Redis value alive, Redis value expired).
// `fallbacks`: the most local loads (without the lease) any worker reported. `late`: set when
// a round could not be run inside its window (a very slow machine): its counts mean nothing.
std::vector<round_result> run_fleet(const std::string& self, const std::string& uri,
                                    const std::string& prefix, bool use_fleet, int n, int threads,
                                    int keys, int expiries, int& fallbacks, bool& late) {
  int origin[2];
  if (::pipe2(origin, O_CLOEXEC) != 0) std::exit(1);
  struct child {
    pid_t pid;
    int in;
    int out;
  };
  std::vector<child> children;
  const std::string a[] = {uri, prefix, use_fleet ? "fleet" : "local", std::to_string(threads),
                           std::to_string(keys)};
  for (int i = 0; i < n; ++i) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::exit(1);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(origin[1], 3);
      ::execl(self.c_str(), self.c_str(), "--worker", a[0].c_str(), a[1].c_str(), a[2].c_str(),
              a[3].c_str(), a[4].c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    children.push_back({pid, in[1], out[0]});
  }
  ::close(origin[1]);
  (void)::fcntl(origin[0], F_SETFL, O_NONBLOCK);

  std::vector<round_result> rounds;
  steady::time_point start;       // of the current round
  steady::time_point last_start;  // of the previous one
  steady::time_point last_done;
  steady::time_point store_start;  // of the last round that stored a value in Redis
  steady::time_point store_done;
  for (int r = 0; r < 1 + 2 * expiries; ++r) {
    const round_kind kind = r == 0       ? round_kind::cold
                            : r % 2 == 1 ? round_kind::redis_alive
                                         : round_kind::redis_expired;
    // The schedule. Every cache entry was written during the previous round and is stale now
    // (past ttl·(1 + jitter)) but not dead (before ttl·(1 - jitter) + stale window). The
    // Redis value was stored during the last cold or expired round: it still lives in an
    // alive round, and has expired (value_ttl after it was stored) in an expired round.
    if (kind == round_kind::redis_alive)
      std::this_thread::sleep_until(last_done + max_fresh + margin);
    if (kind == round_kind::redis_expired) {
      std::this_thread::sleep_until(std::max(store_done + value_ttl, last_done + max_fresh) +
                                    margin);
    }
    start = steady::now();
    if (kind != round_kind::cold && start + margin > last_start + min_fresh + stale_window) {
      late = true;
    }
    const std::string cmd = "round " + std::to_string(r) + "\n";
    for (const child& c : children) (void)!::write(c.in, cmd.data(), cmd.size());
    int waited = 0;
    for (const child& c : children) {
      pollfd p{c.out, POLLIN, 0};
      const std::string line = ::poll(&p, 1, 60000) == 1 ? read_line(c.out) : "";
      if (line.rfind("done ", 0) != 0) {
        std::fprintf(stderr, "07-fleet: a worker did not finish its round\n");
        std::exit(1);
      }
      char* rest = nullptr;
      fallbacks = std::max(fallbacks, static_cast<int>(std::strtol(line.c_str() + 5, &rest, 10)));
      waited += static_cast<int>(std::strtol(rest, nullptr, 10));
    }
    const auto done = steady::now();
    if (kind == round_kind::redis_alive && done + margin > store_start + value_ttl) late = true;
    if (kind != round_kind::redis_alive) {
      store_start = start;
      store_done = done;
    }
    last_start = start;
    last_done = done;
    // Every origin call wrote its line before its worker answered "done".
    int n_calls = 0;
    char buf[256];
    for (ssize_t got; (got = ::read(origin[0], buf, sizeof buf)) > 0;)
      n_calls += static_cast<int>(got) / 2;
    rounds.push_back({kind, n_calls, waited});
  }
  for (const child& c : children) {
    ::close(c.in);  // end of input: the worker returns
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "07-fleet: a worker failed (status %d)\n", status);
      std::exit(1);
    }
    ::close(c.out);
  }
  ::close(origin[0]);
  return rounds;
}

const char* label(round_kind k) {
  switch (k) {
    case round_kind::cold:
      return "cold start: both layers empty";
    case round_kind::redis_alive:
      return "caches stale, Redis value lives";
    case round_kind::redis_expired:
      return "caches stale, Redis value expired";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--worker") {
    return worker(argv[2], argv[3], std::string(argv[4]) == "fleet", std::atoi(argv[5]),
                  std::atoi(argv[6]));
  }
  std::string uri;
  int n = 4;
  int threads = 8;
  int keys = 3;
  int expiries = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--redis") uri = argv[i + 1];
    if (flag == "--processes") n = std::atoi(argv[i + 1]);
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    if (flag == "--keys") keys = std::atoi(argv[i + 1]);
    if (flag == "--expiries") expiries = std::atoi(argv[i + 1]);
  }
  if (n < 1 || keys < 1 || threads < keys || expiries < 0) {
    std::fprintf(stderr, "07-fleet: need --processes >= 1, --keys >= 1, --threads >= --keys\n");
    return 1;
  }
  redis_server own;
  if (uri.empty()) {
    if (!own.start()) {
      std::printf("07-fleet: no redis-server to start (install redis-server or pass --redis)\n");
      own.stop();
      return 77;
    }
    uri = "tcp://127.0.0.1:" + std::to_string(own.port);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string prefix =
      "example-07:" + std::to_string(::getpid()) + ":" +
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf("%d processes x %d threads, %d hot keys, 200 ms origin, Redis %s\n", n, threads, keys,
              uri.c_str());
  std::printf("cache: ttl 1 s ±10%%, stale-while-revalidate 2 s; fleet: value_ttl 3.1 s\n\n");

  int fallbacks = 0;
  bool late = false;
  std::vector<round_result> without =
      run_fleet(self, uri, prefix, false, n, threads, keys, expiries, fallbacks, late);
  fallbacks = 0;
  std::vector<round_result> with =
      run_fleet(self, uri, prefix, true, n, threads, keys, expiries, fallbacks, late);

  std::printf("%-36s %s\n", "", "origin calls per key   readers that waited");
  std::printf("%-36s %s\n", "round", "without fleet   with   without fleet   with");
  bool ok = true;
  for (std::size_t r = 0; r < with.size(); ++r) {
    const round_kind kind = with[r].kind;
    std::printf("%-36s %13.1f %6.1f %15d %6d\n", label(kind),
                static_cast<double>(without[r].origin_calls) / keys,
                static_cast<double>(with[r].origin_calls) / keys, without[r].waited,
                with[r].waited);
    // Without the fleet every process loads each key once per round; with it the fleet loads
    // a key once when Redis has no value, never while it has one.
    const int want_with = kind == round_kind::redis_alive ? 0 : keys;
    if (without[r].origin_calls != n * keys || with[r].origin_calls != want_with) ok = false;
    // After the cold start nobody waits: a stale value is served while the refresh runs.
    if (kind != round_kind::cold && (without[r].waited != 0 || with[r].waited != 0)) ok = false;
  }
  if (fallbacks > 0) {
    std::printf(
        "(a worker loaded %d time(s) without the lease: Redis failed or was slower "
        "than redis_timeout)\n",
        fallbacks);
  }
  own.stop();
  if (late) {
    std::printf("\nFAILED: the machine was too slow to run the rounds inside their windows\n");
    return 1;
  }
  std::printf("\n%s\n",
              ok ? "with the fleet: one origin call per key per expiry in Redis, none while "
                   "the value lives there;\nafter the cold start no reader waited on a load"
                 : "FAILED: the counts are not the expected ones");
  return ok ? 0 : 1;
}
