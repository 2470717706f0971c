// singleflight/detail/cache/impl/read_gate.ipp -- internal; do not include directly.
//
// read_gate's definitions (detail/cache/read_gate.hpp, which describes them) but for its read
// path: included by that header in header-only mode, by singleflight/src.hpp in compiled mode
// (detail/config.hpp).
#pragma once

#include "../read_gate.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL read_gate::~read_gate() = default;

SINGLEFLIGHT_DECL read_gate::read_gate(std::size_t shards, std::size_t stripes)
    : shards_(shards),
      stripes_(stripes),
      row_(round_up(shards * sizeof(counter), line) / sizeof(counter)),
      flags_(new flag[shards]),
      counters_(new counter_line[stripes * row_ / per_line]),
      spilled_(new total[stripes]) {}

SINGLEFLIGHT_DECL std::uint64_t read_gate::hits() const noexcept {
  std::uint64_t n = 0;
  for (std::size_t s = 0; s < stripes_; ++s) {
    n += spilled_[s].n.load(std::memory_order_relaxed);
    for (std::size_t sh = 0; sh < shards_; ++sh) {
      n += at(s, sh).load(std::memory_order_relaxed) >> 32U;
    }
  }
  return n;
}

SINGLEFLIGHT_DECL std::uint64_t read_gate::hits_of(std::size_t shard) const noexcept {
  std::uint64_t n = 0;
  for (std::size_t s = 0; s < stripes_; ++s)
    n += at(s, shard).load(std::memory_order_relaxed) >> 32U;
  return n;
}

SINGLEFLIGHT_DECL void read_gate::lock_out(std::size_t shard) noexcept {
  flags_[shard].closed.store(true, std::memory_order_seq_cst);
  for (std::size_t s = 0; s < stripes_; ++s) {
    const counter& c = at(s, shard);
    for (unsigned spins = 0; (c.load(std::memory_order_seq_cst) & readers_mask) != 0; ++spins) {
      if (spins >= 64) std::this_thread::yield();  // a reader was preempted inside
    }
  }
}

SINGLEFLIGHT_DECL void read_gate::spill(counter& c, std::size_t stripe) noexcept {
  std::uint64_t v = c.load(std::memory_order_relaxed);
  while ((v >> 32U) >= (std::uint64_t{1} << 31U)) {
    if (c.compare_exchange_weak(v, v & readers_mask, std::memory_order_relaxed)) {
      spilled_[stripe].n.fetch_add(v >> 32U, std::memory_order_relaxed);
      return;
    }
  }
}

}  // namespace singleflight::detail
