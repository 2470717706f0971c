// singleflight/batch_options.hpp
//
// The vocabulary of singleflight::batch_loader (include
// <singleflight/batch_loader.hpp>): `batch_options` (its construction-time
// settings), `batch_stats` and its metrics table `metrics::batch_metrics`, and
// `batch_size_error` (a bulk function's sequence of the wrong length). Plain
// types: no state, no lock. The per-key result types a bulk function may
// return are the cache's (`load_result<T>`, `not_found_error`, in
// cache_options.hpp) and the group's (`outcome<T>`).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "detail/chrono.hpp"
#include "errors.hpp"
#include "metrics.hpp"
#include "options.hpp"

namespace singleflight {

// batch_options
//
// Construction-time settings of a batch_loader. The constructor throws
// std::invalid_argument when window is negative.
struct batch_options {
  // A batch takes keys until it holds this many (then it is dispatched at
  // once, without waiting for the window). 0 = no limit: only the window or
  // flush() close a batch.
  std::size_t max_batch = 64;

  // How long a batch stays open for more keys, from the moment its first key
  // arrives. 0: the loader's window thread dispatches it as soon as it gets
  // to it (whatever arrived meanwhile goes with it).
  std::chrono::nanoseconds window{std::chrono::milliseconds(2)};

  // Cap on bulk calls running at once. A batch that is due while this many
  // run waits (and, while it waits, keeps taking keys up to max_batch).
  // 0 = no cap.
  std::size_t max_in_flight_batches = 0;

  // Cap on the loader's own threads that run bulk calls (the window thread aside): a bulk
  // call is started on an idle thread, or a new one while fewer than this many run; else it
  // waits for a free one (a hung origin holds at most this many threads). One idle for 10 s
  // exits. 0 = no cap. Not used with a callable flight.executor (the bulk calls run there).
  std::size_t max_threads = 64;

  // The options of the loader's per-key group (the flights that callers of
  // one key share): ownership (who decides that a key is no longer wanted),
  // timeout (a deadline for each key, from its first caller), max_in_flight
  // (a cap on keys in flight), shards, tracer (a span per key). `executor`
  // is where the bulk calls run instead: empty or thread_executor{}, on
  // threads the loader owns; your callable, handed one task per bulk call
  // (from the loader's window thread, which must not block on it).
  options flight{};
};

// batch_close_result: what batch_loader::close_for found when it returned.
struct batch_close_result {
  bool drained = false;             // every bulk call answered and delivered, threads joined
  std::size_t running_batches = 0;  // bulk calls still running (not yet answered)
  std::size_t keys_in_flight = 0;   // keys whose flight had not finished
};

// batch_stats
//
// Counters since construction. All but calls and joins are the loader's own,
// read together under its lock (one consistent snapshot); calls and joins are
// the per-key group's (summed over its shards in turn, see singleflight::stats)
// plus load_many's repeated keys, read right after that snapshot and not part
// of it. Keys per batch: keys / batches.
struct batch_stats {
  std::uint64_t calls = 0;            // load / try_load / async_load / co_load calls, one per
                                      // key of load_many (the group's calls)
  std::uint64_t joins = 0;            // calls that joined a key already in flight (pending,
                                      // in a running batch, or being delivered)
  std::uint64_t batches = 0;          // bulk calls made (origin calls)
  std::uint64_t keys = 0;             // keys sent in those bulk calls (keys / batches: keys
                                      // per batch)
  std::uint64_t largest_batch = 0;    // the most keys one bulk call has held
  std::uint64_t dropped_keys = 0;     // keys whose flight stopped (every waiter left, a
                                      // deadline, close) before their batch was dispatched
  std::uint64_t skipped_batches = 0;  // batches not run: every key had been dropped
  std::uint64_t stopped_batches = 0;  // bulk calls whose token fired: every key's waiters
                                      // left while it ran, or close()
  std::uint64_t failed_batches = 0;   // bulk calls that failed as a whole (threw, a sequence
                                      // of the wrong length, a broken completion, a dropped
                                      // task)
  std::uint64_t pending_keys = 0;     // keys waiting for dispatch now
  std::uint64_t running_batches = 0;  // bulk calls running now
};

// batch_size_error
//
// Delivered to every key of a batch whose bulk function returned a sequence
// (aligned with the keys) of another length than the keys it was given.
// expected(): the keys; got(): the results.
class SINGLEFLIGHT_EXCEPTION_VISIBLE batch_size_error : public error {
 public:
  batch_size_error(std::size_t expected, std::size_t got)
      : error("singleflight::batch_loader: the bulk function returned " + std::to_string(got) +
              " results for " + std::to_string(expected) +
              " keys (a sequence result must hold one result per key, in the keys' order)"),
        expected_(expected),
        got_(got) {}
  std::size_t expected() const noexcept { return expected_; }
  std::size_t got() const noexcept { return got_; }

 private:
  std::size_t expected_;
  std::size_t got_;
};

}  // namespace singleflight

namespace singleflight::metrics {

// batch_metrics: a batch_loader's `stats()` (batch_stats) as named metrics,
// for any exporter that reads metrics::descriptor tables (metrics.hpp), e.g.
//   collector.add_source({{"loader", "users"}}, singleflight::metrics::batch_metrics,
//                        [&] { return users.stats(); });
// and the per-key group's counters under group_metrics through flight_stats().
// Keys per batch: rate(keys_total) / rate(batches_total).
inline constexpr std::array batch_metrics{
    counter<&batch_stats::calls>("singleflight_batch_calls_total",
                                 "Calls for one key (load, async_load, co_load, each key of "
                                 "load_many)"),
    counter<&batch_stats::joins>("singleflight_batch_joins_total",
                                 "Calls that joined a key already in flight"),
    counter<&batch_stats::batches>("singleflight_batch_batches_total",
                                   "Bulk calls made (origin calls)"),
    counter<&batch_stats::keys>("singleflight_batch_keys_total", "Keys sent in bulk calls"),
    gauge<&batch_stats::largest_batch>("singleflight_batch_largest_keys",
                                       "The most keys one bulk call has held"),
    counter<&batch_stats::dropped_keys>("singleflight_batch_dropped_keys_total",
                                        "Keys no longer wanted before their batch was "
                                        "dispatched"),
    counter<&batch_stats::skipped_batches>("singleflight_batch_skipped_batches_total",
                                           "Batches not run: every key had been dropped"),
    counter<&batch_stats::stopped_batches>("singleflight_batch_stopped_batches_total",
                                           "Bulk calls stopped: no key of theirs was wanted any "
                                           "more, or close()"),
    counter<&batch_stats::failed_batches>("singleflight_batch_failed_batches_total",
                                          "Bulk calls that failed as a whole"),
    gauge<&batch_stats::pending_keys>("singleflight_batch_pending_keys",
                                      "Keys waiting for their batch to be dispatched"),
    gauge<&batch_stats::running_batches>("singleflight_batch_running_batches",
                                         "Bulk calls running now"),
};

}  // namespace singleflight::metrics
