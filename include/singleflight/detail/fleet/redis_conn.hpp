// singleflight/detail/fleet/redis_conn.hpp -- internal; do not include directly.
//
// One synchronous hiredis connection with bounded waits, for the fleet layer
// (fleet.hpp): detail::redis_endpoint (the parsed `redis_uri`),
// detail::redis_reply (an owned reply), detail::redis_failure (the one error
// type of the Redis path) and detail::redis_conn.
//
// Locking: none. A redis_conn is used by one thread at a time: the pool
// (redis_pool.hpp) hands each one out exclusively, and the subscriber and the
// renewer own theirs.
//
// Bounded waits: the connect and the handshake each wait at most the
// `timeout` given to open(). A command's round trip (every write and every
// read of it together, however the reply is cut into packets) is bounded by
// progress, not by one fixed deadline, so that a large value is not a timeout
// by its size alone (a 32 MiB record takes ~100 ms on loopback, most of it the
// server's own work on it) while a server that stops answering is still found
// out in about `timeout`:
//   * idle: it fails when no byte moved (sent or received) for `timeout`;
//     once its whole request is written and until the first byte of the
//     reply, the server works on the request, which takes time in proportion
//     to its size: that wait gets `timeout` + per_mib for each MiB sent;
//   * total: it fails `timeout` + per_mib x (2 x bytes sent + bytes received)
//     after it began (sending, the server's work, receiving), however the
//     bytes trickle in, so that a server or link slower than 1 MiB per
//     per_mib cannot hold a caller for long.
// A command of a few KiB is bounded by `timeout` as a whole, as before: the
// allowance is 10 ms per MiB (per_mib), about 10 us for a 1 KiB command.
// poll() waits with the time left to the earlier of the two before each read
// or write of the non-blocking socket. A command that times out leaves its
// reply in flight, so the connection is then `broken()` and must be dropped,
// never reused. Name resolution (getaddrinfo) is not bounded by the timeout:
// use an address or a local resolver you trust.
//
// Descriptors: the socket is created close-on-exec (SOCK_CLOEXEC), so a
// fork+exec on another thread, even while it connects, does not inherit it (a
// child holding it would keep the connection, and its subscriptions, alive on
// the server).
//
// hiredis 0.14 (Debian 12) has no TLS, no RESP3 and no per-command timeout;
// this file connects the socket itself and hands it to hiredis
// (redisConnectFd), formats commands with redisFormatCommandArgv and sends
// them itself (send with MSG_NOSIGNAL: no SIGPIPE), and uses hiredis's reply
// parser (redisReaderFeed, redisGetReplyFromReader); hiredis 1.x has all of
// these.
#pragma once

#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#elif __has_include(<hiredis.h>)
#include <hiredis.h>
#else
#error "singleflight/fleet.hpp needs hiredis (Debian: libhiredis-dev); link singleflight::fleet"
#endif

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "../chrono.hpp"

namespace singleflight::detail {

// redis_failure: Redis could not be reached or answered unusably (I/O error,
// timeout, refused connection, failed AUTH). The fleet never lets it reach a
// caller of get(): it falls back to a local load.
//
// cause() tells a caller whether the command may be sent again: `unanswered`
// means the connection closed (or was reset, or the write failed) before any
// byte of the reply arrived. On a connection that waited in the pool that is
// the signature of a server that closed it while it was idle (its `timeout`, a
// restart, a proxy), before it read the command; redis_pool's pooled::run
// then sends it once more on a fresh connection. `refused` means the server
// answered and refused the fleet's settings (a wrong password or user, an ACL
// without the rights the fleet needs, a db number the server does not have):
// a configuration error, not an outage; the fleet names it as such and its
// circuit breaker does not count it (see refused_reply()).
//
// `redirected` means a Redis Cluster node answered the command with MOVED,
// ASK, TRYAGAIN or CLUSTERDOWN (what() is its error text, whole): the command
// did not run there, the connection is fine. redis_router.hpp routes the
// command again (MOVED, ASK) or the caller loads locally (TRYAGAIN,
// CLUSTERDOWN), neither a failure of Redis for the breaker. A caller that does
// not route takes it for a failure like any other.
class redis_failure : public std::runtime_error {
 public:
  enum class cause { failed, unanswered, refused, redirected };
  explicit redis_failure(const std::string& what, cause c = cause::failed)
      : std::runtime_error(what), cause_(c) {}
  cause why() const noexcept { return cause_; }
  bool unanswered() const noexcept { return cause_ == cause::unanswered; }
  bool refused() const noexcept { return cause_ == cause::refused; }
  bool redirected() const noexcept { return cause_ == cause::redirected; }

 private:
  cause cause_;
};

// redis_endpoint
//
// Parsed from "tcp://host:port[/db]" (also "redis://..."; host may be an IPv6
// address in brackets) or "unix:///path/to/socket[?db=N]". Throws
// std::invalid_argument with a readable message for anything else.
// parse_list() also reads a list of seeds, "tcp://h1:p1,h2:p2,h3:p3[/db]".
struct redis_endpoint {
  bool unix_socket = false;
  std::string host;  // tcp: host name or address; unix: socket path
  int port = 6379;
  int db = 0;

  // parse(uri, whole): `whole` (when not empty) is the list `uri` is a seed of, quoted in
  // the error instead of `uri`.
  static redis_endpoint parse(std::string_view uri, std::string_view whole = {}) {
    const auto bad = [&](const char* why) {
      return std::invalid_argument(
          "singleflight::fleet_options::redis_uri \"" + std::string(whole.empty() ? uri : whole) +
          "\": " + (whole.empty() ? "" : "seed " + std::string(uri) + ": ") + why +
          " (expected tcp://host:port[/db], tcp://host:port,host:port[/db] "
          "or unix:///path[?db=N])");
    };
    const auto parse_int = [&](std::string_view s, int lo, int hi) {
      if (s.empty() || s.size() > 9) throw bad("bad number");
      int v = 0;
      for (const char c : s) {
        if (c < '0' || c > '9') throw bad("bad number");
        v = v * 10 + (c - '0');
      }
      if (v < lo || v > hi) throw bad("number out of range");
      return v;
    };
    redis_endpoint ep;
    std::string_view rest;
    if (uri.starts_with("unix://")) {
      ep.unix_socket = true;
      rest = uri.substr(7);
      const auto q = rest.find('?');
      if (q != std::string_view::npos) {
        const std::string_view query = rest.substr(q + 1);
        if (!query.starts_with("db=")) throw bad("unknown query");
        ep.db = parse_int(query.substr(3), 0, 1 << 20);
        rest = rest.substr(0, q);
      }
      if (rest.empty() || rest.front() != '/') throw bad("the socket path must be absolute");
      ep.host = std::string(rest);
      return ep;
    }
    if (uri.starts_with("tcp://")) {
      rest = uri.substr(6);
    } else if (uri.starts_with("redis://")) {
      rest = uri.substr(8);
    } else {
      throw bad("unknown scheme");
    }
    const auto slash = rest.find('/');
    if (slash != std::string_view::npos) {
      ep.db = parse_int(rest.substr(slash + 1), 0, 1 << 20);
      rest = rest.substr(0, slash);
    }
    if (rest.find('@') != std::string_view::npos) {
      throw bad("put credentials in fleet_options::username/password, not in the URI");
    }
    std::string_view host = rest;
    std::string_view port;
    if (rest.starts_with('[')) {
      const auto close = rest.find(']');
      if (close == std::string_view::npos) throw bad("unterminated [");
      host = rest.substr(1, close - 1);
      const std::string_view after = rest.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':') throw bad("expected :port after ]");
        port = after.substr(1);
      }
    } else {
      const auto colon = rest.rfind(':');
      if (colon != std::string_view::npos) {
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
      }
    }
    if (host.empty()) throw bad("no host");
    if (host.find(',') != std::string_view::npos) throw bad("a comma in the host");
    ep.host = std::string(host);
    if (!port.empty()) ep.port = parse_int(port, 1, 65535);
    return ep;
  }

  // parse_list(uri): the seeds a URI names, in its order: "scheme://host[:port][/db]" (one, as
  // parse() reads it) or "scheme://h1[:p1],h2[:p2],...[/db]" (the scheme written once, tcp or
  // redis; the db, when given, applies to every seed; IPv6 hosts in brackets). A unix socket
  // is always one seed (its path may hold a comma). Throws std::invalid_argument, quoting the
  // whole URI, for an empty seed or anything parse() rejects.
  static std::vector<redis_endpoint> parse_list(std::string_view uri) {
    std::vector<redis_endpoint> out;
    std::string_view scheme;
    if (uri.starts_with("tcp://")) {
      scheme = uri.substr(0, 6);
    } else if (uri.starts_with("redis://")) {
      scheme = uri.substr(0, 8);
    }
    if (scheme.empty() || uri.find(',') == std::string_view::npos) {
      out.push_back(parse(uri));
      return out;
    }
    std::string_view rest = uri.substr(scheme.size());
    std::string_view db;
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      db = rest.substr(slash);
      rest = rest.substr(0, slash);
    }
    for (;;) {
      const auto comma = rest.find(',');
      const std::string_view one = rest.substr(0, comma);
      if (one.empty()) {
        throw std::invalid_argument("singleflight::fleet_options::redis_uri \"" + std::string(uri) +
                                    "\": an empty seed in the list");
      }
      out.push_back(parse(std::string(scheme) + std::string(one) + std::string(db), uri));
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    return out;
  }
};

// redis_reply: an owned hiredis reply (freeReplyObject on destruction).
struct reply_deleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using redis_reply = std::unique_ptr<redisReply, reply_deleter>;

inline bool is_error(const redisReply* r) noexcept {
  return r != nullptr && r->type == REDIS_REPLY_ERROR;
}
inline bool is_nil(const redisReply* r) noexcept {
  return r != nullptr && r->type == REDIS_REPLY_NIL;
}
inline bool is_string(const redisReply* r) noexcept {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}
inline std::string_view text_of(const redisReply* r) noexcept {
  return is_string(r) || is_error(r) ? std::string_view(r->str, r->len) : std::string_view();
}

struct context_deleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};

// redis_conn
//
// A connected, authenticated hiredis context. Every member may throw
// redis_failure (and then leaves the connection broken) or std::bad_alloc.
class redis_conn {
 public:
  using clock = std::chrono::steady_clock;

  // open(ep, timeout, username, password): connects (bounded by `timeout`;
  // the socket is close-on-exec and non-blocking from its creation), enables
  // TCP keepalive, then runs the handshake in one round trip (bounded by
  // `timeout`): AUTH when a password is given, SELECT when db != 0, else
  // PING. A server that accepted the connection only to reject it (maxclients
  // reached: "-ERR max number of clients reached" is its first reply) fails
  // the handshake, so the connection counts as failed, not opened.
  static std::unique_ptr<redis_conn> open(const redis_endpoint& ep,
                                          std::chrono::milliseconds timeout,
                                          const std::string& username,
                                          const std::string& password) {
    const int fd = connect_socket(ep, timeout);
    redisContext* raw = redisConnectFd(fd);
    if (raw == nullptr) {
      ::close(fd);
      throw std::bad_alloc();
    }
    std::unique_ptr<redisContext, context_deleter> ctx(raw);
    // Every wait is this file's own (poll with the time left to the command's
    // deadline): hiredis only reads and writes what is ready.
    ctx->flags &= ~REDIS_BLOCK;
    if (!ep.unix_socket) (void)redisEnableKeepAlive(ctx.get());
    auto conn = std::unique_ptr<redis_conn>(new redis_conn(std::move(ctx), timeout));
    conn->handshake(ep, username, password);
    return conn;
  }

  redis_conn(const redis_conn&) = delete;
  redis_conn& operator=(const redis_conn&) = delete;
  ~redis_conn() = default;

  // command(args): sends one command and waits for its reply; the round trip
  // (writes and reads) is bounded by the timeout given to open(), by progress
  // and size (see the file comment). An error reply (-ERR ...) is returned,
  // not thrown: the caller decides.
  redis_reply command(std::initializer_list<std::string_view> args) {
    return command_argv(args.begin(), args.size());
  }

  // command_within(bound, args): command(args) with this round trip bounded
  // by `bound` instead of the connection's timeout (WAIT, which the server
  // itself holds for up to its own bound).
  redis_reply command_within(std::chrono::milliseconds bound,
                             std::initializer_list<std::string_view> args) {
    return command_argv(args.begin(), args.size(), bound);
  }
  redis_reply command(const std::vector<std::string_view>& args) {
    return command_argv(args.data(), args.size());
  }

  // command_capped(cap, args, length): command(args) (a GET), except that a
  // bulk string reply longer than `cap` bytes is not read: `length` is set to
  // its length, the reply is null, and the connection is broken (the rest of
  // the reply is in flight: drop the connection, which makes the server stop
  // sending it; only what the socket buffers held by then was transferred).
  // The check reads the reply's header in its first packet (a header cut
  // short there is read whole, as by command()).
  redis_reply command_capped(std::size_t cap, std::initializer_list<std::string_view> args,
                             long long& length) {
    cap_ = cap;
    over_ = 0;
    redis_reply r;
    try {
      r = command_argv(args.begin(), args.size());
    } catch (...) {
      cap_ = 0;
      throw;
    }
    cap_ = 0;
    length = static_cast<long long>(over_);
    return r;
  }

  // pipeline(commands): sends every command in one write and reads their
  // replies, in order; the whole exchange is one round trip, bounded as one.
  std::vector<redis_reply> pipeline(const std::vector<std::vector<std::string_view>>& commands) {
    if (broken()) throw redis_failure("connection already broken");
    for (const auto& args : commands) append(args.data(), args.size());
    begin(timeout_);
    flush();
    std::vector<redis_reply> out;
    out.reserve(commands.size());
    for (std::size_t i = 0; i < commands.size(); ++i) out.push_back(read_reply());
    last_used_ = clock::now();
    // Every reply was read (the connection stays in step): a cluster redirect
    // of any of them is the caller's to route (redis_failure::redirected).
    for (const redis_reply& r : out) {
      if (is_cluster_redirect(r.get())) {
        throw redis_failure(std::string(text_of(r.get())), redis_failure::cause::redirected);
      }
    }
    return out;
  }

  // per_mib: the time a round trip is allowed for each MiB it moves, on top
  // of its timeout (see the file comment): 1 MiB per 10 ms is 100 MiB/s
  // (0.84 Gb/s), well below loopback and a 10 Gb/s link, and above a loaded
  // server's copy of a value into a script and out of it (~3 ms per MiB for
  // redis-server 7.0 on loopback).
  static constexpr std::chrono::microseconds per_mib{10'000};

  // allowance(bytes): per_mib for each MiB of `bytes`, pro rata.
  static constexpr std::chrono::microseconds allowance(std::uint64_t bytes) noexcept {
    return std::chrono::microseconds(
        static_cast<std::int64_t>(bytes * static_cast<std::uint64_t>(per_mib.count()) >> 20));
  }

  // append(args): adds one command to the output buffer (nothing is sent
  // until flush()). Throws std::bad_alloc (the connection is then broken).
  void append(std::span<const std::string_view> args) { append(args.data(), args.size()); }

  // flush(deadline): sends the output buffer, as a round trip of its own
  // with no reply (the subscriber's SUBSCRIBE): bounded as one whose timeout
  // ends at `deadline` (while bytes move, longer: see the file comment).
  // Throws redis_failure (the connection is then broken) on an error or when
  // a bound passes.
  void flush(clock::time_point deadline) {
    begin(std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now()));
    flush();
  }

  // broken(): an I/O error or a timeout happened; drop this connection.
  bool broken() const noexcept { return broken_ || ctx_->err != 0; }

  // quiet(): nothing arrived while no command was outstanding (one poll, no
  // wait). Readable bytes, end of file or an error on an idle connection mean
  // the server closed it (its idle `timeout`, a restart, CLIENT KILL) or the
  // stream is out of step: either way it must not be used.
  bool quiet() const noexcept {
    pollfd p{ctx_->fd, POLLIN, 0};
    return !broken() && ::poll(&p, 1, 0) == 0;
  }

  // When the last command on it completed (or it was opened).
  clock::time_point last_used() const noexcept { return last_used_; }

  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  // The raw context, for the subscriber's read loop (non-blocking: hiredis
  // reads and writes only what is ready; wait with poll first).
  redisContext* raw() noexcept { return ctx_.get(); }

  // Marks the connection unusable (the subscriber, after its own I/O error).
  void mark_broken() noexcept { broken_ = true; }

  // take_parsed(out): appends to `out` the replies hiredis has parsed from what
  // was read into the context (redisBufferRead on raw()); no I/O. False on a
  // protocol error. For the connections read outside a round trip (the
  // subscriber's, the tracker).
  bool take_parsed(std::vector<redis_reply>& out) {
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) return false;
      if (raw == nullptr) return true;
      out.emplace_back(static_cast<redisReply*>(raw));
    }
  }

  // asking(on): while on, every command() is preceded by ASKING in the same
  // write (Redis Cluster: the one command after an ASK redirect may run on
  // the node that imports the slot). redis_router turns it on for one routed
  // step and off again before the connection goes back to the pool.
  void asking(bool on) noexcept { asking_ = on; }

  // is_cluster_redirect(r): r is MOVED, ASK, TRYAGAIN or CLUSTERDOWN (the
  // command did not run on this node).
  static bool is_cluster_redirect(const redisReply* r) noexcept {
    if (!is_error(r)) return false;
    const std::string_view t = text_of(r);
    return t.starts_with("MOVED ") || t.starts_with("ASK ") || t.starts_with("TRYAGAIN") ||
           t.starts_with("CLUSTERDOWN");
  }

 private:
  // flush(): sends the output buffer, waiting for the socket within the
  // bounds of the round trip under way (begin()). Sent with MSG_NOSIGNAL: a
  // peer that closed gives an error here, never a SIGPIPE that would kill the
  // host process.
  void flush() {
    std::size_t off = 0;
    while (off < out_.size()) {
#ifdef MSG_NOSIGNAL
      constexpr int flags = MSG_NOSIGNAL;
#else
      constexpr int flags = 0;  // SO_NOSIGPIPE is set on the socket instead (macOS)
#endif
      const ssize_t n = ::send(ctx_->fd, out_.data() + off, out_.size() - off, flags);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
        moved(static_cast<std::size_t>(n), sent_);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        wait_for(POLLOUT, "write");
        continue;
      }
      // Nothing of a reply was read: the command did not reach the server whole.
      const int e = n < 0 ? errno : EPIPE;
      out_.clear();
      fail("write: " + error_text(e), redis_failure::cause::unanswered);
    }
    out_.clear();
    written_ = true;
  }

  redis_conn(std::unique_ptr<redisContext, context_deleter> ctx,
             std::chrono::milliseconds timeout) noexcept
      : ctx_(std::move(ctx)), timeout_(timeout), last_used_(clock::now()) {}

  static int wait_ms(clock::time_point deadline) noexcept {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now());
    return static_cast<int>(std::clamp<long long>(left.count(), 0, 1'000'000));
  }

  static std::string error_text(int e) { return std::generic_category().message(e); }

  // A connected socket (close-on-exec and non-blocking from its creation), or
  // redis_failure. Name resolution is not bounded by the timeout.
  static int connect_socket(const redis_endpoint& ep, std::chrono::milliseconds timeout) {
    const clock::time_point deadline = clock::now() + timeout;
    std::string why = "no address";
    if (ep.unix_socket) {
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      if (ep.host.size() >= sizeof a.sun_path) throw redis_failure("connect: socket path too long");
      std::memcpy(a.sun_path, ep.host.data(), ep.host.size());
      const int fd =
          try_connect(AF_UNIX, 0, reinterpret_cast<const sockaddr*>(&a), sizeof a, deadline, why);
      if (fd < 0) throw redis_failure("connect: " + ep.host + ": " + why);
      return fd;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const std::string port = std::to_string(ep.port);
    const int rc = ::getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &list);
    if (rc != 0) throw redis_failure("connect: " + ep.host + ": " + ::gai_strerror(rc));
    const std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(list, ::freeaddrinfo);
    for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      const int fd =
          try_connect(ai->ai_family, ai->ai_protocol, ai->ai_addr, ai->ai_addrlen, deadline, why);
      if (fd >= 0) {
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
      }
      if (clock::now() >= deadline) break;
    }
    throw redis_failure("connect: " + ep.host + ":" + port + ": " + why);
  }

  // One address: a socket that is close-on-exec before it connects (no window
  // for a fork+exec on another thread to inherit it), connected by `deadline`;
  // -1 with `why` set otherwise.
  static int try_connect(int family, int protocol, const sockaddr* addr, socklen_t len,
                         clock::time_point deadline, std::string& why) {
#if defined(SOCK_CLOEXEC) && defined(SOCK_NONBLOCK)
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, protocol);
#else
    // No atomic flags (macOS): set at once, a short window remains.
    const int fd = ::socket(family, SOCK_STREAM, protocol);
    if (fd >= 0) {
      (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
      (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
#endif
    if (fd < 0) {
      why = error_text(errno);
      return -1;
    }
#ifdef SO_NOSIGPIPE
    const int on = 1;  // no MSG_NOSIGNAL there: a closed peer must not raise SIGPIPE
    (void)::setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, sizeof on);
#endif
    if (::connect(fd, addr, len) == 0) return fd;
    if (errno != EINPROGRESS && errno != EINTR) {
      why = error_text(errno);
      ::close(fd);
      return -1;
    }
    for (;;) {
      const int ms = wait_ms(deadline);
      if (ms <= 0) {
        why = "connect timed out";
        ::close(fd);
        return -1;
      }
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, ms);
      if (r < 0 && errno != EINTR) {
        why = error_text(errno);
        ::close(fd);
        return -1;
      }
      if (r <= 0) continue;
      int err = 0;
      socklen_t err_len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) err = errno;
      if (err == 0) return fd;
      why = error_text(err);
      ::close(fd);
      return -1;
    }
  }

  void handshake(const redis_endpoint& ep, const std::string& username,
                 const std::string& password) {
    std::vector<std::vector<std::string_view>> commands;
    if (!password.empty()) {
      commands.push_back(username.empty()
                             ? std::vector<std::string_view>{"AUTH", password}
                             : std::vector<std::string_view>{"AUTH", username, password});
    }
    const std::string db = std::to_string(ep.db);
    if (ep.db != 0) commands.push_back({"SELECT", db});
    if (commands.empty()) commands.push_back({"PING"});
    const std::vector<redis_reply> replies = pipeline(commands);
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (is_error(replies[i].get())) {
        broken_ = true;
        // AUTH (WRONGPASS, a disabled user), SELECT (a db out of range), PING
        // (NOAUTH: a password the fleet was not given): the settings.
        throw redis_failure(
            std::string(commands[i][0]) + ": " + std::string(text_of(replies[i].get())),
            redis_failure::cause::refused);
      }
    }
  }

  [[noreturn]] void fail(const std::string& what,
                         redis_failure::cause c = redis_failure::cause::failed) {
    broken_ = true;
    throw redis_failure(what, c);
  }

  // begin(bound): a round trip starts, bounded by `bound` (and its size).
  void begin(std::chrono::milliseconds bound) noexcept {
    bound_ = bound;
    start_ = last_progress_ = clock::now();
    sent_ = 0;
    received_ = 0;
    written_ = false;
  }

  // moved(n, counter): n bytes went out or came in: progress.
  void moved(std::size_t n, std::uint64_t& counter) noexcept {
    counter += n;
    last_progress_ = clock::now();
  }

  // The idle bound of the round trip under way at this point: `bound_`, plus
  // the server's time for a request it has whole and has not answered yet.
  clock::duration idle_bound() const noexcept {
    const bool server_working = written_ && received_ == 0;
    return bound_ + (server_working ? allowance(sent_) : std::chrono::microseconds(0));
  }

  // The total bound of the round trip under way, as far as its bytes so far.
  clock::duration total_bound() const noexcept { return bound_ + allowance(2 * sent_ + received_); }

  // Waits until the socket is ready for `events`, or fails when a bound of
  // the round trip under way passes (the message names the one that did).
  void wait_for(short events, const char* what) {
    for (;;) {
      const clock::time_point idle_end = last_progress_ + idle_bound();
      const clock::time_point total_end = start_ + total_bound();
      const clock::time_point deadline = std::min(idle_end, total_end);
      const int ms = wait_ms(deadline);
      if (ms <= 0) {
        const auto in_ms = [](clock::duration d) {
          return std::to_string(std::chrono::ceil<std::chrono::milliseconds>(d).count());
        };
        // A small command: one bound, `bound_` (as the settings say).
        if (sent_ + received_ < (std::uint64_t{1} << 20)) {
          fail(std::string(what) + ": timed out after " + std::to_string(bound_.count()) + " ms");
        }
        fail(std::string(what) + ": timed out after " + in_ms(clock::now() - start_) + " ms (" +
             std::to_string(sent_) + " bytes sent, " + std::to_string(received_) + " received; " +
             (idle_end <= total_end ? "nothing moved for " + in_ms(idle_bound())
                                    : "bound for the size: " + in_ms(total_bound())) +
             " ms)");
      }
      pollfd p{ctx_->fd, events, 0};
      const int r = ::poll(&p, 1, ms);
      if (r > 0) return;
      if (r < 0 && errno != EINTR) fail(std::string("poll: ") + error_text(errno));
    }
  }

  void append(const std::string_view* args, std::size_t n) {
    constexpr std::size_t inline_args = 12;
    const char* argv_small[inline_args];
    std::size_t len_small[inline_args];
    std::vector<const char*> argv_big;
    std::vector<std::size_t> len_big;
    const char** argv = argv_small;
    std::size_t* lens = len_small;
    if (n > inline_args) {
      argv_big.resize(n);
      len_big.resize(n);
      argv = argv_big.data();
      lens = len_big.data();
    }
    for (std::size_t i = 0; i < n; ++i) {
      argv[i] = args[i].data();
      lens[i] = args[i].size();
    }
    char* cmd = nullptr;
    const int len = redisFormatCommandArgv(&cmd, static_cast<int>(n), argv, lens);
    if (len < 0 || cmd == nullptr) {
      broken_ = true;  // out of memory in hiredis
      throw std::bad_alloc();
    }
    const std::unique_ptr<char, void (*)(char*)> owned(cmd, redisFreeCommand);
    try {
      out_.append(cmd, static_cast<std::size_t>(len));
    } catch (...) {
      broken_ = true;  // a command cut short must not be sent
      throw;
    }
  }

  // The next reply, read within the bounds of the round trip under way. A
  // failure before its first byte is `unanswered`.
  //
  // A long bulk string (a large value's GET) is gathered here and fed to
  // hiredis whole: fed chunk by chunk, its reader grows its buffer by 1 MiB
  // at a time, copying all it holds each time (a 32 MiB value would be copied
  // ~16 times over, too slow for its bound under a sanitizer).
  redis_reply read_reply() {
    std::string bulk;       // a long bulk string being gathered (its first bytes on)
    std::size_t whole = 0;  // its length on the wire, header and CRLF included
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) {
        fail(std::string("protocol error: ") + ctx_->errstr);
      }
      if (raw != nullptr) return redis_reply(static_cast<redisReply*>(raw));
      wait_for(POLLIN, "read");
      char buf[64 * 1024];
      const ssize_t n = ::recv(ctx_->fd, buf, sizeof buf, 0);
      if (n > 0) {
        moved(static_cast<std::size_t>(n), received_);
        const std::string_view chunk(buf, static_cast<std::size_t>(n));
        if (whole == 0 && cap_ > 0) {
          const std::size_t length = bulk_length(chunk);
          if (length != npos && length > cap_) {
            over_ = length;
            broken_ = true;  // the rest of the reply is in flight
            return nullptr;
          }
        }
        if (whole == 0) whole = long_bulk(chunk);
        if (whole > 0) {
          if (bulk.empty()) bulk.reserve(whole);
          bulk.append(chunk);
          if (bulk.size() < whole) continue;
        }
        const std::string_view in = whole > 0 ? std::string_view(bulk) : chunk;
        if (redisReaderFeed(ctx_->reader, in.data(), in.size()) != REDIS_OK) {
          fail("protocol error");
        }
        if (whole > 0) {
          whole = 0;
          std::string().swap(bulk);
        }
        continue;
      }
      const auto c =
          received_ > 0 ? redis_failure::cause::failed : redis_failure::cause::unanswered;
      if (n == 0) fail("Server closed the connection", c);
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      fail("read: " + error_text(errno), c);
    }
  }

  static constexpr std::size_t npos = std::string_view::npos;

  // bulk_length(chunk): when `chunk` begins a bulk string ("$<length>\r\n"
  // whole in it) with hiredis' reader at the start of an item (every byte it
  // holds consumed, none of an item pending), that bulk's length; else npos.
  std::size_t bulk_length(std::string_view chunk) const noexcept {
    const redisReader* r = ctx_->reader;
    if (r->pos != r->len || chunk.empty() || chunk.front() != '$') return npos;
    const std::size_t eol = chunk.find("\r\n");
    if (eol == npos || eol < 2 || eol > 20) return npos;
    std::size_t length = 0;
    for (std::size_t i = 1; i < eol; ++i) {
      const char c = chunk[i];
      if (c < '0' || c > '9') return npos;  // "$-1": nil
      length = length * 10 + static_cast<std::size_t>(c - '0');
    }
    return length;
  }

  // long_bulk(chunk): when `chunk` begins a bulk string of at least 64 KiB
  // (bulk_length), that bulk's length on the wire (header and CRLF
  // included); else 0.
  std::size_t long_bulk(std::string_view chunk) const noexcept {
    constexpr std::size_t at_least = 64 * 1024;
    const std::size_t length = bulk_length(chunk);
    if (length == npos || length < at_least || length > (std::size_t{1} << 40)) return 0;
    return chunk.find("\r\n") + 2 + length + 2;
  }

  redis_reply command_argv(const std::string_view* args, std::size_t n) {
    return command_argv(args, n, timeout_);
  }

  redis_reply command_argv(const std::string_view* args, std::size_t n,
                           std::chrono::milliseconds bound) {
    if (broken()) throw redis_failure("connection already broken");
    if (asking_) {
      constexpr std::string_view asking_args[] = {"ASKING"};
      append(asking_args, 1);
    }
    append(args, n);
    begin(bound);
    flush();
    if (asking_) {
      const redis_reply ok = read_reply();
      if (!ok || is_error(ok.get())) fail("ASKING: " + std::string(text_of(ok.get())));
    }
    redis_reply r = read_reply();
    last_used_ = clock::now();
    // Only an error reply is looked at: a hit pays nothing for the check.
    if (r && r->type == REDIS_REPLY_ERROR && is_cluster_redirect(r.get())) {
      throw redis_failure(std::string(text_of(r.get())), redis_failure::cause::redirected);
    }
    return r;
  }

  std::unique_ptr<redisContext, context_deleter> ctx_;
  std::string out_;  // commands appended, not yet flushed
  const std::chrono::milliseconds timeout_;
  // The round trip under way (begin()): its bound (its errors name it), when
  // it began, when a byte last moved, the bytes sent and received, and
  // whether its whole request is written.
  std::chrono::milliseconds bound_{timeout_};
  clock::time_point start_;
  clock::time_point last_progress_;
  std::uint64_t sent_ = 0;
  std::uint64_t received_ = 0;
  bool written_ = false;
  bool asking_ = false;   // asking(): ASKING before each command
  std::size_t cap_ = 0;   // command_capped: the longest bulk reply read (0: any)
  std::size_t over_ = 0;  // command_capped: the length of a bulk reply over cap_
  clock::time_point last_used_;
  bool broken_ = false;
};

}  // namespace singleflight::detail
