// singleflight/detail/fleet/invalidation_inbox.hpp -- internal; do not include directly.
//
// detail::invalidation_inbox: what fleet_cache's bus (fleet_protocol.hpp,
// bus_channel) told this process and its local cache has not applied yet.
// The subscriber's thread posts into it (a listener: every message, every
// confirmation of the bus subscription); the callers of fleet_cache apply it
// to the local cache before they read it (apply), so the subscriber's thread
// never touches the local cache (whose writes may destroy T: user code) and
// a get that begins after a message was posted never reads what it dropped.
//
//   * A message from another process names one key: apply drops it.
//   * Under client tracking (`tracked` given: fleet_protocol.hpp's
//     tracking_prefix) a message is a Redis key name reported by the server,
//     for a write by anyone, this process included: a value's name
//     ("{N:P:K}:v") drops K, other names (leases, metadata) are ignored; a
//     FLUSHALL (on_flushed) marks everything.
//   * A confirmation (the first, and each after a reconnect: pub/sub loses
//     what was published while the connection was down) marks everything:
//     apply clears the local cache, so every entry stored before the gap is
//     read again through the fleet.
//   * More than max_pending keys waiting, or a key that could not be
//     recorded (out of memory): everything is marked, as for a confirmation.
//
// Locking: `mu_` (a leaf: nothing is called while it is held) guards keys_,
// clear_all_, draining_ and the writes of posted_ and applied_; posted_ and
// applied_ are also read without it (the fast path: nothing to apply). One
// caller at a time applies (draining_), without the lock; callers that need
// what it applies wait on `cv_` until it is done, and apply what was posted
// after it themselves (but the applying thread itself, re-entering through a
// T destroyed by its own drop, returns at once: waiting would wait for
// itself; what it wanted is applied by the next call). A caller that finds applied_ >= the posted_
// it read returns at once: two acquire loads on the hit path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fleet_protocol.hpp"
#include "fleet_subscriber.hpp"

namespace singleflight::detail {

class invalidation_inbox final : public fleet_subscriber::listener {
 public:
  // The writer id every bus message of this process starts with (its own
  // messages are not applied: its put and invalidate already did).
  static constexpr std::size_t id_size = 32;

  // `tracked` empty: bus messages ("<writer id><key text>"); else the
  // tracking prefix whose value names the server reports.
  invalidation_inbox(std::string self, std::size_t max_pending, std::string tracked = {})
      : self_(std::move(self)), max_pending_(max_pending), tracked_(std::move(tracked)) {}

  invalidation_inbox(const invalidation_inbox&) = delete;
  invalidation_inbox& operator=(const invalidation_inbox&) = delete;

  const std::string& self() const noexcept { return self_; }

  // on_message(payload): "<writer id><key text>" (the bus), or a key name
  // (client tracking), from the subscriber's thread.
  void on_message(std::string_view payload) noexcept override {
    std::string_view text;
    if (tracked_.empty()) {
      if (payload.size() < id_size || payload.substr(0, id_size) == self_) return;
      text = payload.substr(id_size);
    } else if (!tracked_key_text(tracked_, payload, text)) {
      return;
    }
    const std::lock_guard<std::mutex> lk(mu_);
    if (!clear_all_) {
      if (keys_.size() >= max_pending_) {
        mark_all();
      } else {
        try {
          keys_.emplace_back(text);
        } catch (...) {  // bad_alloc: a clear loses nothing
          mark_all();
        }
      }
    }
    received_.fetch_add(1, std::memory_order_relaxed);  // a counter
    posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // on_confirmed(): the bus subscription is (again) in place; what was
  // published before is lost.
  void on_confirmed() noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    resyncs_.fetch_add(1, std::memory_order_relaxed);  // a counter
    clear_all_ = true;
    keys_.clear();
    posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // on_flushed(): client tracking reported a FLUSHALL: every key is gone.
  void on_flushed() noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    received_.fetch_add(1, std::memory_order_relaxed);  // a counter
    clear_all_ = true;
    keys_.clear();
    posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // apply(drop, clear): once it returns, everything posted before it began
  // is applied: drop(key text) for each key, or clear() for everything.
  // Throws what they throw (then what was taken is marked as "everything",
  // for the next caller).
  template <class Drop, class Clear>
  void apply(Drop&& drop, Clear&& clear) {
    // Acquire: pairs with the release of posted_ (a post before this load is
    // seen as posted) and of applied_ (what was applied is visible).
    const std::uint64_t want = posted_.load(std::memory_order_acquire);
    if (applied_.load(std::memory_order_acquire) >= want) return;
    std::unique_lock<std::mutex> lk(mu_);
    while (applied_.load(std::memory_order_relaxed) < want) {
      if (draining_) {
        // A T destroyed by this thread's own drop() re-entered the fleet_cache:
        // waiting would wait for itself; the next call applies the rest.
        if (drainer_ == std::this_thread::get_id()) return;
        cv_.wait(lk);  // another caller applies; bounded by its cache writes
        continue;
      }
      std::vector<std::string> keys;
      keys.swap(keys_);
      const bool all = std::exchange(clear_all_, false);
      const std::uint64_t upto = posted_.load(std::memory_order_relaxed);
      draining_ = true;
      drainer_ = std::this_thread::get_id();
      lk.unlock();
      try {
        if (all) {
          clear();
        } else {
          for (const std::string& k : keys) drop(k);
        }
      } catch (...) {
        lk.lock();
        mark_all();
        draining_ = false;
        drainer_ = std::thread::id();
        cv_.notify_all();
        throw;
      }
      lk.lock();
      applied_.store(upto, std::memory_order_release);
      draining_ = false;
      drainer_ = std::thread::id();
      cv_.notify_all();
    }
  }

  std::uint64_t received() const noexcept { return received_.load(std::memory_order_relaxed); }
  std::uint64_t resyncs() const noexcept { return resyncs_.load(std::memory_order_relaxed); }
  std::uint64_t overflows() const noexcept { return overflows_.load(std::memory_order_relaxed); }

 private:
  void mark_all() noexcept {  // mu_ held
    overflows_.fetch_add(1, std::memory_order_relaxed);
    clear_all_ = true;
    keys_.clear();
  }

  const std::string self_;
  const std::size_t max_pending_;
  const std::string tracked_;  // "" on the bus

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> keys_;          // guarded by mu_
  bool clear_all_ = false;                 // guarded by mu_
  bool draining_ = false;                  // guarded by mu_
  std::thread::id drainer_;                // guarded by mu_: who applies while draining_
  std::atomic<std::uint64_t> posted_{0};   // written under mu_
  std::atomic<std::uint64_t> applied_{0};  // written under mu_
  std::atomic<std::uint64_t> received_{0};
  std::atomic<std::uint64_t> resyncs_{0};
  std::atomic<std::uint64_t> overflows_{0};
};

}  // namespace singleflight::detail
