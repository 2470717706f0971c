// singleflight/detail/batch/batch_queue.hpp -- internal; do not include directly.
//
// batch_queue<Key, T>: the batching half of a batch_loader. The loader's
// group makes one flight per key; that flight's (asynchronous) fn is add(),
// which puts the key and the flight's completion into the open batch. This
// class owns what happens next:
//   * the window: a thread of its own (never a caller's; one job on a
//     worker_threads of its own) closes the open
//     batch `window` after its first key arrived, or at once when it holds
//     max_batch keys or flush() is called, and dispatches it when fewer than
//     max_in_flight_batches bulk calls run;
//   * a key whose flight stops before dispatch (every waiter left, its
//     deadline, close()) is dropped from its batch, and its completion
//     resolved at once (which frees the key in the group); a batch whose
//     keys were all dropped is not run;
//   * the bulk call runs on one of the loader's worker_threads (a new one
//     when every one is busy, up to batch_options::max_threads; an idle one
//     exits after a while) or on the executor,
//     with a stop token of its own that fires once every sent key's flight
//     has stopped; a batch whose keys all stopped before its call started is
//     not run. An executor that refuses a batch (throws) fails it with its
//     exception on a worker, never on the window thread (fail_elsewhere);
//   * helping: a blocking load made on the loader's threads (a bulk call, a
//     delivery on a worker) runs batches itself while it waits
//     (help_until): the open one and those waiting for a slot, started at
//     once, and those posted to a worker that has not claimed them yet
//     (`launched_`; each batch is run by whoever claims it first). So such
//     a load never waits for a slot or a thread its own waiters hold;
//   * delivery: every key's completion resolved with its result, on the
//     thread that resolved the batch, keys in order;
//   * frames: which thread is calling a bulk function or delivering a batch,
//     so that a blocking call made there (by a callback, a resumption, the
//     bulk function) can first deliver what this thread holds back, or
//     report that it would wait for itself (batch_loader). A thread finds
//     its own frames in a list of its own (frames_here_), without the lock
//     and without looking at other threads' frames: a call's cost does not
//     grow with the number of running batches;
//   * shutdown: the window thread and the workers follow worker_threads'
//     close protocol (a close from one of the library's threads joins
//     nothing); a close from a thread delivering a batch waits for the other
//     threads' bulk calls and deliveries, but not for those of threads that
//     are in close() themselves, their batches delivered (two callbacks that
//     both close would wait for each other).
//
// Locking: one mutex, `m_`, guards the open, ready and launched batches, the
// items' states, the running count, the list of every thread's frames (not
// a thread's own list, which only that thread touches), the helpers, the flags and
// the counters. It is
// never held while user code runs (the bulk function, the executor, a
// completion's resolution and so the callbacks and resumptions it runs, a
// stop callback, Key's or T's copies and destructors). Stop callbacks of
// items take it; so an item's callback is reset (which waits for a run on
// another thread) only with it released.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "../../batch_completion.hpp"
#include "../../batch_options.hpp"
#include "../../completion.hpp"
#include "../../errors.hpp"
#include "../../executor.hpp"
#include "../../stop_token.hpp"
#include "../../task.hpp"
#include "../after.hpp"
#include "../chrono.hpp"
#include "../task_base.hpp"
#include "../unwind.hpp"
#include "../worker_threads.hpp"
#include "batch.hpp"
#include "bulk_fn.hpp"

namespace singleflight::detail {

template <class Key, class T>
class batch_queue final : public batch_sink<Key, T> {
 public:
  using batch_t = batch<Key, T>;
  using item_t = batch_item<Key, T>;
  using state = typename item_t::state;
  using clock = std::chrono::steady_clock;

  // Starts the window thread: throws std::system_error when it cannot.
  batch_queue(std::unique_ptr<bulk_call<Key, T>> bulk, const batch_options& o)
      : bulk_(std::move(bulk)),
        max_batch_(o.max_batch),
        window_(o.window),
        max_running_(o.max_in_flight_batches),
        exec_(o.flight.executor),
        use_exec_(static_cast<bool>(o.flight.executor) && !o.flight.executor.owns_threads()),
        dropped_(std::make_exception_ptr(cancelled_error())),
        closed_error_(std::make_exception_ptr(closed_error())),
        broken_(std::make_exception_ptr(broken_promise_error())),
        workers_(worker_threads::default_idle_for, o.max_threads),
        window_thread_(worker_threads::default_idle_for, 1) {
    auto j = worker_threads::make_job([this] { window_loop(); });
    (void)window_thread_.post(j);  // open: never refused; throws when no thread can start
  }
  batch_queue(const batch_queue&) = delete;
  batch_queue& operator=(const batch_queue&) = delete;
  // Stops the window thread and the workers, waits for every bulk call and
  // delivery on other threads, and joins the threads. Must not run on them.
  ~batch_queue() { close_finish(wait_for::everyone); }

  // add(key, st, c): the body of a key's flight. Puts the key into the open
  // batch (opening one, and starting its window, if there is none), or
  // resolves `c` at once when the flight already stopped or the loader is
  // closed. Called with no lock held by the thread starting the flight.
  // Throws what allocation throws (the group fails the flight with it).
  void add(Key key, stop_token st, completion<T> c) {
    auto it = std::make_unique<item_t>(this, std::move(key), std::move(c));
    // May run item_stopped right here, on this thread (a stopped token).
    it->on_stop.emplace(std::move(st), typename item_t::stopped{it.get()});
    bool wake = false;
    bool was_closed = false;
    {
      std::lock_guard<std::mutex> lk(m_);
      was_closed = closed_;
      if (it->st == state::joining && !closed_) {
        if (!pending_) {
          pending_ = std::make_shared<batch_t>(this, after(clock::now(), window_));
          wake = true;  // the window thread starts timing it
        }
        if (helpers_ != 0) help_cv_.notify_all();  // a helper may run the batch
        batch_t& b = *pending_;
        // A throw here leaves `it` ours and the batch unchanged.
        if (b.sent.capacity() < b.items.size() + 1) b.sent.reserve(2 * (b.items.size() + 1));
        b.items.push_back(std::move(it));  // strong guarantee
        item_t& added = *b.items.back();
        added.st = state::pending;
        added.owner = &b;
        ++b.live;
        ++pending_keys_;
        if (max_batch_ != 0 && b.live >= max_batch_) {
          ready_.push_back(std::move(pending_));  // full: dispatched at once
          wake = true;
        }
      } else {
        it->st = state::done;  // stopped while joining, or closed: ours to resolve
      }
    }
    if (wake) window_cv_.notify_one();
    if (it) {
      it->on_stop.reset();
      it->done.set_exception(was_closed ? closed_error_ : dropped_);
    }
  }

  // flush(): the open batch is closed now and dispatched as soon as a bulk
  // call may start (or freed unrun when every key left), without waiting for
  // its window. Nothing to do without one. Thread-safe.
  void flush() {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (!pending_) return;
      ready_.push_back(std::move(pending_));
    }
    window_cv_.notify_one();
  }

  // hold() / release(): while held, the open batch's window does not close
  // (max_batch and flush() still dispatch it): load_many's keys go together.
  void hold() {
    std::lock_guard<std::mutex> lk(m_);
    ++holds_;
  }
  void release() noexcept {
    {
      std::lock_guard<std::mutex> lk(m_);
      --holds_;
    }
    window_cv_.notify_one();
  }

  // close_begin(): keys added from now on are resolved with closed_error at
  // once. (The group's close() then stops every flight, which drops every
  // pending key and stops every running bulk call.)
  void close_begin() {
    std::lock_guard<std::mutex> lk(m_);
    closed_ = true;
  }
  bool closed() const {
    std::lock_guard<std::mutex> lk(m_);
    return closed_;
  }

  // close_finish(wait): waits until no other thread calls a bulk function
  // or delivers a batch (wait_for::everyone), the same but for threads that
  // are in close_finish themselves, their batches delivered
  // (wait_for::others_not_closing: close() from a callback), or not at all
  // (wait_for::nobody: close() from a bulk function); then stops the window
  // thread and the workers and joins them (worker_threads::close: none when
  // the calling thread is one of the library's), and frees the batches left
  // (their keys all resolved by then). Idempotent.
  // With `until` (others_not_closing only), it gives up at that time and
  // returns false, stopping and joining nothing (a later close_finish does).
  enum class wait_for { nobody, others_not_closing, everyone };
  bool close_finish(wait_for wait, std::optional<clock::time_point> until = std::nullopt) {
    std::vector<std::shared_ptr<batch_t>> left;
    {
      std::unique_lock<std::mutex> lk(m_);
      if (wait == wait_for::everyone) {
        drained_cv_.wait(lk, [&] { return only_own_frames_locked(); });
      } else if (wait == wait_for::others_not_closing) {
        closer self{std::this_thread::get_id(), closers_};
        closers_ = &self;
        drained_cv_.notify_all();  // a closer waiting for this thread's frames re-checks
        const auto drained = [&] { return only_own_or_closing_frames_locked(); };
        bool ok = true;
        if (until) {
          ok = drained_cv_.wait_until(lk, *until, drained);
        } else {
          drained_cv_.wait(lk, drained);
        }
        closer** p = &closers_;
        while (*p != &self) p = &(*p)->next;
        *p = self.next;
        if (!ok) return false;
      }
      stopping_ = true;
      if (pending_) left.push_back(std::move(pending_));
      for (auto& b : ready_) left.push_back(std::move(b));
      ready_.clear();
    }
    window_cv_.notify_all();
    window_thread_.close();  // on one of the library's threads: joins nothing, waits for nothing
    workers_.close();
    left.clear();  // items' stop callbacks reset, unresolved completions (none) broken
    return true;
  }

  // Frames of the calling thread, read from its own list (frames_here_), never
  // from the other threads': the cost of a call does not grow with the number
  // of running batches. has_frames(): a cheap first look (one load of a
  // thread_local pointer when this thread is inside no loader).
  bool has_frames() const noexcept {
    for (const frame* f = frames_here_; f != nullptr; f = f->below) {
      if (f->q == this) return true;
    }
    return false;
  }

  // drain_here(): delivers the rest of every batch this thread is
  // delivering (a callback or resumption it ran is about to block).
  void drain_here() {
    for (;;) {
      batch_t* b = nullptr;
      for (const frame* f = frames_here_; f != nullptr; f = f->below) {
        if (f->q == this && f->delivering &&
            f->b->next.load(std::memory_order_relaxed) < f->b->sent.size()) {
          b = f->b;
          break;
        }
      }
      if (b == nullptr) return;
      deliver_from(*b);  // alive: its frame is on this thread's stack
    }
  }

  // delivering_here(): whether this thread is delivering a batch.
  bool delivering_here() const noexcept {
    for (const frame* f = frames_here_; f != nullptr; f = f->below) {
      if (f->q == this && f->delivering) return true;
    }
    return false;
  }

  // calling_here(): the batches whose bulk function this thread is running
  // and that are not resolved yet (their keys are read-only and the batches
  // alive while the frames are on this thread's stack).
  std::vector<const batch_t*> calling_here() const {
    std::vector<const batch_t*> out;
    for (const frame* f = frames_here_; f != nullptr; f = f->below) {
      if (f->q == this && calling(*f)) out.push_back(f->b);
    }
    return out;
  }
  // calling_any_here(): whether calling_here() is not empty (allocates nothing).
  bool calling_any_here() const noexcept {
    for (const frame* f = frames_here_; f != nullptr; f = f->below) {
      if (f->q == this && calling(*f)) return true;
    }
    return false;
  }

  // may_help_here(): whether a load made on this thread should run batches
  // itself while it waits (help_until): a thread calling this loader's bulk
  // function, or one of its workers (delivering a batch). Not a foreign
  // thread that delivers (one resolving a batch_completion): bulk calls run
  // only on the loader's threads or its executor's.
  bool may_help_here() const noexcept { return workers_.on_own_thread() || calling_any_here(); }

  // The counters (calls and joins are the group's: the loader adds them).
  batch_stats stats() const {
    std::lock_guard<std::mutex> lk(m_);
    batch_stats s;
    s.batches = batches_;
    s.keys = keys_;
    s.largest_batch = largest_;
    s.dropped_keys = dropped_keys_;
    s.skipped_batches = skipped_;
    s.stopped_batches = stopped_;
    s.failed_batches = failed_;
    s.pending_keys = pending_keys_;
    s.running_batches = running_;
    return s;
  }

  // ---- batch_sink ---------------------------------------------------------

  void item_stopped(item_t* it) noexcept override {
    completion<T> drop;
    // Held while the bulk call's stop callbacks run here (user code that may wait for the
    // batch's delivery): the delivery then does not reset this item's callback (it would
    // wait for this run), and the batch, with this callback, goes when both are done.
    std::shared_ptr<batch_t> stop;
    {
      std::lock_guard<std::mutex> lk(m_);
      switch (it->st) {
        case state::joining:
          it->st = state::gone_early;
          break;
        case state::pending:
          it->st = state::dropped;
          drop = std::move(it->done);
          --it->owner->live;
          --pending_keys_;
          ++dropped_keys_;
          break;
        case state::sent:
          it->st = state::left;
          if (--it->owner->wanted == 0) {
            stop = it->owner->weak_from_this().lock();  // null: being freed, nothing to stop
            if (stop) {
              it->stopping = true;
              ++stopped_;
            }
          }
          break;
        default:
          break;
      }
    }
    // The flight has settled for its waiters (or has none): resolving only
    // frees the key, so that a newcomer starts a fresh flight at once.
    if (drop) drop.set_exception(dropped_);
    if (stop) stop->stop.request_stop();
  }

  void results_ready(std::shared_ptr<batch_t> b) noexcept override {
    frame f{this, std::this_thread::get_id(), b.get(), /*delivering=*/true};
    {
      std::lock_guard<std::mutex> lk(m_);
      for (item_t* it : b->sent) it->st = state::done;  // later stops change nothing
      --running_;
      if (b->whole_error) ++failed_;
      link_locked(f);
    }
    window_cv_.notify_one();  // a bulk call's slot is free
    // Stop callbacks no longer matter; reset them with no lock held (each
    // reset waits for a run of its callback on another thread), but not one
    // that is running the bulk call's stop (`stopping`, stable once the items
    // are done): it may be waiting for this very delivery. It goes with the
    // batch (item_stopped holds it meanwhile).
    for (auto& it : b->items) {
      if (!it->stopping) it->on_stop.reset();
    }
    deliver_from(*b);  // every key has its result (nested drains ran inside)
    {
      std::lock_guard<std::mutex> lk(m_);
      unlink_locked(f);
      drained_cv_.notify_all();  // under the lock: close_finish may free us right after
    }
  }

  // help_until(done): the calling thread -- one of the loader's, about to block in a load
  // made from a bulk function or a delivery callback -- runs batches itself until done()
  // (read under the queue's lock) holds: the open batch and closed ones waiting for a slot
  // are started at once (max_in_flight_batches does not count them), and batches posted to
  // a busy worker are claimed from it. So a load made on the loader's threads never waits
  // for a slot or a thread that the waiting threads themselves hold. Whatever done() reads
  // must change inside settle().
  template <class Done>
  void help_until(Done done) {
    for (;;) {
      std::shared_ptr<batch_t> run, stale;
      {
        std::unique_lock<std::mutex> lk(m_);
        ++helpers_;
        help_cv_.wait(lk, [&] { return done() || stealable_locked(); });
        --helpers_;
        if (done()) return;
        if (!launched_.empty()) {
          run = std::move(launched_.front());
          launched_.pop_front();
          run->listed = false;
          // Claimed by its worker, which is about to unlist it: not ours.
          if (run->claimed.exchange(true, std::memory_order_acq_rel)) stale = std::move(run);
        } else {
          run = take_ready_locked();
        }
      }
      stale.reset();  // not the last reference: its claimer holds one
      if (run) run_batch(run);
    }
  }
  // settle(f): runs f() (what a helper's done() reads changes) under the
  // queue's lock and wakes the helpers: once the lock is released nothing
  // here is touched, so the helper may return and the loader go.
  template <class F>
  void settle(F&& f) {
    const std::lock_guard<std::mutex> lk(m_);
    f();
    help_cv_.notify_all();
  }

 private:
  // Which thread calls a bulk function (delivering = false) or delivers a
  // batch (true). Lives on that thread's stack, in two lists: every thread's
  // frames of this queue (frames_, under m_: close_finish waits for the other
  // threads'), and this thread's frames of every queue of this type
  // (frames_here_, innermost first; read and written by this thread only, so
  // without a lock).
  struct frame {
    const batch_queue* q;
    std::thread::id thread;
    batch_t* b;
    bool delivering;
    frame* prev = nullptr;   // frames_ (m_)
    frame* next = nullptr;   // frames_ (m_)
    frame* below = nullptr;  // frames_here_ (this thread)
  };
  // The calling thread's frames, keyed by queue (frame::q). A thread_local of
  // the class, not "which thread is inside this queue": each queue finds its
  // own frames by its address. (Under -fvisibility=hidden each shared object
  // has its own copy, as for worker_threads' current thread: a loader's
  // re-entrant calls are recognised when compiled in the shared object that
  // runs its bulk calls and deliveries.)
  static inline thread_local frame* frames_here_ = nullptr;

  static bool calling(const frame& f) noexcept {
    return !f.delivering && !f.b->resolved.load(std::memory_order_acquire);
  }

  void link_locked(frame& f) noexcept {
    f.next = frames_;
    if (frames_ != nullptr) frames_->prev = &f;
    frames_ = &f;
    f.below = frames_here_;
    frames_here_ = &f;
  }
  void unlink_locked(frame& f) noexcept {
    if (f.prev != nullptr) {
      f.prev->next = f.next;
    } else {
      frames_ = f.next;
    }
    if (f.next != nullptr) f.next->prev = f.prev;
    // Frames nest (each lives in a scope of the one below), so f is the top; searched
    // all the same, as an unwind may leave them in any order.
    frame** p = &frames_here_;
    while (*p != nullptr && *p != &f) p = &(*p)->below;
    if (*p != nullptr) *p = f.below;
  }
  bool only_own_frames_locked() const noexcept {
    for (frame* f = frames_; f != nullptr; f = f->next) {
      if (f->thread != std::this_thread::get_id()) return false;
    }
    return true;
  }
  // The same, but frames of threads waiting in close_finish do not count.
  bool only_own_or_closing_frames_locked() const noexcept {
    for (frame* f = frames_; f != nullptr; f = f->next) {
      if (f->thread == std::this_thread::get_id()) continue;
      bool closing = false;
      for (closer* c = closers_; c != nullptr && !closing; c = c->next) {
        closing = c->thread == f->thread;
      }
      if (!closing) return false;
    }
    return true;
  }

  // A thread waiting in close_finish(others_not_closing). Lives on its
  // stack; linked under m_.
  struct closer {
    std::thread::id thread;
    closer* next;
  };

  // Where launch() on this thread is handing a task to the executor: a task
  // the executor destroys unrun right there (refused or dropped) hands its
  // batch back, and launch() fails it on a worker with the executor's error.
  struct handback {
    const batch_queue* q;
    std::shared_ptr<batch_t> b;
  };
  static inline thread_local handback* handback_ = nullptr;

  // The task that runs one bulk call on the executor. Destroyed unrun later
  // (an executor dropped it), it fails the batch there.
  class bulk_task final : public task_base {
   public:
    bulk_task(batch_queue* q, std::shared_ptr<batch_t> b) noexcept : q_(q), b_(std::move(b)) {}
    ~bulk_task() override {
      if (ran_) return;
      if (handback_ != nullptr && handback_->q == q_ && !handback_->b) {
        handback_->b = std::move(b_);
        return;
      }
      if (b_->claimed.exchange(true, std::memory_order_acq_rel)) return;
      finish_whole(b_, std::make_exception_ptr(
                           error("singleflight::batch_loader: the executor dropped the bulk "
                                 "call's task without running it")));
    }
    void run() override {
      ran_ = true;
      if (b_->claimed.exchange(true, std::memory_order_acq_rel)) return;
      q_->run_batch(b_);
    }

   private:
    batch_queue* q_;
    std::shared_ptr<batch_t> b_;
    bool ran_ = false;
  };

  // The job that runs one bulk call on a worker, unless a helper claimed the
  // batch first. A posted job always runs (worker_threads runs every queued
  // job); refused, launch() takes the batch back.
  class bulk_job final : public worker_threads::job {
   public:
    bulk_job(batch_queue* q, std::shared_ptr<batch_t> b) noexcept : q_(q), b_(std::move(b)) {}
    ~bulk_job() override {
      if (b_ && !b_->claimed.exchange(true, std::memory_order_acq_rel)) {
        q_->unlist(*b_);
        finish_whole(b_, std::make_exception_ptr(abandoned_error()));
      }
    }
    void run() override {
      const std::shared_ptr<batch_t> b = std::move(b_);
      if (b->claimed.exchange(true, std::memory_order_acq_rel)) return;  // a helper runs it
      q_->unlist(*b);
      q_->run_batch(b);
    }
    std::shared_ptr<batch_t> take() noexcept { return std::move(b_); }

   private:
    batch_queue* q_;
    std::shared_ptr<batch_t> b_;
  };

  // unlist(b): b leaves the list of batches helpers may claim (its claimer
  // holds another reference).
  void unlist(batch_t& b) noexcept {
    std::shared_ptr<batch_t> ref;
    {
      const std::lock_guard<std::mutex> lk(m_);
      if (!b.listed) return;
      ref = std::move(*b.listed_at);
      launched_.erase(b.listed_at);
      b.listed = false;
    }
  }

  // fail_elsewhere(b, e): every key of b (claimed by the caller) fails with e,
  // delivered on a worker, not on the calling thread (the window thread: a
  // callback that blocks there would stall dispatch). Here only when no
  // worker takes the job (closed, or no thread could start).
  void fail_elsewhere(std::shared_ptr<batch_t> b, std::exception_ptr e) noexcept {
    std::unique_ptr<worker_threads::job> j;
    try {
      j = worker_threads::make_job([b, e]() mutable { finish_whole(b, std::move(e)); });
    } catch (...) {
    }
    if (j && !workers_.try_post(j)) return;
    finish_whole(b, std::move(e));
  }

  // finish_whole(b, e): every key of b fails with e, unless b was resolved.
  // Touches nothing but b (the queue is alive while b is unresolved: the
  // group's close waits for b's keys).
  static void finish_whole(const std::shared_ptr<batch_t>& b, std::exception_ptr e) noexcept {
    if (b->resolved.exchange(true, std::memory_order_acq_rel)) return;
    b->whole_error = std::move(e);
    b->sink->results_ready(b);
  }

  // Every sent key of b gets its result, from b->next on (shared with the
  // nested drains of this same thread).
  static void deliver_from(batch_t& b) noexcept {
    for (;;) {
      const std::size_t i = b.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= b.sent.size()) return;
      completion<T>& c = b.sent[i]->done;
      if (b.whole_error) {
        // The last key takes the batch's reference, before its waiters wake: a waiter never
        // reads an exception whose last reference another thread may drop (TSan cannot see
        // exception_ptr's count; nor can it see that this is safe). An earlier index's copy
        // was made before its resolution ran any callback (and so any nested drain).
        if (i + 1 == b.sent.size()) {
          c.set_exception(std::move(b.whole_error));
        } else {
          c.set_exception(b.whole_error);
        }
      } else if (b.results[i].value) {
        try {
          c.set_value(std::move(*b.results[i].value));
        } catch (...) {  // T's move into set_value's parameter threw: that key fails
          c.set_exception(std::current_exception());
        }
      } else {
        c.set_exception(std::move(b.results[i].error));
      }
    }
  }

  // run_batch(b): the bulk call (on a worker, the executor's thread or a
  // helper), by b's claimer. Not run when every key left meanwhile.
  void run_batch(const std::shared_ptr<batch_t>& b) {
    bool abandoned = false;
    {
      std::lock_guard<std::mutex> lk(m_);
      if (b->wanted == 0) {  // every key's flight stopped after dispatch: nobody wants it
        abandoned = true;
        ++skipped_;
        --stopped_;
        --batches_;
        keys_ -= b->sent.size();
      }
    }
    if (abandoned) {
      finish_whole(b, dropped_);
      return;
    }
    try {
      b->keys.reserve(b->sent.size());
      for (item_t* it : b->sent) b->keys.push_back(std::move(it->key));
    } catch (...) {  // allocation, or Key's move
      finish_whole(b, std::current_exception());
      return;
    }
    frame f{this, std::this_thread::get_id(), b.get(), /*delivering=*/false};
    {
      std::lock_guard<std::mutex> lk(m_);
      link_locked(f);
    }
    b->call_phase.fetch_or(batch_t::phase_in_call, std::memory_order_acq_rel);
    // Whether the completion was dropped during the call (batch_dropped left b to us).
    auto end_call = [&]() noexcept {
      {
        std::lock_guard<std::mutex> lk(m_);
        unlink_locked(f);
        drained_cv_.notify_all();
      }
      return (b->call_phase.fetch_or(batch_t::phase_ended, std::memory_order_acq_rel) &
              batch_t::phase_dropped) != 0;
    };
    // The bulk function ended its thread: the keys fail, the unwind goes on.
    on_unwind abandoned_call([&] {
      (void)end_call();
      finish_whole(b, std::make_exception_ptr(abandoned_error()));
    });
    std::exception_ptr thrown;
    try {
      bulk_->call(std::span<const Key>(b->keys), b->stop.get_token(),
                  batch_completion_access::make(b));
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      thrown = std::current_exception();
    }
    abandoned_call.disarm();
    const bool dropped = end_call();
    if (thrown) {
      finish_whole(b, std::move(thrown));
    } else if (dropped) {
      finish_whole(b, broken_);
    }
  }

  // launch(b): b's bulk call goes to the executor or a worker. Never fails b
  // on this thread (the window thread) while a worker can take the failure.
  void launch(std::shared_ptr<batch_t> b) noexcept {
    if (use_exec_) {
      launch_on_executor(std::move(b));
    } else {
      launch_on_worker(std::move(b));
    }
  }

  void launch_on_executor(std::shared_ptr<batch_t> b) noexcept {
    task t;
    try {
      t = task(std::make_unique<bulk_task>(this, b));
    } catch (...) {  // allocation: b is still ours
      b->claimed.store(true, std::memory_order_release);
      fail_elsewhere(std::move(b), std::current_exception());
      return;
    }
    b.reset();  // the task holds the only reference: this thread frees no batch
    handback h{this, nullptr};
    handback_ = &h;
    std::exception_ptr refused;
    try {
      executor_access::submit(exec_, std::move(t));
    } catch (...) {  // the executor's own error (thread_pool: overloaded_error, closed_error)
      refused = std::current_exception();
    }
    handback_ = nullptr;
    if (!h.b) return;  // taken (or kept, then failed where it is dropped)
    if (h.b->claimed.exchange(true, std::memory_order_acq_rel)) return;
    if (!refused) {
      refused = std::make_exception_ptr(
          error("singleflight::batch_loader: the executor dropped the bulk call's task "
                "without running it"));
    }
    fail_elsewhere(std::move(h.b), std::move(refused));
  }

  void launch_on_worker(std::shared_ptr<batch_t> b) noexcept {
    {
      std::lock_guard<std::mutex> lk(m_);
      try {  // listed for helpers (not when the list cannot grow: then only its worker runs it)
        launched_.push_back(b);
        b->listed_at = std::prev(launched_.end());
        b->listed = true;
      } catch (...) {
      }
      if (helpers_ != 0) help_cv_.notify_all();
    }
    std::unique_ptr<worker_threads::job> j;
    try {
      j = std::make_unique<bulk_job>(this, std::move(b));
    } catch (...) {  // allocation: b is still ours
      if (!b->claimed.exchange(true, std::memory_order_acq_rel)) {
        unlist(*b);
        fail_elsewhere(std::move(b), std::current_exception());
      }
      return;
    }
    std::exception_ptr refused = workers_.try_post(j);
    if (!refused) return;  // this thread holds no reference now
    b = static_cast<bulk_job&>(*j).take();
    j.reset();
    if (b->claimed.exchange(true, std::memory_order_acq_rel)) return;  // a helper runs it
    unlist(*b);
    fail_elsewhere(std::move(b), std::move(refused));
  }

  bool slot_free_locked() const noexcept { return max_running_ == 0 || running_ < max_running_; }

  // For help_until: a batch a helper may run.
  bool stealable_locked() const noexcept {
    if (!launched_.empty()) return true;
    for (const auto& b : ready_) {
      if (b->live != 0) return true;
    }
    return pending_ && pending_->live != 0;
  }
  // A closed or the open batch with keys, started now (no slot needed), claimed.
  std::shared_ptr<batch_t> take_ready_locked() noexcept {
    std::shared_ptr<batch_t> b;
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if ((*it)->live != 0) {
        b = std::move(*it);
        ready_.erase(it);
        break;
      }
    }
    if (!b && pending_ && pending_->live != 0) b = std::move(pending_);
    if (!b) return b;
    start_locked(*b);
    b->claimed.store(true, std::memory_order_relaxed);  // nobody else holds it
    return b;
  }

  // start_locked(b): b's pending items are sent; b counts as running. No
  // allocation (sent's capacity was reserved by add).
  void start_locked(batch_t& b) noexcept {
    for (auto& it : b.items) {
      if (it->st != state::pending) continue;
      it->st = state::sent;
      b.sent.push_back(it.get());
    }
    b.wanted = b.sent.size();
    pending_keys_ -= b.sent.size();
    ++running_;
    ++batches_;
    keys_ += b.sent.size();
    if (b.sent.size() > largest_) largest_ = b.sent.size();
  }

  // The batches to start now, and those to free unrun (every key dropped).
  void take_due_locked(clock::time_point now, std::vector<std::shared_ptr<batch_t>>& start,
                       std::vector<std::shared_ptr<batch_t>>& skip) {
    while (!ready_.empty()) {
      if (ready_.front()->live == 0) {
        skip.push_back(std::move(ready_.front()));
      } else if (slot_free_locked()) {
        start_locked(*ready_.front());
        start.push_back(std::move(ready_.front()));
      } else {
        break;
      }
      ready_.pop_front();
    }
    if (!ready_.empty() || !pending_ || holds_ != 0 || now < pending_->due) return;
    if (pending_->live == 0) {
      skip.push_back(std::move(pending_));
    } else if (slot_free_locked()) {
      start_locked(*pending_);
      start.push_back(std::move(pending_));
    }
  }

  // The window thread: closes batches when due and dispatches them. Runs no
  // user code but the executor (which must hand the task off and return).
  void window_loop() {
    std::vector<std::shared_ptr<batch_t>> start, skip;
    std::unique_lock<std::mutex> lk(m_);
    while (!stopping_) {
      try {
        take_due_locked(clock::now(), start, skip);
      } catch (...) {  // the vectors' allocation: try again on the next wake
      }
      if (!start.empty() || !skip.empty()) {
        skipped_ += skip.size();
        lk.unlock();
        skip.clear();  // items' callbacks reset, with no lock held
        for (auto& b : start) launch(std::move(b));
        start.clear();
        lk.lock();
        continue;
      }
      const bool timed = pending_ && holds_ == 0 && ready_.empty() && slot_free_locked() &&
                         pending_->due != clock::time_point::max();
      if (timed) {
        const clock::time_point due = pending_->due;  // pending_ may go while we wait
        window_cv_.wait_until(lk, due);
      } else {
        window_cv_.wait(lk);
      }
    }
  }

  const std::unique_ptr<bulk_call<Key, T>> bulk_;
  const std::size_t max_batch_;
  const std::chrono::nanoseconds window_;
  const std::size_t max_running_;
  const executor exec_;
  const bool use_exec_;
  const std::exception_ptr dropped_;       // resolves dropped keys (nobody sees it)
  const std::exception_ptr closed_error_;  // resolves keys added after close
  const std::exception_ptr broken_;        // a completion destroyed unresolved

  mutable std::mutex m_;
  std::condition_variable window_cv_;   // the window thread waits on it
  std::condition_variable drained_cv_;  // close_finish waits on it for frames to go
  std::condition_variable help_cv_;     // help_until waits on it
  std::size_t helpers_ = 0;             // m_: threads in help_until
  // m_: batches posted to a worker and not claimed yet (help_until may run them).
  std::list<std::shared_ptr<batch_t>> launched_;
  std::shared_ptr<batch_t> pending_;            // m_: the open batch
  std::deque<std::shared_ptr<batch_t>> ready_;  // m_: closed, waiting for a slot
  std::size_t running_ = 0;                     // m_: bulk calls not yet answered
  std::size_t holds_ = 0;                       // m_
  bool closed_ = false;                         // m_
  bool stopping_ = false;                       // m_
  frame* frames_ = nullptr;                     // m_
  closer* closers_ = nullptr;                   // m_
  std::uint64_t batches_ = 0, keys_ = 0, largest_ = 0, dropped_keys_ = 0, skipped_ = 0,
                stopped_ = 0, failed_ = 0, pending_keys_ = 0;  // m_

  worker_threads workers_;        // the bulk calls
  worker_threads window_thread_;  // last: started once everything above exists; joined first
};

}  // namespace singleflight::detail
