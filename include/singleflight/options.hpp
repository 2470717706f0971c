// singleflight/options.hpp
//
// `singleflight::ownership` and `singleflight::options`: the per-group
// policies, fixed at construction.
#pragma once

#include <cstddef>
#include <memory>

#include "detail/chrono.hpp"
#include "executor.hpp"
#include "tracer.hpp"

namespace singleflight {

// ownership
//
// Who decides that a flight's work is no longer wanted. In every policy a
// caller whose own stop_token fires stops waiting at once (cancelled_error);
// the policy only decides what that does to the shared work.
enum class ownership {
  // waiters (default): the current waiter set owns the work. When the last
  // waiter leaves, the flight's token is stopped, its waiters are gone, and no
  // newcomer can join it (a newcomer starts a fresh flight once the stopped fn
  // has returned).
  waiters,
  // group: the group owns the work. Leaving only stops waiting; the work runs
  // to completion, to its deadline, or to close(), and stays joinable.
  group,
  // leader: the first caller owns the work. Its stop cancels the flight for
  // every waiter (cancelled_error); other callers leaving only stop waiting.
  leader,
};

// options
//
// Construction-time settings of a group. All fields have usable defaults.
struct options {
  // Who owns the shared work; see `ownership`.
  ownership owner = ownership::waiters;

  // Deadline inside each flight, measured from the moment the flight starts.
  // At the deadline the flight settles with timeout_error for all its waiters,
  // its token is stopped and it is no longer joinable. 0 = no deadline.
  // A group with a timeout owns one timer thread.
  std::chrono::nanoseconds timeout{0};

  // Cap on map entries (flights whose fn has not returned). A caller that
  // would start one more gets overloaded_error; joining is never capped.
  // 0 = unbounded.
  std::size_t max_in_flight = 0;

  // Where flights run. Empty: the first caller runs fn on its own thread and
  // returns when fn does. Set: every flight is handed to it as a `task` and
  // every caller, the first included, is a waiter that can leave at once.
  // Assign any callable `void(singleflight::task)` (the threads are yours),
  // `singleflight::thread_executor{}` (a thread per flight, owned and joined
  // by the group) or a `singleflight::thread_pool`'s executor().
  // (Initialised here, as `tracer` below, so that designated initialisers may
  // omit it under -Wextra's -Wmissing-field-initializers.)
  ::singleflight::executor executor{};

  // Shards of the group's table: keys are spread over them by hash, each
  // under its own lock. A call for a key not in flight writes two cache
  // lines of its shard and nothing else shared, so threads on different
  // keys slow each other down only when their keys share a shard: the more
  // shards there are for the keys in use, the better calls scale across
  // cores (docs/performance.md has the figures). 0 (the default) picks 8
  // per hardware thread (at least 8, at most 256); any other value is
  // rounded up to a power of two, at most 65,536 (1: one lock for the whole
  // group). A shard takes 384 bytes (libstdc++). stats(), in_flight() and
  // close() visit every shard, one lock at a time (they take longer with
  // more shards; no thread ever holds two shard locks, so ThreadSanitizer,
  // which follows at most 64 held locks, accepts any count).
  std::size_t shards = 0;

  // Reports each flight's start and settle (status, duration, joins, whether
  // fn ran) to your flight_tracer: a span per flight, without a metrics
  // library. Null (the default): nothing is reported, at the cost of one
  // branch per start and per settle. See tracer.hpp for where and when it
  // runs (never under a lock, never on the timer thread; noexcept).
  // (Initialised here so that designated initialisers may omit it under
  // -Wmissing-field-initializers.)
  std::shared_ptr<flight_tracer> tracer = nullptr;
};

}  // namespace singleflight
