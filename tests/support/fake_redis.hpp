// tests/support/fake_redis.hpp: a scripted Redis node on loopback, for the replies a real
// server or cluster cannot easily be made to send (the router's corner cases: a redirect loop,
// a malformed MOVED, a slot map that is garbage, TRYAGAIN forever, a reply cut in half).
//
//   sftest::fake_redis node;                                 // listens on a free 127.0.0.1 port
//   fleet_options o; o.redis_uri = node.uri();
//   node.on("GETRANGE", {fake_redis::error("MOVED 12 127.0.0.1:" + std::to_string(p))});
//   node.always("CLUSTER", fake_redis::error("ERR no map here"));
//   node.on_if([](const argv& a) { return a.size() > 3; }, {fake_redis::silence()});
//   ... the fleet's call ...
//   node.wait_for([](const auto& log) { return log.size() >= 2; }, "two commands");
//   node.commands("GETRANGE");                               // how many it received
//
// What it answers: each command (a RESP array of bulk strings, what hiredis sends) is logged
// (its connection's number and its argv) and matched against the script, rule by rule in the
// order they were added: the first rule whose name (case-insensitive) or predicate matches and
// that has a reply left answers with its next one (a rule made with always() never runs out).
// Unmatched commands get the defaults: PING +PONG, ASKING +OK, anything else an error
// "ERR fake_redis: unscripted <NAME>" (a loud Redis error, never a silent success).
//
// Replies are bytes (status, error, bulk, nil, integer, array) or an action on the connection:
// silence() answers nothing, now or ever, on that connection (commands after it are logged,
// not answered: a server that stalled); cut(bytes) writes `bytes` (the start of a reply, or
// nothing) and closes the connection (a server that died mid-reply).
//
// One thread runs a poll loop (bounded waits: at most 50 ms between checks of its stop flag,
// and a wake-up pipe); the destructor stops and joins it and closes every socket. At most
// max_connections connections and max_buffer unread bytes per connection (past them the
// connection is closed). Every member is thread-safe; the script applies to the commands read
// after the call that changed it.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sync.hpp"

namespace sftest {

class fake_redis {
 public:
  using argv = std::vector<std::string>;
  using match = std::function<bool(const argv&)>;

  // One command as received: the connection it came on (1, 2, ... in accept order), its argv.
  struct received {
    int conn = 0;
    argv args;
  };

  // reply: what one command gets.
  struct reply {
    enum kind_t { bytes, silence, cut } kind = bytes;
    std::string data;  // bytes: the reply; cut: what is written before the close
  };

  static constexpr std::size_t max_connections = 64;
  static constexpr std::size_t max_buffer = std::size_t{1} << 20;

  // ---- replies ---------------------------------------------------------------------------

  static reply status(std::string_view s) { return {reply::bytes, "+" + std::string(s) + "\r\n"}; }
  static reply error(std::string_view s) { return {reply::bytes, "-" + std::string(s) + "\r\n"}; }
  static reply bulk(std::string_view s) {
    return {reply::bytes, "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"};
  }
  static reply nil() { return {reply::bytes, "$-1\r\n"}; }
  static reply integer(long long v) { return {reply::bytes, ":" + std::to_string(v) + "\r\n"}; }
  // array(items): items must be byte replies (not silence or cut).
  static reply array(const std::vector<reply>& items) {
    reply r{reply::bytes, "*" + std::to_string(items.size()) + "\r\n"};
    for (const reply& i : items) {
      if (i.kind != reply::bytes) throw std::invalid_argument("fake_redis::array: not bytes");
      r.data += i.data;
    }
    return r;
  }
  static reply raw(std::string bytes) { return {reply::bytes, std::move(bytes)}; }
  static reply silence() { return {reply::silence, {}}; }
  static reply cut(std::string partial = {}) { return {reply::cut, std::move(partial)}; }

  // slot_range(first, last, host, port): one entry of a CLUSTER SLOTS reply (a master, no
  // replica, no node id).
  static reply slot_range(long long first, long long last, std::string_view host, long long port) {
    return array({integer(first), integer(last), array({bulk(host), integer(port)})});
  }

  // ---- lifetime --------------------------------------------------------------------------

  fake_redis() {
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("fake_redis: pipe2");
    wake_read_ = fds[0];
    wake_write_ = fds[1];
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (listen_fd_ >= 0) ::close(listen_fd_);
      ::close(wake_read_);
      ::close(wake_write_);
      throw std::runtime_error("fake_redis: bind/listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  fake_redis(const fake_redis&) = delete;
  fake_redis& operator=(const fake_redis&) = delete;

  ~fake_redis() {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    poke();
    thread_.join();
    for (conn& c : conns_) ::close(c.fd);
    ::close(listen_fd_);
    ::close(wake_read_);
    ::close(wake_write_);
  }

  int port() const { return port_; }
  std::string uri() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // ---- script ----------------------------------------------------------------------------

  // on(name, replies): the next commands called `name` get `replies`, one each, in order.
  void on(std::string name, std::vector<reply> replies) {
    add(named(std::move(name)), std::move(replies), false);
  }
  // always(name, r): every command called `name` gets `r` (after the rules added before).
  void always(std::string name, reply r) { add(named(std::move(name)), {std::move(r)}, true); }
  // on_if(m, replies, forever): as on() for the commands `m` accepts; `forever`: the last
  // reply repeats.
  void on_if(match m, std::vector<reply> replies, bool forever = false) {
    add(std::move(m), std::move(replies), forever);
  }

  // ---- observations ----------------------------------------------------------------------

  std::vector<received> log() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return log_;
  }
  // commands(name): how many commands called `name` it received (case-insensitive).
  std::size_t commands(std::string name) const {
    name = upper(std::move(name));
    const std::lock_guard<std::mutex> lk(mu_);
    std::size_t n = 0;
    for (const received& r : log_) n += !r.args.empty() && upper(r.args[0]) == name ? 1 : 0;
    return n;
  }
  std::size_t accepted() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return accepted_;
  }
  // wait_for(pred, name, limit): blocks until pred(log) holds (checked at each command
  // received); aborts the test binary with `name` past `limit` (sync.hpp's hang()).
  template <class Pred>
  void wait_for(Pred pred, const char* name, std::chrono::milliseconds limit = bound) const {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, limit, [&] { return pred(log_); })) hang(name, limit);
  }

 private:
  struct rule {
    match m;
    std::deque<reply> replies;
    bool forever = false;
  };
  struct conn {
    int fd = -1;
    int id = 0;
    std::string in;
    bool mute = false;  // silence() answered: nothing more is written
  };

  static std::string upper(std::string s) {
    for (char& c : s) c = c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
    return s;
  }
  static match named(std::string name) {
    return [n = upper(std::move(name))](const argv& a) { return !a.empty() && upper(a[0]) == n; };
  }
  void add(match m, std::vector<reply> replies, bool forever) {
    if (replies.empty()) throw std::invalid_argument("fake_redis: a rule needs a reply");
    const std::lock_guard<std::mutex> lk(mu_);
    rules_.push_back(
        rule{std::move(m), std::deque<reply>(replies.begin(), replies.end()), forever});
  }

  void poke() const {
    const char b = 1;
    (void)!::write(wake_write_, &b, 1);
  }

  // parse(in, out): the first complete command of `in` (removed from it); false when `in`
  // holds no complete command yet; throws for bytes that are not a RESP array of bulk strings.
  static bool parse(std::string& in, argv& out) {
    std::size_t pos = 0;
    const auto line = [&](char type, long long& v) {
      if (pos >= in.size()) return false;
      if (in[pos] != type) throw std::runtime_error("fake_redis: not RESP");
      const std::size_t end = in.find("\r\n", pos);
      if (end == std::string::npos) return false;
      v = std::stoll(in.substr(pos + 1, end - pos - 1));
      pos = end + 2;
      return true;
    };
    long long n = 0;
    if (!line('*', n)) return false;
    if (n < 0 || n > 1024 * 1024) throw std::runtime_error("fake_redis: bad array length");
    argv a;
    for (long long i = 0; i < n; ++i) {
      long long len = 0;
      if (!line('$', len)) return false;
      if (len < 0 || static_cast<std::size_t>(len) > max_buffer) {
        throw std::runtime_error("fake_redis: bad bulk length");
      }
      if (in.size() < pos + static_cast<std::size_t>(len) + 2) return false;
      a.push_back(in.substr(pos, static_cast<std::size_t>(len)));
      pos += static_cast<std::size_t>(len) + 2;
    }
    in.erase(0, pos);
    out = std::move(a);
    return true;
  }

  // answer(a): the reply to `a` (with mu_ held): the script's, else the default.
  reply answer(const argv& a) {
    for (rule& r : rules_) {
      if (r.replies.empty() || !r.m(a)) continue;
      reply out = r.replies.front();
      if (!r.forever || r.replies.size() > 1) r.replies.pop_front();
      return out;
    }
    const std::string name = a.empty() ? std::string() : upper(a[0]);
    if (name == "PING") return status("PONG");
    if (name == "ASKING") return status("OK");
    return error("ERR fake_redis: unscripted " + name);
  }

  // Writes all of `bytes` (bounded: a client that reads nothing for 5 s is dropped).
  static bool write_all(int fd, std::string_view bytes) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n > 0) {
        bytes.remove_prefix(static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (std::chrono::steady_clock::now() > until) return false;
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, 50);
    }
    return true;
  }

  // serve(c): answers every complete command in c.in; false when c is to be closed.
  bool serve(conn& c) {
    for (;;) {
      argv a;
      reply r;
      {
        const std::lock_guard<std::mutex> lk(mu_);
        try {
          if (!parse(c.in, a)) return true;
        } catch (const std::exception&) {
          return false;  // not what hiredis sends: close
        }
        log_.push_back(received{c.id, a});
        cv_.notify_all();
        if (c.mute) continue;
        r = answer(a);
      }
      if (r.kind == reply::silence) {
        c.mute = true;
        continue;
      }
      if (!write_all(c.fd, r.data)) return false;
      if (r.kind == reply::cut) return false;
    }
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      {
        const std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
      }
      fds.clear();
      fds.push_back({wake_read_, POLLIN, 0});
      fds.push_back({listen_fd_, POLLIN, 0});
      for (const conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) return;
      char drain[64];
      while (::read(wake_read_, drain, sizeof drain) > 0) {
      }
      if ((fds[1].revents & POLLIN) != 0) accept_all();
      // Connections in fds[2..]: conns_ is unchanged since fds was built, except for
      // accept_all()'s appends after them.
      std::vector<int> dead;
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        conn& c = conns_[i - 2];
        char buf[16 * 1024];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          dead.push_back(c.fd);
          continue;
        }
        if (n < 0) continue;
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.size() > max_buffer || !serve(c)) dead.push_back(c.fd);
      }
      for (const int fd : dead) {
        for (std::size_t i = 0; i < conns_.size(); ++i) {
          if (conns_[i].fd != fd) continue;
          ::close(fd);
          conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (conns_.size() >= max_connections) {
        ::close(fd);
        continue;
      }
      int id = 0;
      {
        const std::lock_guard<std::mutex> lk(mu_);
        id = static_cast<int>(++accepted_);
      }
      conns_.push_back(conn{fd, id, {}, false});
    }
  }

  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::vector<conn> conns_;  // the loop's thread only (and the destructor, after the join)

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // notified at each command logged
  bool stop_ = false;                   // guarded by mu_
  std::vector<rule> rules_;             // guarded by mu_
  std::vector<received> log_;           // guarded by mu_
  std::size_t accepted_ = 0;            // guarded by mu_
  std::thread thread_;                  // last: started once everything above is set up
};

}  // namespace sftest
