// 09-fleet-cache: an invalidate by one process reaches every other process's local cache.
//
//   09-fleet-cache [--redis tcp://host:port] [--readers N] [--rounds R]
//
// Starts N reader processes (fork/exec of this program); the parent is the writer. Every
// process reads one hot key through a singleflight::fleet_cache with a local ttl of 60 s, so
// nothing but the fleet's coherence can make a reader drop its local copy within the run:
//
//   fleet_cache (in-process: ttl 60 s; a hit costs no Redis round trip)
//     └─ the fleet (Redis: the value, one origin call per key across the processes)
//          └─ the origin: a file holding the current version ("v7")
//
// Each round: every reader reads the key (a local hit once it has it); the writer changes the
// origin, calls invalidate(key), and once invalidate has returned tells the readers which value
// to expect. Each reader then reads until it gets that value, bounded by a deadline it must
// never reach, and reports how long it took and how many reads still saw the old value. The
// rounds run under both coherence modes: client tracking (the default: every write under the
// prefix reported by the server) and the bus (fleet_cache's own put / invalidate published).
//
// Without --redis it starts its own redis-server on a free loopback port (a temporary
// directory, a pidfile) and stops it by pid at the end. Exits 77 (ctest: skipped) when there
// is none, 1 if a reader never saw a value written before it was told to expect it. The times
// are printed, not checked: on a loaded machine a reader's subscriber thread can be scheduled
// late (docs/fleet_cache.md: "The bound, measured").
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
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// How long a reader may take to see a new value before the example fails: far beyond the
// 20 ms the coherence aims at, so that only a lost invalidation fails it, never a slow machine.
constexpr auto must_see_within = 20s;

std::string read_line(int fd) {
  std::string line;
  char c = 0;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

void write_line(int fd, const std::string& line) {
  const std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
}

// The origin: a file with the current version, replaced atomically by the writer.
std::string read_origin(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  std::getline(in, v);
  return v;
}

void write_origin(const std::string& path, const std::string& value) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << value << "\n";
  }
  std::filesystem::rename(tmp, path);
}

singleflight::fleet_cache_options options(const std::string& uri, const std::string& prefix,
                                          singleflight::fleet_coherence coherence) {
  singleflight::fleet_cache_options o;
  o.local.ttl = 60s;  // the local copy lives long: the coherence drops it, not its age
  o.fleet.redis_uri = uri;
  o.fleet.key_prefix = prefix;
  o.fleet.value_ttl = 5min;
  o.coherence = coherence;  // tracking (the default) or publish
  // Generous (the default is 50 ms): this demo also runs on busy, sanitized CI machines.
  o.fleet.redis_timeout = 1s;
  return o;
}

// Both coherence modes' subscriptions (the coherence channel and the expire channel) are
// confirmed: from now on an invalidate reaches this process. Bounded.
bool until_listening(const singleflight::fleet_cache<std::string, std::string>& c) {
  const auto until = steady::now() + must_see_within;
  while (c.stats().resyncs < 2) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(1ms);  // polling a demo's progress
  }
  return true;
}

// --- a reader: one process of the fleet -------------------------------------------------------

int reader(const std::string& uri, const std::string& prefix, const std::string& origin_path,
           singleflight::fleet_coherence coherence) {
  singleflight::fleet_cache<std::string, std::string> profiles(
      options(uri, prefix, coherence), [&origin_path](const std::string&) {
        return read_origin(origin_path);  // a miss across the fleet: one process reads it
      });
  if (!until_listening(profiles)) return 2;
  write_line(1, "ready");
  for (std::string cmd; !(cmd = read_line(0)).empty();) {
    if (cmd == "read") {
      write_line(1, "saw " + profiles.get("profile"));
    } else if (cmd.rfind("expect ", 0) == 0) {
      // Told after the writer's invalidate returned: every read from here on started after it.
      const std::string want = cmd.substr(7);
      const auto start = steady::now();
      int old_reads = 0;
      std::string got;
      while ((got = profiles.get("profile")) != want) {
        old_reads += 1;
        if (steady::now() - start > must_see_within) break;
        std::this_thread::sleep_for(100us);  // polling: the next read, not a synchronisation
      }
      const auto us =
          std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - start).count();
      write_line(1, (got == want ? "seen " : "never ") + std::to_string(us) + " " +
                        std::to_string(old_reads));
    }
  }
  return 0;
}

// --- the parent: the writer -------------------------------------------------------------------

struct redis_server {
  pid_t pid = -1;
  std::filesystem::path dir;
  int port = 0;

  bool start() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "example-09.XXXXXX").string();
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

struct child {
  pid_t pid;
  int in;
  int out;
};

// A reader's answer, bounded: a reader that does not answer fails the example.
std::string answer(const child& c) {
  pollfd p{c.out, POLLIN, 0};
  return ::poll(&p, 1, 60000) == 1 ? read_line(c.out) : "";
}

struct mode_result {
  long long max_us = 0;  // the slowest reader to see a new value, after invalidate returned
  int old_reads = 0;     // reads, across the readers, that still saw the old value
  bool ok = true;
};

mode_result run_mode(const std::string& self, const std::string& uri, const std::string& prefix,
                     const std::string& origin_path, singleflight::fleet_coherence coherence, int n,
                     int rounds) {
  const char* mode = coherence == singleflight::fleet_coherence::tracking ? "tracking" : "publish";
  mode_result res;
  write_origin(origin_path, "v0");
  std::vector<child> children;
  for (int i = 0; i < n; ++i) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::exit(1);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execl(self.c_str(), self.c_str(), "--reader", uri.c_str(), prefix.c_str(),
              origin_path.c_str(), mode, static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    children.push_back({pid, in[1], out[0]});
  }
  singleflight::fleet_cache<std::string, std::string> profiles(
      options(uri, prefix, coherence),
      [&origin_path](const std::string&) { return read_origin(origin_path); });
  for (const child& c : children) {
    if (answer(c) != "ready") {
      std::fprintf(stderr, "09-fleet-cache: a reader did not start\n");
      std::exit(1);
    }
  }
  for (int r = 1; r <= rounds; ++r) {
    const std::string old = "v" + std::to_string(r - 1);
    const std::string now = "v" + std::to_string(r);
    // Every reader holds the old value locally (read twice: the second read is a local hit).
    for (int pass = 0; pass < 2; ++pass) {
      for (const child& c : children) write_line(c.in, "read");
      for (const child& c : children) {
        if (answer(c) != "saw " + old) res.ok = false;
      }
    }
    write_origin(origin_path, now);  // the origin changes...
    profiles.invalidate("profile");  // ...and once this returns, every process reads `now`
    for (const child& c : children) write_line(c.in, "expect " + now);
    for (const child& c : children) {
      const std::string a = answer(c);
      long long us = 0;
      int old_reads = 0;
      if (std::sscanf(a.c_str(), "seen %lld %d", &us, &old_reads) != 2) {
        std::fprintf(stderr, "09-fleet-cache (%s): round %d: a reader answered \"%s\"\n", mode, r,
                     a.c_str());
        res.ok = false;
        continue;
      }
      res.max_us = std::max(res.max_us, us);
      res.old_reads += old_reads;
    }
  }
  for (const child& c : children) {
    ::close(c.in);  // end of input: the reader returns
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "09-fleet-cache: a reader failed (status %d)\n", status);
      res.ok = false;
    }
    ::close(c.out);
  }
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--reader") {
    return reader(argv[2], argv[3], argv[4],
                  std::string(argv[5]) == "tracking" ? singleflight::fleet_coherence::tracking
                                                     : singleflight::fleet_coherence::publish);
  }
  std::string uri;
  int n = 4;
  int rounds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--redis") uri = argv[i + 1];
    if (flag == "--readers") n = std::atoi(argv[i + 1]);
    if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  if (n < 1 || rounds < 1) {
    std::fprintf(stderr, "09-fleet-cache: need --readers >= 1 and --rounds >= 1\n");
    return 1;
  }
  redis_server own;
  if (uri.empty()) {
    if (!own.start()) {
      std::printf(
          "09-fleet-cache: no redis-server to start (install redis-server or pass --redis)\n");
      own.stop();
      return 77;
    }
    uri = "tcp://127.0.0.1:" + std::to_string(own.port);
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "example-09-origin.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return 1;
  const std::filesystem::path origin_dir = tmpl;
  const std::string origin_path = (origin_dir / "origin").string();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string run =
      std::to_string(::getpid()) + ":" +
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf(
      "%d reader processes and a writer, one hot key, local ttl 60 s, %d invalidates, "
      "Redis %s\n\n",
      n, rounds, uri.c_str());
  std::printf("%-10s %s\n", "coherence", "slowest reader to see the new value   stale reads");
  bool ok = true;
  for (const auto coherence :
       {singleflight::fleet_coherence::tracking, singleflight::fleet_coherence::publish}) {
    const bool tracking = coherence == singleflight::fleet_coherence::tracking;
    const mode_result r = run_mode(self, uri, "example-09:" + run + (tracking ? ":t" : ":p"),
                                   origin_path, coherence, n, rounds);
    std::printf("%-10s %27.3f ms %14d\n", tracking ? "tracking" : "publish",
                static_cast<double>(r.max_us) / 1000.0, r.old_reads);
    ok = ok && r.ok;
  }
  own.stop();
  std::error_code ec;
  std::filesystem::remove_all(origin_dir, ec);
  std::printf("\n%s\n", ok ? "every reader saw every new value after the writer's invalidate "
                             "returned, with a local ttl of 60 s"
                           : "FAILED: a reader did not see a new value");
  return ok ? 0 : 1;
}
