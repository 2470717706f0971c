// singleflight/stats.hpp
//
// `singleflight::stats`, a snapshot of a group's counters, and
// `singleflight::call_info`, which tells one caller what part it played.
#pragma once

#include <cstdint>

namespace singleflight {

// stats
//
// Counters of one group since construction, summed over its shards, each
// shard's read together under its lock in turn (while calls run, the sum is
// not one instant across shards; a later snapshot never reports less). They
// are plain increments inside critical sections the calls take anyway, so
// they are always on.
//
// Accounting identity: every call ends as exactly one of started, joined or
// rejected, so `calls == flights + joins + rejections` once no call is
// running. The coalescing ratio is `flights / calls` (far below 1: working;
// stuck at 1: the key is over-specified or nothing overlaps).
struct stats {
  std::uint64_t calls = 0;          // do_ / do_fresh calls
  std::uint64_t flights = 0;        // flights started (entries created for a new fn)
  std::uint64_t fn_starts = 0;      // fns actually called: flights minus those stopped
                                    // while their task was still queued (origin calls)
  std::uint64_t joins = 0;          // calls that attached to an existing flight
  std::uint64_t rejections = 0;     // calls that neither started nor joined: closed,
                                    // overloaded, stopped before attaching, timed out
                                    // waiting for a predecessor, self-deadlock
  std::uint64_t failures = 0;       // flights whose fn threw (or whose task was dropped)
  std::uint64_t cancellations = 0;  // calls that ended in cancelled_error
  std::uint64_t timeouts = 0;       // flights settled by their deadline
  std::uint64_t wait_timeouts = 0;  // calls that ended at their own wait_bound (timeout_error)
  std::uint64_t overloaded = 0;     // calls rejected by max_in_flight (also in rejections)
  std::uint64_t in_flight = 0;      // map entries now (same as group::in_flight())
};

// role
//
// What a caller was to the flight whose outcome it received. Unlike Go's
// `shared` flag (true for the leader too whenever anybody joined), a role
// answers one question: did this caller's fn run?
enum class role {
  none,      // the call was rejected before it attached to any flight
  leader,    // this caller started the flight; its fn is the one that ran
  follower,  // this caller joined a flight another caller started
};

// call_info
//
// Filled in by the `do_` / `do_fresh` overloads that take it, on every exit
// path (value or exception). `flight` numbers flights of one group from 1 in
// the order they started; callers with equal numbers shared one execution.
struct call_info {
  singleflight::role role = role::none;
  std::uint64_t flight = 0;
};

}  // namespace singleflight
