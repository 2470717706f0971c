// bench/fleet_cache/driver.cpp: fleet_cache's coherence bound measured with real processes
// against a real redis-server (docs/fleet_cache.md, "The bound, measured").
//
//   fleet_cache_driver [--seconds S] [--readers 4,8] [--modes tracking,publish]
//                      [--variants steady,kill,kill-quiet,restart,unheard]
//                      [--read-interval-us U] [--load-us L] [--swr-ms W] [--ttl-s T]
//                      [--redis-server PATH]
//
// Starts its own redis-server (a free loopback port, a temporary directory, a pidfile;
// stopped by pid), then, for each variant, coherence mode and reader count:
//   - one writer process: every 100 ms it bumps the origin's version (shared memory) and
//     calls fleet_cache::invalidate on the hot key, recording when invalidate returned
//     (CLOCK_MONOTONIC, shared by the processes of one machine);
//   - N reader processes (local ttl T s, 60 by default; stale_while_revalidate W ms, 0 by
//     default): each loops get_entry(hot key) every U µs, recording the read's start, the
//     version it saw, whether it was answered stale, its latency, and its process's
//     stats().resyncs and stats().fleet.gets before it, and, from a thread polling stats()
//     every 1 ms, when its subscription was (re)confirmed (stats().resyncs);
//   - variants: steady; kill (`CLIENT KILL TYPE pubsub` every 200 ms, from the driver, at
//     every second invalidate: the gap hides it); kill-quiet (the same 50 ms after an
//     invalidate: the gap hides no write);
//     restart (the redis-server stopped at half time, by pid, and restarted 300 ms later on
//     the same port); unheard, the measurement's control: the writer invalidates through a
//     plain fleet on the same prefix, which publishes nothing on the bus (under publish, every
//     reader keeps its copy: the stale reads must show), and which client tracking reports.
// The loader (the origin) reads the version from shared memory, counts the call, and takes L
// µs. Afterwards, per run:
//   - stale reads: reads that started more than 20 ms after the invalidate of version v
//     returned and saw a version < v; those inside a gap (from a CLIENT KILL or the server's
//     stop to the reader's next resync + 20 ms) are counted apart. Those outside gaps are split
//     by what the reader's process had heard when the read started (stats().
//     invalidations_heard + resyncs, read before each get): *unheard*, nothing at all since the
//     last read that started before invalidate(v) was called (the report was still on its way:
//     the server, the socket, or the process's subscriber thread waiting for a core), and
//     *heard*, something was (the library's bound, "a get that begins after its process heard
//     the message returns no value stored before it", allows none; a late report of an earlier
//     write also counts here, so this errs towards blaming the library);
//   - the window: for each version and reader, from the invalidate's return to the start of
//     the last read that still saw an older version (0 when none did); p50, p99, max;
//   - new seen: from the invalidate's return to the end of the reader's first read that saw
//     the new version; p50, p99;
//   - reconnect: from a gap's start to each reader's next resync (p50, max; sampled every
//     1 ms, so up to ~1 ms late, which widens the gap's excuse by as much);
//   - past reconnect + 20 ms (issue 19's goal for gaps): per reader and gap, the reads that
//     started more than 20 ms after its resync and before the next gap, and saw a version
//     below v, the newest whose invalidate returned before the read started and either before
//     the resync (the gap may have hidden its report) or more than 20 ms before the read (the
//     steady bound); in parentheses, those whose v returned before the resync;
//   - per reader and gap, from the first read that applied a confirmation (its resyncs count
//     grew): the reads answered stale (stale_while_revalidate), how long after that read the
//     last stale answer ended (the refresh replaced the value just after), and the reads
//     through the fleet (stats().fleet.gets, each one Redis GET first) up to and including the
//     first read answered fresh after the last confirmation: the gap's reload (it includes
//     the reload of a write the gap hid, and under tracking the reload after the report of
//     the process's own store); FCB_DEBUG_GAPS=N prints the first N (at least 6) gaps that took
//     more than one, read by read (with the flights the process had led before each: a gap
//     whose refresh led shows the count grow), after the writer's invalidates around the gap;
//   - median and p99 read latency; origin calls per version (mean, max); Redis reads (GET and
//     GETRANGE, INFO commandstats) per reader per version (a gap's cost: against steady).
// Prints a markdown table.
#include <singleflight/fleet_cache.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace sf = singleflight;
using ms = std::chrono::milliseconds;

constexpr int kMaxVersions = 4096;
constexpr std::int64_t kBoundNs = 20'000'000;  // the goal: 20 ms

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "fleet_cache_driver: %s\n", why.c_str());
  std::exit(1);
}

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleep_until_ns(std::int64_t t) {
  timespec ts{};
  ts.tv_sec = t / 1'000'000'000;
  ts.tv_nsec = t % 1'000'000'000;
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// The memory the processes share (a file in the run's directory, mapped MAP_SHARED).
struct shared_state {
  std::atomic<std::uint64_t> version;              // the origin's current version
  std::atomic<int> ready;                          // processes that finished their warm-up
  std::atomic<int> phase;                          // 0 warm-up, 1 run, 2 stop
  std::atomic<int> versions;                       // versions the writer published (1..versions)
  std::atomic<int> failed_invalidates;             // invalidate calls that threw
  std::atomic<std::uint64_t> calls[kMaxVersions];  // origin calls per version
  std::atomic<std::int64_t> ret[kMaxVersions];     // when invalidate(v) returned; 0: it threw
  std::atomic<std::int64_t> began[kMaxVersions];   // when invalidate(v) was called
};
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

shared_state* map_shared(const std::string& path, bool create) {
  const int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
  if (fd < 0) die("open " + path);
  if (create && ::ftruncate(fd, sizeof(shared_state)) != 0) die("ftruncate");
  void* p = ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) die("mmap");
  return static_cast<shared_state*>(p);  // zero-filled: every atomic starts at 0
}

struct read_rec {
  std::int64_t start;
  std::uint32_t latency_ns;
  std::uint32_t version;
  std::uint64_t heard;       // the process's invalidations_heard + resyncs when the read started
  std::uint32_t fleet_gets;  // its stats().fleet.gets then (reads through the fleet so far)
  std::uint16_t resyncs;     // its stats().resyncs then (confirmations so far)
  std::uint8_t stale;        // 1: answered freshness::stale (within stale_while_revalidate)
  std::uint8_t leads;        // its stats().fleet.leader then, modulo 256 (flights it led)
};

sf::fleet_cache_options cache_options(const std::map<std::string, std::string>& a) {
  sf::fleet_cache_options o;
  o.local.ttl = std::chrono::seconds(std::stol(a.at("ttl_s")));
  o.local.stale_while_revalidate = ms(std::stol(a.at("swr_ms")));
  o.fleet.redis_uri = a.at("uri");
  o.fleet.key_prefix = a.at("prefix");
  o.fleet.redis_timeout = ms(50);
  o.coherence =
      a.at("mode") == "publish" ? sf::fleet_coherence::publish : sf::fleet_coherence::tracking;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Reader and writer processes.

int reader_main(const std::map<std::string, std::string>& a) {
  shared_state* sh = map_shared(a.at("shm"), false);
  const long interval_us = std::stol(a.at("interval_us"));
  const long load_us = std::stol(a.at("load_us"));
  const auto load = [sh, load_us] {
    const std::uint64_t v = sh->version.load();
    sh->calls[v % kMaxVersions].fetch_add(1);
    if (load_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(load_us));
    return std::to_string(v);
  };
  sf::fleet_cache<std::string, std::string> c(cache_options(a));
  std::vector<read_rec> reads;
  reads.reserve(1 << 20);
  std::vector<std::int64_t> resyncs;  // when stats().resyncs was seen to grow
  std::atomic<bool> stop{false};
  std::jthread poll([&] {
    std::uint64_t seen = c.stats().resyncs;
    while (!stop.load()) {
      const std::uint64_t r = c.stats().resyncs;
      if (r != seen) {
        resyncs.push_back(now_ns());
        seen = r;
      }
      std::this_thread::sleep_for(ms(1));  // sampling, not synchronisation
    }
  });
  // Warm-up: the first subscription confirmed, the hot key read once.
  for (int i = 0; i < 2000 && c.stats().resyncs == 0; ++i) std::this_thread::sleep_for(ms(5));
  (void)c.get(std::string("hot"), load);
  sh->ready.fetch_add(1);
  while (sh->phase.load() == 0) std::this_thread::sleep_for(ms(1));
  std::int64_t next = now_ns();
  while (sh->phase.load() == 1) {
    const sf::fleet_cache_stats st = c.stats();
    const std::uint64_t heard = st.invalidations_heard + st.resyncs;
    const std::int64_t t0 = now_ns();
    std::string v;
    bool stale = false;
    try {
      sf::cached<std::string> e = c.get_entry(std::string("hot"), load);
      v = e.value.value_or("0");
      stale = e.state == sf::freshness::stale;
    } catch (...) {
      v = "0";  // counted as version 0: stale if anything was invalidated
    }
    const std::int64_t t1 = now_ns();
    reads.push_back({t0, static_cast<std::uint32_t>(std::min<std::int64_t>(t1 - t0, UINT32_MAX)),
                     static_cast<std::uint32_t>(std::stoul(v)), heard,
                     static_cast<std::uint32_t>(st.fleet.gets),
                     static_cast<std::uint16_t>(st.resyncs), static_cast<std::uint8_t>(stale),
                     static_cast<std::uint8_t>(st.fleet.leader)});
    if (interval_us > 0) {
      next += interval_us * 1000;
      if (next < t1) next = t1;
      sleep_until_ns(next);
    }
  }
  stop = true;
  poll.join();
  c.close();
  std::ofstream out(a.at("out"), std::ios::binary);
  const std::uint64_t n = reads.size();
  const std::uint64_t m = resyncs.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof n);
  out.write(reinterpret_cast<const char*>(reads.data()),
            static_cast<std::streamsize>(n * sizeof(read_rec)));
  out.write(reinterpret_cast<const char*>(&m), sizeof m);
  out.write(reinterpret_cast<const char*>(resyncs.data()),
            static_cast<std::streamsize>(m * sizeof(std::int64_t)));
  return out ? 0 : 1;
}

int writer_main(const std::map<std::string, std::string>& a) {
  shared_state* sh = map_shared(a.at("shm"), false);
  const long period_ms = std::stol(a.at("period_ms"));
  const bool unheard = a.at("variant") == "unheard";
  sf::fleet_cache<std::string, std::string> c(cache_options(a));
  sf::fleet<std::string, std::string> plain(cache_options(a).fleet);
  sh->ready.fetch_add(1);
  while (sh->phase.load() == 0) std::this_thread::sleep_for(ms(1));
  const std::int64_t t0 = now_ns();
  for (std::uint64_t v = 1; v < kMaxVersions; ++v) {
    sleep_until_ns(t0 + static_cast<std::int64_t>(v) * period_ms * 1'000'000);
    if (sh->phase.load() != 1) break;
    sh->version.store(v);
    sh->began[v].store(now_ns());
    try {
      if (unheard) {
        (void)plain.invalidate(std::string("hot"));
      } else {
        (void)c.invalidate(std::string("hot"));
      }
      sh->ret[v].store(now_ns());
    } catch (const std::exception&) {
      sh->failed_invalidates.fetch_add(1);
    }
    sh->versions.store(static_cast<int>(v));
  }
  c.close();
  plain.close();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The driver's redis-server.

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
  server(std::string bin, std::string dir) : bin_(std::move(bin)), dir_(std::move(dir)) {
    port_ = free_port();
    start();
  }
  ~server() { stop(); }
  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

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
    const std::int64_t until = now_ns() + 10'000'000'000;
    for (;;) {
      c_ = redisConnect("127.0.0.1", port_);
      if (c_ != nullptr && c_->err == 0) break;
      if (c_ != nullptr) redisFree(c_);
      c_ = nullptr;
      if (now_ns() > until) die("redis-server did not start; see " + dir_ + "/r.log");
      std::this_thread::sleep_for(ms(5));  // polling readiness
    }
  }
  void stop() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void run(const char* cmd) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, cmd));
    if (r == nullptr) die(std::string("redis command failed: ") + cmd);
    freeReplyObject(r);
  }
  // INFO commandstats: calls of one command since the start (or CONFIG RESETSTAT).
  long long calls(const std::string& command) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, "INFO commandstats"));
    long long n = 0;
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      std::istringstream in(std::string(r->str, r->len));
      std::string line;
      const std::string head = "cmdstat_" + command + ":calls=";
      while (std::getline(in, line)) {
        if (line.rfind(head, 0) == 0) n = std::stoll(line.substr(head.size()));
      }
    }
    if (r != nullptr) freeReplyObject(r);
    return n;
  }

 private:
  std::string bin_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  redisContext* c_ = nullptr;
};

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<std::string> all = {std::filesystem::read_symlink("/proc/self/exe").string()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// ---------------------------------------------------------------------------------------------
// One run and its figures.

struct config {
  std::string mode;     // tracking | publish
  std::string variant;  // steady | kill | restart
  int readers = 4;
  int seconds = 10;
  long interval_us = 500;
  long load_us = 1000;
  long swr_ms = 0;  // the readers' local stale_while_revalidate
  long ttl_s = 60;  // the readers' local ttl
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (const double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

void run_one(server& s, const std::string& dir, const config& cfg, int run_id) {
  const std::string shm = dir + "/shm-" + std::to_string(run_id);
  shared_state* sh = map_shared(shm, true);
  const std::string prefix = "fcb" + std::to_string(run_id);
  const std::vector<std::string> common = {"uri=" + s.uri(),
                                           "prefix=" + prefix,
                                           "mode=" + cfg.mode,
                                           "shm=" + shm,
                                           "swr_ms=" + std::to_string(cfg.swr_ms),
                                           "ttl_s=" + std::to_string(cfg.ttl_s)};
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (int i = 0; i < cfg.readers; ++i) {
    outs.push_back(dir + "/reads-" + std::to_string(run_id) + "-" + std::to_string(i));
    std::vector<std::string> args = {"--reader"};
    args.insert(args.end(), common.begin(), common.end());
    args.push_back("interval_us=" + std::to_string(cfg.interval_us));
    args.push_back("load_us=" + std::to_string(cfg.load_us));
    args.push_back("out=" + outs.back());
    pids.push_back(spawn(args));
  }
  {
    std::vector<std::string> args = {"--writer"};
    args.insert(args.end(), common.begin(), common.end());
    args.push_back("period_ms=100");
    args.push_back("variant=" + cfg.variant);
    pids.push_back(spawn(args));
  }
  const std::int64_t ready_by = now_ns() + 30'000'000'000;
  while (sh->ready.load() < cfg.readers + 1) {
    if (now_ns() > ready_by) die("processes not ready");
    std::this_thread::sleep_for(ms(5));
  }
  const long long gets_before = s.calls("get") + s.calls("getrange");
  long long gets_lost = 0;         // counted by a server that was stopped
  std::vector<std::int64_t> gaps;  // when a gap began (a CLIENT KILL sent, the server stopped)
  sh->phase.store(1);
  const std::int64_t t0 = now_ns();
  const std::int64_t end = t0 + static_cast<std::int64_t>(cfg.seconds) * 1'000'000'000;
  if (cfg.variant == "kill" || cfg.variant == "kill-quiet") {
    // kill: at every second invalidate (the gap hides it); kill-quiet: 50 ms after one (the
    // gap hides no write: what it costs by itself).
    const std::int64_t offset = cfg.variant == "kill" ? 0 : 50'000'000;
    for (std::int64_t t = t0 + 200'000'000 + offset; t < end; t += 200'000'000) {
      sleep_until_ns(t);
      gaps.push_back(now_ns());
      s.run("CLIENT KILL TYPE pubsub");
    }
  } else if (cfg.variant == "restart") {
    sleep_until_ns(t0 + (end - t0) / 2);
    gets_lost = s.calls("get") + s.calls("getrange") - gets_before;
    gaps.push_back(now_ns());
    s.stop();
    std::this_thread::sleep_for(ms(300));  // the server is down for 300 ms
    s.start();
  }
  sleep_until_ns(end);
  sh->phase.store(2);
  for (const pid_t p : pids) {
    int status = 0;
    if (::waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      die("worker process " + std::to_string(p) + " failed: " +
          (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                               : "exit " + std::to_string(WEXITSTATUS(status))));
    }
  }
  const long long gets =
      (cfg.variant == "restart" ? s.calls("get") + s.calls("getrange") + gets_lost
                                : s.calls("get") + s.calls("getrange") - gets_before);

  // The invalidates that returned, in version order (their return times increase).
  const int versions = sh->versions.load();
  std::vector<std::pair<std::int64_t, std::uint32_t>> rets;  // (returned, version)
  for (int v = 1; v <= versions; ++v) {
    const std::int64_t r = sh->ret[v].load();
    if (r != 0) rets.emplace_back(r, static_cast<std::uint32_t>(v));
  }
  long stale = 0;        // outside gaps, the reader's process had not heard the report yet
  long stale_heard = 0;  // outside gaps, after it had heard something since the invalidate
  long stale_in_gap = 0;
  double worst_late_ms = 0;  // the latest stale read past the bound, from the invalidate
  std::size_t n_reads = 0;
  std::size_t n_resyncs = 0;         // during the run, all readers
  std::vector<double> reconnect_ms;  // per (reader, gap): gap start to the next resync
  std::vector<double> latencies_us;
  std::vector<double> window_ms;     // per (reader, version): last old read's start - return
  std::vector<double> seen_ms;       // per (reader, version): first new read's end - return
  long past_reconnect = 0;           // stale reads past the reader's resync + 20 ms (see below)
  long past_reconnect_gap = 0;       // ... of a version whose invalidate returned before the resync
  std::vector<double> served_stale;  // per (reader, gap): reads answered freshness::stale
  std::vector<double> stale_for_ms;  // per confirmation applied: until the last stale answer
  std::vector<double> gap_gets;      // per (reader, gap): reads through the fleet to reload
  int debug_gaps = 0;                // FCB_DEBUG_GAPS: gaps printed
  const char* debug_env = std::getenv("FCB_DEBUG_GAPS");
  const int debug_gaps_max = debug_env != nullptr ? std::max(6, std::atoi(debug_env)) : 0;
  for (int i = 0; i < cfg.readers; ++i) {
    std::ifstream in(outs[static_cast<std::size_t>(i)], std::ios::binary);
    std::uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof n);
    std::vector<read_rec> reads(n);
    in.read(reinterpret_cast<char*>(reads.data()),
            static_cast<std::streamsize>(n * sizeof(read_rec)));
    std::uint64_t m = 0;
    in.read(reinterpret_cast<char*>(&m), sizeof m);
    std::vector<std::int64_t> resyncs(m);
    in.read(reinterpret_cast<char*>(resyncs.data()), static_cast<std::streamsize>(m * 8));
    if (!in) die("cannot read " + outs[static_cast<std::size_t>(i)]);
    n_reads += reads.size();
    n_resyncs += static_cast<std::size_t>(
        std::count_if(resyncs.begin(), resyncs.end(), [&](std::int64_t t) { return t >= t0; }));
    for (std::size_t k = 0; k < reads.size(); k += 7) {  // a sample is enough for percentiles
      latencies_us.push_back(reads[k].latency_ns / 1000.0);
    }
    // This reader's gaps: [gap start, its next resync + 20 ms].
    std::vector<std::pair<std::int64_t, std::int64_t>> excused;
    for (const std::int64_t g : gaps) {
      const auto r = std::lower_bound(resyncs.begin(), resyncs.end(), g);
      excused.emplace_back(g, r == resyncs.end() ? INT64_MAX : *r + kBoundNs);
      if (r != resyncs.end()) reconnect_ms.push_back((*r - g) / 1e6);
    }
    const auto in_gap = [&](std::int64_t t) {
      return std::any_of(excused.begin(), excused.end(),
                         [&](const auto& e) { return t >= e.first && t <= e.second; });
    };
    // What the reader had heard by invalidate(v)'s call: its count at the last read that
    // started before it (0 when none did).
    const auto heard_before = [&](std::uint32_t v) -> std::uint64_t {
      const std::int64_t b = sh->began[v].load();
      const auto k =
          std::lower_bound(reads.begin(), reads.end(), b,
                           [](const read_rec& a, std::int64_t t) { return a.start < t; });
      return k == reads.begin() ? 0 : std::prev(k)->heard;
    };
    for (const read_rec& r : reads) {
      // The newest version whose invalidate returned more than 20 ms before this read.
      const auto it = std::lower_bound(rets.begin(), rets.end(),
                                       std::make_pair(r.start - kBoundNs, std::uint32_t{0}));
      if (it == rets.begin()) continue;
      const auto& [ret, v] = *std::prev(it);
      if (r.version >= v) continue;
      if (in_gap(r.start)) {
        ++stale_in_gap;
      } else {
        const std::uint64_t before = heard_before(v);
        const bool heard = r.heard > before;
        ++(heard ? stale_heard : stale);
        if (std::getenv("FCB_DEBUG") != nullptr && stale + stale_heard < 40) {
          const std::int64_t base = gaps.empty() ? t0 : gaps.front();
          std::string rs;
          for (const std::int64_t x : resyncs) rs += " " + std::to_string((x - base) / 1000000);
          std::fprintf(stderr,
                       "stale: reader %d read at %+.1f ms saw %u; v %u returned at %+.1f ms; "
                       "heard %llu, %llu when invalidate(v) was called (%s); resyncs at%s\n",
                       i, (r.start - base) / 1e6, r.version, v, (ret - base) / 1e6,
                       static_cast<unsigned long long>(r.heard),
                       static_cast<unsigned long long>(before), heard ? "heard" : "unheard",
                       rs.c_str());
        }
        if (!heard) worst_late_ms = std::max(worst_late_ms, (r.start - ret) / 1e6);
      }
    }
    // After each gap, up to the next one: the reconnect's bound and its cost.
    const auto read_at = [&](std::int64_t t) {
      return static_cast<std::size_t>(
          std::lower_bound(reads.begin(), reads.end(), t,
                           [](const read_rec& a, std::int64_t x) { return a.start < x; }) -
          reads.begin());
    };
    for (std::size_t gi = 0; gi < gaps.size(); ++gi) {
      const std::int64_t g = gaps[gi];
      const std::int64_t g_next = gi + 1 < gaps.size() ? gaps[gi + 1] : INT64_MAX;
      const auto rs = std::lower_bound(resyncs.begin(), resyncs.end(), g);
      if (rs == resyncs.end() || *rs >= g_next) continue;  // not back before the next gap
      const std::int64_t resync = *rs;
      const std::size_t first = read_at(g);
      const std::size_t last = read_at(g_next);
      // Past reconnect + 20 ms: a read that started more than 20 ms after the resync and saw a
      // version below v, the newest whose invalidate returned before the read started and
      // either before the resync (the gap may have hidden its report: the resync's mark must
      // cover it) or more than 20 ms before the read (the steady bound).
      for (std::size_t k = read_at(resync + kBoundNs + 1); k < last; ++k) {
        const read_rec& r = reads[k];
        const std::int64_t before = std::max(resync + 1, r.start - kBoundNs);
        const auto it =
            std::lower_bound(rets.begin(), rets.end(), std::make_pair(before, std::uint32_t{0}));
        if (it == rets.begin() || r.version >= std::prev(it)->second) continue;
        ++past_reconnect;
        if (std::prev(it)->first <= resync) ++past_reconnect_gap;
        if (std::getenv("FCB_DEBUG") != nullptr && past_reconnect < 40) {
          std::fprintf(stderr,
                       "past reconnect: reader %d read at +%.1f ms after the resync saw %u "
                       "(stale answer: %d); v %u returned %+.1f ms from the resync\n",
                       i, (r.start - resync) / 1e6, r.version, r.stale, std::prev(it)->second,
                       (std::prev(it)->first - resync) / 1e6);
        }
      }
      // The confirmations this reader applied (its resyncs count grew between two reads).
      std::vector<std::size_t> marks;
      for (std::size_t k = std::max<std::size_t>(first, 1); k < last; ++k) {
        if (reads[k].resyncs > reads[k - 1].resyncs) marks.push_back(k);
      }
      if (marks.empty()) continue;
      long served = 0;
      for (std::size_t j = 0; j < marks.size(); ++j) {
        const std::size_t until = j + 1 < marks.size() ? marks[j + 1] : last;
        double for_ms = 0;
        for (std::size_t k = marks[j]; k < until; ++k) {
          if (reads[k].stale == 0) continue;
          ++served;
          for_ms = (reads[k].start + reads[k].latency_ns - reads[marks[j]].start) / 1e6;
        }
        stale_for_ms.push_back(for_ms);
      }
      served_stale.push_back(static_cast<double>(served));
      // The reload: reads through the fleet from the first confirmation's read to the first
      // read answered fresh after the last one (that read's own included).
      std::size_t e = marks.back() + 1;
      while (e < reads.size() && reads[e - 1].stale != 0) ++e;
      const bool costly =
          e < reads.size() && reads[e].fleet_gets > reads[marks.front()].fleet_gets + 1;
      if (debug_gaps_max > 0 && costly && ++debug_gaps <= debug_gaps_max) {
        std::fprintf(stderr, "gap %zu reader %d: resync +%.2f ms\n", gi, i, (resync - g) / 1e6);
        for (int v = 1; v <= versions; ++v) {  // the writer's invalidates around it
          const std::int64_t b = sh->began[v].load();
          if (b > g - 60'000'000 && b < g + 60'000'000) {
            std::fprintf(stderr, "  invalidate(v%d) called %+.2f ms, returned %+.2f ms\n", v,
                         (b - g) / 1e6, (sh->ret[v].load() - g) / 1e6);
          }
        }
        for (std::size_t k = first; k < std::min(e + 2, last); ++k) {
          if (k > first && k + 1 < e && reads[k].fleet_gets == reads[k - 1].fleet_gets &&
              reads[k].heard == reads[k - 1].heard && reads[k].stale == reads[k - 1].stale &&
              reads[k].version == reads[k - 1].version) {
            continue;
          }
          std::fprintf(stderr,
                       "  +%.2f ms v%u stale %d resyncs %u heard %llu gets %u leads %u lat %.2f "
                       "ms\n",
                       (reads[k].start - g) / 1e6, reads[k].version, reads[k].stale,
                       reads[k].resyncs, static_cast<unsigned long long>(reads[k].heard),
                       reads[k].fleet_gets, reads[k].leads, reads[k].latency_ns / 1e6);
        }
      }
      if (e < reads.size()) {
        gap_gets.push_back(static_cast<double>(reads[e].fleet_gets) -
                           static_cast<double>(reads[marks.front()].fleet_gets));
      }
    }
    for (std::size_t j = 0; j < rets.size(); ++j) {
      const auto [ret, v] = rets[j];
      if (in_gap(ret)) continue;
      const std::int64_t next_ret = j + 1 < rets.size() ? rets[j + 1].first : INT64_MAX;
      auto k = std::lower_bound(reads.begin(), reads.end(), ret,
                                [](const read_rec& a, std::int64_t t) { return a.start < t; });
      std::int64_t last_old = ret;
      std::int64_t first_new = -1;
      for (; k != reads.end() && k->start < next_ret; ++k) {
        if (k->version < v) last_old = k->start;
        if (k->version >= v && first_new < 0) first_new = k->start + k->latency_ns;
      }
      window_ms.push_back((last_old - ret) / 1e6);
      if (first_new >= 0) seen_ms.push_back((first_new - ret) / 1e6);
    }
  }
  std::uint64_t calls = 0;
  std::uint64_t max_calls = 0;
  for (int v = 1; v <= versions; ++v) {
    calls += sh->calls[v].load();
    max_calls = std::max(max_calls, sh->calls[v].load());
  }
  const double per_version = versions > 0 ? static_cast<double>(calls) / versions : 0;
  std::printf(
      "| %s | %s | %d | %zu | %d (%d failed) | **%ld** | %ld (%.1f ms) | %ld | **%ld** (%ld) | "
      "%.1f / %.0f | %.2f / %.2f | %.2f / %.0f | "
      "%.2f / %.2f / %.2f | %.2f / %.2f | %.1f / %.1f | %.2f / %llu | %.2f | %zu / %.1f | "
      "%.1f / %.1f |\n",
      cfg.mode.c_str(), cfg.variant.c_str(), cfg.readers, n_reads, versions,
      sh->failed_invalidates.load(), stale_heard, stale, worst_late_ms, stale_in_gap,
      past_reconnect, past_reconnect_gap, mean(served_stale), pct(served_stale, 1.0),
      pct(stale_for_ms, 0.5), pct(stale_for_ms, 1.0), mean(gap_gets), pct(gap_gets, 1.0),
      pct(window_ms, 0.5), pct(window_ms, 0.99), pct(window_ms, 1.0), pct(seen_ms, 0.5),
      pct(seen_ms, 0.99), pct(latencies_us, 0.5), pct(latencies_us, 0.99), per_version,
      static_cast<unsigned long long>(max_calls),
      static_cast<double>(gets) / cfg.readers / std::max(1, versions), gaps.size(),
      static_cast<double>(n_resyncs) / cfg.readers, pct(reconnect_ms, 0.5), pct(reconnect_ms, 1.0));
  std::fflush(stdout);
  ::munmap(sh, sizeof(shared_state));
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (std::getline(in, w, ',')) out.push_back(w);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--reader" || std::string(argv[1]) == "--writer")) {
    std::map<std::string, std::string> a;
    for (int i = 2; i < argc; ++i) {
      const std::string w = argv[i];
      a[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
    }
    return std::string(argv[1]) == "--reader" ? reader_main(a) : writer_main(a);
  }
  config base;
  std::vector<std::string> readers = {"4", "8"};
  std::vector<std::string> modes = {"tracking", "publish"};
  std::vector<std::string> variants = {"steady", "kill", "restart"};
  std::string bin = "redis-server";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--seconds")
      base.seconds = std::stoi(v);
    else if (k == "--readers")
      readers = split(v);
    else if (k == "--modes")
      modes = split(v);
    else if (k == "--variants")
      variants = split(v);
    else if (k == "--read-interval-us")
      base.interval_us = std::stol(v);
    else if (k == "--load-us")
      base.load_us = std::stol(v);
    else if (k == "--swr-ms")
      base.swr_ms = std::stol(v);
    else if (k == "--ttl-s")
      base.ttl_s = std::stol(v);
    else if (k == "--redis-server")
      bin = v;
    else
      die("unknown option " + k);
  }
  if (bin.find('/') == std::string::npos) {
    for (const char* d : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
      if (::access((std::string(d) + "/" + bin).c_str(), X_OK) == 0) {
        bin = std::string(d) + "/" + bin;
        break;
      }
    }
  }
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "fleet-cache-driver.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) die("mkdtemp");
  const std::string dir = tmpl;
  int run_id = 0;
  {
    server s(bin, dir);
    std::printf(
        "fleet_cache_driver: redis-server at %s; %u hardware threads; %d s per run; a read "
        "every %ld µs per reader; origin %ld µs; invalidate every 100 ms; readers' local ttl "
        "%ld s, stale_while_revalidate %ld ms\n\n",
        s.uri().c_str(), std::thread::hardware_concurrency(), base.seconds, base.interval_us,
        base.load_us, base.ttl_s, base.swr_ms);
    std::printf(
        "| mode | variant | readers | reads | versions (invalidate threw) | stale reads past "
        "invalidate + 20 ms, outside gaps, after the reader heard it | the same, report not yet "
        "heard (latest, after the invalidate) | stale reads in gaps (gap start to resync + 20 "
        "ms) | stale reads past reconnect + 20 ms (of an invalidate before the resync) | reads "
        "answered stale per gap mean / max | answered stale until, ms after the confirmation "
        "p50 / max | reads through the fleet per reader per gap mean / max | window p50 / p99 / "
        "max ms | new seen p50 / p99 ms | read µs p50 / p99 | origin "
        "calls per version mean / max | Redis GETs per reader per version | gaps / resyncs per "
        "reader | reconnect ms p50 / max |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|-"
        "--:|"
        "\n");
    std::fflush(stdout);
    for (const auto& variant : variants) {
      for (const auto& mode : modes) {
        for (const auto& r : readers) {
          config c = base;
          c.variant = variant;
          c.mode = mode;
          c.readers = std::stoi(r);
          run_one(s, dir, c, ++run_id);
        }
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
