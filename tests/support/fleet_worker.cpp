// tests/support/fleet_worker.cpp: one process of a fleet, for the multi-process tests
// (tests/test_fleet_procs.cpp starts several with fork/exec and injects faults).
//
//   fleet_worker uri=tcp://127.0.0.1:PORT prefix=P key=K threads=T [mode=fleet|group|naive]
//                [load_ms=L] [hold=1] [fail=1] [lease_ms=..] [slice_ms=..] [max_wait_ms=..]
//                [timeout_ms=..] [value_ttl_ms=..] [error_ttl_ms=..] [breaker=N] [gather=1]
//
// Protocol (lines):
//   stdout  "ready <pid>"                          once the fleet is constructed
//   stdin   "go"                                   start: T threads each call get(K) once
//   fd 3    "O <pid>"                              written by the loader itself, once per
//                                                  origin call, before it loads: the test
//                                                  counts origin calls on this pipe, not from
//                                                  anything the process reports about itself
//   stdin   "release"                              with hold=1: the loader returns now (it
//                                                  blocks until then)
//   stdout  "done ok=N err=N value=V error=E ms=M <fleet_stats fields as name=value>"
// then the process closes the fleet and exits 0. With gather=1 (mode=fleet) the T threads
// meet in a group of the worker's own in front of the fleet, and the loader announces itself
// on fd 3 only once the other T - 1 have joined that flight (counted under the group's lock:
// stats().joins), so a test that stops the process on "O <pid>" knows every caller of the
// process is in its flight (a thread still starting would otherwise call later and read the
// value another process stored meanwhile). The loader sleeps load_ms (the origin's
// latency, not synchronisation) or blocks on stdin (hold=1), then returns "v-<pid>" or throws
// std::runtime_error("origin failed in <pid>") (fail=1).
#include <singleflight/fleet.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include "jthread.hpp"

namespace {

std::map<std::string, std::string> args;

std::string arg(const std::string& name, const std::string& fallback = "") {
  const auto it = args.find(name);
  return it == args.end() ? fallback : it->second;
}
long num(const std::string& name, long fallback) {
  const auto it = args.find(name);
  return it == args.end() ? fallback : std::stol(it->second);
}

std::string read_line() {
  std::string line;
  char c = 0;
  while (::read(0, &c, 1) == 1) {
    if (c == '\n') return line;
    line += c;
  }
  return line;  // EOF: the test went away
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) std::_Exit(3);
    off += static_cast<std::size_t>(n);
  }
}

std::string loader_value() { return "v-" + std::to_string(::getpid()); }

singleflight::group<std::string, std::string>* gather_group = nullptr;  // gather=1
int gather_threads = 0;

std::string load() {
  if (gather_group != nullptr) {
    // Bounded: a caller that never joins fails the test on its own (origin pipe, "done").
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (gather_group->stats().joins < static_cast<std::uint64_t>(gather_threads - 1) &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }
  write_all(3, "O " + std::to_string(::getpid()) + "\n");
  if (num("hold", 0) != 0) {
    while (read_line() != "release") {
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(num("load_ms", 200)));
  }
  if (num("fail", 0) != 0) {
    throw std::runtime_error("origin failed in " + std::to_string(::getpid()));
  }
  return loader_value();
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (eq == std::string::npos) return 2;
    args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  using ms = std::chrono::milliseconds;
  const std::string mode = arg("mode", "fleet");
  const std::string key = arg("key", "k");
  const int threads = static_cast<int>(num("threads", 4));

  singleflight::fleet_options o;
  o.redis_uri = arg("uri");
  o.key_prefix = arg("prefix", "sftest");
  o.lease_ttl = ms(num("lease_ms", 1000));
  o.wait_slice = ms(num("slice_ms", 0));
  o.max_wait = ms(num("max_wait_ms", 0));
  o.redis_timeout = ms(num("timeout_ms", 1000));
  o.value_ttl = ms(num("value_ttl_ms", 60000));
  o.error_ttl = ms(num("error_ttl_ms", 0));
  o.breaker_threshold = static_cast<std::uint32_t>(num("breaker", 3));
  singleflight::fleet<std::string, std::string> fleet(o);
  singleflight::group<std::string, std::string> local;

  if (mode == "fleet" && num("gather", 0) != 0) {
    gather_group = &local;
    gather_threads = threads;
  }
  write_all(1, "ready " + std::to_string(::getpid()) + "\n");
  if (read_line() != "go") return 4;

  std::mutex mu;
  int ok = 0;
  int err = 0;
  std::string value;
  std::vector<std::exception_ptr> errors;
  long max_ms = 0;
  {
    std::vector<sftest::jthread> callers;
    for (int t = 0; t < threads; ++t) {
      callers.emplace_back([&] {
        const auto t0 = std::chrono::steady_clock::now();
        std::string v;
        std::exception_ptr e;
        try {
          if (mode == "fleet" && gather_group != nullptr) {
            v = local.do_(key, [&] { return fleet.get(key, [] { return load(); }); });
          } else if (mode == "fleet") {
            v = fleet.get(key, [] { return load(); });
          } else if (mode == "group") {
            v = local.do_(key, [] { return load(); });
          } else {
            v = load();
          }
        } catch (...) {
          e = std::current_exception();
        }
        const long took = static_cast<long>(
            std::chrono::duration_cast<ms>(std::chrono::steady_clock::now() - t0).count());
        const std::lock_guard<std::mutex> lk(mu);
        max_ms = std::max(max_ms, took);
        if (!e) {
          ok += 1;
          value = v;
        } else {
          err += 1;
          // Kept until every caller thread is joined: the callers of one flight share one
          // exception object, and TSan cannot see libstdc++'s exception_ptr reference count
          // (a false race when the last holder frees it while another reads it).
          errors.push_back(e);
        }
      });
    }
  }
  std::string error;
  if (!errors.empty()) {
    try {
      std::rethrow_exception(errors.back());
    } catch (const std::exception& x) {
      error = x.what();
    } catch (...) {
      error = "not-a-std::exception";
    }
  }
  errors.clear();
  for (char& c : error) {
    if (c == ' ' || c == '\n') c = '_';
  }
  const auto s = fleet.stats();
  char line[1024];
  std::snprintf(line, sizeof line,
                "done ok=%d err=%d value=%s error=%s ms=%ld gets=%llu hits=%llu leader=%llu "
                "follower_woken=%llu late_hit=%llu local_fallback=%llu lease_lost=%llu "
                "fence_rejections=%llu invalidated_stores=%llu decode_failures=%llu "
                "redis_errors=%llu remote_failures=%llu origin_calls=%llu breaker_opens=%llu\n",
                ok, err, value.empty() ? "-" : value.c_str(), error.empty() ? "-" : error.c_str(),
                max_ms, static_cast<unsigned long long>(s.gets),
                static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.leader),
                static_cast<unsigned long long>(s.follower_woken),
                static_cast<unsigned long long>(s.late_hit),
                static_cast<unsigned long long>(s.local_fallback),
                static_cast<unsigned long long>(s.lease_lost),
                static_cast<unsigned long long>(s.fence_rejections),
                static_cast<unsigned long long>(s.invalidated_stores),
                static_cast<unsigned long long>(s.decode_failures),
                static_cast<unsigned long long>(s.redis_errors),
                static_cast<unsigned long long>(s.remote_failures),
                static_cast<unsigned long long>(s.origin_calls),
                static_cast<unsigned long long>(s.breaker_opens));
  write_all(1, line);
  fleet.close();
  return 0;
}
