// singleflight/detail/cache/impl/cache_policy.ipp -- internal; do not include directly.
//
// The eviction policy's definitions (detail/cache/cache_policy.hpp, which describes them) but for
// the hit path (policy_hook::touch) and the members that take the shard's callables (insert,
// evict, sweep): included by that header in header-only mode, by singleflight/src.hpp in
// compiled mode (detail/config.hpp), which also instantiates the two ghost tables there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "../../algorithm.hpp"
#include "../cache_policy.hpp"

namespace singleflight::detail {

// frequency_sketch

SINGLEFLIGHT_DECL void frequency_sketch::configure(std::size_t capacity) noexcept {
  sample_ = 16 * std::max<std::uint64_t>(1, capacity);
}

SINGLEFLIGHT_DECL void frequency_sketch::fit(std::size_t entries) noexcept {
  if (words_ && width_ >= entries) return;
  std::size_t want = words_ ? width_ : 64;
  while (want < entries) want *= 2;
  if (words_ && want == width_) return;
  // The counters (4 rows of want / 16 words), then the doorkeeper (want / 4
  // words: 16 bits a counter of one row, as many bytes as the counters).
  const std::size_t per_row = want / 16;
  std::unique_ptr<std::uint64_t[]> grown(new (std::nothrow) std::uint64_t[8 * per_row]());
  if (!grown) return;
  if (words_) {
    const std::size_t old_row = width_ / 16;
    const auto tile = [](std::uint64_t* to, std::size_t to_n, const std::uint64_t* from,
                         std::size_t from_n) {
      for (std::size_t at = 0; at < to_n; at += from_n) {
        std::memcpy(to + at, from, from_n * sizeof(std::uint64_t));
      }
    };
    for (std::size_t r = 0; r < 4; ++r) {
      tile(&grown[r * per_row], per_row, &words_[r * old_row], old_row);
    }
    tile(&grown[4 * per_row], 4 * per_row, door(), 4 * old_row);
  }
  words_ = std::move(grown);
  width_ = want;
}

SINGLEFLIGHT_DECL int frequency_sketch::estimate(std::uint64_t fp) const noexcept {
  if (!words_) return 0;
  int m = 15;
  for (std::size_t r = 0; r < 4; ++r) m = std::min(m, get(r, slot(fp, r)));
  return m + (door_has(fp) ? 1 : 0);
}

SINGLEFLIGHT_DECL void frequency_sketch::add(std::uint64_t fp, int times) noexcept {
  if (!words_) return;
  for (; times > 0; --times) {
    if (++adds_ >= sample_) halve();
    if (door_set(fp)) continue;  // a first sighting since the last reset
    std::size_t s[4];
    int m = 15;
    for (std::size_t r = 0; r < 4; ++r) {
      s[r] = slot(fp, r);
      m = std::min(m, get(r, s[r]));
    }
    if (m == 15) continue;
    for (std::size_t r = 0; r < 4; ++r) {
      if (get(r, s[r]) == m) words_[r * (width_ / 16) + s[r] / 16] += one(s[r]);
    }
  }
}

SINGLEFLIGHT_DECL std::size_t frequency_sketch::bytes() const noexcept {
  return words_ ? width_ / 2 * sizeof(std::uint64_t) : 0;
}

SINGLEFLIGHT_DECL void frequency_sketch::halve() noexcept {
  for (std::size_t i = 0; i < width_ / 4; ++i) {
    words_[i] = (words_[i] >> 1U) & 0x7777777777777777ULL;
  }
  std::memset(door(), 0, width_ / 4 * sizeof(std::uint64_t));
  adds_ /= 2;
}

// ghost_table

template <bool Stamped>
SINGLEFLIGHT_DECL void ghost_table<Stamped>::configure(std::size_t keys) noexcept {
  keys_ = std::min<std::size_t>(std::max<std::size_t>(keys, 1), (std::size_t{1} << 31U) - 1);
}

template <bool Stamped>
SINGLEFLIGHT_DECL void ghost_table<Stamped>::add(std::uint64_t fp,
                                                 [[maybe_unused]] std::uint32_t stamp) noexcept {
  grow();
  if (!slots_) return;
  const std::uint32_t tag = tag_of(fp);
  slot& s = slots_[tag & mask_];
  s.tag = tag;
  s.number = static_cast<std::uint32_t>(++added_);
  if constexpr (Stamped) s.stamp = stamp;
}

template <bool Stamped>
SINGLEFLIGHT_DECL auto ghost_table<Stamped>::find(std::uint64_t fp) const noexcept -> const slot* {
  if (!slots_) return nullptr;
  const std::uint32_t tag = tag_of(fp);
  const slot& s = slots_[tag & mask_];
  const auto age = static_cast<std::uint32_t>(static_cast<std::uint32_t>(added_) - s.number);
  return s.tag == tag && age < keys_ ? &s : nullptr;
}

template <bool Stamped>
SINGLEFLIGHT_DECL std::size_t ghost_table<Stamped>::bytes() const noexcept {
  return slots_ ? (mask_ + 1) * sizeof(slot) : 0;
}

template <bool Stamped>
SINGLEFLIGHT_DECL void ghost_table<Stamped>::grow() noexcept {
  const std::size_t have = slots_ ? mask_ + 1 : 0;
  const std::size_t keys = static_cast<std::size_t>(std::min<std::uint64_t>(added_ + 1, keys_));
  std::size_t want = have == 0 ? 64 : have;
  while (want < keys) want *= 2;
  if (want == have) return;
  std::unique_ptr<slot[]> grown(new (std::nothrow) slot[want]());
  if (!grown) return;
  for (std::size_t i = 0; i < have; ++i) {
    if (slots_[i].tag != 0) grown[slots_[i].tag & (want - 1)] = slots_[i];
  }
  slots_ = std::move(grown);
  mask_ = want - 1;
}

#if defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
// The policy's two tables, instantiated once, here (cache_policy.hpp declares them extern).
template class ghost_table<true>;
template class ghost_table<false>;
#endif

// wtinylfu

SINGLEFLIGHT_DECL wtinylfu::wtinylfu() noexcept = default;

SINGLEFLIGHT_DECL wtinylfu::~wtinylfu() = default;

SINGLEFLIGHT_DECL void wtinylfu::configure(std::size_t capacity) noexcept {
  capacity_ = capacity;
  if (capacity == 0) return;
  horizon_ =
      static_cast<std::uint32_t>(std::min<std::size_t>(capacity, (std::size_t{1} << 31U) - 1));
  window_ = std::max<std::size_t>(1, capacity / 100);
  surge_block_ = static_cast<std::uint32_t>(
      std::min<std::size_t>(std::max<std::size_t>(64, capacity / 4), std::uint32_t{1} << 30U));
  window_max_ = std::max<std::size_t>(1, capacity - std::max<std::size_t>(1, capacity / 100));
  sketch_.configure(capacity);
  lost_.configure(capacity / 4);
  evicted_.configure(capacity / 4);
}

SINGLEFLIGHT_DECL std::size_t wtinylfu::ghost_bytes() const noexcept {
  return lost_.bytes() + evicted_.bytes() + sketch_.bytes();
}

SINGLEFLIGHT_DECL void wtinylfu::rewritten(policy_hook* n) noexcept {
  if (capacity_ == 0) {
    unlink(n);
    push_head(window_q, n);
  } else {
    n->touch();
  }
}

SINGLEFLIGHT_DECL void wtinylfu::remove(policy_hook* n) noexcept {
  if (n->queue != none) unlink(n);
}

SINGLEFLIGHT_DECL bool wtinylfu::fold(policy_hook* n) noexcept {
  const std::uint8_t f = n->freq.load(std::memory_order_relaxed);
  if (f == 0) return false;
  n->freq.store(0, std::memory_order_relaxed);
  sketch_.add(n->fingerprint, f);
  return true;
}

SINGLEFLIGHT_DECL bool wtinylfu::admits(const policy_hook* c, const policy_hook* v) noexcept {
  const int cf = sketch_.estimate(c->fingerprint);
  if (cf > sketch_.estimate(v->fingerprint)) return true;
  if (cf < 6) return false;
  rng_ = rng_ * 6364136223846793005ULL + 1442695040888963407ULL;
  return ((rng_ >> 33U) & 127U) == 0;
}

SINGLEFLIGHT_DECL void wtinylfu::surge() noexcept {
  if (surge_back_ >= surge_block_ / 3) window_ += (window_max_ - window_) / 4;
  surge_inserts_ = 0;
  surge_back_ = 0;
}

SINGLEFLIGHT_DECL void wtinylfu::demote() noexcept {
  const std::size_t limit = (capacity_ - window_) * 8 / 10;
  while (q_[protected_q].n > limit) {
    policy_hook* t = q_[protected_q].tail;
    unlink(t);
    push_head(fold(t) ? protected_q : probation_q, t);
  }
}

SINGLEFLIGHT_DECL void wtinylfu::push_head(std::uint8_t id, policy_hook* n) noexcept {
  queue_list& q = q_[id];
  n->queue = id;
  n->prev = nullptr;
  n->next = q.head;
  if (q.head != nullptr) q.head->prev = n;
  q.head = n;
  if (q.tail == nullptr) q.tail = n;
  ++q.n;
}

SINGLEFLIGHT_DECL void wtinylfu::unlink(policy_hook* n) noexcept {
  queue_list& q = q_[n->queue];
  if (hand_ == n) hand_ = n->prev;
  if (n->prev != nullptr) n->prev->next = n->next;
  if (n->next != nullptr) n->next->prev = n->prev;
  if (q.head == n) q.head = n->next;
  if (q.tail == n) q.tail = n->prev;
  n->prev = n->next = nullptr;
  n->queue = none;
  --q.n;
}

}  // namespace singleflight::detail
