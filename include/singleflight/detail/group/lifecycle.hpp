// singleflight/detail/group/lifecycle.hpp -- internal; do not include directly.
//
// lifecycle: close() and the drain (not a template, as deadlines.hpp). close() marks
// every shard closed, one at a time (each shard rejects new calls from its
// marking on), then settles every unsettled flight with closed_error, stops
// their tokens, notifies, and waits until each shard's drain count (`users`:
// calls inside, unfinished tasks, unresolved completions, notification
// loops) is down to what the calling thread itself holds. Then it joins the
// group's threads, never the one it runs on. Also the thread_executor
// workers: started here, reaped when the next one starts, joined by close().
//
// On a library thread (a thread of any group: timer, delivery, thread_executor
// worker; or of any detail::worker_threads) close() follows worker_threads.hpp's
// rule: it marks, settles and stops like any close(), then returns without
// waiting for the drain and joins nothing: such a thread may be the one another
// closer waits for (two thread_executor fns that both call close() each waited
// for the other's fn). The destructor (or a close() from outside) finishes.
//
// Locking: shard locks as in flight_table.hpp, one at a time (never two at
// once: a group may have 65,536 shards, and ThreadSanitizer follows at most
// 64 locks held by one thread); workers_ is guarded by workers_mu_; join_mu_
// serialises joins, so a second close() returns only once the first has
// joined everything.
#pragma once

#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "../../executor.hpp"
#include "../../task.hpp"
#include "../chrono.hpp"
#include "../config.hpp"
#include "../worker_threads.hpp"
#include "deadlines.hpp"
#include "hooks.hpp"
#include "owned_thread.hpp"

namespace singleflight::detail {

class lifecycle : public deadlines {
  using base = deadlines;

 public:
  using kind = outcome_kind;

  SINGLEFLIGHT_DECL explicit lifecycle(options opts);
  SINGLEFLIGHT_DECL ~lifecycle();

 protected:
  // close_until(until, destroying)
  //
  // close() (until: nullopt) or close_for(). Returns false when `until`
  // passed before the drain. `destroying`: ~group, which also joins (or
  // orphans) the threads that close() called from inside the group leaves
  // alone.
  SINGLEFLIGHT_DECL bool close_until(std::optional<steady::time_point> until, bool destroying);

  // A thread of any group or of any worker_threads (detail/library_thread.hpp).
  static bool on_library_thread() noexcept { return detail::on_library_thread(); }

  // Hands a task to the executor (user code: no lock of the group held), or
  // starts a thread_executor worker: a thread the group owns, which touches
  // nothing of the group once its task has returned.
  SINGLEFLIGHT_DECL void submit(task tk);

 private:
  // Settles shard s's unsettled flights with closed_error, ends its
  // observers' waits, stops the flights, then notifies.
  SINGLEFLIGHT_DECL void close_shard(shard& s);

  // Joins the group's threads: the timer first (then nothing new reaches the
  // delivery thread), then the delivery thread (which delivers what is
  // queued first), then the thread_executor workers. Never the calling
  // thread: close() leaves it to the destructor; the destructor detaches it
  // (orphaned: it touches nothing of the group any more).
  SINGLEFLIGHT_DECL void join_threads(bool destroying);

  std::mutex join_mu_;
  std::mutex workers_mu_;
  std::list<owned_thread> workers_;  // guarded by workers_mu_
};

}  // namespace singleflight::detail

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#include "impl/lifecycle.ipp"
#endif
