// singleflight/detail/fleet/redis_pool.hpp -- internal; do not include directly.
//
// detail::redis_pool: the fleet's command connections. A call takes one
// connection for the length of its protocol steps (detail::pooled, RAII) and
// gives it back; a connection that broke (I/O error, timeout) is dropped, not
// given back, so no later call ever reads a reply meant for another.
//
// Dead idle connections: a server closes connections idle longer than its
// `timeout` (a common production setting), and so do proxies and restarts. A
// connection taken from the idle list is checked first (redis_conn::quiet():
// one poll, no wait) and dropped when the server closed it or when it has been
// idle longer than `max_idle_age` (a middlebox may drop such a flow without a
// word); and a step that fails on a reused connection before any byte of its
// reply arrived (the close raced the command) is sent once more on a fresh
// connection (pooled::run).
//
// Seeds: a pool may be given several endpoints (redis_uri's list of seeds, the
// same server or cluster by other addresses). A new connection goes to the
// endpoint that answered last (the first one to begin with); when it cannot be
// reached (refused, reset, timed out: not a server that refused the settings),
// to the next in the list, each tried once, and the one that answers becomes
// the pool's. With one endpoint: that endpoint, as it always was.
//
// Locking: `mu_` guards the idle list and the closed flag, and is held only
// to push or pop. Connecting, and every round trip, happen without it.
// `at_` (the endpoint that answered last) is an atomic hint: relaxed, as it
// orders nothing (a racing connect at worst tries a dead endpoint once more).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../chrono.hpp"
#include "redis_conn.hpp"

namespace singleflight::detail {

class redis_pool;

// pooled: one connection taken from the pool; gives it back on destruction
// unless it broke.
class pooled {
 public:
  pooled(redis_pool* pool, std::unique_ptr<redis_conn> c, bool reused) noexcept
      : pool_(pool), conn_(std::move(c)), reused_(reused) {}
  pooled(pooled&& o) noexcept
      : pool_(o.pool_), conn_(std::move(o.conn_)), reused_(o.reused_), asking_(o.asking_) {}
  pooled& operator=(pooled&&) = delete;
  pooled(const pooled&) = delete;
  pooled& operator=(const pooled&) = delete;
  inline ~pooled();

  redis_conn& operator*() const noexcept { return *conn_; }
  redis_conn* operator->() const noexcept { return conn_.get(); }

  // mark_broken(): the connection, if this still holds one, is not given
  // back. None is held after run() threw from its reconnect (open()).
  void mark_broken() noexcept {
    if (conn_) conn_->mark_broken();
  }

  // run(step): step(connection), whose result it returns. When the step
  // fails with the connection closed before any byte of its reply arrived
  // (redis_failure::unanswered) and the connection had waited in the pool,
  // the server most likely closed it while it was idle, before it read the
  // command: the step runs once more on a fresh connection. For steps that
  // may run twice: idempotent reads and the fleet's fenced scripts (a second
  // store or renew of the same fence changes nothing; a second invalidate
  // bumps the generation once more). Throws what the step or open() throws.
  template <class Step>
  decltype(auto) run(Step&& step);

  // reused(): the connection came from the idle list (it was not opened for
  // this caller).
  bool reused() const noexcept { return reused_; }

  // asking(on): every command on this connection (and on the fresh one
  // run() may open instead) is preceded by ASKING while on (redis_conn::asking,
  // redis_router.hpp: a Redis Cluster ASK redirect). Turned off before the
  // connection goes back to the pool.
  void asking(bool on) noexcept {
    asking_ = on;
    if (conn_) conn_->asking(on);
  }

 private:
  redis_pool* pool_;
  std::unique_ptr<redis_conn> conn_;
  bool reused_;
  bool asking_ = false;
};

class redis_pool {
 public:
  using clock = redis_conn::clock;

  // The default bound on how long a connection may wait in the idle list.
  static constexpr std::chrono::milliseconds default_max_idle_age{30000};

  redis_pool(redis_endpoint ep, std::chrono::milliseconds timeout, std::string username,
             std::string password, std::size_t max_idle,
             std::chrono::milliseconds max_idle_age = default_max_idle_age)
      : redis_pool(std::vector<redis_endpoint>{std::move(ep)}, timeout, std::move(username),
                   std::move(password), max_idle, max_idle_age) {}

  // seeds: at least one (the file comment: Seeds).
  redis_pool(std::vector<redis_endpoint> seeds, std::chrono::milliseconds timeout,
             std::string username, std::string password, std::size_t max_idle,
             std::chrono::milliseconds max_idle_age = default_max_idle_age)
      : eps_(std::move(seeds)),
        timeout_(timeout),
        username_(std::move(username)),
        password_(std::move(password)),
        max_idle_(max_idle == 0 ? 1 : max_idle),
        max_idle_age_(max_idle_age) {
    idle_.reserve(max_idle_);  // give_back() never allocates
  }

  // acquire(): the most recently used idle connection that is still quiet
  // and not older than max_idle_age (the others are dropped), or a new one
  // (connect + handshake, each bounded by the timeout). Throws redis_failure
  // when Redis cannot be reached or the pool is closed. Thread-safe.
  pooled acquire() {
    for (;;) {
      std::unique_ptr<redis_conn> c;
      {
        const std::lock_guard<std::mutex> lk(mu_);
        if (closed_) throw redis_failure("the fleet is closed");
        if (idle_.empty()) break;
        c = std::move(idle_.back());
        idle_.pop_back();
      }
      // Checked without the lock (a poll); a dead one is closed without it too.
      if (fresh_enough(*c, clock::now()) && c->quiet()) return pooled(this, std::move(c), true);
    }
    return pooled(this, open(), false);
  }

  // open(): a new connection that belongs to the caller (the subscriber and
  // the renewer keep theirs). Throws redis_failure.
  // With seeds: the one that answered last, then the others in the list's order, each
  // once; throws the last one's failure (at once for settings the server refused: every
  // seed would refuse them).
  std::unique_ptr<redis_conn> open() const {
    const std::size_t n = eps_.size();
    const std::size_t first = n == 1 ? 0 : at_.load(std::memory_order_relaxed);
    for (std::size_t i = 0;; ++i) {
      const std::size_t k = (first + i) % n;
      try {
        auto c = redis_conn::open(eps_[k], timeout_, username_, password_);
        if (k != first) at_.store(k, std::memory_order_relaxed);
        return c;
      } catch (const redis_failure& f) {
        if (f.refused() || i + 1 >= n) throw;
      }
    }
  }

  // endpoint(): the endpoint new connections go to (the seed that answered last). Thread-safe.
  const redis_endpoint& endpoint() const noexcept {
    return eps_[at_.load(std::memory_order_relaxed)];
  }

  // seeds(): how many endpoints the pool was given.
  std::size_t seeds() const noexcept { return eps_.size(); }

  // close(): drops the idle connections; later acquire() calls fail and
  // connections given back are dropped. Thread-safe, idempotent.
  void close() noexcept {
    std::vector<std::unique_ptr<redis_conn>> drop;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      closed_ = true;
      drop.swap(idle_);
    }
  }

  // closed(): close() was called. Thread-safe.
  bool closed() {
    const std::lock_guard<std::mutex> lk(mu_);
    return closed_;
  }

  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  friend class pooled;

  bool fresh_enough(const redis_conn& c, clock::time_point now) const noexcept {
    return now - c.last_used() <= max_idle_age_;
  }

  // Keeps `c` for the next caller, unless it broke, the pool is closed or
  // already holds max_idle connections; the oldest idle connection, when it
  // has waited longer than max_idle_age, goes (one per call: the list stays
  // short without a timer). Dropped connections are closed after the lock is
  // released.
  void give_back(std::unique_ptr<redis_conn> c) noexcept {
    if (!c || c->broken()) return;
    std::unique_ptr<redis_conn> aged;
    std::unique_lock<std::mutex> lk(mu_);
    if (!idle_.empty() && !fresh_enough(*idle_.front(), clock::now())) {
      aged = std::move(idle_.front());
      idle_.erase(idle_.begin());
    }
    if (!closed_ && idle_.size() < max_idle_) {
      idle_.push_back(std::move(c));  // within the capacity reserved at construction
      return;                         // `aged` closes after the lock is released
    }
    lk.unlock();
    c.reset();
  }

  const std::vector<redis_endpoint> eps_;   // never empty
  mutable std::atomic<std::size_t> at_{0};  // the index of the endpoint that answered last
  const std::chrono::milliseconds timeout_;
  const std::string username_;
  const std::string password_;
  const std::size_t max_idle_;
  const std::chrono::milliseconds max_idle_age_;
  std::mutex mu_;
  std::vector<std::unique_ptr<redis_conn>> idle_;  // guarded by mu_
  bool closed_ = false;                            // guarded by mu_
};

inline pooled::~pooled() {
  if (conn_ && asking_) conn_->asking(false);
  if (conn_ && pool_ != nullptr) pool_->give_back(std::move(conn_));
}

template <class Step>
decltype(auto) pooled::run(Step&& step) {
  if (!conn_) throw redis_failure("no connection");
  if (!reused_) return step(*conn_);
  try {
    return step(*conn_);
  } catch (const redis_failure& f) {
    if (!f.unanswered()) throw;
  }
  conn_.reset();  // broken: not given back
  reused_ = false;
  conn_ = pool_->open();
  conn_->asking(asking_);
  return step(*conn_);
}

}  // namespace singleflight::detail
