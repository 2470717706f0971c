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
// Bounded waits: connect, every write and every read wait at most the
// `timeout` given to open() (SO_SNDTIMEO / SO_RCVTIMEO on the socket, which
// is what hiredis 0.14's redisSetTimeout sets). A command that times out
// leaves its reply in flight, so the connection is then `broken()` and must be
// dropped, never reused. Name resolution (getaddrinfo) is not bounded by the
// timeout: use an address or a local resolver you trust.
//
// hiredis 0.14 (Debian 12) has no TLS, no RESP3 and no per-command timeout;
// this file uses only the synchronous API that hiredis 1.x still has.
#pragma once

#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
#elif __has_include(<hiredis.h>)
#include <hiredis.h>
#else
#error "singleflight/fleet.hpp needs hiredis (Debian: libhiredis-dev); link singleflight::fleet"
#endif

#include <fcntl.h>
#include <sys/time.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace singleflight::detail {

// redis_failure: Redis could not be reached or answered unusably (I/O error,
// timeout, refused connection, failed AUTH). The fleet never lets it reach a
// caller of get(): it falls back to a local load.
class redis_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// redis_endpoint
//
// Parsed from "tcp://host:port[/db]" (also "redis://..."; host may be an IPv6
// address in brackets) or "unix:///path/to/socket[?db=N]". Throws
// std::invalid_argument with a readable message for anything else.
struct redis_endpoint {
  bool unix_socket = false;
  std::string host;  // tcp: host name or address; unix: socket path
  int port = 6379;
  int db = 0;

  static redis_endpoint parse(std::string_view uri) {
    const auto bad = [&](const char* why) {
      return std::invalid_argument("singleflight::fleet_options::redis_uri \"" + std::string(uri) +
                                   "\": " + why +
                                   " (expected tcp://host:port[/db] or unix:///path[?db=N])");
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
    ep.host = std::string(host);
    if (!port.empty()) ep.port = parse_int(port, 1, 65535);
    return ep;
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
  // open(ep, timeout, username, password): connects (bounded by `timeout`),
  // sets the same bound on every later read and write, enables TCP keepalive,
  // then AUTH (when a password is given) and SELECT (when db != 0).
  static std::unique_ptr<redis_conn> open(const redis_endpoint& ep,
                                          std::chrono::milliseconds timeout,
                                          const std::string& username,
                                          const std::string& password) {
    const timeval tv = to_timeval(timeout);
    std::unique_ptr<redisContext, context_deleter> ctx(
        ep.unix_socket ? redisConnectUnixWithTimeout(ep.host.c_str(), tv)
                       : redisConnectWithTimeout(ep.host.c_str(), ep.port, tv));
    if (!ctx) throw std::bad_alloc();
    if (ctx->err != 0) throw redis_failure(std::string("connect: ") + ctx->errstr);
    if (redisSetTimeout(ctx.get(), tv) != REDIS_OK) {
      throw redis_failure(std::string("set timeout: ") + ctx->errstr);
    }
    if (!ep.unix_socket) (void)redisEnableKeepAlive(ctx.get());
    // Not inherited by programs the process starts (a child holding the socket
    // would keep the connection, and its subscriptions, alive on the server).
    (void)::fcntl(ctx->fd, F_SETFD, ::fcntl(ctx->fd, F_GETFD) | FD_CLOEXEC);
    auto conn = std::unique_ptr<redis_conn>(new redis_conn(std::move(ctx)));
    if (!password.empty()) {
      const redis_reply r = username.empty() ? conn->command({"AUTH", password})
                                             : conn->command({"AUTH", username, password});
      if (is_error(r.get())) throw redis_failure("AUTH: " + std::string(text_of(r.get())));
    }
    if (ep.db != 0) {
      const std::string db = std::to_string(ep.db);
      const redis_reply r = conn->command({"SELECT", db});
      if (is_error(r.get())) throw redis_failure("SELECT: " + std::string(text_of(r.get())));
    }
    return conn;
  }

  redis_conn(const redis_conn&) = delete;
  redis_conn& operator=(const redis_conn&) = delete;
  ~redis_conn() = default;

  // command(args): sends one command and waits (bounded) for its reply. An
  // error reply (-ERR ...) is returned, not thrown: the caller decides.
  redis_reply command(std::initializer_list<std::string_view> args) {
    return command_argv(args.begin(), args.size());
  }
  redis_reply command(const std::vector<std::string_view>& args) {
    return command_argv(args.data(), args.size());
  }

  // broken(): an I/O error or a timeout happened; drop this connection.
  bool broken() const noexcept { return broken_ || ctx_->err != 0; }

  // The raw context, for the subscriber's non-blocking read loop.
  redisContext* raw() noexcept { return ctx_.get(); }

  // Marks the connection unusable (the subscriber, after its own I/O error).
  void mark_broken() noexcept { broken_ = true; }

 private:
  explicit redis_conn(std::unique_ptr<redisContext, context_deleter> ctx) noexcept
      : ctx_(std::move(ctx)) {}

  static timeval to_timeval(std::chrono::milliseconds d) noexcept {
    const auto ms = d.count() > 0 ? d.count() : 1;
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms % 1000) * 1000);
    return tv;
  }

  redis_reply command_argv(const std::string_view* args, std::size_t n) {
    if (broken()) throw redis_failure("connection already broken");
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
    void* raw = redisCommandArgv(ctx_.get(), static_cast<int>(n), argv, lens);
    if (raw == nullptr) {
      broken_ = true;
      throw redis_failure(ctx_->err != 0 ? std::string(ctx_->errstr) : "no reply");
    }
    return redis_reply(static_cast<redisReply*>(raw));
  }

  std::unique_ptr<redisContext, context_deleter> ctx_;
  bool broken_ = false;
};

}  // namespace singleflight::detail
