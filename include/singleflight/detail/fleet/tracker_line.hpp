// singleflight/detail/fleet/tracker_line.hpp -- internal; do not include directly.
//
// detail::tracker_line: the subscriber's tracker connection (fleet_subscriber.hpp, "Client
// tracking"), shared between its owner, the subscriber's thread, and the flights that store a
// value through it (fleet_flight.hpp, store_on_tracker in fleet_protocol.hpp).
//
// The tracker sends `CLIENT TRACKING on REDIRECT <id> BCAST NOLOOP PREFIX <prefix>`: the server
// does not report a write made by the tracker itself (a command sent on it, a MULTI/EXEC; not a
// write inside a script, which runs as the server's own client). A leader that stores its value
// on the tracker therefore never hears the report of its own store, and keeps its local copy. A
// write by anyone else under the prefix is still reported to it, one made right after the store
// included: the server remembers, per key and per event-loop pass, the last client that changed
// it, and skips the report only for the tracker when that client was the tracker (redis 7.0
// src/tracking.c, trackingRememberKeyToBroadcast / trackingBuildBroadcastReply).
//
// Ownership: only the subscriber's thread installs and drops the connection (install, reset);
// it polls the connection for its close only while no flight holds it (poll_fd, after_poll). A
// flight takes it with try_take (never waits for another flight: busy, absent or broken, it stores
// with the script on a pool connection, as without a tracker) and gives it back through the `held`
// guard, which pokes the subscriber when it skipped the tracker while the flight held it (so it
// polls it again) or when the flight left it broken. A flight that failed on it marks it broken;
// the subscriber then drops it and its own connection and reopens both (as when the tracker
// closes).
//
// Locking: `mu_`, a leaf, guards conn_ and is held by a flight for its whole exchange (two round
// trips, each bounded by the connection's timeout) and by the subscriber's thread for its
// non-blocking read and for install/reset. `taken_` (atomic) keeps a second flight from waiting
// on it. No user code runs under it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "../functional.hpp"
#include "redis_conn.hpp"

namespace singleflight::detail {

class tracker_line {
 public:
  // poke: wakes the subscriber's thread (its wake pipe). Never throws.
  explicit tracker_line(std::function<void()> poke) : poke_(std::move(poke)) {}

  tracker_line(const tracker_line&) = delete;
  tracker_line& operator=(const tracker_line&) = delete;
  ~tracker_line() = default;

  // held: a flight's hold of the tracker, from try_take to its destruction.
  class held {
   public:
    held() noexcept = default;
    held(held&& o) noexcept : line_(std::exchange(o.line_, nullptr)) {}
    held& operator=(held&&) = delete;
    held(const held&) = delete;
    held& operator=(const held&) = delete;
    ~held() {
      if (line_ != nullptr) line_->give_back();
    }

    explicit operator bool() const noexcept { return line_ != nullptr; }
    redis_conn& operator*() const noexcept { return *line_->conn_; }
    redis_conn* operator->() const noexcept { return line_->conn_.get(); }

   private:
    friend class tracker_line;
    explicit held(tracker_line* l) noexcept : line_(l) {}
    tracker_line* line_ = nullptr;
  };

  // try_take(): the tracker, held by the caller until the guard is destroyed; empty when there is
  // none, it is broken, or another flight holds it. Never waits for another flight; may wait for
  // the subscriber's thread's own brief holds (a non-blocking read; install; reset, which itself
  // waits only for a flight). Thread-safe.
  held try_take() noexcept {
    if (taken_.exchange(true, std::memory_order_acquire)) return held();
    mu_.lock();
    if (!conn_ || conn_->broken()) {
      mu_.unlock();
      taken_.store(false, std::memory_order_release);
      return held();
    }
    return held(this);
  }

  // install(c), reset(): the subscriber's thread, as it opens and drops its connections. reset
  // waits for a flight's exchange on it to end (bounded by the connection's timeout).
  void install(std::unique_ptr<redis_conn> c) {
    const std::lock_guard<std::mutex> lk(mu_);
    conn_ = std::move(c);
  }
  void reset() noexcept {
    std::unique_ptr<redis_conn> gone;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      gone = std::move(conn_);
    }
  }

  // poll_fd(lost): the subscriber's thread, before its poll: the tracker's descriptor, or -1
  // when there is none or a flight holds it (its replies are the flight's to read); `lost` set
  // when a flight found it broken.
  int poll_fd(bool& lost) noexcept {
    skipped_.store(true);  // before the try: a flight that gives it back now pokes
    if (!mu_.try_lock()) return -1;
    skipped_.store(false);
    int fd = -1;
    if (conn_) {
      lost = conn_->broken();
      fd = lost ? -1 : conn_->raw()->fd;
    }
    mu_.unlock();
    return fd;
  }

  // after_poll(): the subscriber's thread, when its poll found the tracker readable: reads what
  // arrived (non-blocking) unless a flight took it since; false when it closed or failed (it is
  // sent nothing while no flight holds it).
  bool after_poll() noexcept {
    if (!mu_.try_lock()) return true;  // a flight's replies: the flight reads them
    bool ok = true;
    if (conn_) {
      try {
        std::vector<redis_reply> ignored;  // it is sent nothing while no flight holds it
        ok = redisBufferRead(conn_->raw()) == REDIS_OK && conn_->take_parsed(ignored);
      } catch (const std::bad_alloc&) {  // a reply it cannot hold: dropped as broken
        ok = false;
      }
      if (!ok) conn_->mark_broken();
    }
    mu_.unlock();
    return ok;
  }

 private:
  // A broken tracker pokes too: the subscriber may be polling it (taken mid-poll), and a
  // timeout leaves nothing to read on it that would wake it.
  void give_back() noexcept {
    const bool broken = conn_->broken();
    mu_.unlock();
    taken_.store(false, std::memory_order_release);
    if (skipped_.exchange(false) || broken) poke_();
  }

  const std::function<void()> poke_;
  std::mutex mu_;
  std::unique_ptr<redis_conn> conn_;  // guarded by mu_
  std::atomic<bool> taken_{false};    // a flight holds it, or is taking it (flights only)
  std::atomic<bool> skipped_{false};  // the subscriber polled without the tracker
};

}  // namespace singleflight::detail
