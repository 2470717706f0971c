// tests/support/sync.hpp: the test suite's synchronisation tools.
//
// Rules the tests follow:
//  * interleavings are forced with gates, latches and observable state
//    (stats(), in_flight()), never with sleeps;
//  * every wait is bounded, joins included (sftest::thread, finish()); a wait
//    that runs out aborts the test binary with the wait's name, so a hang
//    fails fast and says where (each TEST_CASE runs in its own process under
//    ctest);
//  * worker threads record into atomics or into result slots read after join;
//    Catch2 assertions run on the test's own thread only.
#pragma once

#include <algorithm>
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
#include "jthread.hpp"

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

// hang: reports the wait `name` that ran out after `limit` (the bound unless the wait set its
// own) and aborts the test binary.
[[noreturn]] inline void hang(const char* name, std::chrono::milliseconds limit = bound) {
  std::fprintf(stderr, "\nHANG: bounded wait '%s' ran out after %lld ms\n", name,
               static_cast<long long>(limit.count()));
  std::fflush(stderr);
  std::abort();
}

// Polls `pred` (yielding) until it holds; aborts with `name` past the bound.
template <class Pred>
void must(Pred pred, const char* name, std::chrono::milliseconds limit = bound) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) hang(name, limit);
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
sftest::jthread spawn(result<T>& r, F f) {
  return sftest::jthread([&r, f = std::move(f)]() mutable {
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
void finish(sftest::jthread& t, const result<T>& r, const char* name) {
  must([&] { return r.done.load(std::memory_order_acquire); }, name);
  t.join();
}

// thread: a thread whose join is bounded. Its body raises a flag as its last
// step; join(name) waits (bounded, by name) for the flag, then joins, which
// returns at once. A plain std::thread::join() is bounded only by ctest's
// timeout, and says nothing about where the test hung.
// Destroyed unjoined (a failed REQUIRE unwinding past it), it joins with the
// same bound, so a stuck body aborts with a name instead of hanging.
class thread {
 public:
  template <class F>
  explicit thread(F f)
      : t_([this, f = std::move(f)]() mutable {
          f();
          // Release: what the body wrote is visible to whoever saw the flag.
          done_.store(true, std::memory_order_release);
        }) {}
  thread(const thread&) = delete;  // not movable either: the body refers to done_
  thread& operator=(const thread&) = delete;
  ~thread() {
    if (t_.joinable()) join("sftest::thread destroyed before join()");
  }

  void join(const char* name) {
    must([&] { return done(); }, name);
    t_.join();
  }
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::thread::id get_id() const noexcept { return t_.get_id(); }

 private:
  std::atomic<bool> done_{false};  // declared before t_: set up before the body starts
  std::thread t_;
};

// race_sweep: where two sides of a race released together start, relative to
// each other, over many rounds. Released at the same moment, one side tends
// to win every round on a given machine (a settle always beats a stop that
// must first wake a thread, or the reverse under TSan), so the interleavings
// in between are never reached. The sweep delays one side by `offset` and
// moves the offset after each round towards the boundary between the two
// outcomes, where those interleavings are: the step doubles while the winner
// repeats and halves when it flips (wake-up latencies range from microseconds
// to milliseconds on a loaded machine).
//
// Not synchronisation: tests assert only what holds for every interleaving,
// and force each outcome they require by other means. The delays spin
// (yielding) rather than sleep: a sleep lasts tens of microseconds at least,
// far longer than the finest steps.
//
// Thread safety: hold_a() and hold_b() from the two sides, record() from the
// test's thread between rounds.
class race_sweep {
 public:
  // Side a's delay before it acts: the offset, when positive.
  void hold_a() const { spin(offset_ns_.load(std::memory_order_relaxed)); }
  // Side b's delay before it acts: minus the offset, when negative.
  void hold_b() const { spin(-offset_ns_.load(std::memory_order_relaxed)); }
  // After a round: which side's outcome happened. Moves the offset to give
  // the other side the next one.
  void record(bool a_won) {
    step_ns_ = a_won == last_a_won_ ? std::min<long long>(step_ns_ * 2, max_step_ns)
                                    : std::max<long long>(step_ns_ / 2, min_step_ns);
    last_a_won_ = a_won;
    offset_ns_.fetch_add(a_won ? step_ns_ : -step_ns_, std::memory_order_relaxed);
  }
  long long offset_ns() const { return offset_ns_.load(std::memory_order_relaxed); }

 private:
  static constexpr long long min_step_ns = 250;
  static constexpr long long max_step_ns = 1'000'000;
  static void spin(long long ns) {
    if (ns <= 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
    while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }
  // Relaxed: the rounds are ordered by the test's own synchronisation (the
  // release of both sides, and waiting for both to act); the offset only
  // tunes timing.
  std::atomic<long long> offset_ns_{0};
  long long step_ns_ = min_step_ns;
  bool last_a_won_ = true;
};

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
