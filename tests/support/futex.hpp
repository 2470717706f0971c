// tests/support/futex.hpp: which lock a thread is blocked on, as the kernel
// sees it (Linux only).
//
// A few schedules need "thread X is blocked on the group's mutex" as a step:
// a state the library does not expose, but one that holds still (a thread
// waiting for a mutex that another thread holds stays blocked until it is
// released). Linux shows the system call a thread is blocked in, with its
// arguments, in /proc/self/task/<tid>/syscall; a thread waiting for a mutex
// or a condition variable is in futex(2), whose first argument is the
// address of the word it waits on. Two threads blocked on one futex word
// wait for the same lock.
//
// Waiters blocked on one futex word are woken in the order they blocked
// (same priority: FIFO), one per unlock for a glibc mutex, so "A blocked
// before B" also says who gets the lock first once its holder releases it.
//
// Elsewhere (no /proc), futex_waits_visible() is false and the tests that
// need it say so and skip.
#pragma once

#include <cstdint>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#endif

namespace sftest {

#if defined(__linux__)

// The kernel's id of the calling thread.
inline long this_tid() { return static_cast<long>(::syscall(SYS_gettid)); }

// The futex word that thread `tid` of this process is blocked on right now,
// or 0 when it is not blocked in futex(2) (running, or blocked elsewhere).
inline std::uintptr_t futex_waited_on(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  std::string word;
  // "running" when the thread is on a CPU: the first read fails.
  if (!(in >> nr >> word) || nr != SYS_futex) return 0;
  return static_cast<std::uintptr_t>(std::stoull(word, nullptr, 16));
}

// Whether this machine shows blocked system calls at all (the calling
// thread's own file reads as a system call number).
inline bool futex_waits_visible() {
  std::ifstream in("/proc/self/task/" + std::to_string(this_tid()) + "/syscall");
  long nr = -2;
  return static_cast<bool>(in >> nr) && nr >= 0;
}

#else

inline long this_tid() { return 0; }
inline std::uintptr_t futex_waited_on(long) { return 0; }
inline bool futex_waits_visible() { return false; }

#endif

}  // namespace sftest
