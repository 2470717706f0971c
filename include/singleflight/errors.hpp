// singleflight/errors.hpp
//
// The exceptions the library throws on its own behalf. Every one derives from
// `singleflight::error`, itself a `std::runtime_error`, so a caller can catch
// "anything the group decided" in one clause and still let exceptions thrown
// by the user's `fn` (which are rethrown untouched, of any type) pass by.
#pragma once

#include <stdexcept>
#include <string>

#include "detail/config.hpp"

// SINGLEFLIGHT_EXCEPTION_VISIBLE: default symbol visibility for the library's exception types,
// so that one thrown in a shared object built with -fvisibility=hidden is caught by its type in
// another module. libc++abi matches a catch clause by the address of the type_info, and each
// hidden-visibility module would have its own (libstdc++ compares the names, which hides the
// problem there); with default visibility the dynamic linker keeps one.
#if defined(__GNUC__) || defined(__clang__)
#define SINGLEFLIGHT_EXCEPTION_VISIBLE __attribute__((visibility("default")))
#else
#define SINGLEFLIGHT_EXCEPTION_VISIBLE
#endif

namespace singleflight {

// error
//
// Base of the library's own errors. Never thrown directly.
class SINGLEFLIGHT_EXCEPTION_VISIBLE error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;

  // what(): the message. The library's own errors carry a string literal, so
  // throwing one allocates nothing beyond the exception object itself (a
  // caller leaving on its stop_token stays allocation-free).
  SINGLEFLIGHT_DECL const char* what() const noexcept override;

  // Copy and destruction, here and in each class below: declared, and defined in
  // impl/errors.ipp, so that in compiled mode (detail/config.hpp) each class has a key function
  // (here what(), below the destructor) and its vtable and type_info are emitted once. A copy
  // shares the message (std::runtime_error's copy); a move is a copy. Thread-compatible, like any
  // exception.
  SINGLEFLIGHT_DECL error(const error&) noexcept;
  error& operator=(const error&) = default;
  SINGLEFLIGHT_DECL ~error() override;

 protected:
  struct literal_tag {};
  // An empty runtime_error message shares libstdc++'s empty representation.
  SINGLEFLIGHT_DECL error(literal_tag, const char* literal);

 private:
  const char* literal_ = nullptr;
};

// cancelled_error
//
// Thrown to a caller whose own `stop_token` fired before it received an
// outcome, to every waiter of a flight that the `ownership::leader` policy
// cancelled, and to a caller whose token was already stopped on entry (that
// caller starts and joins nothing).
class SINGLEFLIGHT_EXCEPTION_VISIBLE cancelled_error : public error {
 public:
  SINGLEFLIGHT_DECL cancelled_error();
  using error::error;
  SINGLEFLIGHT_DECL cancelled_error(const cancelled_error&) noexcept;
  cancelled_error& operator=(const cancelled_error&) = default;
  SINGLEFLIGHT_DECL ~cancelled_error() override;
};

// closed_error
//
// Thrown to every caller that arrives after `group::close()` began, and to
// every waiter of a flight that `close()` stopped.
class SINGLEFLIGHT_EXCEPTION_VISIBLE closed_error : public error {
 public:
  SINGLEFLIGHT_DECL closed_error();
  using error::error;
  SINGLEFLIGHT_DECL closed_error(const closed_error&) noexcept;
  closed_error& operator=(const closed_error&) = default;
  SINGLEFLIGHT_DECL ~closed_error() override;
};

// timeout_error
//
// Thrown to every waiter of a flight whose deadline (`options::timeout`)
// passed before it settled, and to a newcomer whose wait for a winding-down
// predecessor outlasted the same bound.
class SINGLEFLIGHT_EXCEPTION_VISIBLE timeout_error : public error {
 public:
  SINGLEFLIGHT_DECL timeout_error();
  using error::error;
  SINGLEFLIGHT_DECL timeout_error(const timeout_error&) noexcept;
  timeout_error& operator=(const timeout_error&) = default;
  SINGLEFLIGHT_DECL ~timeout_error() override;
};

// overloaded_error
//
// Thrown to a caller that would have started a flight while
// `options::max_in_flight` flights were already in the map. Joining an
// existing flight is never rejected.
class SINGLEFLIGHT_EXCEPTION_VISIBLE overloaded_error : public error {
 public:
  SINGLEFLIGHT_DECL overloaded_error();
  using error::error;
  SINGLEFLIGHT_DECL overloaded_error(const overloaded_error&) noexcept;
  overloaded_error& operator=(const overloaded_error&) = default;
  SINGLEFLIGHT_DECL ~overloaded_error() override;
};

// broken_promise_error
//
// Thrown to every waiter of a flight whose asynchronous fn let its
// `completion<T>` be destroyed without resolving it (set_value or
// set_exception): the work can no longer finish, so the flight fails rather
// than stranding its waiters.
class SINGLEFLIGHT_EXCEPTION_VISIBLE broken_promise_error : public error {
 public:
  SINGLEFLIGHT_DECL broken_promise_error();
  using error::error;
  SINGLEFLIGHT_DECL broken_promise_error(const broken_promise_error&) noexcept;
  broken_promise_error& operator=(const broken_promise_error&) = default;
  SINGLEFLIGHT_DECL ~broken_promise_error() override;
};

// abandoned_error
//
// Thrown to every other waiter of a flight whose fn ended its thread before
// returning (pthread_exit, or pthread_cancel at a cancellation point: a
// forced unwind). The group fails the flight, frees the key, and lets the
// unwind continue on the thread that ran fn.
class SINGLEFLIGHT_EXCEPTION_VISIBLE abandoned_error : public error {
 public:
  SINGLEFLIGHT_DECL abandoned_error();
  using error::error;
  SINGLEFLIGHT_DECL abandoned_error(const abandoned_error&) noexcept;
  abandoned_error& operator=(const abandoned_error&) = default;
  SINGLEFLIGHT_DECL ~abandoned_error() override;
};

}  // namespace singleflight

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/errors.ipp"
#endif
