// singleflight/detail/cache/read_gate.hpp -- internal; do not include directly.
//
// read_gate: lets singleflight::cache's hit path read a shard without taking
// its mutex and without writing any cache line another thread writes.
//
// It is a "big reader" lock split by shard and by stripe. Each stripe (about
// one per hardware thread; a thread keeps its stripe for life) owns a row of
// per-shard reader counters on its own cache lines. A reader of shard s
//   * increments its stripe's counter for s, then reads s's `closed` flag;
//   * if the flag is clear, reads the shard (plain reads: no writer can be
//     inside) and finally decrements its counter;
//   * if the flag is set, decrements at once and falls back to the mutex.
// A writer of shard s, holding s's mutex,
//   * sets s's flag, then waits until every stripe's counter for s is 0;
//   * writes; then clears the flag.
// Memory ordering: the reader's increment and flag load and the writer's flag
// store and counter loads are seq_cst: of a reader's increment and a writer's
// flag store, whichever comes second in the single total order sees the other
// (a Dekker handshake), so either the reader backs off or the writer waits for
// it. The reader's decrement is a release and the writer's loads acquire, so
// everything the reader read happens before what the writer then writes; the
// writer's clearing store is a release and the reader's flag load an acquire,
// so a reader that finds the flag clear sees every earlier write.
//
// Each counter also counts, in its upper 32 bits, the read sections that
// ended in a hit: leaving with a hit is one atomic add (-1 + 2^32) that does
// both, so a hit costs three atomic operations on the thread's own line, not
// four. A half-full upper part is moved to a 64-bit per-stripe total.
//
// Writers never wait for readers of other shards, and readers arriving while
// a writer waits back off at once, so a writer waits at most for the readers
// already inside s (a few hundred nanoseconds each). Readers never block.
//
// Thread safety: try_enter/leave from any thread; lock_out/let_in only with
// the shard's mutex held (one writer per shard at a time). A read section
// must not be entered again on the same thread for the same shard (user code
// never runs inside one, except KeyEqual, which must not re-enter the cache).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>

#include "../config.hpp"

namespace singleflight::detail {

// A small per-thread number, assigned round-robin on first use, used to pick
// a stripe. Only a hint: two threads on one stripe are correct, just slower.
// constinit, so that reading it is a plain thread-local load (no guard). (As an
// inline function's static it is per shared object where symbols are hidden;
// that only changes which stripes threads pick.)
inline std::size_t this_thread_ordinal() noexcept {
  static std::atomic<std::size_t> next{0};
  constinit thread_local std::size_t mine = 0;
  if (mine == 0) mine = next.fetch_add(1, std::memory_order_relaxed) + 1;
  return mine;
}

class read_gate {
 public:
  // read_gate(shards, stripes): `stripes` must be a power of two.
  SINGLEFLIGHT_DECL read_gate(std::size_t shards, std::size_t stripes);

  read_gate(const read_gate&) = delete;
  read_gate& operator=(const read_gate&) = delete;
  SINGLEFLIGHT_DECL ~read_gate();

  std::size_t stripes() const noexcept { return stripes_; }

  // The calling thread's stripe.
  std::size_t my_stripe() const noexcept { return this_thread_ordinal() & (stripes_ - 1); }

  // try_enter(shard, stripe): true when the caller may read `shard` until it
  // calls leave(shard, stripe); false when a writer is active (the caller is
  // then not inside and should take the shard's mutex instead).
  bool try_enter(std::size_t shard, std::size_t stripe) noexcept {
    counter& c = at(stripe, shard);
    c.fetch_add(1, std::memory_order_seq_cst);
    if (!flags_[shard].closed.load(std::memory_order_seq_cst)) return true;
    c.fetch_sub(1, std::memory_order_release);
    return false;
  }

  // leave(shard, stripe, hit): ends the read section; `hit` (0 or 1) is
  // added to the section count of hits.
  void leave(std::size_t shard, std::size_t stripe, std::uint64_t hit = 0) noexcept {
    counter& c = at(stripe, shard);
    const std::uint64_t old = c.fetch_add((hit << 32U) - 1, std::memory_order_release);
    if ((old >> 32U) >= (std::uint64_t{1} << 31U)) spill(c, stripe);
  }

  // hits(): hits counted by leave(), over every stripe and shard.
  SINGLEFLIGHT_DECL std::uint64_t hits() const noexcept;

  // hits_of(shard): the hits counted by leave() for one shard, over every
  // stripe (relaxed: a count). Runs back by 2^31 when a stripe's counter of
  // the shard spills its hits to the stripe's total (spill()).
  SINGLEFLIGHT_DECL std::uint64_t hits_of(std::size_t shard) const noexcept;

  // lock_out(shard): with the shard's mutex held, makes new readers back off
  // and waits for those inside to leave.
  SINGLEFLIGHT_DECL void lock_out(std::size_t shard) noexcept;

  // let_in(shard): readers may enter again; publishes the writer's changes.
  void let_in(std::size_t shard) noexcept {
    flags_[shard].closed.store(false, std::memory_order_release);
  }

 private:
  using counter = std::atomic<std::uint64_t>;  // readers inside (low 32) | hits (high 32)
  static constexpr std::uint64_t readers_mask = 0xffffffffULL;
  static constexpr std::size_t line = 64;
  static constexpr std::size_t per_line = line / sizeof(counter);
  struct alignas(line) counter_line {
    counter c[per_line] = {};
  };
  struct alignas(line) flag {
    std::atomic<bool> closed{false};
  };
  struct alignas(line) total {
    std::atomic<std::uint64_t> n{0};
  };
  static constexpr std::size_t round_up(std::size_t n, std::size_t m) noexcept {
    return (n + m - 1) / m * m;
  }
  counter& at(std::size_t stripe, std::size_t shard) const noexcept {
    const std::size_t i = stripe * row_ + shard;
    return counters_[i / per_line].c[i % per_line];
  }
  // Moves the hits of `c` to the stripe's total (exactly what was read, with
  // a CAS, so that concurrent spills never subtract twice).
  SINGLEFLIGHT_DECL void spill(counter& c, std::size_t stripe) noexcept;

  std::size_t shards_;
  std::size_t stripes_;
  std::size_t row_;  // counters per stripe row, a whole number of cache lines
  std::unique_ptr<flag[]> flags_;
  std::unique_ptr<counter_line[]> counters_;
  std::unique_ptr<total[]> spilled_;
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/read_gate.ipp"
#endif
