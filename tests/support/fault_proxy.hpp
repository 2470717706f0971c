// tests/support/fault_proxy.hpp: a TCP proxy on loopback that puts network faults between the
// library and a redis-server (the fleet tests and the soak).
//
//   sftest::fault_proxy proxy(server.port());          // listens on a free 127.0.0.1 port
//   fleet_options o; o.redis_uri = proxy.uri();
//   proxy.set_delay(sftest::fault_proxy::up, 10ms);     // each direction on its own
//   proxy.hold_command("EVALSHA", 200ms);               // the next EVALSHA, on any connection
//   proxy.trickle(sftest::fault_proxy::down, 40ms);     // replies one byte every 40 ms
//   proxy.drop_all();                                   // every connection closed, now
//   proxy.refuse(true);                                 // connect() fails with ECONNREFUSED
//
// Directions: `up` is client -> server, `down` is server -> client. Every fault applies to the
// bytes the proxy reads from then on, on every connection; a byte never overtakes an earlier
// one of its direction (a held or delayed chunk holds back what follows it, as on a TCP
// stream). The proxy parses the client's commands (RESP arrays, what hiredis sends) so that
// it can hold one by name and count them; anything else is forwarded as it comes.
//
// When one side closes, what the proxy still holds for the other side is delivered first
// (then the write side is shut down): a command a client gave up on still reaches the server
// later, as it would through a slow network. drop_all() closes both sides at once instead.
//
// One thread runs a poll loop (bounded waits: at most 50 ms between checks of its stop flag,
// and a wake-up pipe for every change); the destructor stops and joins it and closes every
// socket. Every member is thread-safe. A control call returns once the loop has applied it
// where that matters (drop_all, refuse); the others apply to the next bytes read.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sync.hpp"

namespace sftest {

class fault_proxy {
  using clock = std::chrono::steady_clock;
  using ms = std::chrono::milliseconds;

 public:
  enum direction : int { up = 0, down = 1 };

  // A hold that lasts until release_commands() (hold_command) or resume() (pause).
  static constexpr ms until_released = ms::max();

  // fault_proxy(upstream_port): forwards 127.0.0.1:port() to 127.0.0.1:upstream_port.
  explicit fault_proxy(int upstream_port) : upstream_port_(upstream_port) {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("fault_proxy: pipe2");
    wake_read_ = fds[0];
    wake_write_ = fds[1];
    listen_fd_ = listen_on(0);
    thread_ = std::thread([this] { run(); });
  }
  fault_proxy(const fault_proxy&) = delete;
  fault_proxy& operator=(const fault_proxy&) = delete;

  // ~fault_proxy(): stops the loop, joins it, closes every socket.
  ~fault_proxy() {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    poke();
    thread_.join();
    for (auto& c : conns_) close_conn(c);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    ::close(wake_read_);
    ::close(wake_write_);
  }

  int port() const { return port_; }
  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }

  // ---- faults ----------------------------------------------------------------------------

  // set_delay(d, fixed): every chunk read in direction d waits `fixed` before it is forwarded.
  void set_delay(direction d, ms fixed) { set_random_delay(d, fixed, fixed); }

  // set_random_delay(d, lo, hi): each chunk waits a uniform random time in [lo, hi] (order
  // kept: a chunk never leaves before the one read before it).
  void set_random_delay(direction d, ms lo, ms hi) {
    change([&] {
      flows_[d].delay_lo = lo;
      flows_[d].delay_hi = std::max(lo, hi);
    });
  }

  // hold_bytes(d, n, for_): the next n bytes read in direction d (and, in order, whatever
  // follows them) wait `for_` from the moment they are read.
  void hold_bytes(direction d, std::size_t n, ms for_) {
    change([&] {
      flows_[d].hold_left = n;
      flows_[d].hold_for = for_;
    });
  }

  // hold_command(name, for_): the next client command called `name` (case-insensitive, on
  // any connection) waits `for_` (until_released: until release_commands()), and with it
  // what its connection sends after it. One command per call; holds of different names are
  // armed side by side (a second call for the same name replaces the first).
  void hold_command(std::string name, ms for_) {
    for (char& c : name) c = upper(c);
    change([&] { hold_cmds_[std::move(name)] = for_; });
  }

  // release_commands(): the commands held until_released go now.
  void release_commands() {
    change([&] {
      for (auto& c : conns_) {
        for (auto& ch : c.flow[up].q) ch.held = false;
      }
    });
  }

  // trickle(d, every): forwards direction d one byte every `every` (0: as fast as it comes).
  void trickle(direction d, ms every) {
    change([&] { flows_[d].trickle = every; });
  }

  // pause(d) / resume(d): nothing is forwarded in direction d until resume() (bytes are
  // still read and queued).
  void pause(direction d) {
    change([&] { flows_[d].paused = true; });
  }
  void resume(direction d) {
    change([&] { flows_[d].paused = false; });
  }

  // clear(): no delay, no hold, no trickle, no pause; held commands released.
  void clear() {
    change([&] {
      for (auto& f : flows_) f = flow_settings{};
      hold_cmds_.clear();
      for (auto& c : conns_) {
        for (auto& ch : c.flow[up].q) ch.held = false;
      }
    });
  }

  // drop_all(reset): closes both sides of every connection (with an RST when `reset`);
  // returns once they are closed. New connections are still accepted.
  void drop_all(bool reset = false) {
    sync([&] {
      for (auto& c : conns_) {
        if (reset) {
          abort_fd(c.client);
          abort_fd(c.server);
        }
        close_conn(c);
      }
      conns_.clear();
    });
  }

  // refuse(on): on: the listener is closed (a connect fails with ECONNREFUSED); off: it
  // listens again on the same port. Open connections are not touched. Returns once applied.
  void refuse(bool on) {
    sync([&] {
      if (on && listen_fd_ >= 0) {
        ::close(listen_fd_);
        listen_fd_ = -1;
      } else if (!on && listen_fd_ < 0) {
        listen_fd_ = listen_on(port_);
      }
    });
  }

  // ---- observations ----------------------------------------------------------------------

  std::size_t accepted() const {
    return observe([&] { return accepted_; });
  }
  std::size_t open_connections() const {
    return observe([&] { return conns_.size(); });
  }
  std::size_t peak_connections() const {
    return observe([&] { return peak_; });
  }
  // Commands of this name the clients sent, all connections (counted as they are read).
  std::size_t commands(std::string name) const {
    for (char& c : name) c = upper(c);
    return observe([&] {
      const auto it = counts_.find(name);
      return it == counts_.end() ? std::size_t{0} : it->second;
    });
  }
  // Commands caught by hold_command since construction.
  std::size_t held_commands() const {
    return observe([&] { return held_total_; });
  }
  // Bytes read from each side but not yet forwarded, all connections.
  std::size_t queued(direction d) const {
    return observe([&] {
      std::size_t n = 0;
      for (const auto& c : conns_) {
        for (const auto& ch : c.flow[d].q) n += ch.bytes.size() - ch.off;
      }
      return n;
    });
  }

 private:
  struct flow_settings {
    ms delay_lo{0};
    ms delay_hi{0};
    std::size_t hold_left = 0;
    ms hold_for{0};
    ms trickle{0};
    bool paused = false;
  };

  struct chunk {
    std::string bytes;
    std::size_t off = 0;
    clock::time_point at;  // not before
    bool held = false;     // until release_commands()
  };

  // One direction of one connection.
  struct flow_state {
    std::deque<chunk> q;
    std::size_t queued = 0;
    clock::time_point last_at{};    // release times never decrease
    clock::time_point next_byte{};  // trickle pacing
    std::string partial;            // up: the start of a command not complete yet
    bool raw = false;               // up: not RESP: forwarded as read
    bool eof_in = false;            // its source closed (or failed)
    bool shut = false;              // ... and that was passed on (SHUT_WR)
    bool failed = false;            // its destination failed: discard
    bool finished() const { return failed || (eof_in && q.empty() && shut); }
  };

  struct conn {
    int client = -1;
    int server = -1;
    flow_state flow[2];  // [up] client -> server, [down] server -> client
  };

  static constexpr std::size_t max_queued = std::size_t{8} << 20;  // per flow: stop reading

  static char upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }

  int listen_on(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) throw std::runtime_error("fault_proxy: socket");
    const int one = 1;
    (void)::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    socklen_t len = sizeof a;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 512) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(s);
      throw std::runtime_error("fault_proxy: bind/listen on 127.0.0.1:" + std::to_string(port));
    }
    port_ = ntohs(a.sin_port);
    return s;
  }

  // A connection to the upstream server, bounded (1 s), or -1.
  int connect_upstream() const {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(upstream_port_));
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      if (errno != EINPROGRESS) {
        ::close(s);
        return -1;
      }
      pollfd p{s, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, 1000) != 1 || ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
          err != 0) {
        ::close(s);
        return -1;
      }
    }
    nodelay(s);
    return s;
  }

  static void nodelay(int s) {
    const int one = 1;
    (void)::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  static void abort_fd(int fd) {
    if (fd < 0) return;
    const linger l{1, 0};
    (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }

  static void close_conn(conn& c) {
    if (c.client >= 0) ::close(c.client);
    if (c.server >= 0) ::close(c.server);
    c.client = c.server = -1;
  }

  void poke() const {
    const char b = 1;
    (void)!::write(wake_write_, &b, 1);
  }

  template <class F>
  void change(F f) {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      f();
    }
    poke();
  }

  template <class F>
  std::size_t observe(F f) const {
    const std::lock_guard<std::mutex> lk(mu_);
    return f();
  }

  // Runs f on the loop's thread and waits (bounded) until it has.
  template <class F>
  void sync(F f) {
    std::unique_lock<std::mutex> lk(mu_);
    const std::uint64_t ticket = ++requested_;
    pending_.emplace_back(ticket, std::function<void()>(std::move(f)));
    poke();
    if (!cv_.wait_for(lk, bound, [&] { return applied_ >= ticket; })) hang("fault_proxy: sync");
  }

  // The length of the RESP command at the start of `b`, 0 while incomplete, npos when `b`
  // is not a RESP array of bulk strings. `name` gets its first word, upper-cased.
  static std::size_t command_length(std::string_view b, std::string& name) {
    const auto number = [&](std::size_t& at, long long& out) {
      const auto eol = b.find("\r\n", at);
      if (eol == std::string_view::npos) return false;
      out = 0;
      for (std::size_t i = at; i < eol; ++i) {
        if (b[i] < '0' || b[i] > '9') {
          out = -1;
          return true;
        }
        out = out * 10 + (b[i] - '0');
      }
      at = eol + 2;
      return true;
    };
    if (b.empty()) return 0;
    if (b[0] != '*') return std::string_view::npos;
    std::size_t at = 1;
    long long n = 0;
    if (!number(at, n)) return 0;
    if (n < 0) return std::string_view::npos;
    for (long long i = 0; i < n; ++i) {
      if (at >= b.size()) return 0;
      if (b[at] != '$') return std::string_view::npos;
      ++at;
      long long len = 0;
      if (!number(at, len)) return 0;
      if (len < 0) return std::string_view::npos;
      if (b.size() < at + static_cast<std::size_t>(len) + 2) return 0;
      if (i == 0) {
        name.assign(b.substr(at, static_cast<std::size_t>(len)));
        for (char& c : name) c = upper(c);
      }
      at += static_cast<std::size_t>(len) + 2;
    }
    return at;
  }

  // Queues bytes read from one side (mu_ held).
  void enqueue(flow_state& f, direction d, std::string bytes, clock::time_point now) {
    flow_settings& s = flows_[d];
    if (d == up && !f.raw) {
      f.partial += bytes;
      for (;;) {
        std::string name;
        const std::size_t n = command_length(f.partial, name);
        if (n == std::string_view::npos) {
          f.raw = true;
          break;
        }
        if (n == 0) return;
        ++counts_[name];
        std::string cmd = f.partial.substr(0, n);
        f.partial.erase(0, n);
        bool held = false;
        ms extra{0};
        if (const auto h = hold_cmds_.find(name); h != hold_cmds_.end()) {
          ++held_total_;
          held = h->second == until_released;
          extra = held ? ms{0} : h->second;
          hold_cmds_.erase(h);
        }
        push(f, s, std::move(cmd), now, extra, held);
      }
      bytes = std::move(f.partial);  // raw from here on
      f.partial.clear();
      if (bytes.empty()) return;
    }
    push(f, s, std::move(bytes), now, ms{0}, false);
  }

  void push(flow_state& f, flow_settings& s, std::string bytes, clock::time_point now, ms extra,
            bool held) {
    while (!bytes.empty()) {
      chunk c;
      std::size_t take = bytes.size();
      ms wait = extra;
      if (s.hold_left > 0) {
        take = std::min(take, s.hold_left);
        s.hold_left -= take;
        wait = std::max(wait, s.hold_for);
      }
      const auto lo = s.delay_lo.count();
      const auto hi = s.delay_hi.count();
      const auto delay = ms(lo == hi ? lo : std::uniform_int_distribution<long long>(lo, hi)(rng_));
      c.bytes = bytes.substr(0, take);
      bytes.erase(0, take);
      c.at = std::max(f.last_at, now + delay + wait);
      c.held = held;
      f.last_at = c.at;
      f.queued += c.bytes.size();
      f.q.push_back(std::move(c));
    }
  }

  // Forwards what flow f may send now to `to` (mu_ held). Returns the next time it may send
  // more (time_point::max() when only an event can change that).
  clock::time_point pump(flow_state& f, direction d, int to, clock::time_point now) {
    const flow_settings& s = flows_[d];
    while (!f.q.empty() && !f.failed) {
      chunk& c = f.q.front();
      if (s.paused || c.held) return clock::time_point::max();
      if (c.at > now) return c.at;
      std::size_t want = c.bytes.size() - c.off;
      if (s.trickle.count() > 0) {
        if (now < f.next_byte) return f.next_byte;
        want = 1;
      }
      const ssize_t n = ::send(to, c.bytes.data() + c.off, want, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return now;  // POLLOUT
        f.failed = true;
        f.q.clear();
        f.queued = 0;
        break;
      }
      c.off += static_cast<std::size_t>(n);
      f.queued -= static_cast<std::size_t>(n);
      if (s.trickle.count() > 0) f.next_byte = now + s.trickle;
      if (c.off == c.bytes.size()) f.q.pop_front();
    }
    if (f.q.empty() && f.eof_in && !f.shut && !f.failed) {
      (void)::shutdown(to, SHUT_WR);
      f.shut = true;
    }
    return clock::time_point::max();
  }

  // Reads what `from` has into flow f (mu_ held).
  void drain(int from, flow_state& f, direction d, clock::time_point now) {
    char buf[65536];
    for (int rounds = 0; rounds < 16 && !f.eof_in; ++rounds) {  // bounded per loop turn
      const ssize_t n = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (!f.failed) enqueue(f, d, std::string(buf, static_cast<std::size_t>(n)), now);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      f.eof_in = true;  // closed or failed: what is queued still goes
    }
  }

  void run() {
    std::vector<pollfd> fds;
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      // Control requests, on this thread.
      while (!pending_.empty()) {
        auto [ticket, f] = std::move(pending_.front());
        pending_.pop_front();
        f();
        applied_ = ticket;
        cv_.notify_all();
      }

      // Send what may go now; work out the poll set and its timeout.
      auto now = clock::now();
      clock::time_point next = now + ms(50);
      fds.clear();
      fds.push_back({wake_read_, POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& c : conns_) {
        for (const int d : {up, down}) {
          flow_state& f = c.flow[d];
          const int to = d == up ? c.server : c.client;
          const clock::time_point t = pump(f, static_cast<direction>(d), to, now);
          next = std::min(next, t == now ? now + ms(50) : t);
        }
        const auto events = [](const flow_state& in, const flow_state& out) {
          short e = 0;
          if (!in.eof_in && in.queued < max_queued) e |= POLLIN;
          if (!out.q.empty() && !out.failed) e |= POLLOUT;
          return e;
        };
        fds.push_back({c.client, events(c.flow[up], c.flow[down]), 0});
        fds.push_back({c.server, events(c.flow[down], c.flow[up]), 0});
      }
      // POLLOUT is asked for only when a queue's front may go now; otherwise the timeout
      // (the front's release time) wakes the loop.
      std::size_t i = 2;
      for (auto& c : conns_) {
        for (const int d : {down, up}) {  // the client's slot writes down, the server's up
          flow_state& f = c.flow[d];
          const bool ready = !f.q.empty() && !flows_[d].paused && !f.q.front().held &&
                             f.q.front().at <= now &&
                             (flows_[d].trickle.count() == 0 || f.next_byte <= now);
          if (!ready) fds[i].events = static_cast<short>(fds[i].events & ~POLLOUT);
          ++i;
        }
      }
      const auto wait =
          std::clamp<long long>(std::chrono::duration_cast<ms>(next - now).count() + 1, 0, 50);

      lk.unlock();
      (void)::poll(fds.data(), fds.size(), static_cast<int>(wait));
      lk.lock();
      if (stop_) break;
      now = clock::now();

      if ((fds[0].revents & POLLIN) != 0) {
        char buf[256];
        while (::read(wake_read_, buf, sizeof buf) > 0) {
        }
      }
      // Reads. The poll set matches conns_ as it was: nothing else changes it meanwhile
      // (control requests run at the top of the loop).
      i = 2;
      for (auto& c : conns_) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          drain(c.client, c.flow[up], up, now);
        }
        if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          drain(c.server, c.flow[down], down, now);
        }
        i += 2;
      }
      // Finished connections go.
      for (auto it = conns_.begin(); it != conns_.end();) {
        if (it->flow[up].finished() && it->flow[down].finished()) {
          close_conn(*it);
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      // New connections (bounded per turn).
      if (listen_fd_ >= 0 && (fds[1].revents & POLLIN) != 0 && fds[1].fd == listen_fd_) {
        for (int k = 0; k < 64; ++k) {
          const int cl = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cl < 0) break;
          ++accepted_;
          const int sv = connect_upstream();
          if (sv < 0) {
            ::close(cl);
            continue;
          }
          nodelay(cl);
          conns_.emplace_back();
          conns_.back().client = cl;
          conns_.back().server = sv;
          peak_ = std::max(peak_, conns_.size());
        }
      }
    }
  }

  const int upstream_port_;
  int port_ = 0;
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::thread thread_;

  // Everything below: guarded by mu_ (the loop holds it but while it polls).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int listen_fd_ = -1;
  bool stop_ = false;
  flow_settings flows_[2];
  std::map<std::string, ms> hold_cmds_;  // armed holds: command name -> for how long
  std::list<conn> conns_;
  std::size_t accepted_ = 0;
  std::size_t peak_ = 0;
  std::size_t held_total_ = 0;
  std::map<std::string, std::size_t> counts_;
  std::deque<std::pair<std::uint64_t, std::function<void()>>> pending_;
  std::uint64_t requested_ = 0;
  std::uint64_t applied_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace sftest
