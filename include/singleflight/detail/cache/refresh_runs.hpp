// singleflight/detail/cache/refresh_runs.hpp -- internal; do not include directly.
//
// refresh_runs<Key, KeyEqual>: which keys the cache's own threads are refreshing right now, and
// on which thread. A refresh on those threads is a flight whose body (a hand-off) returned
// long ago, so the group no longer knows the thread that runs its loader: a loader that then
// calls the cache for its own key would join its own flight and wait for itself forever. The
// blocking path asks here first (running_here) and throws std::logic_error instead, as the
// group does on the caller's thread. A fleet keeps one too, for the same reason: the flights of
// its async_get and co_get run on its workers after the group's fn handed them off (keyed by the
// key codec's text; KeyEqual is then std::equal_to<std::string>, library code).
//
// Each record lives on the stack of the thread running the refresh (scope), linked for as
// long as its loader runs. Locking: `mu_` guards the list; KeyEqual runs under it (as it runs
// under the table's locks). `count_` lets a thread that runs no refresh skip the lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

#include "../group/frames.hpp"

namespace singleflight::detail {

template <class Key, class KeyEqual>
class refresh_runs {
 public:
  struct record {
    std::thread::id thread = std::this_thread::get_id();
    std::uint64_t mixed = 0;
    const Key* key = nullptr;
    record* prev = nullptr;
    record* next = nullptr;
    bool linked = false;
  };

  // scope: `key` is being refreshed on this thread while the scope lives.
  class scope {
   public:
    scope(refresh_runs& runs, const Key& key, std::uint64_t mixed) : runs_(runs) {
      r_.key = &key;
      r_.mixed = mixed;
      const std::lock_guard<std::mutex> lk(runs_.mu_);
      runs_.list_.push(r_);
      // Relaxed: only this thread's own records matter to its running_here(), and a thread
      // sees its own writes in program order; other threads may read any value and then
      // find no record of theirs under the lock.
      runs_.count_.fetch_add(1, std::memory_order_relaxed);
    }
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;
    ~scope() {
      const std::lock_guard<std::mutex> lk(runs_.mu_);
      runs_.list_.erase(r_);
      runs_.count_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    refresh_runs& runs_;
    record r_;
  };

  // running_here(key, mixed, eq): whether this thread is running the refresh of `key` (a
  // loader calling back into the cache). Runs KeyEqual; throws what it throws.
  template <class P>
  bool running_here(const P& key, std::uint64_t mixed, const KeyEqual& eq) const {
    if (count_.load(std::memory_order_relaxed) == 0) return false;  // see scope
    const std::thread::id me = std::this_thread::get_id();
    const std::lock_guard<std::mutex> lk(mu_);
    for (const record* r = list_.head(); r != nullptr; r = r->next) {
      if (r->thread == me && r->mixed == mixed && eq(*r->key, key)) return true;
    }
    return false;
  }

 private:
  mutable std::mutex mu_;
  record_list<record> list_;  // mu_
  std::atomic<std::size_t> count_{0};
};

}  // namespace singleflight::detail
