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
//     Each report posted is numbered (reports(): the count so far); apply
//     hands the number to drop(key text, number), so that fleet_cache keeps a
//     value read from Redis after the report was posted (read_mark.hpp: the
//     read already reflects the write reported, its own load's store included).
//   * An expire (fleet_cache::expire, heard on the expire channel through
//     expire_listener(), this process's own included) marks one key stale:
//     apply calls stale(key) instead of drop(key). Under client tracking the
//     server then reports the expire's deletion of the value, which would
//     drop the key: an expire heard records the key as `expiring` (the
//     expire's PUBLISH reaches the subscriber's connection before the
//     server's report, sent after the script), and the next report of that
//     key is taken as the expire's own, not dropped.
//   * Tracking refused by the server (on_tracking_refused): the inbox falls
//     back to the bus for good; bus messages then come through
//     bus_listener() (the subscriber's fallback channel), and expires are
//     handled as on the bus (no deletion report will follow them).
//   * A confirmation (the first, and each after a reconnect: pub/sub loses
//     what was published while the connection was down) marks everything
//     stale: apply calls stale_all(since) (the local cache's expire_all,
//     its stale answers bounded from `since`, the steady-clock time the mark
//     was posted, not the later time the first caller applies it), so every
//     entry stored before the gap is read again through the fleet, once per
//     key, while readers are answered with it for a bounded while.
//     The confirmations of one (re)subscription (the coherence channel's and
//     the expire channel's, which may come in separate reads) are one mark,
//     posted once all are in (on_settled): a mark per confirmation would make
//     a reader's refresh started between them void (the second mark's new
//     version) and the key read through the fleet twice per gap.
//     Keys heard before it are still dropped (a drop is more than a stale
//     mark), after the mark.
//   * More than max_pending keys waiting, or a key that could not be
//     recorded (out of memory): which keys changed is lost, as in a gap:
//     everything is marked stale, as for a confirmation (counted once per
//     apply: overflows), and the keys recorded are still dropped.
//   * A FLUSHALL reported (on_flushed), or a drop or mark that threw in
//     apply: everything is marked for a clear (every value is known gone, or
//     what was taken could not be applied), which covers the keys waiting.
//
// Locking: `mu_` (a leaf: nothing is called while it is held) guards keys_, the writes of
// reports_,
// expiring_, clear_all_, stale_all_, stale_since_, confirmed_, overflowed_, draining_ and the
// writes of posted_,
// applied_ and fell_back_; posted_ and applied_ are also read without it (the fast path: nothing to
// apply). One caller at a time applies (draining_), without the lock; callers that need what it
// applies wait on `cv_` until it is done, and apply what was posted after it themselves (but the
// applying thread itself, re-entering through a T destroyed by its own drop, returns at once:
// waiting would wait for itself; what it wanted is applied by the next call). A caller that finds
// applied_ >= the posted_ it read returns at once: two acquire loads on the hit path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../chrono.hpp"
#include "fleet_protocol.hpp"
#include "fleet_subscriber.hpp"
#include "read_mark.hpp"

namespace singleflight::detail {

class invalidation_inbox final : public fleet_subscriber::listener, public report_source {
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

  // expire_listener(): the listener of the expire channel (fleet_protocol.hpp,
  // expire_channel): "<writer id><key text>", this process's messages
  // included (under tracking, its own expire's report comes back too).
  fleet_subscriber::listener* expire_listener() noexcept { return &expires_; }

  // bus_listener(): under client tracking, the listener of the bus channel
  // subscribed as the fallback (fleet_subscriber::subscribe_fallback), heard
  // only once the server refused tracking: "<writer id><key text>".
  fleet_subscriber::listener* bus_listener() noexcept { return &bus_; }

  // on_tracking_refused(): from the subscriber's thread, before the
  // confirmations of the connection that follows; idempotent.
  void on_tracking_refused() noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    expiring_.clear();                                  // no deletion report will come for them
    fell_back_.store(true, std::memory_order_relaxed);  // written under mu_
  }

  // fell_back(): the server refused tracking; the bus is in use. Thread-safe.
  bool fell_back() const noexcept { return fell_back_.load(std::memory_order_relaxed); }

  // on_message(payload): "<writer id><key text>" (the bus), or a key name
  // (client tracking), from the subscriber's thread.
  void on_message(std::string_view payload) noexcept override {
    if (tracked_.empty()) {
      on_bus(payload);
      return;
    }
    std::string_view text;
    if (!tracked_key_text(tracked_, payload, text)) return;
    const std::lock_guard<std::mutex> lk(mu_);
    bool stale = false;
    if (!expiring_.empty()) {
      const auto it = expiring_.find(std::string(text));  // NOLINT: bad_alloc is terminate
      if (it != expiring_.end()) {
        expiring_.erase(it);
        stale = true;  // the expire's own deletion: its stale mark is posted already
      }
    }
    if (!stale) {
      // Numbered before it is posted: a read that loads the new count (acquire) is sent after
      // the report is in keys_.
      const std::uint64_t seq = reports_.load(std::memory_order_relaxed) + 1;
      post(text, false, seq);
      reports_.store(seq, std::memory_order_release);
    }
    received_.fetch_add(1, std::memory_order_relaxed);  // a counter
  }

  // reports(): the count of client-tracking reports of a key posted so far
  // (read_mark.hpp, report_source). Memory ordering: stored with release by
  // the subscriber's thread after the report is recorded, loaded with
  // acquire. Thread-safe.
  std::uint64_t reports() const noexcept override {
    return reports_.load(std::memory_order_acquire);
  }

  // on_bus(payload): "<writer id><key text>" from the bus (under tracking:
  // once tracking was refused), on the subscriber's thread; this process's
  // own messages are skipped.
  void on_bus(std::string_view payload) noexcept {
    if (payload.size() < id_size || payload.substr(0, id_size) == self_) return;
    const std::lock_guard<std::mutex> lk(mu_);
    post(payload.substr(id_size), false);
    received_.fetch_add(1, std::memory_order_relaxed);  // a counter
  }

  // on_expire(payload): "<writer id><key text>" from the expire channel, on
  // the subscriber's thread.
  void on_expire(std::string_view payload) noexcept {
    if (payload.size() < id_size) return;
    const std::string_view text = payload.substr(id_size);
    // Its own expire this process applied already (a late repeat would make
    // a value refreshed since stale again); under tracking, the report of its
    // deletion still comes back: marked, not posted.
    const bool own = payload.substr(0, id_size) == self_;
    const std::lock_guard<std::mutex> lk(mu_);
    const bool tracking = !tracked_.empty() && !fell_back_.load(std::memory_order_relaxed);
    if (own && !tracking) return;
    if (tracking) {
      if (expiring_.size() >= max_pending_) {
        lost_track();
      } else {
        try {
          expiring_.emplace(text);
        } catch (...) {  // bad_alloc: the stale mark covers the key
          lost_track();
        }
      }
    }
    if (!own) {
      post(text, true);
      expires_received_.fetch_add(1, std::memory_order_relaxed);  // a counter
    }
  }

  // on_confirmed(): one of the inbox's channels is (again) subscribed; what
  // was published on it before is lost. Recorded, not posted yet: the
  // confirmations of one reconnect (the coherence channel's, the expire
  // channel's) are one stale mark, posted by on_settled once all are in.
  void on_confirmed() noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    confirmed_ += 1;
    expiring_.clear();  // reports sent during the gap are lost with their expires
  }

  // on_settled(): the subscriber's confirmations are all in: if any came
  // since the last call, everything is marked stale, once, and they are
  // counted (resyncs). Idempotent.
  void on_settled() noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    if (confirmed_ == 0) return;
    resyncs_.fetch_add(std::exchange(confirmed_, 0), std::memory_order_relaxed);  // a counter
    mark_stale_all();
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

  // apply(drop, clear[, stale, stale_all]): once it returns, everything
  // posted before it began is applied: clear() for everything; else
  // stale_all() when everything was marked stale (a confirmation, an
  // overflow; stale_all(since) when it takes the steady-clock time of the
  // earliest such mark not yet applied), then, in the order heard, drop(key text) for each key
  // dropped and stale(key text) for each key expired. Without `stale` and
  // `stale_all`, drop and clear stand for them. A drop invocable as
  // drop(key text, seq) is also given the report's number (reports(); 0 for
  // a bus message, which is always applied). Throws what they throw (then
  // everything is marked for a clear, for the next caller: what was taken is
  // lost).
  template <class Drop, class Clear>
  void apply(Drop&& drop, Clear&& clear) {
    apply(drop, clear, drop, clear);
  }
  template <class Drop, class Clear, class Stale, class StaleAll>
  void apply(Drop&& drop, Clear&& clear, Stale&& stale, StaleAll&& stale_all) {
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
      std::vector<pending> keys;
      keys.swap(keys_);
      const bool all = std::exchange(clear_all_, false);
      const bool stale_all_keys = std::exchange(stale_all_, false);
      const std::chrono::steady_clock::time_point since = stale_since_;
      overflowed_ = false;
      const std::uint64_t upto = posted_.load(std::memory_order_relaxed);
      draining_ = true;
      drainer_ = std::this_thread::get_id();
      lk.unlock();
      try {
        if (all) {
          clear();
        } else {
          if (stale_all_keys) {
            if constexpr (std::is_invocable_v<StaleAll&, std::chrono::steady_clock::time_point>) {
              stale_all(since);
            } else {
              stale_all();
            }
          }
          for (const pending& p : keys) {
            if (p.expired) {
              stale(p.text);
            } else if constexpr (std::is_invocable_v<Drop&, const std::string&, std::uint64_t>) {
              drop(p.text, p.seq);
            } else {
              drop(p.text);
            }
          }
        }
      } catch (...) {
        lk.lock();
        overflows_.fetch_add(1, std::memory_order_relaxed);
        clear_all_ = true;
        keys_.clear();
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
  std::uint64_t expires_received() const noexcept {
    return expires_received_.load(std::memory_order_relaxed);
  }

 private:
  // The expire channel's listener: forwards to on_expire; its confirmation is
  // one too (an expire published before it was lost: everything is marked).
  struct expire_relay final : fleet_subscriber::listener {
    explicit expire_relay(invalidation_inbox* in) noexcept : inbox(in) {}
    void on_message(std::string_view payload) noexcept override { inbox->on_expire(payload); }
    void on_confirmed() noexcept override { inbox->on_confirmed(); }
    void on_settled() noexcept override { inbox->on_settled(); }
    void on_flushed() noexcept override {}
    invalidation_inbox* inbox;
  };

  // The fallback bus's listener: forwards to on_bus; its confirmation is one
  // too (what was published before it is lost).
  struct bus_relay final : fleet_subscriber::listener {
    explicit bus_relay(invalidation_inbox* in) noexcept : inbox(in) {}
    void on_message(std::string_view payload) noexcept override { inbox->on_bus(payload); }
    void on_confirmed() noexcept override { inbox->on_confirmed(); }
    void on_settled() noexcept override { inbox->on_settled(); }
    void on_flushed() noexcept override {}
    void on_tracking_refused() noexcept override { inbox->on_tracking_refused(); }
    invalidation_inbox* inbox;
  };

  // A key to apply: dropped, or marked stale (expired); seq: its tracking
  // report's number, 0 for the bus.
  struct pending {
    std::string text;
    bool expired = false;
    std::uint64_t seq = 0;
  };

  // post(text, stale, seq): one key to apply. mu_ held.
  void post(std::string_view text, bool stale, std::uint64_t seq = 0) noexcept {
    if (!clear_all_) {
      if (keys_.size() >= max_pending_) {
        lost_track();
      } else {
        try {
          keys_.push_back(pending{std::string(text), stale, seq});
        } catch (...) {  // bad_alloc: the stale mark covers the key
          lost_track();
        }
      }
    }
    posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // lost_track(): a key heard could not be recorded: everything is marked
  // stale (counted once until the next apply takes the mark). mu_ held.
  void lost_track() noexcept {
    if (!overflowed_) overflows_.fetch_add(1, std::memory_order_relaxed);
    overflowed_ = true;
    mark_stale_all();
  }

  // mark_stale_all(): everything is to be marked stale; the earliest such mark not yet
  // applied keeps its time (stale_since_). mu_ held.
  void mark_stale_all() noexcept {
    if (!stale_all_) stale_since_ = std::chrono::steady_clock::now();
    stale_all_ = true;
  }

  const std::string self_;
  const std::size_t max_pending_;
  const std::string tracked_;  // "" on the bus

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pending> keys_;                          // guarded by mu_
  std::unordered_set<std::string> expiring_;           // guarded by mu_; tracking only
  bool clear_all_ = false;                             // guarded by mu_
  bool stale_all_ = false;                             // guarded by mu_
  std::chrono::steady_clock::time_point stale_since_;  // guarded by mu_: when stale_all_ was set
  std::uint64_t confirmed_ = 0;  // guarded by mu_: confirmations not yet settled
  bool overflowed_ = false;      // guarded by mu_: lost_track() counted since the last apply
  bool draining_ = false;        // guarded by mu_
  std::thread::id drainer_;      // guarded by mu_: who applies while draining_
  std::atomic<std::uint64_t> posted_{0};   // written under mu_
  std::atomic<std::uint64_t> applied_{0};  // written under mu_
  std::atomic<std::uint64_t> reports_{0};  // written under mu_: tracking reports posted
  std::atomic<std::uint64_t> received_{0};
  std::atomic<std::uint64_t> resyncs_{0};
  std::atomic<std::uint64_t> overflows_{0};
  std::atomic<std::uint64_t> expires_received_{0};
  std::atomic<bool> fell_back_{false};  // written under mu_; read without it by stats
  expire_relay expires_{this};
  bus_relay bus_{this};
};

}  // namespace singleflight::detail
