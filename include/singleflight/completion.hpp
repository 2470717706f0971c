// singleflight/completion.hpp
//
// `singleflight::completion<T>`: the handle an asynchronous fn uses to finish
// its flight. A group calls such an fn as
//
//   void fn(singleflight::stop_token st, singleflight::completion<T> done);
//
// The fn starts the work and returns at once; the work later calls
// `done.set_value(v)` or `done.set_exception(e)`, on any thread.
#pragma once

#include <cassert>
#include <exception>
#include <utility>

#include "detail/group/flight.hpp"

namespace singleflight {

namespace detail {
struct completion_access;
}

// completion
//
// Move-only; resolves its flight at most once. Until it is resolved the
// flight's fn counts as running: the key stays taken (no second fn starts
// for it), and close() waits for it.
//
// Thread safety: one completion must not be used from two threads at once;
// any single thread may resolve it, including fn itself before it returns.
// Resolving runs the waiting callbacks and resumes the waiting coroutines
// inline, on the resolving thread, after the group's lock is released.
//
// Destroyed (or assigned over) without being resolved, it fails the flight
// with broken_promise_error. If fn throws before returning, the flight fails
// with that exception instead, even when the completion died in the unwind.
// Resolving a flight that has already settled (cancelled, deadline, close)
// only frees the key; the value is discarded.
//
// Calling set_value or set_exception on an empty completion (moved from or
// already resolved) is undefined; it asserts in debug builds.
template <class T>
class completion {
 public:
  completion() noexcept = default;  // empty
  completion(completion&& o) noexcept
      : group_(std::exchange(o.group_, nullptr)),
        resolve_(std::exchange(o.resolve_, nullptr)),
        flight_(std::exchange(o.flight_, nullptr)) {}
  completion& operator=(completion&& o) noexcept {
    if (this != &o) {
      finish(detail::resolution::broken, nullptr);
      group_ = std::exchange(o.group_, nullptr);
      resolve_ = std::exchange(o.resolve_, nullptr);
      flight_ = std::exchange(o.flight_, nullptr);
    }
    return *this;
  }
  completion(const completion&) = delete;
  completion& operator=(const completion&) = delete;
  ~completion() { finish(detail::resolution::broken, nullptr); }

  // set_value(v): the flight's value. Every waiter receives its own copy of
  // `v`. If moving `v` into the flight throws, the flight fails with that
  // exception. Leaves *this empty.
  void set_value(T v) {
    assert(flight_ != nullptr && "singleflight::completion::set_value on an empty completion");
    try {
      // Only this completion writes the value, and waiters read it only
      // after the settle that the resolve below publishes.
      flight_->value.emplace(std::move(v));
    } catch (...) {
      finish(detail::resolution::error, std::current_exception());
      return;
    }
    finish(detail::resolution::value, nullptr);
  }

  // set_exception(e): the flight fails with `e` (the same exception object
  // for every waiter). A null `e` is undefined (asserts). Leaves *this empty.
  void set_exception(std::exception_ptr e) noexcept {
    assert(flight_ != nullptr && "singleflight::completion::set_exception on an empty completion");
    assert(e && "singleflight::completion::set_exception with a null exception_ptr");
    finish(detail::resolution::error, std::move(e));
  }

  // True while the completion holds an unresolved flight.
  explicit operator bool() const noexcept { return flight_ != nullptr; }

 private:
  friend struct detail::completion_access;
  using resolve_fn = void (*)(void*, detail::flight_value<T>*, detail::resolution,
                              std::exception_ptr) noexcept;

  // Adopts one reference to `f`; `group` stays alive while the completion is
  // unresolved (it counts as one of the group's users).
  completion(void* group, resolve_fn resolve, detail::flight_value<T>* f) noexcept
      : group_(group), resolve_(resolve), flight_(f) {}

  void finish(detail::resolution r, std::exception_ptr e) noexcept {
    detail::flight_value<T>* f = std::exchange(flight_, nullptr);
    if (f == nullptr) return;
    resolve_(group_, f, r, std::move(e));
    f->release();
  }

  void* group_ = nullptr;
  resolve_fn resolve_ = nullptr;
  detail::flight_value<T>* flight_ = nullptr;
};

namespace detail {
// The group's way to make a completion.
struct completion_access {
  template <class T, class R>
  static completion<T> make(void* group, R resolve, flight_value<T>* f) noexcept {
    return completion<T>(group, resolve, f);
  }
};
}  // namespace detail

}  // namespace singleflight
