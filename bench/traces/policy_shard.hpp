// bench/traces/policy_shard.hpp: the cache's eviction policy (detail::wtinylfu) driven alone, as
// a cache with one shard drives it, for the tools that study the policy away from the cache
// (policy_cells.cpp, policy_timeline.cpp). A hit touches the entry's bits; a miss evicts first
// when the shard holds its capacity, then inserts; the policy's clock is the hits so far; the
// fingerprint is the cache's for a uint32_t key (mix64 of std::hash, the identity), so that every
// cell reads as bench_traces's "1 shard" column does, to the hundredth. A non-zero `seed` mixes
// the key with it first: the same policy over other fingerprints, which is how much a cell moves
// with the hash alone (policy_cells --seeds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "singleflight/detail/cache/cache_clock.hpp"
#include "singleflight/detail/cache/cache_policy.hpp"

namespace sftrace {

// What the policy holds of a key; a tool that records more derives from it.
struct policy_entry : singleflight::detail::policy_hook {
  std::uint32_t key = 0;
};

template <class Entry = policy_entry>
class policy_shard {
 public:
  explicit policy_shard(std::size_t capacity, std::uint64_t seed = 0)
      : capacity_(capacity), seed_(seed) {
    policy_.configure(capacity);
  }
  policy_shard(const policy_shard&) = delete;
  policy_shard& operator=(const policy_shard&) = delete;
  ~policy_shard() {
    for (const auto& [key, e] : at_) delete e;
  }

  // access(k, before_evict, evicted): k's entry when the access hit (touched), else nullptr once
  // the miss has evicted (when the shard was full: before_evict() just before the policy chose,
  // evicted(victim) just before the victim is deleted) and inserted k.
  template <class BeforeEvict, class Evicted>
  Entry* access(std::uint32_t k, BeforeEvict&& before_evict, Evicted&& evicted) {
    const auto clock = [this] { return hits_; };
    if (auto f = at_.find(k); f != at_.end()) {
      ++hits_;
      f->second->touch();
      return f->second;
    }
    if (policy_.size() >= capacity_) {
      before_evict();
      const auto dead = [](const singleflight::detail::policy_hook*) { return false; };
      auto* v = static_cast<Entry*>(policy_.evict(dead, clock));
      evicted(*v);
      at_.erase(v->key);
      delete v;
    }
    auto* n = new Entry;
    n->key = k;
    n->fingerprint = singleflight::detail::mix64(std::uint64_t{k} ^ seed_);
    policy_.insert(n, clock);
    at_[k] = n;
    return nullptr;
  }
  Entry* access(std::uint32_t k) {
    return access(
        k, [] {}, [](Entry&) {});
  }

  bool holds(std::uint32_t k) const { return at_.count(k) != 0; }
  const std::unordered_map<std::uint32_t, Entry*>& entries() const { return at_; }
  const singleflight::detail::wtinylfu& policy() const { return policy_; }

 private:
  const std::size_t capacity_;
  const std::uint64_t seed_;
  singleflight::detail::wtinylfu policy_;
  std::unordered_map<std::uint32_t, Entry*> at_;
  std::uint64_t hits_ = 0;
};

}  // namespace sftrace
