// singleflight/detail/fleet/fleet_renewer.hpp -- internal; do not include directly.
//
// detail::lease_renewer: keeps the leases of this process's leaders alive
// while their loaders run. One thread and one connection of its own; every
// `renew_every` it runs the token-checked renew script for each registered
// lease, all due leases pipelined in one round trip (batches of 128). A renewal that finds the
// lease gone (it expired while the process was paused, or Redis lost it) marks the lease lost: the
// leader goes on (the lease is an efficiency lease, not a lock) and its store is then fenced out if
// another leader took over meanwhile.
//
// Locking: `mu_` guards `leases_`, `closing_` and each entry's `registered`
// flag. Round trips happen without it. The thread runs no user code.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fleet_protocol.hpp"
#include "redis_pool.hpp"

namespace singleflight::detail {

class lease_renewer {
  using clock = std::chrono::steady_clock;

  struct entry {
    fleet_names names;  // a copy: a renewal under way may outlive the leader's call
    std::string token;
    clock::time_point due;
    bool registered = true;         // guarded by mu_
    std::atomic<bool> lost{false};  // set by the thread, read by the leader after remove()
  };

 public:
  // handle: a registered lease; unregisters on destruction.
  class handle {
   public:
    handle() noexcept = default;
    handle(handle&& o) noexcept
        : owner_(std::exchange(o.owner_, nullptr)), id_(o.id_), e_(std::move(o.e_)) {}
    handle& operator=(handle&&) = delete;
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { release(); }

    // release(): stops renewing (a renewal under way may still finish; it
    // only extends a lease this leader is about to release anyway).
    void release() noexcept {
      if (owner_ != nullptr) std::exchange(owner_, nullptr)->remove(id_);
    }

    // lost(): a renewal found the lease gone. Read after release().
    bool lost() const noexcept { return e_ && e_->lost.load(std::memory_order_acquire); }

   private:
    friend class lease_renewer;
    handle(lease_renewer* owner, std::uint64_t id, std::shared_ptr<entry> e) noexcept
        : owner_(owner), id_(id), e_(std::move(e)) {}
    lease_renewer* owner_ = nullptr;
    std::uint64_t id_ = 0;
    std::shared_ptr<entry> e_;
  };

  lease_renewer(const redis_pool& pool, std::chrono::milliseconds lease_ttl,
                std::chrono::milliseconds renew_every, std::chrono::milliseconds meta_ttl,
                std::atomic<std::uint64_t>& errors, std::atomic<std::uint64_t>& lost)
      : pool_(pool),
        lease_ttl_(lease_ttl),
        renew_every_(renew_every),
        meta_ttl_(meta_ttl),
        errors_(errors),
        lost_(lost) {
    thread_ = std::thread([this] { run(); });
  }

  lease_renewer(const lease_renewer&) = delete;
  lease_renewer& operator=(const lease_renewer&) = delete;
  ~lease_renewer() { close(); }

  // add(names, token): renews this lease every renew_every from now until
  // the handle is released. After close(), returns a handle that renews
  // nothing. Thread-safe.
  handle add(const fleet_names& names, std::string token) {
    auto e = std::make_shared<entry>();
    e->names = names;
    e->token = std::move(token);
    e->due = clock::now() + renew_every_;
    const std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return handle();
    const std::uint64_t id = ++next_id_;
    leases_.emplace(id, e);
    cv_.notify_all();
    return handle(this, id, std::move(e));
  }

  // close(): stops and joins the thread. Idempotent.
  void close() noexcept {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void remove(std::uint64_t id) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    const auto it = leases_.find(id);
    if (it == leases_.end()) return;
    it->second->registered = false;
    leases_.erase(it);
  }

  void run() {
    std::unique_ptr<redis_conn> conn;
    std::vector<std::shared_ptr<entry>> due;
    std::vector<std::pair<const fleet_names*, std::string_view>> batch_args;
    // Leases per pipelined round trip: the whole batch shares one
    // redis_timeout, so it is kept to what a server answers well within one.
    constexpr std::size_t batch = 128;
    std::unique_lock<std::mutex> lk(mu_);
    while (!closing_) {
      if (leases_.empty()) {
        cv_.wait(lk, [&] { return closing_ || !leases_.empty(); });
        continue;
      }
      clock::time_point next = clock::time_point::max();
      for (const auto& [id, e] : leases_) next = std::min(next, e->due);
      const auto now = clock::now();
      if (now < next) {
        cv_.wait_until(lk, next);
        continue;
      }
      due.clear();
      for (const auto& [id, e] : leases_) {
        if (e->due <= now) {
          due.push_back(e);
          e->due = now + renew_every_;
        }
      }
      lk.unlock();
      // Every due lease in pipelined batches: one round trip per batch, not
      // per lease (at 20 ms RTT, 64 leases renewed one by one took longer
      // than a 1 s lease_ttl, and every lease was lost).
      for (std::size_t from = 0; from < due.size(); from += batch) {
        const std::size_t to = std::min(due.size(), from + batch);
        batch_args.clear();
        for (std::size_t i = from; i < to; ++i) {
          batch_args.emplace_back(&due[i]->names, due[i]->token);
        }
        std::vector<bool> ours(to - from, true);  // unknown on failure: not lost
        try {
          if (!conn) conn = pool_.open();
          ours = renew_all(*conn, batch_args, lease_ttl_, meta_ttl_);
        } catch (const redis_failure&) {
          errors_.fetch_add(1, std::memory_order_relaxed);
          conn.reset();
        }
        for (std::size_t i = from; i < to; ++i) {
          if (ours[i - from]) continue;
          // Counted only while the leader still waits on it: a renewal that
          // raced the leader's own release finds the lease gone legitimately.
          const std::lock_guard<std::mutex> relock(mu_);
          entry& e = *due[i];
          if (e.registered && !e.lost.exchange(true, std::memory_order_acq_rel)) {
            lost_.fetch_add(1, std::memory_order_relaxed);
          }
        }
      }
      due.clear();
      lk.lock();
    }
    lk.unlock();
    conn.reset();
  }

  const redis_pool& pool_;
  const std::chrono::milliseconds lease_ttl_;
  const std::chrono::milliseconds renew_every_;
  const std::chrono::milliseconds meta_ttl_;
  std::atomic<std::uint64_t>& errors_;
  std::atomic<std::uint64_t>& lost_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::shared_ptr<entry>> leases_;  // guarded by mu_
  std::uint64_t next_id_ = 0;                               // guarded by mu_
  bool closing_ = false;                                    // guarded by mu_
  std::thread thread_;
};

}  // namespace singleflight::detail
