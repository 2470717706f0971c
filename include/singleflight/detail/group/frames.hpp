// singleflight/detail/group/frames.hpp -- internal; do not include directly.
//
// Which threads are inside a group, kept *in the group* (guarded by the
// lock of the shard they concern), never in a thread_local: a thread_local in a function-local
// static of an inline function is one per shared object under
// -fvisibility=hidden (and per DLL on Windows), so two modules instantiating
// the group would each see only their own frames.
//
//   frame        a thread that holds some of the group's user counts while it
//                runs user code (fn, an executor, a stop callback it
//                triggers): close() called from that code does not wait for
//                those counts.
//   loop_record  a notification loop in progress on a thread, registered
//                while it still holds work the group counts as users (async
//                observers not yet gone round, flights they started): a
//                thread about to block inside the group (do_, close()) first
//                runs this work itself, or it would wait for it forever.
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

#include "../../task.hpp"
#include "wake_batch.hpp"

namespace singleflight::detail {

// An intrusive doubly linked list of records with `prev`/`next` members,
// newest first. Guarded by the lock of the shard that owns the list.
template <class R>
class record_list {
 public:
  void push(R& r) noexcept {
    r.prev = nullptr;
    r.next = head_;
    if (head_ != nullptr) head_->prev = &r;
    head_ = &r;
    r.linked = true;
  }
  void erase(R& r) noexcept {
    if (!r.linked) return;
    (r.prev != nullptr ? r.prev->next : head_) = r.next;
    if (r.next != nullptr) r.next->prev = r.prev;
    r.prev = r.next = nullptr;
    r.linked = false;
  }
  bool empty() const noexcept { return head_ == nullptr; }
  R* head() const noexcept { return head_; }

 private:
  R* head_ = nullptr;
};

// frame: "this thread holds `holds` of the group's user counts while it runs
// user code". Lives on that thread's stack; linked while the counts are held.
struct frame {
  explicit frame(std::size_t n = 1) noexcept : holds(n) {}
  frame(const frame&) = delete;
  frame& operator=(const frame&) = delete;
  ~frame() = default;

  std::thread::id thread = std::this_thread::get_id();
  std::size_t holds;
  frame* prev = nullptr;
  frame* next = nullptr;
  bool linked = false;
};

// loop_record: one notification loop in progress (see notifier::notify).
// Lives on the notifying thread's stack. Only that thread reads or changes
// `batch`, `deferred` and `orphaned` (nested calls on the same thread
// included); the shard's lock guards the links.
struct loop_record {
  explicit loop_record(wake_batch* b) noexcept : batch(b) {}
  loop_record(const loop_record&) = delete;
  loop_record& operator=(const loop_record&) = delete;
  ~loop_record() = default;

  std::thread::id thread = std::this_thread::get_id();
  wake_batch* batch;           // what the loop has not notified yet
  std::vector<task> deferred;  // flights started inside the loop, run when it is over
  bool orphaned = false;       // the group was destroyed by code this loop ran
  loop_record* prev = nullptr;
  loop_record* next = nullptr;
  bool linked = false;
};

// The number of user counts `me` holds in the group: its frames' counts and
// one per notification loop it has registered.
inline std::size_t held_by(const record_list<frame>& frames, const record_list<loop_record>& loops,
                           std::thread::id me) noexcept {
  std::size_t n = 0;
  for (const frame* f = frames.head(); f != nullptr; f = f->next) {
    if (f->thread == me) n += f->holds;
  }
  for (const loop_record* l = loops.head(); l != nullptr; l = l->next) {
    if (l->thread == me) ++n;
  }
  return n;
}

// The innermost registered loop of `me`, or null.
inline loop_record* innermost_loop(const record_list<loop_record>& loops,
                                   std::thread::id me) noexcept {
  for (loop_record* l = loops.head(); l != nullptr; l = l->next) {
    if (l->thread == me) return l;
  }
  return nullptr;
}

// The innermost loop of `me` that still has work (claimed waiters not yet
// notified, or deferred flights), or null.
inline loop_record* loop_with_work(const record_list<loop_record>& loops,
                                   std::thread::id me) noexcept {
  for (loop_record* l = loops.head(); l != nullptr; l = l->next) {
    if (l->thread == me && (!l->batch->empty() || !l->deferred.empty())) return l;
  }
  return nullptr;
}

}  // namespace singleflight::detail
