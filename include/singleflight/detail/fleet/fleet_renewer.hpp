// singleflight/detail/fleet/fleet_renewer.hpp -- internal; do not include directly.
//
// detail::lease_renewer: keeps the leases of this process's leaders alive
// while their loaders run. One long-running job (run(), started by start() on the
// fleet's service threads, a worker_threads: detail/worker_threads.hpp) and one connection of
// its own to each Redis node it renews leases on (redis_router.hpp: one, unless the fleet talks
// to a Redis Cluster, where each lease goes to the owner of its key's slot; a MOVED reply
// moves the slot, and the lease is renewed there at the next turn); every
// `renew_every` it runs the token-checked renew script for each registered
// lease, all due leases pipelined in one round trip (batches of 128). A renewal that finds the
// lease gone (it expired while the process was paused, or Redis lost it) marks the lease lost: the
// leader goes on (the lease is an efficiency lease, not a lock) and its store is then fenced out if
// another leader took over meanwhile.
//
// The same thread retries the releases that failed on the caller's path
// (release_later): a race given up on (its reply lost: it may have taken, or
// may still take, a lease nobody holds) and a lease whose store failed. Each
// is retried every retry_every until it succeeds or lease_ttl has passed
// since it was handed over (the lease expires by then anyway): a server that
// stalls for a few hundred milliseconds must not leave a lease that makes
// other processes wait lease_ttl for nobody.
//
// Shutdown: stop() ends the job (the loop returns within one round trip) and waits for
// nothing; the fleet's close() then waits for it through the worker_threads that runs it (from
// outside: joined; from a library thread: not waited for, the destructor joins).
//
// Locking: `mu_` guards `leases_`, `releases_`, `closing_` and each entry's
// `registered` flag. Round trips happen without it. The job runs no user
// code.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../chrono.hpp"
#include "../functional.hpp"
#include "../worker_threads.hpp"
#include "fleet_protocol.hpp"
#include "redis_pool.hpp"
#include "redis_router.hpp"

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

  // A release to retry (release_later).
  struct pending_release {
    fleet_names names;
    std::string token;
    std::chrono::milliseconds tomb_ttl{};  // > 0: a race given up on (release()'s tombstone)
    std::string message;
    clock::time_point next;   // the next attempt, not before
    clock::time_point until;  // no attempt after: the lease has expired by then
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

  // Releases handed over and not yet done, at most: beyond, the oldest is
  // dropped (its lease expires). A stalled server makes each attempt cost a
  // timeout; the queue only has to outlast one stall.
  static constexpr std::size_t max_pending_releases = 4096;

  lease_renewer(redis_router& router, std::chrono::milliseconds lease_ttl,
                std::chrono::milliseconds renew_every, std::chrono::milliseconds meta_ttl,
                std::chrono::milliseconds retry_every, std::atomic<std::uint64_t>& errors,
                std::atomic<std::uint64_t>& lost, std::atomic<std::uint64_t>& publish_failures)
      : router_(router),
        lease_ttl_(lease_ttl),
        renew_every_(renew_every),
        meta_ttl_(meta_ttl),
        retry_every_(std::max(std::chrono::milliseconds(1), retry_every)),
        errors_(errors),
        lost_(lost),
        publish_failures_(publish_failures) {}

  lease_renewer(const lease_renewer&) = delete;
  lease_renewer& operator=(const lease_renewer&) = delete;
  // The job must have ended (stop(), and the worker_threads that ran it joined).
  ~lease_renewer() = default;

  // start(threads): runs the loop as one job on `threads` until stop(). Throws
  // std::system_error (no thread could be started) or closed_error (`threads` closed).
  void start(worker_threads& threads) {
    std::unique_ptr<worker_threads::job> j = worker_threads::make_job([this] { run(); });
    if (!threads.post(j)) throw closed_error();
  }

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

  // release_later(names, token, tomb_ttl, message): runs the release script
  // for this lease (with a tombstone for tomb_ttl when > 0) on this thread,
  // at once and then every retry_every while Redis fails, for lease_ttl at
  // most. For a caller whose own attempt failed or could not wait. After
  // close(), or when the copy cannot be made, does nothing (the lease
  // expires). Never throws.
  void release_later(const fleet_names& names, const std::string& token,
                     std::chrono::milliseconds tomb_ttl, std::string_view message) noexcept {
    try {
      pending_release r{
          names, token, tomb_ttl, std::string(message), clock::now(), clock::now() + lease_ttl_};
      const std::lock_guard<std::mutex> lk(mu_);
      if (closing_) return;
      if (releases_.size() >= max_pending_releases) releases_.pop_front();
      releases_.push_back(std::move(r));
      cv_.notify_all();
    } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch): the lease expires
    }
  }

  // Releases handed over and not yet done (tests).
  std::size_t pending_releases() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return releases_.size();
  }

  // stop(): ends the job after its current round trip, waiting for nothing; later add()
  // calls renew nothing and release_later() does nothing. Idempotent, thread-safe.
  void stop() noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
    cv_.notify_all();
  }

 private:
  void remove(std::uint64_t id) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    const auto it = leases_.find(id);
    if (it == leases_.end()) return;
    it->second->registered = false;
    leases_.erase(it);
  }

  // The job's connection to each node it has renewed or released on (one, off a cluster).
  using connections = std::vector<std::pair<redis_node*, std::unique_ptr<redis_conn>>>;

  static std::unique_ptr<redis_conn>& conn_to(connections& conns, redis_node* n) {
    for (auto& [node, c] : conns) {
      if (node == n) return c;
    }
    conns.emplace_back(n, nullptr);
    return conns.back().second;
  }

  // A redirect of a step on node `n`: a MOVED teaches the router the slot's owner (the next
  // attempt goes there); true when it was one (the failure is then not Redis failing).
  bool redirected(const redis_failure& f, const redis_node& n) noexcept {
    if (!f.redirected()) return false;
    try {
      const cluster_redirect r = cluster_redirect::parse(f.what());
      if (r.kind == cluster_redirect::moved) (void)router_.moved(r, n);
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: retried as it was
    }
    return true;
  }

  void run() {
    connections conns;
    std::vector<std::shared_ptr<entry>> due;
    std::vector<redis_node*> owner;  // owner[i]: the node of due[i]'s key
    std::vector<std::pair<const fleet_names*, std::string_view>> batch_args;
    // Leases per pipelined round trip: the whole batch shares one
    // redis_timeout, so it is kept to what a server answers well within one.
    constexpr std::size_t batch = 128;
    std::unique_lock<std::mutex> lk(mu_);
    while (!closing_) {
      if (leases_.empty() && releases_.empty()) {
        cv_.wait(lk, [&] { return closing_ || !leases_.empty() || !releases_.empty(); });
        continue;
      }
      clock::time_point next = clock::time_point::max();
      for (const auto& [id, e] : leases_) next = std::min(next, e->due);
      for (const auto& r : releases_) next = std::min(next, r.next);
      const auto now = clock::now();
      if (now < next) {
        cv_.wait_until(lk, next);
        continue;
      }
      if (std::any_of(releases_.begin(), releases_.end(),
                      [&](const pending_release& r) { return r.next <= now; })) {
        retry_releases(lk, conns);
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
      // By node (off a cluster: all on the seed, in the order they came).
      owner.clear();
      for (const auto& e : due) owner.push_back(&router_.route(e->names.value));
      if (router_.cluster()) {
        std::vector<std::size_t> order(due.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
          return std::less<redis_node*>()(owner[a], owner[b]);
        });
        std::vector<std::shared_ptr<entry>> sorted_due;
        std::vector<redis_node*> sorted_owner;
        for (const std::size_t i : order) {
          sorted_due.push_back(due[i]);
          sorted_owner.push_back(owner[i]);
        }
        due.swap(sorted_due);
        owner.swap(sorted_owner);
      }
      // Every due lease in pipelined batches: one round trip per batch, not
      // per lease (at 20 ms RTT, 64 leases renewed one by one took longer
      // than a 1 s lease_ttl, and every lease was lost); a batch goes to one node.
      for (std::size_t from = 0; from < due.size();) {
        std::size_t to = from;
        while (to < due.size() && to - from < batch && owner[to] == owner[from]) ++to;
        batch_args.clear();
        for (std::size_t i = from; i < to; ++i) {
          batch_args.emplace_back(&due[i]->names, due[i]->token);
        }
        redis_node* node = owner[from];
        std::unique_ptr<redis_conn>& conn = conn_to(conns, node);
        std::vector<bool> ours(to - from, true);  // unknown on failure: not lost
        try {
          if (!conn) conn = node->pool.open();
          ours = renew_all(*conn, batch_args, lease_ttl_, meta_ttl_);
        } catch (const redis_failure& f) {
          if (!redirected(f, *node)) {
            errors_.fetch_add(1, std::memory_order_relaxed);
            conn.reset();
          }
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
        from = to;
      }
      due.clear();
      lk.lock();
    }
    lk.unlock();
    conns.clear();
  }

  // retry_releases(lk, conn): with `lk` held on entry and on return, one
  // attempt at each due release until one fails (Redis is down: the others
  // would each wait a timeout too); then every release is due again
  // retry_every from now at the soonest. Releases past their `until` are
  // dropped.
  void retry_releases(std::unique_lock<std::mutex>& lk, connections& conns) {
    for (;;) {
      const auto now = clock::now();
      releases_.erase(std::remove_if(releases_.begin(), releases_.end(),
                                     [&](const pending_release& r) { return r.until <= now; }),
                      releases_.end());
      const auto it = std::find_if(releases_.begin(), releases_.end(),
                                   [&](const pending_release& r) { return r.next <= now; });
      if (closing_ || it == releases_.end()) return;
      pending_release r = std::move(*it);
      releases_.erase(it);
      lk.unlock();
      bool done = false;
      redis_node* node = &router_.route(r.names.value);
      std::unique_ptr<redis_conn>& conn = conn_to(conns, node);
      try {
        if (!conn) conn = node->pool.open();
        bool published = true;
        if (release(*conn, r.names, r.token, r.tomb_ttl, r.message, published, router_.cluster()) ==
                release_result::released &&
            !published) {
          publish_failures_.fetch_add(1, std::memory_order_relaxed);
        }
        done = true;
      } catch (const redis_failure& f) {
        if (!redirected(f, *node)) conn.reset();  // the next attempt opens a new one
      } catch (const std::bad_alloc&) {           // NOLINT(bugprone-empty-catch): retried
      }
      lk.lock();
      if (done) continue;
      const auto later = clock::now() + retry_every_;
      r.next = later;
      for (auto& other : releases_) other.next = std::max(other.next, later);
      try {
        releases_.push_back(std::move(r));
      } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch): the lease expires
      }
      return;
    }
  }

  redis_router& router_;
  const std::chrono::milliseconds lease_ttl_;
  const std::chrono::milliseconds renew_every_;
  const std::chrono::milliseconds meta_ttl_;
  const std::chrono::milliseconds retry_every_;
  std::atomic<std::uint64_t>& errors_;
  std::atomic<std::uint64_t>& lost_;
  std::atomic<std::uint64_t>& publish_failures_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::shared_ptr<entry>> leases_;  // guarded by mu_
  std::deque<pending_release> releases_;                    // guarded by mu_, by `next`
  std::uint64_t next_id_ = 0;                               // guarded by mu_
  bool closing_ = false;                                    // guarded by mu_
};

}  // namespace singleflight::detail
