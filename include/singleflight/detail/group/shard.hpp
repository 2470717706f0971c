// singleflight/detail/group/shard.hpp -- internal; do not include directly.
//
// shard: one part of a group's state, the keys whose hash selects it, under
// one lock. Independent of the group's Key and T (the table holds
// flight_base*; flight_table casts to its own flight type), so that every
// layer but the table itself is compiled once for all groups.
//
// Locking: `mu` guards everything in it and every flight it holds. Locks of
// two shards are only ever held together in index order (stats(), close());
// the timer gate's mutex and the delivery queue's are taken after a shard's,
// never before one.
//
// Sharing between cores: a call for a key that is not in flight writes two
// cache lines of its shard (the lock and the chain head; the counters, the
// drain count, the live and frame lists) and nothing else shared (its flight
// comes from its own thread's pool). Two threads on distinct keys only meet
// when their keys share a shard, so the shard count is what spreads them
// (options::shards).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "../../stats.hpp"
#include "deadline_list.hpp"
#include "flight.hpp"
#include "frames.hpp"
#include "observers.hpp"

namespace singleflight::detail {

// Its first two cache lines hold what every call writes (a shard that
// another core wrote costs one transfer per line); the rest is touched only
// by bounded waits, deadlines, notification loops, close() and rarer
// counters. Aligned so that two shards never share a cache line (128: x86
// prefetches pairs of lines).
struct alignas(128) shard {
  // ---- line 0: the lock and the table ----
  std::mutex mu;
  flight_base* chain = nullptr;  // the only bucket while bucket_bits == 0
  std::size_t size = 0;          // entries: flights whose fn has not returned
  std::uint64_t seq = 0;         // flights started here (stats::flights)
  // ---- line 1: per-call bookkeeping ----
  // The drain count: calls inside the group, unfinished tasks, unresolved
  // completions, registered notification loops. close() waits for it.
  std::size_t users = 0;
  std::uint64_t calls = 0;      // stats::calls
  std::uint64_t fn_starts = 0;  // stats::fn_starts
  flight_base* live = nullptr;  // flights whose fn has not returned
  record_list<frame> frames;
  unsigned bucket_bits = 0;  // 0: `chain` only; else buckets.size() == 1 << bucket_bits
  std::uint32_t index = 0;
  bool closed = false;
  // ---- the rest ----
  std::vector<flight_base*> buckets;  // chains through flight_base::bucket_prev/next
  // The other counters (calls, flights, fn_starts and in_flight unused).
  singleflight::stats st{};
  deadline_list deadlines;
  bound_list bounds;
  record_list<loop_record> loops;
  std::condition_variable drain_cv;
};

}  // namespace singleflight::detail
