// singleflight/detail/group/flight_pool.hpp -- internal; do not include directly.
//
// flight_pool<F>: finished flights of type F kept by the thread that finished
// them, for its next start (in any group whose flights are F), so that a
// steady uncontended leader path allocates nothing and writes no line that
// another core wrote a moment ago. A pool shared by the threads of a shard
// (what the table had before) hands a thread a flight whose six cache lines
// the other core has just written; a thread's own pool hands it the flight
// it finished itself.
//
// Owns: one list per thread (a function-local thread_local), at most `limit`
// flights long; each flight in it is unlinked, settled, unique (no one else
// holds a reference), retired (no stop state, no error, no value; never traced)
// and keeps its last key, whose storage the next key's assignment reuses.
// The list is freed when the thread exits (thread_local destruction).
//
// Locking: none. Only the owning thread touches its list; a flight enters it
// only when nobody else can reach it (flight_base::unique()).
//
// What it keeps after a group is gone: up to `limit` flights per thread and
// per flight type, with their last keys, until that thread's next start or
// its exit. (Keeping which thread is inside *which group* in a thread_local
// would break across shared objects; this is only a cache of memory: a
// second pool per shared object changes nothing but the hit rate.)
#pragma once

#include <cstddef>

namespace singleflight::detail {

template <class F>
class flight_pool {
 public:
  // Flights kept per thread (and per flight type).
  static constexpr std::size_t limit = 8;

  // A pooled flight of this thread, or null. Never throws.
  static F* take() noexcept {
    list& l = mine();
    F* f = l.head;
    if (f != nullptr) {
      l.head = f->spare_next;
      f->spare_next = nullptr;
      --l.count;
    }
    return f;
  }

  // Puts back a flight taken from this thread's pool that was not used (a
  // start that threw after taking it). Never throws.
  static void put_back(F* f) noexcept {
    list& l = mine();
    f->spare_next = l.head;
    l.head = f;
    ++l.count;
  }

  // Keeps f (unique, unlinked, retired) for this thread's next start; false
  // when the pool is full (the caller releases f). Never throws.
  static bool give(F* f) noexcept {
    list& l = mine();
    if (l.count >= limit) return false;
    put_back(f);
    return true;
  }

  // Releases this thread's pooled flights (tests use it to start cold).
  static void clear() noexcept { mine().clear(); }

  // How many flights this thread keeps now (tests check the bound).
  static std::size_t size() noexcept { return mine().count; }

 private:
  struct list {
    list() = default;
    list(const list&) = delete;
    list& operator=(const list&) = delete;
    ~list() { clear(); }
    void clear() noexcept {
      while (head != nullptr) {
        F* f = head;
        head = f->spare_next;
        f->release();
      }
      count = 0;
    }
    F* head = nullptr;
    std::size_t count = 0;
  };

  static list& mine() noexcept {
    static thread_local list l;
    return l;
  }
};

}  // namespace singleflight::detail
