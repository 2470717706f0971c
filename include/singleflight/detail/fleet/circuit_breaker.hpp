// singleflight/detail/fleet/circuit_breaker.hpp -- internal; do not include directly.
//
// detail::circuit_breaker: stops a fleet from paying redis_timeout on every
// call while Redis is down or stalled. Closed, it lets every call through;
// `threshold` consecutive failures open it for `cooldown`, during which every
// call skips Redis (and loads locally at no extra latency); then one call is
// let through as a probe: its success closes the breaker, its failure opens it
// for another cooldown.
//
// Locking: `mu_` guards the state. The closed state is also mirrored in the
// atomic `closed_`, so the hot path (a call while Redis is healthy) takes no
// lock: allow() reads it with acquire, paired with the release stores made
// under mu_, so a thread that sees "closed" also sees the reset that closed it
// (there is nothing else to see: allow() reads no other field without mu_).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "../chrono.hpp"

namespace singleflight::detail {

class circuit_breaker {
 public:
  using clock = std::chrono::steady_clock;

  circuit_breaker(std::uint32_t threshold, std::chrono::milliseconds cooldown) noexcept
      : threshold_(threshold == 0 ? 1 : threshold), cooldown_(cooldown) {}

  // allow(): may this call use Redis? True when closed; when open, false
  // until the cooldown has passed, then true for one caller (the probe) until
  // it reports success() or failure(), or for one more after each further
  // cooldown without a report.
  bool allow() {
    if (closed_.load(std::memory_order_acquire)) return true;
    const std::lock_guard<std::mutex> lk(mu_);
    if (state_ == state::closed) return true;
    // A probe that never reported (its call ended without a round trip) is
    // replaced by another one after a further cooldown.
    const auto now = clock::now();
    if (now >= open_until_) {
      state_ = state::probing;
      open_until_ = now + cooldown_;
      return true;
    }
    return false;
  }

  // success(): a round trip worked. Closes the breaker and resets the count.
  void success() {
    if (closed_.load(std::memory_order_acquire) && failures_.load(std::memory_order_relaxed) == 0) {
      return;
    }
    const std::lock_guard<std::mutex> lk(mu_);
    failures_.store(0, std::memory_order_relaxed);
    state_ = state::closed;
    closed_.store(true, std::memory_order_release);
  }

  // failure(): a round trip failed (error, timeout, refused). Returns true
  // when this failure opened the breaker.
  bool failure() {
    const std::lock_guard<std::mutex> lk(mu_);
    const std::uint32_t n = failures_.load(std::memory_order_relaxed) + 1;
    failures_.store(n, std::memory_order_relaxed);
    if (state_ == state::probing || (state_ == state::closed && n >= threshold_)) {
      state_ = state::open;
      open_until_ = clock::now() + cooldown_;
      closed_.store(false, std::memory_order_release);
      opens_ += 1;
      return true;
    }
    return false;
  }

  // closed(): no recent run of failures (the fleet's healthy()).
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  std::uint64_t opens() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return opens_;
  }

 private:
  enum class state { closed, open, probing };

  const std::uint32_t threshold_;
  const std::chrono::milliseconds cooldown_;
  mutable std::mutex mu_;
  state state_ = state::closed;             // guarded by mu_
  clock::time_point open_until_{};          // guarded by mu_
  std::uint64_t opens_ = 0;                 // guarded by mu_
  std::atomic<std::uint32_t> failures_{0};  // written under mu_; read on the fast path
  std::atomic<bool> closed_{true};          // mirror of state_ == closed
};

}  // namespace singleflight::detail
