// tests/support/procs.hpp: real child processes for the multi-process fleet tests.
//
// worker_fleet starts N processes of tests/support/fleet_worker.cpp (fork/exec; each dies with
// the test process: PR_SET_PDEATHSIG) sharing one origin pipe (fd 3 in each child, written by
// the loader itself: the children cannot fake the count), reads their stdout lines, and
// injects signals. Every wait is bounded and named (sync.hpp's hang()).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sync.hpp"

namespace sftest {

// One worker process.
struct worker_proc {
  pid_t pid = -1;
  int in = -1;                     // its stdin (we write)
  int out = -1;                    // its stdout (we read)
  std::string buffer;              // unread stdout bytes
  std::vector<std::string> lines;  // complete stdout lines
  bool exited = false;
  bool eof = false;  // its stdout reached end of file
  int status = 0;

  // The "done" line's fields (name -> value), once it arrived.
  std::optional<std::map<std::string, std::string>> done() const {
    for (const auto& l : lines) {
      if (l.rfind("done ", 0) != 0) continue;
      std::map<std::string, std::string> fields;
      std::istringstream words(l.substr(5));
      std::string w;
      while (words >> w) {
        const auto eq = w.find('=');
        if (eq != std::string::npos) fields[w.substr(0, eq)] = w.substr(eq + 1);
      }
      return fields;
    }
    return std::nullopt;
  }
  long field(const std::string& name) const {
    const auto d = done();
    if (!d || d->count(name) == 0) return -1;
    return std::stol(d->at(name));
  }
  std::string text(const std::string& name) const {
    const auto d = done();
    return d && d->count(name) != 0 ? d->at(name) : std::string();
  }
  bool ready() const {
    for (const auto& l : lines) {
      if (l.rfind("ready ", 0) == 0) return true;
    }
    return false;
  }
};

class worker_fleet {
 public:
  using clock = std::chrono::steady_clock;

  // Starts n workers with the same arguments (name=value words).
  worker_fleet(int n, const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    origin_read_ = fds[0];
    const int origin_write = fds[1];
    for (int i = 0; i < n; ++i) procs_.push_back(spawn(args, origin_write));
    ::close(origin_write);
  }
  worker_fleet(const worker_fleet&) = delete;
  worker_fleet& operator=(const worker_fleet&) = delete;
  ~worker_fleet() {
    for (auto& p : procs_) {
      if (!p.exited) {
        ::kill(p.pid, SIGCONT);
        ::kill(p.pid, SIGKILL);
        ::waitpid(p.pid, &p.status, 0);
      }
      ::close(p.in);
      ::close(p.out);
    }
    ::close(origin_read_);
  }

  std::vector<worker_proc>& procs() { return procs_; }
  worker_proc& proc_of(pid_t pid) {
    for (auto& p : procs_) {
      if (p.pid == pid) return p;
    }
    throw std::runtime_error("no such worker");
  }

  // Origin calls seen so far: the pid of each loader call, in order.
  const std::vector<pid_t>& origins() const { return origins_; }
  std::vector<clock::time_point> origin_times() const { return origin_times_; }

  void send(worker_proc& p, const std::string& line) {
    const std::string s = line + "\n";
    if (::write(p.in, s.data(), s.size()) != static_cast<ssize_t>(s.size())) {
      throw std::runtime_error("write to worker failed");
    }
  }
  void send_all(const std::string& line) {
    for (auto& p : procs_) {
      if (!p.exited) send(p, line);
    }
  }

  void signal(worker_proc& p, int sig) { ::kill(p.pid, sig); }

  // Reads everything available until pred() holds; aborts with `name` past the bound.
  template <class Pred>
  void until(Pred pred, const char* name, std::chrono::milliseconds limit = bound) {
    const auto deadline = clock::now() + limit;
    while (!pred()) {
      if (clock::now() > deadline) {
        dump();
        hang(name, limit);
      }
      pump(std::chrono::milliseconds(20));
    }
  }

  void wait_ready() {
    until(
        [&] {
          for (auto& p : procs_) {
            if (!p.ready()) return false;
          }
          return true;
        },
        "workers ready");
  }

  // Every worker that was not killed has printed "done" (and exited).
  void wait_done(const char* name = "workers done") {
    until(
        [&] {
          for (auto& p : procs_) {
            if (killed_.count(p.pid) == 0 && (!p.done() || !p.exited)) return false;
          }
          return true;
        },
        name);
  }

  void kill_hard(worker_proc& p) {
    ::kill(p.pid, SIGKILL);
    killed_[p.pid] = true;
  }

  void dump() const {
    for (const auto& p : procs_) {
      std::fprintf(stderr, "worker %d%s:\n", static_cast<int>(p.pid), p.exited ? " (exited)" : "");
      for (const auto& l : p.lines) std::fprintf(stderr, "  %s\n", l.c_str());
    }
    std::fprintf(stderr, "origin calls: %zu\n", origins_.size());
  }

 private:
  worker_proc spawn(const std::vector<std::string>& args, int origin_write) {
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2");
    }
    std::vector<std::string> words = {SINGLEFLIGHT_FLEET_WORKER};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(origin_write, 3);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    worker_proc p;
    p.pid = pid;
    p.in = in[1];
    p.out = out[0];
    (void)::fcntl(p.out, F_SETFL, ::fcntl(p.out, F_GETFL) | O_NONBLOCK);
    return p;
  }

  // One round of poll over the origin pipe and every worker's stdout.
  void pump(std::chrono::milliseconds wait) {
    // A pipe at end of file is left out (poll would report it at once, every time).
    std::vector<pollfd> fds;
    fds.push_back({origin_eof_ ? -1 : origin_read_, POLLIN, 0});
    for (auto& p : procs_) fds.push_back({p.eof ? -1 : p.out, POLLIN, 0});
    (void)::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    char buf[4096];
    if ((fds[0].revents & (POLLIN | POLLHUP)) != 0) {
      const ssize_t n = ::read(origin_read_, buf, sizeof buf);
      if (n > 0) origin_buffer_.append(buf, static_cast<std::size_t>(n));
      if (n == 0) origin_eof_ = true;
      std::size_t eol = 0;
      while ((eol = origin_buffer_.find('\n')) != std::string::npos) {
        const std::string line = origin_buffer_.substr(0, eol);
        origin_buffer_.erase(0, eol + 1);
        if (line.rfind("O ", 0) == 0) {
          origins_.push_back(static_cast<pid_t>(std::stol(line.substr(2))));
          origin_times_.push_back(clock::now());
        }
      }
    }
    for (std::size_t i = 0; i < procs_.size(); ++i) {
      worker_proc& p = procs_[i];
      if ((fds[i + 1].revents & (POLLIN | POLLHUP)) != 0) {
        for (;;) {
          const ssize_t n = ::read(p.out, buf, sizeof buf);
          if (n == 0) p.eof = true;
          if (n <= 0) break;
          p.buffer.append(buf, static_cast<std::size_t>(n));
        }
        std::size_t eol = 0;
        while ((eol = p.buffer.find('\n')) != std::string::npos) {
          p.lines.push_back(p.buffer.substr(0, eol));
          p.buffer.erase(0, eol + 1);
        }
      }
      if (!p.exited && ::waitpid(p.pid, &p.status, WNOHANG) == p.pid) p.exited = true;
    }
  }

  std::vector<worker_proc> procs_;
  int origin_read_ = -1;
  bool origin_eof_ = false;
  std::string origin_buffer_;
  std::vector<pid_t> origins_;
  std::vector<clock::time_point> origin_times_;
  std::map<pid_t, bool> killed_;
};

}  // namespace sftest
