// singleflight/detail/fleet/queued_flights.hpp -- internal; do not include directly.
//
// queued_flights: the async flights of a fleet whose body is posted to its workers and has not
// started yet, by key text, so that a fleet worker blocked in get() on such a flight runs it
// itself. The workers are bounded (max_async_threads): when every one of them runs a loader
// that waits, blocking, for a key whose async flight is queued behind them, no worker is left
// to start it and they would all wait forever (one worker suffices: its loader waits for a
// flight queued after its own). A bounded pool must not wait for a thread of its own.
//
// Each flight's body is one slot, run exactly once: by the worker its post() reaches, or
// earlier by a fleet worker that waits for that key (take, then run, in help_until); whoever
// comes second finds it taken and does nothing. Only slots of the awaited key are run by a
// waiter (running another key's flight there could make that flight wait for one below it on
// the same stack).
//
// Locking: `mu_` guards the list and the waiters' `ready` flags; `cv_` wakes the waiters when
// a slot is added or a waiter's outcome is ready. No job runs, and no T is moved, under `mu_`.
#pragma once

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "../worker_threads.hpp"

namespace singleflight::detail {

class queued_flights {
 public:
  // One flight's body; `taken` once a thread has claimed it.
  struct slot {
    explicit slot(std::string t, std::unique_ptr<worker_threads::job> j)
        : text(std::move(t)), body(std::move(j)) {}
    const std::string text;
    std::unique_ptr<worker_threads::job> body;
    bool taken = false;  // queued_flights::mu_
  };

  // add(s): `s` may be run by a waiter from here on (until it is taken). Throws
  // std::bad_alloc.
  void add(const std::shared_ptr<slot>& s) {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      list_.push_back(s);
    }
    cv_.notify_all();
  }

  // run(s): runs s's body unless a waiter took it first (the worker's job).
  void run(const std::shared_ptr<slot>& s) {
    if (take(s)) s->body->run();
  }

  // drop(s): s was never posted (the workers refused it): it leaves the list unrun, its body
  // destroyed by the caller's last reference.
  void drop(const std::shared_ptr<slot>& s) { (void)take(s); }

  // help_until(text, ready): waits until `ready` (set by done()), running meanwhile, on this
  // thread, every queued slot of `text` (their bodies settle flights this waiter may have
  // joined). Called on a fleet worker only.
  void help_until(const std::string& text, const bool& ready) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (ready) return;
      std::shared_ptr<slot> s = take_locked(text);
      if (s) {
        lk.unlock();
        s->body->run();
        s.reset();  // its body (the loader, the completion) dies off the lock
        lk.lock();
        continue;
      }
      cv_.wait(lk);
    }
  }

  // done(ready): sets a waiter's `ready` and wakes it. The waiter may return (and its frame
  // die) as soon as `ready` is set: nothing of it is touched afterwards.
  void done(bool& ready) {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      ready = true;
    }
    cv_.notify_all();
  }

 private:
  bool take(const std::shared_ptr<slot>& s) {
    const std::lock_guard<std::mutex> lk(mu_);
    if (s->taken) return false;
    s->taken = true;
    list_.remove(s);
    return true;
  }

  std::shared_ptr<slot> take_locked(const std::string& text) {
    for (auto it = list_.begin(); it != list_.end(); ++it) {
      if ((*it)->text == text) {
        std::shared_ptr<slot> s = std::move(*it);
        list_.erase(it);
        s->taken = true;
        return s;
      }
    }
    return nullptr;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<std::shared_ptr<slot>> list_;  // mu_: the slots not taken yet
};

}  // namespace singleflight::detail
