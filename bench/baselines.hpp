// bench/baselines.hpp
//
// Hand-rolled request coalescers that singleflight::group is measured against.
// They are meant to be what a careful engineer would write in an afternoon:
// idiomatic, correct for the happy path, identity-checked on erase, and
// without any artificial slowness. They are NOT full replacements for the
// library (no deadlines, no close(), no self-deadlock detection, no
// ownership policies).
//
//   direct_call     (a) no coalescing: call fn.
//   future_group    (b) std::mutex + std::unordered_map<Key, std::shared_future<T>>.
//   cv_group        (c) std::mutex + std::unordered_map<Key, std::shared_ptr<call>>,
//                       one condition variable per call: the classic
//                       hand-rolled singleflight (a transliteration of Go's
//                       x/sync/singleflight). With CV = std::condition_variable_any
//                       it also accepts a std::stop_token per caller (followers
//                       leave when it fires; the flight keeps running, like
//                       singleflight::ownership::group).
//
// Every coalescer counts flights and joins (plain integers under its mutex,
// as the library does) so that benchmarks can check coalescing and wait for
// a burst to form.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <unordered_map>
#include <utility>

namespace sfbench {

struct counts {
  std::uint64_t calls = 0;
  std::uint64_t flights = 0;
  std::uint64_t joins = 0;
};

// (a) No coalescing at all: the cost floor.
template <class Key, class T>
class direct_call {
 public:
  template <class F>
  T do_(const Key&, F&& fn) {
    return std::forward<F>(fn)();
  }
};

// (b) A map of shared futures. The leader owns the promise; followers copy
// the shared_future out of the map and wait on it outside the lock.
template <class Key, class T, class Hash = std::hash<Key>>
class future_group {
 public:
  template <class F>
  T do_(const Key& key, F&& fn) {
    std::unique_lock<std::mutex> lk(mu_);
    ++n_.calls;
    if (auto it = map_.find(key); it != map_.end()) {
      std::shared_future<T> fut = it->second;
      ++n_.joins;
      lk.unlock();
      return fut.get();  // copies T; rethrows the leader's exception
    }
    std::promise<T> p;
    std::shared_future<T> fut = p.get_future().share();
    map_.emplace(key, fut);
    ++n_.flights;
    lk.unlock();

    try {
      p.set_value(std::forward<F>(fn)());
    } catch (...) {
      p.set_exception(std::current_exception());
    }

    lk.lock();
    // Identity-checked erase: only remove the entry if it is still ours.
    // (shared_future has no operator==; two ready futures share a state iff
    // get() yields the same object. Ours is ready; a foreign entry may not
    // be, and is never waited for here.)
    if (auto it = map_.find(key); it != map_.end() && same_state(it->second, fut)) map_.erase(it);
    lk.unlock();
    return fut.get();
  }

  counts stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_;
  }

 private:
  static bool same_state(const std::shared_future<T>& entry, const std::shared_future<T>& mine) {
    if (entry.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    try {
      return &entry.get() == &mine.get();
    } catch (...) {
      // Both hold an exception: compare the exception objects instead.
      std::exception_ptr a, b;
      try {
        (void)entry.get();
      } catch (...) {
        a = std::current_exception();
      }
      try {
        (void)mine.get();
      } catch (...) {
        b = std::current_exception();
      }
      return a == b;
    }
  }

  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_future<T>, Hash> map_;
  counts n_;
};

// (c) The classic: a shared call record with its own condition variable.
template <class Key, class T, class Hash = std::hash<Key>, class CV = std::condition_variable>
class cv_group {
  struct call {
    CV cv;
    bool done = false;
    std::optional<T> val;
    std::exception_ptr err;
  };

 public:
  template <class F>
  T do_(const Key& key, F&& fn) {
    return do_impl(key, std::forward<F>(fn), nullptr);
  }

  // Followers leave when `st` fires (std::condition_variable_any only).
  template <class F>
  requires std::same_as<CV, std::condition_variable_any> T do_(const Key& key, F&& fn,
                                                               std::stop_token st) {
    return do_impl(key, std::forward<F>(fn), &st);
  }

  counts stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_;
  }

 private:
  template <class F>
  T do_impl(const Key& key, F&& fn, std::stop_token* st) {
    std::unique_lock<std::mutex> lk(mu_);
    ++n_.calls;
    if (auto it = map_.find(key); it != map_.end()) {
      std::shared_ptr<call> c = it->second;
      ++n_.joins;
      if constexpr (std::same_as<CV, std::condition_variable_any>) {
        if (st != nullptr) {
          if (!c->cv.wait(lk, *st, [&] { return c->done; })) throw std::runtime_error("cancelled");
        } else {
          c->cv.wait(lk, [&] { return c->done; });
        }
      } else {
        (void)st;
        c->cv.wait(lk, [&] { return c->done; });
      }
      lk.unlock();  // val/err are immutable once done: copy outside the lock
      if (c->err) std::rethrow_exception(c->err);
      return *c->val;
    }
    auto c = std::make_shared<call>();
    map_.emplace(key, c);
    ++n_.flights;
    lk.unlock();

    try {
      c->val.emplace(std::forward<F>(fn)());
    } catch (...) {
      c->err = std::current_exception();
    }

    lk.lock();
    c->done = true;
    // Identity-checked erase (golang/go#31420): only remove our own entry.
    if (auto it = map_.find(key); it != map_.end() && it->second == c) map_.erase(it);
    lk.unlock();
    c->cv.notify_all();  // `c` keeps the call alive; waiters re-check `done` under mu_
    if (c->err) std::rethrow_exception(c->err);
    return *c->val;
  }

  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<call>, Hash> map_;
  counts n_;
};

}  // namespace sfbench
