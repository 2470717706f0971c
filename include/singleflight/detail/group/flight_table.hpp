// singleflight/detail/group/flight_table.hpp -- internal; do not include directly.
//
// flight_table<Key, T, Hash, KeyEqual>: the key's side of the group's table,
// and the first rung of the group that is a template. Below it, none of which
// depends on Key or T: shard_set (shard_set.hpp: the shards, the links, the
// bookkeeping), notifier (notification.hpp), deadlines (the timer and delivery
// threads), lifecycle (close, the drain, the joins), leader_stop (an inline
// leader's stop callback) and execution (running a flight's fn, its body
// erased). Here:
//   * the user's Hash and KeyEqual, and the lookup of a key (the flight
//     carries its key and is its own node);
//   * making a flight the entry for a key (its key assigned into the storage
//     a recycled flight kept);
//   * recycling: finished flights, with their key's storage, kept by the
//     thread that finished them (flight_pool.hpp);
//   * a new flight's start, reported to options.tracer with its key;
//   * the timer's start when options.timeout > 0 (in the constructor: after
//     Hash and KeyEqual are constructed, as when deadlines was above this rung).
//
// Locking: as shard_set: each shard's mutex guards it and its flights; code
// here runs with that lock held unless a comment says otherwise. User code
// never runs under a shard's lock, except KeyEqual (lookups) and Key's copy
// or assignment (a new entry).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "../../options.hpp"
#include "../chrono.hpp"
#include "execution.hpp"
#include "flight.hpp"
#include "flight_pool.hpp"
#include "lifecycle.hpp"
#include "shard_set.hpp"

namespace singleflight::detail {

template <class Key, class T, class Hash, class KeyEqual>
class flight_table : public execution {
 public:
  using flight_t = flight<Key, T>;
  // A reference to one of this table's flights, typed as its base: its
  // members are compiled once in a translation unit, not once per (Key, T).
  // Where the value or the key is needed, get() is cast to flight_t.
  using ref_t = flight_ref<flight_base>;

  // Throws std::system_error when options.timeout > 0 and the timer cannot start. The timer
  // starts here, once the user's Hash and KeyEqual are constructed (a throwing one leaves no
  // thread behind), and before any rung above this one is.
  explicit flight_table(options opts) : execution(std::move(opts)) {
    if (this->opts().timeout > std::chrono::nanoseconds::zero()) this->ensure_timer();
  }

  flight_table(const flight_table&) = delete;
  flight_table& operator=(const flight_table&) = delete;
  ~flight_table() = default;

  // ---- the table ------------------------------------------------------------

  // The entry for `key` (mixed hash `mixed`), or null. Runs KeyEqual.
  template <class P>
  flight_t* find(shard& s, const P& key, std::uint64_t mixed) const {
    if (s.size == 0) return nullptr;
    for (flight_base* f = head_of(s, mixed); f != nullptr; f = f->bucket_next) {
      if (f->hash == mixed && eq_(*static_cast<flight_t*>(f)->key, key))
        return static_cast<flight_t*>(f);
    }
    return nullptr;
  }

  // Makes f the entry for `key`. Throws (Key's copy, allocation) with the
  // table unchanged (f's key may have been overwritten; f is not linked).
  template <class P>
  void insert(shard& s, const P& key, std::uint64_t mixed, flight_t* f) {
    if constexpr (std::is_assignable_v<Key&, const P&>) {
      if (f->key) {
        assign_key(*f->key, key);  // reuses the previous key's storage
      } else {
        f->key.emplace(key);
      }
    } else {
      f->key.emplace(key);
    }
    link(s, f, mixed);
  }

  // ---- recycling --------------------------------------------------------------

  // A flight object for a new start in shard s: one from this thread's pool
  // when there is one. Throws (allocation, a stop state) with nothing
  // changed.
  flight_t* acquire(shard& s, bool stoppable) {
    flight_t* f = flight_pool<flight_t>::take();
    if (f == nullptr) {
      f = new flight_t();
      if (stoppable) {
        try {
          f->stop = stop_source();
        } catch (...) {
          f->release();
          throw;
        }
      }
    } else {
      try {
        f->reuse(stoppable);  // may throw (the stop state)
      } catch (...) {
        flight_pool<flight_t>::put_back(f);
        throw;
      }
    }
    f->shard = s.index;
    return f;
  }

  // Keeps a settled, unlinked flight that nobody else references for this
  // thread's next start, or leaves `mine` to release it.
  void recycle(ref_t& mine) noexcept {
    auto* f = static_cast<flight_t*>(mine.get());
    if (!f->unique() || f->value || f->error) return;
    f->retire();
    if (flight_pool<flight_t>::give(f)) mine.detach();
  }

  // ---- a new flight -------------------------------------------------------------

  // Starts the bookkeeping of a new flight f (just inserted; shard_set's
  // started) and begins its trace. Returns its number.
  std::uint64_t started(shard& s, flight_t* f) noexcept {
    const clock::time_point now = shard_set::started(s, *f);
    if (opts().tracer) f->trace.begin(opts().tracer, number(*f), s.index, *f->key, now);
    return f->seq;
  }

 protected:
  [[no_unique_address]] Hash hash_{};
  [[no_unique_address]] KeyEqual eq_{};

 private:
  template <class P>
  static void assign_key(Key& k, const P& key) {
// GCC 12 at -O3 reports a bogus -Wrestrict overlap inside std::string's
// assignment from a C string once it is inlined here (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#endif
    k = key;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  }
};

}  // namespace singleflight::detail
