// singleflight/detail/group/impl/shard_set.ipp -- internal; do not include directly.
//
// shard_set's definitions (detail/group/shard_set.hpp, which describes them): included by that
// header in header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include "../shard_set.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL shard_set::~shard_set() = default;

SINGLEFLIGHT_DECL shard_set::shard_set(options opts) : opts_(std::move(opts)) {
  if (opts_.timeout < std::chrono::nanoseconds::zero())
    opts_.timeout = std::chrono::nanoseconds::zero();
  std::size_t n = opts_.shards;
  if (n == 0) {
    const std::size_t cores = std::thread::hardware_concurrency();
    n = cores <= 1 ? 8 : cores >= 32 ? 256 : 8 * cores;  // 8 per hardware thread, 8 to 256
  }
  n = std::bit_ceil(n < 1 ? 1 : n > max_shards ? max_shards : n);
  shard_bits_ = static_cast<unsigned>(std::countr_zero(n));
  shard_count_ = n;
  shards_ = std::make_unique<shard[]>(n);
  for (std::size_t i = 0; i < n; ++i) shards_[i].index = static_cast<std::uint32_t>(i);
}

SINGLEFLIGHT_DECL void shard_set::link(shard& s, flight_base* f, std::uint64_t mixed) {
  // One chain in the shard's first line up to chain_limit entries (no
  // bucket array to fetch), then buckets; rehash may throw (allocation)
  // before anything changed.
  if (s.size + 1 > (s.buckets.size() > chain_limit ? s.buckets.size() : chain_limit))
    rehash(s, s.buckets.empty() ? 2 * chain_limit : 2 * s.buckets.size());
  f->hash = mixed;
  flight_base*& head = head_ref(s, mixed);
  f->bucket_prev = nullptr;
  f->bucket_next = head;
  if (head != nullptr) head->bucket_prev = f;
  head = f;
  ++s.size;
  f->in_table = true;
}

SINGLEFLIGHT_DECL shard_set::clock::time_point shard_set::started(shard& s,
                                                                  flight_base& f) noexcept {
  f.seq = ++s.seq;
  f.waiters = 1;
  f.live_prev = nullptr;
  f.live_next = s.live;
  if (s.live != nullptr) s.live->live_prev = &f;
  s.live = &f;
  const bool timed = opts_.timeout > std::chrono::nanoseconds::zero();
  if (!timed && !opts_.tracer) return clock::time_point{};
  // One reading of the clock for both: a traced flight's reported duration
  // is then at least options.timeout when its deadline settles it.
  const clock::time_point now = clock::now();
  if (timed) {
    f.deadline = after(now, opts_.timeout);
    s.deadlines.push(f);
    gate_.linked(f.deadline);
  }
  return now;
}

SINGLEFLIGHT_DECL void shard_set::settle(shard& s, flight_base& f, kind k,
                                         wake_batch& wake) noexcept {
  f.kind = k;
  if (f.trace.tracer) {  // report it once the lock is released
    f.trace.settled(status_of(k), clock::now(), f.joins, f.fn_started);
    wake.add_trace(f);
  }
  s.deadlines.erase(f);
  if (k == kind::timeout) ++s.st.timeouts;
  if (k == kind::fn_error || k == kind::dropped) ++s.st.failures;
  const bool cancelled = k == kind::cancelled;
  (void)f.list.claim_if([](const waiter& w) { return !w.observer; },
                        [&](waiter& w) {
                          if (cancelled) ++s.st.cancellations;
                          exit_user(s);
                          s.bounds.unlink(static_cast<bounded_wait&>(w));  // its own bound
                          wake.add(w);
                        },
                        [&] {
                          if (cancelled) ++s.st.cancellations;
                          exit_user(s);
                          wake.add_blocked(f);
                        });
}

SINGLEFLIGHT_DECL void shard_set::finish(shard& s, flight_base* f, kind k,
                                         wake_batch& wake) noexcept {
  f->fn_done = true;
  if (f->kind == kind::pending) settle(s, *f, k, wake);
  if (f->in_table) {
    erase(s, f);
    f->release();  // the table's reference
  }
  (f->live_prev != nullptr ? f->live_prev->live_next : s.live) = f->live_next;
  if (f->live_next != nullptr) f->live_next->live_prev = f->live_prev;
  f->live_prev = f->live_next = nullptr;
  claim_observers(*f, s.bounds, wake);
}

SINGLEFLIGHT_DECL bool shard_set::leave(shard& s, flight_base& f, bool is_leader,
                                        wake_batch& wake) noexcept {
  --f.waiters;
  if (f.kind != kind::pending) return false;
  if (!leaving_stops(opts_.owner, f.waiters, is_leader)) return false;
  settle(s, f, kind::cancelled, wake);
  return f.stop.stop_possible();
}

SINGLEFLIGHT_DECL singleflight::stats shard_set::snapshot() noexcept {
  singleflight::stats sum{};
  for (std::size_t i = 0; i < shard_count_; ++i) {
    const shard& s = shards_[i];
    std::lock_guard<std::mutex> lk(shards_[i].mu);
    sum.calls += s.calls;
    sum.flights += s.seq;
    sum.fn_starts += s.fn_starts;
    sum.joins += s.st.joins;
    sum.rejections += s.st.rejections;
    sum.failures += s.st.failures;
    sum.cancellations += s.st.cancellations;
    sum.timeouts += s.st.timeouts;
    sum.wait_timeouts += s.st.wait_timeouts;
    sum.overloaded += s.st.overloaded;
    sum.in_flight += s.size;
  }
  return sum;
}

SINGLEFLIGHT_DECL std::size_t shard_set::entries() noexcept {
  std::size_t n = 0;
  for (std::size_t i = 0; i < shard_count_; ++i) {
    std::lock_guard<std::mutex> lk(shards_[i].mu);
    n += shards_[i].size;
  }
  return n;
}

SINGLEFLIGHT_DECL void shard_set::rehash(shard& s, std::size_t n) {
  std::vector<flight_base*> next(n, nullptr);  // may throw: nothing changed yet
  std::swap(s.buckets, next);
  flight_base* const first = s.bucket_bits == 0 ? std::exchange(s.chain, nullptr) : nullptr;
  s.bucket_bits = static_cast<unsigned>(std::countr_zero(n));
  relink(s, first);
  for (flight_base* chain : next) relink(s, chain);
}

SINGLEFLIGHT_DECL void shard_set::relink(shard& s, flight_base* chain) noexcept {
  while (chain != nullptr) {
    flight_base* f = chain;
    chain = f->bucket_next;
    flight_base*& head = s.buckets[bucket_of(s, f->hash)];
    f->bucket_prev = nullptr;
    f->bucket_next = head;
    if (head != nullptr) head->bucket_prev = f;
    head = f;
  }
}

}  // namespace singleflight::detail
