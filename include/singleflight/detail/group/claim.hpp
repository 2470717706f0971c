// singleflight/detail/group/claim.hpp -- internal; do not include directly.
//
// The claim/leave exchange: one caller waiting for a flight (`waiter`), and
// the flight's intrusive list of them (`waiter_list`). Links and flags are
// guarded by the lock of the shard that holds the flight; `state` is the one
// field two threads race on without it.
#pragma once

#include <atomic>
#include <cstddef>

namespace singleflight::detail {

// waiter
//
// One caller waiting for a flight, linked into the flight's list: a blocked
// thread (blocking_waiter, in the caller's frame), a callback or a suspended
// coroutine (async_node). The list is intrusive, so a join allocates nothing.
//
// Who decides a wait: a settler *claiming* the waiter (under the shard's
// lock: it unlinks it, settles its accounting and notifies it after the lock
// is released), or the caller *leaving* on its own stop (without the lock;
// it then unlinks itself under the lock). Exactly one CAS from `waiting`
// wins. A claimed waiter has been accounted for by the settler and, unless it
// is an observer, no longer counts as a user of the group: it must not touch
// the group again. A leaving waiter still counts, and unlinks itself.
struct waiter {
  waiter* prev = nullptr;
  waiter* next = nullptr;
  waiter* signal_next = nullptr;  // the settler's batch, once claimed (async waiters)

  // Async waiters only: called once per claim, after the lock is released,
  // by the thread that claimed it (run a callback, resume a coroutine, or go
  // round again). May destroy the waiter.
  void (*notify)(waiter*) noexcept = nullptr;

  // Guarded by the shard's lock.
  bool linked = false;
  bool observer = false;  // waits for the flight's fn to return, not for its outcome
  bool async = false;     // an async_node (set once, at construction)

  // Memory ordering: seq_cst. acq_rel would order the winner's prior writes
  // (the settler's outcome and bookkeeping) for whoever reads the state after
  // it; seq_cst also makes "store `waiting`, then read the caller's stop
  // flag" (an async observer going round again) and "set the stop flag, then
  // CAS" (its stop callback) a Dekker pair: at least one side sees the other,
  // so a stop is never lost between two waits.
  enum : unsigned char { waiting, claimed, leaving };
  std::atomic<unsigned char> state{waiting};
  bool try_claim() noexcept { return transition(claimed); }
  bool try_leave() noexcept { return transition(leaving); }
  bool is_claimed() const noexcept { return state.load(std::memory_order_seq_cst) == claimed; }
  // Re-opens a waiter for another wait (an observer going round again).
  // Under the shard's lock, before reading the caller's stop flag.
  void rearm() noexcept { state.store(waiting, std::memory_order_seq_cst); }

 private:
  bool transition(unsigned char to) noexcept {
    unsigned char expected = waiting;
    return state.compare_exchange_strong(expected, to, std::memory_order_seq_cst,
                                         std::memory_order_seq_cst);
  }
};

// waiter_list: a flight's waiters in arrival order. Guarded by the shard's lock.
class waiter_list {
 public:
  void push(waiter& w) noexcept {
    w.prev = tail_;
    w.next = nullptr;
    if (tail_ != nullptr) {
      tail_->next = &w;
    } else {
      head_ = &w;
    }
    tail_ = &w;
    w.linked = true;
  }
  void erase(waiter& w) noexcept {
    (w.prev != nullptr ? w.prev->next : head_) = w.next;
    (w.next != nullptr ? w.next->prev : tail_) = w.prev;
    w.prev = w.next = nullptr;
    w.linked = false;
  }
  // Claims, oldest first, every waiter for which pred(w) holds and which is
  // not already leaving, under the lock: on_async(w) / on_blocked() do its
  // accounting and queue its notification. Returns how many were claimed.
  //
  // A blocked waiter runs off as soon as it sees itself claimed (it needs
  // nothing more from the settler), so everything done to it happens before
  // the CAS: it is unlinked first, and on_blocked() gets no reference to it.
  // If it turns out to be leaving, it finds itself unlinked (`linked`) when
  // it takes the lock. An async waiter waits to be notified, so it is
  // unlinked after the CAS; a leaving one stays linked and unlinks itself.
  template <class Pred, class OnAsync, class OnBlocked>
  std::size_t claim_if(Pred pred, OnAsync on_async, OnBlocked on_blocked) noexcept {
    std::size_t n = 0;
    for (waiter* w = head_; w != nullptr;) {
      waiter* next = w->next;
      if (pred(*w)) {
        if (w->async) {
          if (w->try_claim()) {
            erase(*w);
            on_async(*w);
            ++n;
          }
        } else {
          erase(*w);
          if (w->try_claim()) {
            on_blocked();
            ++n;
          }
        }
      }
      w = next;
    }
    return n;
  }
  // True when some waiter wants the outcome (not only observers).
  bool has_followers() const noexcept {
    for (const waiter* w = head_; w != nullptr; w = w->next) {
      if (!w->observer) return true;
    }
    return false;
  }
  bool empty() const noexcept { return head_ == nullptr; }

 private:
  waiter* head_ = nullptr;
  waiter* tail_ = nullptr;
};

}  // namespace singleflight::detail
