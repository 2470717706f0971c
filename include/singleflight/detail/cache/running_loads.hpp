// singleflight/detail/cache/running_loads.hpp -- internal; do not include directly.
//
// running_loads<Clock>: the loads of one cache whose loader is running now (called and not yet
// returned, or an asynchronous one whose completion is not yet resolved), for the gauges of
// cache_stats: how many run (loads_running), how many of them still run after their stop was
// requested (loads_stuck: flight.timeout passed, or the cache closed, and the loader ignores
// its token), and how long the oldest has run (oldest_load_age), by the cache's Clock.
//
// Each load holds a ticket (in its registration, cache_loads.hpp): an entry linked from just
// before its loader is called until its outcome is published or its failure recorded. The
// entry is on the heap, so that the ticket can move with the registration into an
// asynchronous loader's completion.
//
// Locking: `mu_` guards the list; nothing runs under it but links, the entry's times and
// stop_token::stop_requested() (the library's own, an atomic read). No user code; entries (and
// their stop_tokens) are freed after it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "../../stop_token.hpp"
#include "../chrono.hpp"

namespace singleflight::detail {

template <class Clock>
class running_loads {
 public:
  using time_point = typename Clock::time_point;

  struct entry {
    time_point started;
    stop_token st;
    entry* prev = nullptr;
    entry* next = nullptr;
  };

  // ticket: one load's entry, linked while it lives (or until end()).
  class ticket {
   public:
    ticket() = default;
    ticket(running_loads* owner, std::unique_ptr<entry> e) noexcept
        : owner_(owner), e_(std::move(e)) {}
    ticket(ticket&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), e_(std::move(o.e_)) {}
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        end();
        owner_ = std::exchange(o.owner_, nullptr);
        e_ = std::move(o.e_);
      }
      return *this;
    }
    ticket(const ticket&) = delete;
    ticket& operator=(const ticket&) = delete;
    ~ticket() { end(); }

    // The load's loader is over: unlinked (then freed, after the lock). Idempotent.
    void end() noexcept {
      if (e_ == nullptr) return;
      owner_->unlink(*e_);
      e_.reset();
      owner_ = nullptr;
    }

   private:
    running_loads* owner_ = nullptr;
    std::unique_ptr<entry> e_;
  };

  // start(st): a load whose loader is about to be called with `st`, from now. Throws
  // std::bad_alloc (nothing linked).
  ticket start(const stop_token& st) {
    auto e = std::make_unique<entry>();
    e->started = Clock::now();
    e->st = st;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      e->prev = tail_;
      (tail_ != nullptr ? tail_->next : head_) = e.get();
      tail_ = e.get();
    }
    return ticket(this, std::move(e));
  }

  struct gauges {
    std::uint64_t running = 0;
    std::uint64_t stuck = 0;
    std::chrono::nanoseconds oldest{0};
  };

  // read(now): the gauges now (a snapshot under the lock).
  gauges read(time_point now) const {
    gauges g;
    const std::lock_guard<std::mutex> lk(mu_);
    for (const entry* e = head_; e != nullptr; e = e->next) {
      ++g.running;
      if (e->st.stop_requested()) ++g.stuck;
      if (now > e->started) {
        const auto age = std::chrono::duration_cast<std::chrono::nanoseconds>(now - e->started);
        if (age > g.oldest) g.oldest = age;
      }
    }
    return g;
  }

 private:
  void unlink(entry& e) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    (e.prev != nullptr ? e.prev->next : head_) = e.next;
    (e.next != nullptr ? e.next->prev : tail_) = e.prev;
    e.prev = e.next = nullptr;
  }

  mutable std::mutex mu_;
  entry* head_ = nullptr;
  entry* tail_ = nullptr;
};

}  // namespace singleflight::detail
