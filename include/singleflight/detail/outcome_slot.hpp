// singleflight/detail/outcome_slot.hpp -- internal; do not include directly.
//
// The moves of a delivered outcome into the place a waiting caller reads it from: a
// get_many / load_many slot, a co_get's result, a blocking call's one_waiter, and from
// those slots into the vector get_many / load_many return. T's move is user code and may
// throw. Such a move runs where a throw cannot be passed on (a delivery callback the group
// or the cache runs noexcept, where it would call std::terminate) or where passing it on
// would lose the other keys' outcomes (get_many / load_many's result): instead the place
// receives that exception as the key's outcome (status failed, the same call_info), so the
// key fails alone, its slot is still filled and counted, and nobody is left waiting for it.
//   * put_outcome(slot, o): slot receives o, or the exception its move threw;
//   * append_outcome(out, o): out gains o, or the exception its move threw (only a
//     reallocation of `out` throws: reserve first, and nothing does).
//
// Locking: none; the caller owns the slot (one delivery writes it) or the vector.
#pragma once

#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "../outcome.hpp"
#include "unwind.hpp"

namespace singleflight::detail {

// The outcome to keep when moving `from` threw: that exception, with from's call_info.
template <class T>
outcome<T> move_failed(const outcome<T>& from, std::exception_ptr e) noexcept {
  return outcome<T>(from_flight, from.info(), status::failed, std::move(e));
}

template <class T>
void put_outcome(std::optional<outcome<T>>& slot, outcome<T>&& o) noexcept {
  try {
    slot.emplace(std::move(o));  // T's move
  } catch (...) {  // the slot stays empty when the move throws (noexcept: a forced unwind,
                   // which only a rethrow could pass on, would end the process here anyway)
    slot.emplace(move_failed(o, std::current_exception()));  // holds no T: no T move
  }
}

template <class T>
void append_outcome(std::vector<outcome<T>>& out, outcome<T>&& o) {
  try {
    out.push_back(std::move(o));  // T's move; with room, a throw leaves `out` as it was
  } catch (...) {
    SINGLEFLIGHT_RETHROW_FOREIGN();
    if (out.size() == out.capacity()) throw;  // the reallocation's own failure
    out.push_back(move_failed(o, std::current_exception()));
  }
}

}  // namespace singleflight::detail
