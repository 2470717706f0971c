// 05-asio-server: a TCP cache front end whose backend lookups are coalesced
// with singleflight's Asio adapter (singleflight/asio.hpp), plus the load
// generator that hammers it, in one program.
//
// Protocol: a client sends lines `GET <key>`; the server answers each with a
// line `<key> <value>` (or `<key> ERR <reason>`) as soon as that lookup
// completes, so pipelined requests are answered in completion order, not in
// request order.
//
// Each request runs `co_await singleflight::async_do(cache, key, fetch,
// asio::use_awaitable)`. `fetch` is an asynchronous origin,
// void(singleflight::stop_token, singleflight::completion<std::string>): it arms a
// 200 ms steady_timer standing in for the backend round trip and returns; the
// timer's handler calls set_value. The stop_token (stopped when every waiter
// has left, ownership::waiters) cancels the timer, and the completion then
// fails with the timer's operation_aborted error.
//
// Load: 1,000 concurrent connections, 100 hot keys, 3 rounds; in each round
// every connection pipelines 5 GETs (5 distinct keys) in one write and checks
// the 5 replies. Rounds start together (a barrier), so each round is a burst
// of 5,000 requests: 50 per key, 100 origin calls when each key's 50 requests
// reach the server within one 200 ms flight. The keys go in stampedes: the
// connections send in turn, and each run of 50 consecutive senders asks for
// the same 5 keys (the next run for the next 5), so a key's requests arrive
// together even when a slow build (the sanitizers, on a busy machine) needs
// more than 200 ms to read a whole round; keys scattered over all 1,000
// connections would make the ratio measure the server's speed instead.
// Prints requests served, origin calls and the coalescing ratio (origin calls
// / requests served) and exits 0 only if every reply was right and the ratio
// is below 0.05 (expected: 300 / 15,000 = 0.02). A watchdog ends the program
// with status 2 if it has not finished after 60 s.
//
// Threads: one io_context, run by two threads (main and one more). Each
// server connection is a strand of its own (its reader and lookup coroutines
// share it, so its reply queue needs no lock); each backend call is a strand;
// the acceptor is a strand; all client connections share one strand (so the
// load generator's barriers and tallies need no locks). async_do delivers each
// result to the awaiting coroutine's strand, whichever thread fired the timer.
//
// The process opens over 2,000 sockets: the RLIMIT_NOFILE soft limit is raised
// to the hard limit at start.
//
//   ./build/dev/examples/05-asio-server        (or: ctest --preset dev -R 05-asio)

// Asio 1.22 turns on its coroutine support (awaitable, use_awaitable) for clang only through
// <experimental/coroutine>; clang 14 and later have C++20's <coroutine>, which later Asio
// versions use. Say so before any Asio header is included.
#if defined(__clang__) && __clang_major__ >= 14 && __cplusplus >= 202002L && \
    !defined(ASIO_HAS_CO_AWAIT)
#define ASIO_HAS_CO_AWAIT 1
#define ASIO_HAS_STD_COROUTINE 1
#endif

#include <singleflight/asio.hpp>
#include <singleflight/singleflight.hpp>

#include <sys/resource.h>

#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#if !defined(ASIO_HAS_CO_AWAIT)
#error "05-asio-server needs Asio's C++20 coroutine support (asio::awaitable)"
#endif

namespace {

namespace sf = singleflight;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;
using namespace std::chrono_literals;

constexpr int connections = 1000;
constexpr int hot_keys = 100;
constexpr int gets_per_round = 5;
constexpr int rounds = 3;
constexpr int requests_total = connections * gets_per_round * rounds;
// Consecutive senders that ask for the same gets_per_round keys in a round.
constexpr int stampede = connections * gets_per_round / hot_keys;
static_assert(hot_keys % gets_per_round == 0 && connections % (hot_keys / gets_per_round) == 0);
constexpr auto backend_latency = 200ms;
constexpr auto watchdog_limit = 60s;
constexpr double ratio_limit = 0.05;

using cache_t = sf::group<std::string, std::string>;
using strand_t = asio::strand<asio::io_context::executor_type>;

// What the backend answers for `key`; the clients check every reply against it.
std::string backend_value(std::string_view key) { return "value-of-" + std::string(key); }

// ---- the backend: an asynchronous origin ----------------------------------------------------

// One backend call: a 200 ms timer, then set_value. Everything touching the timer runs on the
// call's own strand; the stop callback only posts a cancel there.
class backend_call : public std::enable_shared_from_this<backend_call> {
 public:
  backend_call(asio::io_context& io, std::string key, sf::completion<std::string> done)
      : strand_(asio::make_strand(io)),
        timer_(strand_),
        key_(std::move(key)),
        done_(std::move(done)) {}

  static void start(asio::io_context& io, std::string key, singleflight::stop_token st,
                    sf::completion<std::string> done) {
    auto call = std::make_shared<backend_call>(io, std::move(key), std::move(done));
    asio::dispatch(call->strand_,
                   [call, st = std::move(st)]() mutable { call->arm(std::move(st)); });
  }

 private:
  // Posts a cancel to the call's strand; runs inside request_stop() on the stopping thread.
  struct canceller {
    std::weak_ptr<backend_call> call;
    void operator()() const {
      if (auto c = call.lock()) asio::post(c->strand_, [c] { c->timer_.cancel(); });
    }
  };

  void arm(singleflight::stop_token st) {
    timer_.expires_after(backend_latency);
    timer_.async_wait([self = shared_from_this()](std::error_code ec) { self->fire(ec); });
    on_stop_.emplace(std::move(st), canceller{weak_from_this()});
  }

  void fire(std::error_code ec) {
    on_stop_.reset();
    if (ec) {
      done_.set_exception(std::make_exception_ptr(std::system_error(ec, "backend")));
    } else {
      done_.set_value(backend_value(key_));  // resumes the waiting coroutines' strands
    }
  }

  strand_t strand_;
  asio::steady_timer timer_;
  std::string key_;
  sf::completion<std::string> done_;
  std::optional<singleflight::stop_callback<canceller>> on_stop_;
};

// ---- the server ----------------------------------------------------------------------------

struct server_state {
  server_state(asio::io_context& i, cache_t& c) : io(i), cache(c) {}
  asio::io_context& io;
  cache_t& cache;
  std::atomic<long> origin_calls{0};
  std::atomic<long> served{0};
};

// One accepted connection. Its coroutines all run on the socket's strand.
class session {
 public:
  explicit session(tcp::socket socket) : socket_(std::move(socket)) {}
  tcp::socket& socket() { return socket_; }

  // Queues a reply line; the first sender writes the queue out while the others just append.
  awaitable<void> send(std::string line) {
    out_ += line;
    if (writing_) co_return;
    writing_ = true;
    while (!out_.empty()) {
      std::string batch;
      batch.swap(out_);
      std::error_code ec;
      co_await asio::async_write(socket_, asio::buffer(batch),
                                 asio::redirect_error(use_awaitable, ec));
      if (ec) {  // the client went away: drop what is left
        out_.clear();
        break;
      }
    }
    writing_ = false;
  }

 private:
  tcp::socket socket_;
  std::string out_;
  bool writing_ = false;
};

awaitable<void> lookup(std::shared_ptr<session> s, std::string key, server_state& server) {
  // The origin, named rather than written inside the co_await expression: GCC 12 bitwise-copies
  // a closure temporary with non-trivial captures (this std::string) in a co_await
  // full-expression and then frees the copy's buffer twice (asio issue #1007).
  auto fetch = [&server, key](singleflight::stop_token st, sf::completion<std::string> done) {
    server.origin_calls.fetch_add(1, std::memory_order_relaxed);
    backend_call::start(server.io, key, std::move(st), std::move(done));
  };
  std::string reply;
  try {
    std::string value = co_await sf::async_do(server.cache, key, std::move(fetch), use_awaitable);
    reply = key + ' ' + value + '\n';
    server.served.fetch_add(1, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    reply = key + " ERR " + e.what() + '\n';
  }
  co_await s->send(std::move(reply));
}

awaitable<void> serve(std::shared_ptr<session> s, server_state& server) {
  std::string in;
  for (;;) {
    std::error_code ec;
    const std::size_t n = co_await asio::async_read_until(
        s->socket(), asio::dynamic_buffer(in), '\n', asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;  // end of stream (or an error): lookups in progress still reply
    std::string line = in.substr(0, n - 1);
    in.erase(0, n);
    if (line.starts_with("GET ") && line.size() > 4) {
      asio::co_spawn(s->socket().get_executor(), lookup(s, line.substr(4), server), asio::detached);
    } else {
      co_await s->send("ERR bad request\n");
    }
  }
}

awaitable<void> accept_loop(tcp::acceptor& acceptor, server_state& server) {
  for (;;) {
    std::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(asio::make_strand(server.io),
                                                        asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;  // the acceptor was closed: the load is over
    auto s = std::make_shared<session>(std::move(socket));
    asio::co_spawn(s->socket().get_executor(), serve(s, server), asio::detached);
  }
}

// ---- the load generator ----------------------------------------------------------------------

// A one-shot barrier for coroutines that all run on one strand (so no locking): the last to
// arrive cancels the timer everyone else waits on.
class barrier {
 public:
  barrier(const strand_t& ex, int count)
      : timer_(ex, asio::steady_timer::time_point::max()), remaining_(count) {}
  awaitable<void> arrive_and_wait() {
    if (--remaining_ == 0) {
      timer_.cancel();
      co_return;
    }
    std::error_code ec;  // operation_aborted: released
    co_await timer_.async_wait(asio::redirect_error(use_awaitable, ec));
  }

 private:
  asio::steady_timer timer_;
  int remaining_;
};

struct load_state {
  load_state(strand_t s, tcp::endpoint e) : strand(std::move(s)), server(std::move(e)) {}
  strand_t strand;
  tcp::endpoint server;
  std::vector<std::unique_ptr<barrier>> round_start;  // [0]: all connected; [r]: round r-1 done
  std::vector<int> sent;                              // [r]: connections that sent in round r
  long replies_ok = 0;
  long replies_bad = 0;
  long failures = 0;
  int finished = 0;
  std::string first_problem;
};

// The j-th key of the `order`-th connection to send in `round`: runs of `stampede` consecutive
// senders share 5 keys; the runs map to key groups differently in each round.
std::string key_for(int order, int round, int j) {
  const int group = (order / stampede + round * 7) % (hot_keys / gets_per_round);
  return "key-" + std::to_string(group * gets_per_round + j);
}

void note_problem(load_state& load, const std::string& what) {
  if (load.first_problem.empty()) load.first_problem = what;
}

awaitable<void> client(int id, load_state& load) {
  int passed = 0;  // barriers passed; a client that fails still arrives at the rest
  try {
    tcp::socket socket(load.strand);
    co_await socket.async_connect(load.server, use_awaitable);
    std::string in;
    for (int r = 0; r < rounds; ++r) {
      co_await load.round_start[r]->arrive_and_wait();
      ++passed;
      std::string request;
      std::multiset<std::string> pending;
      const int order = load.sent[r]++;
      for (int j = 0; j < gets_per_round; ++j) {
        std::string key = key_for(order, r, j);
        request += "GET " + key + '\n';
        pending.insert(std::move(key));
      }
      co_await asio::async_write(socket, asio::buffer(request), use_awaitable);
      for (int j = 0; j < gets_per_round; ++j) {
        const std::size_t n =
            co_await asio::async_read_until(socket, asio::dynamic_buffer(in), '\n', use_awaitable);
        const std::string line = in.substr(0, n - 1);
        in.erase(0, n);
        const std::size_t space = line.find(' ');
        const std::string key = line.substr(0, space);
        const auto it = pending.find(key);
        if (space != std::string::npos && it != pending.end() &&
            line.substr(space + 1) == backend_value(key)) {
          pending.erase(it);
          ++load.replies_ok;
        } else {
          ++load.replies_bad;
          note_problem(load, "connection " + std::to_string(id) + ": bad reply '" + line + "'");
        }
      }
    }
    socket.shutdown(tcp::socket::shutdown_send);
  } catch (const std::exception& e) {
    ++load.failures;
    note_problem(load, "connection " + std::to_string(id) + ": " + e.what());
  }
  while (passed < rounds) co_await load.round_start[passed++]->arrive_and_wait();
}

// Raises the soft RLIMIT_NOFILE to the hard limit; false if that is still too low.
bool raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return true;  // unknown: try anyway
  lim.rlim_cur = lim.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &lim);
  (void)getrlimit(RLIMIT_NOFILE, &lim);
  constexpr rlim_t needed = 2 * connections + 64;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < needed) {
    std::fprintf(stderr, "05-asio-server: needs %llu file descriptors, the limit is %llu\n",
                 static_cast<unsigned long long>(needed),
                 static_cast<unsigned long long>(lim.rlim_cur));
    return false;
  }
  return true;
}

int run() {
  if (!raise_fd_limit()) return 1;
  const auto started = std::chrono::steady_clock::now();

  // The group outlives the io_context: handlers that the io_context destroys unrun may hold
  // completions, which settle their flights in the group.
  cache_t cache;
  asio::io_context io(2);
  server_state server(io, cache);

  tcp::acceptor acceptor(asio::make_strand(io),
                         tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  acceptor.listen(asio::socket_base::max_listen_connections);
  asio::co_spawn(acceptor.get_executor(), accept_loop(acceptor, server), asio::detached);

  load_state load(asio::make_strand(io), acceptor.local_endpoint());
  for (int r = 0; r < rounds; ++r) {
    load.round_start.push_back(std::make_unique<barrier>(load.strand, connections));
  }
  load.sent.assign(rounds, 0);
  asio::steady_timer watchdog(load.strand, watchdog_limit);
  std::atomic<bool> hung{false};
  watchdog.async_wait([&](std::error_code ec) {
    if (ec) return;  // cancelled: finished in time
    hung = true;
    io.stop();
  });
  for (int i = 0; i < connections; ++i) {
    asio::co_spawn(load.strand, client(i, load),
                   asio::bind_executor(load.strand, [&](const std::exception_ptr&) {
                     if (++load.finished < connections) return;
                     // The last client is done: stop accepting, so that run() returns once
                     // the server's connections have wound down.
                     watchdog.cancel();
                     asio::post(acceptor.get_executor(), [&] { acceptor.close(); });
                   }));
  }

  std::thread helper([&] { io.run(); });
  io.run();
  helper.join();

  if (hung) {
    std::fprintf(stderr, "05-asio-server: not finished after %lld s (%ld replies so far)\n",
                 static_cast<long long>(watchdog_limit.count()), load.replies_ok);
    std::fflush(stderr);
    std::_Exit(2);  // skip destructors: flights may still be pending
  }

  const long served = server.served.load();
  const long origin = server.origin_calls.load();
  const double ratio = served > 0 ? static_cast<double>(origin) / static_cast<double>(served) : 1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - started)
                      .count();
  const auto stats = server.cache.stats();
  std::printf("connections:      %d (%d rounds of %d pipelined GETs, %d hot keys)\n", connections,
              rounds, gets_per_round, hot_keys);
  std::printf("requests served:  %ld\n", served);
  std::printf("origin calls:     %ld (group flights: %llu)\n", origin,
              static_cast<unsigned long long>(stats.flights));
  std::printf("coalescing ratio: %.4f (origin calls / requests served)\n", ratio);
  std::printf("replies checked:  %ld ok, %ld bad; %ld connections failed; %lld ms\n",
              load.replies_ok, load.replies_bad, load.failures, static_cast<long long>(ms));
  if (!load.first_problem.empty())
    std::printf("first problem:    %s\n", load.first_problem.c_str());

  const bool ok = load.replies_ok == requests_total && load.replies_bad == 0 &&
                  load.failures == 0 && served == requests_total && ratio < ratio_limit &&
                  static_cast<long>(stats.flights) == origin;
  if (!ok) std::puts("FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "05-asio-server: %s\n", e.what());
    return 1;
  }
}
