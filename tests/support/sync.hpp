// tests/support/sync.hpp: the test suite's synchronisation tools.
//
// Rules the tests follow:
//  * interleavings are forced with gates, latches and observable state
//    (stats(), in_flight()), never with sleeps;
//  * every wait is bounded; a wait that runs out aborts the test binary with
//    the wait's name, so a hang fails fast and says where (each TEST_CASE runs
//    in its own process under ctest);
//  * worker threads record into atomics or into result slots read after join;
//    Catch2 assertions run on the test's own thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <singleflight/options.hpp>

namespace sftest {

using namespace std::chrono_literals;

// Options for a group whose flight numbers (call_info::flight) count 1, 2,
// 3, ... in the order flights start: one shard. With several shards the
// numbers are unique and increase for each key, but interleave across
// shards; tests that pin exact numbers of a single key use this (the key
// lives in one shard either way, so nothing else changes).
inline singleflight::options numbered(singleflight::options o = {}) {
  o.shards = 1;
  return o;
}

// How long any single wait in a test may take before it counts as a hang.
// Generous, because sanitizer builds on two cores are slow; a correct run
// never gets near it.
inline constexpr std::chrono::milliseconds bound = 20s;

[[noreturn]] inline void hang(const char* name) {
  std::fprintf(stderr, "\nHANG: bounded wait '%s' ran out after %lld ms\n", name,
               static_cast<long long>(bound.count()));
  std::fflush(stderr);
  std::abort();
}

// Polls `pred` (yielding) until it holds; aborts with `name` past the bound.
template <class Pred>
void must(Pred pred, const char* name, std::chrono::milliseconds limit = bound) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) hang(name);
    std::this_thread::yield();
  }
}

// Polls `pred` for up to `limit`; returns whether it came to hold. For the
// rare assertion that something does NOT happen within a short window.
template <class Pred>
bool becomes(Pred pred, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// gate: a one-shot event. wait() blocks until open() (bounded, by name).
class gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lk(m_);
    open_ = true;
    cv_.notify_all();
  }
  bool is_open() const {
    std::lock_guard<std::mutex> lk(m_);
    return open_;
  }
  void wait(const char* name = "gate") const {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, bound, [&] { return open_; })) hang(name);
  }

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

// result<T>: what one worker's call ended with.
template <class T>
struct result {
  std::optional<T> value;
  std::exception_ptr error;
  std::atomic<bool> done{false};

  template <class E>
  bool threw() const {
    if (!error) return false;
    try {
      std::rethrow_exception(error);
    } catch (const E&) {
      return true;
    } catch (...) {
      return false;
    }
  }
};

// Runs `f` on a new thread, recording its value or exception in `r`.
template <class T, class F>
std::jthread spawn(result<T>& r, F f) {
  return std::jthread([&r, f = std::move(f)]() mutable {
    try {
      r.value.emplace(f());
    } catch (...) {
      r.error = std::current_exception();
    }
    r.done.store(true, std::memory_order_release);
  });
}

// Waits (bounded, by name) for a spawned call to finish, then joins it.
template <class T>
void finish(std::jthread& t, const result<T>& r, const char* name) {
  must([&] { return r.done.load(std::memory_order_acquire); }, name);
  t.join();
}

// counted: a value type that counts its copies and moves (the copy contract).
struct counted {
  static inline std::atomic<int> copies{0};
  static inline std::atomic<int> moves{0};
  int v = 0;
  counted() = default;
  explicit counted(int x) : v(x) {}
  counted(const counted& o) : v(o.v) { copies.fetch_add(1); }
  counted(counted&& o) noexcept : v(o.v) { moves.fetch_add(1); }
  counted& operator=(const counted& o) {
    v = o.v;
    copies.fetch_add(1);
    return *this;
  }
  counted& operator=(counted&& o) noexcept {
    v = o.v;
    moves.fetch_add(1);
    return *this;
  }
  static void reset() {
    copies = 0;
    moves = 0;
  }
};

}  // namespace sftest
