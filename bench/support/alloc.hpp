// bench/support/alloc.hpp: the benchmarks' counting allocator (replaced global operator
// new/delete).
//
// Owns: every form of the global allocation functions (plain, array, nothrow, aligned, sized
// delete), forwarding to malloc/aligned_alloc/free, and the counters they keep. No lock:
// per-thread counters are thread_local; the process-wide tallies are relaxed atomics.
//
//  * Always: this thread's allocation count and requested bytes (t_allocs, t_bytes), read
//    through `probe` to attribute allocations to individual calls (per call, per join).
//  * With SFBENCH_ALLOC_LIVE_AND_GLOBAL defined before the include (bench_group): also this
//    thread's live usable bytes (t_live: malloc_usable_size of what it allocated minus what it
//    freed, for the bytes-per-in-flight-call benchmark) and the process-wide tallies
//    g_allocs / g_alloc_bytes, which a benchmark may switch off with g_enabled (the
//    multi-threaded throughput benchmarks do, so that the counter's cache line does not bounce
//    between cores inside the timing). Without it (bench_async) an allocation costs only the
//    two thread-local additions, as it did before these counters moved here.
//
// ONE TRANSLATION UNIT PER EXECUTABLE: the replacement functions are ordinary definitions.
// Each benchmark is one .cpp; a second includer in the same executable fails to link with
// sfbench_alloc_hpp_is_included_by_more_than_one_translation_unit among the duplicates.
#pragma once

#include <malloc.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace sfbench::alloc {

#if defined(SFBENCH_ALLOC_LIVE_AND_GLOBAL)
inline constexpr bool live_and_global = true;
#else
inline constexpr bool live_and_global = false;
#endif

// Process-wide tallies (only with live_and_global). Relaxed: tallies, they order nothing.
inline std::atomic<std::uint64_t> g_allocs{0};
inline std::atomic<std::uint64_t> g_alloc_bytes{0};
inline std::atomic<bool> g_enabled{true};
// This thread's counters; constant-initialised, so touching them never allocates.
inline constinit thread_local std::uint64_t t_allocs = 0;
inline constinit thread_local std::uint64_t t_bytes = 0;
inline constinit thread_local std::int64_t t_live = 0;  // usable bytes allocated minus freed

inline void on_alloc(void* p, std::size_t n) noexcept {
  ++t_allocs;
  t_bytes += n;
  if constexpr (live_and_global) {
    t_live += static_cast<std::int64_t>(malloc_usable_size(p));
    if (g_enabled.load(std::memory_order_relaxed)) {
      g_allocs.fetch_add(1, std::memory_order_relaxed);
      g_alloc_bytes.fetch_add(n, std::memory_order_relaxed);
    }
  } else {
    (void)p;
  }
}
inline void on_free(void* p) noexcept {
  if constexpr (live_and_global) {
    if (p != nullptr) t_live -= static_cast<std::int64_t>(malloc_usable_size(p));
  } else {
    (void)p;
  }
}
inline void* allocate(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  on_alloc(p, n);
  return p;
}
inline void* allocate(std::size_t n, std::align_val_t al) {
  const auto a = static_cast<std::size_t>(al);
  const std::size_t rounded = ((n == 0 ? 1 : n) + a - 1) / a * a;
  void* p = std::aligned_alloc(a, rounded);
  if (p == nullptr) throw std::bad_alloc();
  on_alloc(p, n);
  return p;
}
inline void deallocate(void* p) noexcept {
  on_free(p);
  std::free(p);
}
template <class F>
void* no_throw(F f) noexcept {
  try {
    return f();
  } catch (...) {
    return nullptr;
  }
}

// Snapshot of this thread's counters; allocs() and bytes() are what it allocated since.
struct probe {
  std::uint64_t allocs0 = t_allocs;
  std::uint64_t bytes0 = t_bytes;
  std::uint64_t allocs() const noexcept { return t_allocs - allocs0; }
  std::uint64_t bytes() const noexcept { return t_bytes - bytes0; }
};

}  // namespace sfbench::alloc

// The link-time guard described above: defined once per includer.
extern "C" {
[[maybe_unused]] int sfbench_alloc_hpp_is_included_by_more_than_one_translation_unit = 0;
}

void* operator new(std::size_t n) { return sfbench::alloc::allocate(n); }
void* operator new[](std::size_t n) { return sfbench::alloc::allocate(n); }
void* operator new(std::size_t n, std::align_val_t al) { return sfbench::alloc::allocate(n, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return sfbench::alloc::allocate(n, al); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return sfbench::alloc::no_throw([n] { return sfbench::alloc::allocate(n); });
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return sfbench::alloc::no_throw([n] { return sfbench::alloc::allocate(n); });
}
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return sfbench::alloc::no_throw([n, al] { return sfbench::alloc::allocate(n, al); });
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return sfbench::alloc::no_throw([n, al] { return sfbench::alloc::allocate(n, al); });
}
void operator delete(void* p) noexcept { sfbench::alloc::deallocate(p); }
void operator delete[](void* p) noexcept { sfbench::alloc::deallocate(p); }
void operator delete(void* p, std::size_t) noexcept { sfbench::alloc::deallocate(p); }
void operator delete[](void* p, std::size_t) noexcept { sfbench::alloc::deallocate(p); }
void operator delete(void* p, std::align_val_t) noexcept { sfbench::alloc::deallocate(p); }
void operator delete[](void* p, std::align_val_t) noexcept { sfbench::alloc::deallocate(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  sfbench::alloc::deallocate(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  sfbench::alloc::deallocate(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { sfbench::alloc::deallocate(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { sfbench::alloc::deallocate(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  sfbench::alloc::deallocate(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  sfbench::alloc::deallocate(p);
}
