// singleflight/detail/batch/batch.hpp -- internal; do not include directly.
//
// One batch of a batch_loader and the keys in it:
//   * batch_item: one key's flight as the batch sees it: the key, the
//     completion<T> that finishes that key's flight in the loader's group,
//     and a stop callback on the flight's token (every waiter of the key
//     left, its deadline, close());
//   * batch: the items that joined it while it was open, and, once
//     dispatched, the keys sent to the bulk function, the bulk call's stop
//     source, the results and the delivery cursor;
//   * batch_sink: what items and completions report to (the loader's
//     batch_queue), so that this file needs nothing of it.
//
// Locking: the fields marked "queue lock" are guarded by the batch_queue's
// mutex; the others are written by one thread before they are published
// (see each field). Nothing here locks.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "../../completion.hpp"
#include "../../errors.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "bulk_results.hpp"

namespace singleflight::detail {

template <class Key, class T>
struct batch;
template <class Key, class T>
struct batch_item;

// batch_sink: the loader side of items and completions. Every member is
// called with no lock held and may be called from any thread.
template <class Key, class T>
class batch_sink {
 public:
  // The flight of `item` stopped (its stop callback, on the stopping thread).
  virtual void item_stopped(batch_item<Key, T>* item) noexcept = 0;
  // The batch's results (or its whole-batch error) are written: deliver them.
  virtual void results_ready(std::shared_ptr<batch<Key, T>> b) noexcept = 0;

 protected:
  batch_sink() = default;
  ~batch_sink() = default;
};

template <class Key, class T>
struct batch_item {
  enum class state : unsigned char {
    joining,     // made by the enqueuing thread, not yet in a batch
    gone_early,  // its flight stopped while joining: the enqueuing thread resolves it
    pending,     // in an open (or ready) batch
    dropped,     // stopped while pending: resolved by the stopping thread, not sent
    sent,        // in a dispatched batch
    left,        // sent, then its flight stopped (the result is discarded)
    done,        // its batch is delivering: stops no longer matter
  };

  // The stop callback: reports to the sink. Runs on the stopping thread.
  struct stopped {
    batch_item* self;
    void operator()() const noexcept { self->sink->item_stopped(self); }
  };

  batch_item(batch_sink<Key, T>* s, Key k,
             completion<T> c) noexcept(std::is_nothrow_move_constructible_v<Key>)
      : sink(s), key(std::move(k)), done(std::move(c)) {}
  batch_item(const batch_item&) = delete;
  batch_item& operator=(const batch_item&) = delete;

  batch_sink<Key, T>* sink;
  // Moved into batch::keys by the thread that runs the bulk call.
  Key key;
  // Resolved exactly once: by the delivery (sent), the stopping thread
  // (dropped), or the enqueuing thread (gone_early, closed).
  completion<T> done;
  state st = state::joining;       // queue lock
  bool stopping = false;           // queue lock: its stop callback runs the bulk call's stop
  batch<Key, T>* owner = nullptr;  // queue lock: the batch it joined
  // Registered by the enqueuing thread before the item joins a batch; reset
  // with no lock held before the item is destroyed (which waits for a run on
  // another thread), so a stop callback always finds its item and batch.
  std::optional<stop_callback<stopped>> on_stop;
};

template <class Key, class T>
struct batch : std::enable_shared_from_this<batch<Key, T>> {
  using item_t = batch_item<Key, T>;
  // The bulk call's phase (call_phase): the call began, it ended (returned, threw or its
  // thread ended), its completion was dropped unresolved.
  static constexpr unsigned phase_in_call = 1, phase_ended = 2, phase_dropped = 4;

  batch(batch_sink<Key, T>* s, std::chrono::steady_clock::time_point d) noexcept
      : sink(s), due(d) {}
  batch(const batch&) = delete;
  batch& operator=(const batch&) = delete;

  batch_sink<Key, T>* sink;

  // While open (queue lock):
  std::vector<std::unique_ptr<item_t>> items;  // every item that joined, dropped ones too
  std::size_t live = 0;                        // items pending
  std::chrono::steady_clock::time_point due;   // when the window closes

  // From dispatch:
  std::vector<item_t*> sent;  // written under the queue lock at dispatch, read-only after
  std::size_t wanted = 0;     // queue lock: sent items whose flight has not stopped
  // Who runs the bulk call: the worker it was posted to, or a thread of the loader that
  // needs one of its keys (batch_queue::help_until). Whoever sets it first; a batch is
  // resolved only by its claimer's path, so an unclaimed batch is unresolved (and its
  // loader alive). Memory ordering: acq_rel.
  std::atomic<bool> claimed{false};
  // Queue lock: on the loader's list of batches posted to a worker and not yet claimed.
  bool listed = false;
  typename std::list<std::shared_ptr<batch>>::iterator listed_at;
  // phase_* bits. Memory ordering: acq_rel; decides who resolves a batch whose completion
  // was dropped (batch_dropped).
  std::atomic<unsigned> call_phase{0};
  // The keys of `sent`, in order: built by the thread that runs the bulk
  // call, before the call, and read-only from then on.
  std::vector<Key> keys;
  stop_source stop;  // the bulk call's token
  // Written by the one thread that resolves the batch (the winner of
  // `resolved`) before results_ready publishes them (queue lock).
  std::vector<key_result<T>> results;
  std::exception_ptr whole_error;  // non-null: every key gets this instead of results
  // Memory ordering: acq_rel; only its winner writes results.
  std::atomic<bool> resolved{false};
  // The next sent item to deliver. Relaxed: it only hands out indexes; the
  // deliverers are the resolving thread and, nested inside it, that same
  // thread (batch_queue::drain_here).
  std::atomic<std::size_t> next{0};
};

// batch_dropped(b): b's batch_completion was destroyed unresolved. During the bulk call
// nothing happens here (the call's end resolves b: its exception, else
// broken_promise_error); afterwards b fails with broken_promise_error, unless it was
// resolved already, in which case nothing of the loader is touched (it may be gone: the
// completion can outlive it, kept by an I/O layer after the bulk function threw).
template <class Key, class T>
void batch_dropped(std::shared_ptr<batch<Key, T>> b) noexcept {
  using batch_t = batch<Key, T>;
  const unsigned was = b->call_phase.fetch_or(batch_t::phase_dropped, std::memory_order_acq_rel);
  if ((was & batch_t::phase_in_call) != 0 && (was & batch_t::phase_ended) == 0) return;
  if (b->resolved.exchange(true, std::memory_order_acq_rel)) return;
  b->whole_error = std::make_exception_ptr(broken_promise_error());
  batch_sink<Key, T>* const sink = b->sink;
  sink->results_ready(std::move(b));
}

}  // namespace singleflight::detail
