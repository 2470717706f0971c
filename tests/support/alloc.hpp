// tests/support/alloc.hpp: the test suite's replaced global operator new/delete, with
// allocation counting and fault injection.
//
// Owns: every form of the global allocation functions (plain, array, nothrow, aligned, sized
// delete), forwarding to malloc/aligned_alloc/free so that AddressSanitizer sees one consistent
// allocator, and the thread_local state that steers them. No lock: the state a thread steers
// is its own (thread_local); the only shared counter is an atomic.
//
//  * Counting: while a thread's `counting` flag is set, each allocation it makes adds one to
//    its own `thread_allocations` and to the process-wide `allocations`.
//    allocations_during(f) runs f on this thread and returns the allocations it made;
//    bytes_during(f) the bytes they asked for.
//  * Fail at N: arm(n) makes the n-th allocation (1-based) of the current thread after arming
//    throw std::bad_alloc (nothrow forms return nullptr); then the thread is disarmed (the
//    unwinding may allocate again). Other threads are never affected. `hit` says whether the
//    n-th allocation was reached; `pause` suspends arming in a scope (a user's fn, whose own
//    allocations are not the library's allocation points).
//
// ThreadSanitizer's runtime defines operator new itself: under TSan nothing is replaced,
// `sftest::alloc::replaced` is false, and the tests that need the replacement say that they
// were skipped.
//
// ONE TRANSLATION UNIT PER EXECUTABLE. The replacement functions are ordinary (non-inline)
// definitions, as the language requires: include this header from exactly one .cpp of a test
// executable (its test file). A second includer in the same executable fails to link, and the
// symbol named in that error is sftest_alloc_hpp_is_included_by_more_than_one_translation_unit
// (defined below for exactly this message).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_THREAD__)
#define SFTEST_ALLOC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SFTEST_ALLOC_TSAN 1
#endif
#endif

namespace sftest::alloc {

// Whether this build replaces operator new (false under ThreadSanitizer).
#if defined(SFTEST_ALLOC_TSAN)
inline constexpr bool replaced = false;
#else
inline constexpr bool replaced = true;
#endif

// ---- counting ---------------------------------------------------------------------------
// All thread_local state is constant-initialised: touching it never allocates.

inline thread_local bool counting = false;         // this thread counts its allocations
inline thread_local long thread_allocations = 0;   // this thread's, while counting
inline thread_local std::size_t thread_bytes = 0;  // the bytes those allocations asked for
// Every thread's, while counting. Relaxed: a tally read after the counting threads were joined
// or after the counted call returned on the reading thread; it orders nothing.
inline std::atomic<long> allocations{0};

// Runs call() on this thread with counting on; returns the allocations this thread made in it.
template <class F>
long allocations_during(F&& call) {
  const long before = thread_allocations;
  counting = true;
  static_cast<F&&>(call)();
  counting = false;
  return thread_allocations - before;
}

// Runs call() on this thread with counting on; returns the bytes its allocations asked for.
template <class F>
std::size_t bytes_during(F&& call) {
  const std::size_t before = thread_bytes;
  counting = true;
  static_cast<F&&>(call)();
  counting = false;
  return thread_bytes - before;
}

// ---- fail at N ----------------------------------------------------------------------------

inline thread_local bool armed = false;
inline thread_local long fail_at = 0;  // the allocation number (1-based) that throws
inline thread_local long count = 0;    // allocations since arm()
inline thread_local bool hit = false;  // the fail_at-th allocation happened (and failed)

// The n-th allocation of this thread from now on fails.
inline void arm(long n) noexcept {
  count = 0;
  hit = false;
  fail_at = n;
  armed = true;
}
inline void disarm() noexcept { armed = false; }

// Suspends arming in a scope (restores it on exit).
struct pause {
  bool was = armed;
  pause() noexcept { armed = false; }
  ~pause() { armed = was; }
  pause(const pause&) = delete;
  pause& operator=(const pause&) = delete;
};

namespace detail {

// Called by every operator new before it allocates `n` bytes: counts, and says whether to fail.
inline bool on_allocation(std::size_t n) noexcept {
  if (counting) {
    ++thread_allocations;
    thread_bytes += n;
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (!armed) return false;
  if (++count != fail_at) return false;
  hit = true;
  armed = false;  // only the n-th: unwinding may allocate again
  return true;
}

}  // namespace detail
}  // namespace sftest::alloc

#if !defined(SFTEST_ALLOC_TSAN)

// The link-time guard described above: defined once per includer.
extern "C" {
[[maybe_unused]] int sftest_alloc_hpp_is_included_by_more_than_one_translation_unit = 0;
}

namespace sftest::alloc::detail {
// noinline: keeps every allocation an observable call (the counts are what the tests assert).
[[gnu::noinline]] inline void* allocate(std::size_t n) {
  if (on_allocation(n)) throw std::bad_alloc();
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
[[gnu::noinline]] inline void* allocate_aligned(std::size_t n, std::align_val_t al) {
  if (on_allocation(n)) throw std::bad_alloc();
  auto a = static_cast<std::size_t>(al);
  if (a < sizeof(void*)) a = sizeof(void*);
  const std::size_t size = ((n == 0 ? 1 : n) + a - 1) / a * a;  // aligned_alloc's rule
  void* p = std::aligned_alloc(a, size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
template <class F>
void* no_throw(F f) noexcept {
  try {
    return f();
  } catch (...) {
    return nullptr;
  }
}
}  // namespace sftest::alloc::detail

[[gnu::noinline]] void* operator new(std::size_t n) { return sftest::alloc::detail::allocate(n); }
[[gnu::noinline]] void* operator new[](std::size_t n) { return sftest::alloc::detail::allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return sftest::alloc::detail::no_throw([n] { return sftest::alloc::detail::allocate(n); });
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return sftest::alloc::detail::no_throw([n] { return sftest::alloc::detail::allocate(n); });
}
void* operator new(std::size_t n, std::align_val_t a) {
  return sftest::alloc::detail::allocate_aligned(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return sftest::alloc::detail::allocate_aligned(n, a);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return sftest::alloc::detail::no_throw(
      [n, a] { return sftest::alloc::detail::allocate_aligned(n, a); });
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return sftest::alloc::detail::no_throw(
      [n, a] { return sftest::alloc::detail::allocate_aligned(n, a); });
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

#endif  // !SFTEST_ALLOC_TSAN
