// singleflight/detail/fleet/redis_pool.hpp -- internal; do not include directly.
//
// detail::redis_pool: the fleet's command connections. A call takes one
// connection for the length of its protocol steps (detail::pooled, RAII) and
// gives it back; a connection that broke (I/O error, timeout) is dropped, not
// given back, so no later call ever reads a reply meant for another.
//
// Locking: `mu_` guards the idle list and the closed flag, and is held only
// to push or pop. Connecting, and every round trip, happen without it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "redis_conn.hpp"

namespace singleflight::detail {

class redis_pool;

// pooled: one connection taken from the pool; gives it back on destruction
// unless it broke.
class pooled {
 public:
  pooled(redis_pool* pool, std::unique_ptr<redis_conn> c) noexcept
      : pool_(pool), conn_(std::move(c)) {}
  pooled(pooled&& o) noexcept : pool_(o.pool_), conn_(std::move(o.conn_)) {}
  pooled& operator=(pooled&&) = delete;
  pooled(const pooled&) = delete;
  pooled& operator=(const pooled&) = delete;
  inline ~pooled();

  redis_conn& operator*() const noexcept { return *conn_; }
  redis_conn* operator->() const noexcept { return conn_.get(); }

 private:
  redis_pool* pool_;
  std::unique_ptr<redis_conn> conn_;
};

class redis_pool {
 public:
  redis_pool(redis_endpoint ep, std::chrono::milliseconds timeout, std::string username,
             std::string password, std::size_t max_idle)
      : ep_(std::move(ep)),
        timeout_(timeout),
        username_(std::move(username)),
        password_(std::move(password)),
        max_idle_(max_idle == 0 ? 1 : max_idle) {
    idle_.reserve(max_idle_);  // give_back() never allocates
  }

  // acquire(): an idle connection, or a new one (connect + AUTH + SELECT,
  // each bounded by the timeout). Throws redis_failure when Redis cannot be
  // reached or the pool is closed. Thread-safe.
  pooled acquire() {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (closed_) throw redis_failure("the fleet is closed");
      if (!idle_.empty()) {
        std::unique_ptr<redis_conn> c = std::move(idle_.back());
        idle_.pop_back();
        return pooled(this, std::move(c));
      }
    }
    return pooled(this, open());
  }

  // open(): a new connection that belongs to the caller (the subscriber and
  // the renewer keep theirs). Throws redis_failure.
  std::unique_ptr<redis_conn> open() const {
    return redis_conn::open(ep_, timeout_, username_, password_);
  }

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

  std::chrono::milliseconds timeout() const noexcept { return timeout_; }

 private:
  friend class pooled;

  // Keeps `c` for the next caller, unless it broke, the pool is closed or
  // already holds max_idle connections; a dropped connection is closed after
  // the lock is released.
  void give_back(std::unique_ptr<redis_conn> c) noexcept {
    if (!c || c->broken()) return;
    std::unique_lock<std::mutex> lk(mu_);
    if (!closed_ && idle_.size() < max_idle_) {
      idle_.push_back(std::move(c));  // within the capacity reserved at construction
      return;
    }
    lk.unlock();
    c.reset();
  }

  const redis_endpoint ep_;
  const std::chrono::milliseconds timeout_;
  const std::string username_;
  const std::string password_;
  const std::size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<redis_conn>> idle_;  // guarded by mu_
  bool closed_ = false;                            // guarded by mu_
};

inline pooled::~pooled() {
  if (conn_ && pool_ != nullptr) pool_->give_back(std::move(conn_));
}

}  // namespace singleflight::detail
