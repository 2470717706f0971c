// singleflight/detail/cache/value_box.hpp -- internal; do not include directly.
//
// value_ref<T>: a counted reference (counted.hpp) to one immutable T in a box
// of its own: what a load hands to every caller of its flight (loaded<T>), a
// node's value when T does not sit in the node (value_slot), and the pin a
// hit copies T from after its read section. The operations of
// std::shared_ptr<const T> the cache uses, and no more: make, *, bool, swap,
// copy, move. One allocation, as make_shared's; the counting is
// counted_ref's, compiled once, not shared_ptr's control block and layers
// per T.
//
// Thread safety and memory ordering: counted_ref's. The T itself is never
// changed after make(), so any number of threads may read it.
#pragma once

#include <cstddef>
#include <utility>

#include "counted.hpp"

namespace singleflight::detail {

template <class T>
class value_ref {
 public:
  value_ref() noexcept = default;
  value_ref(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): as shared_ptr's

  // make(args...): a new box holding T(args...). Throws what the allocation and T's
  // constructor throw.
  template <class... A>
  static value_ref make(A&&... args) {
    return value_ref(new box(std::forward<A>(args)...));
  }

  // The value; undefined if empty.
  const T& operator*() const noexcept { return static_cast<const box*>(r_.get())->v; }
  explicit operator bool() const noexcept { return r_.get() != nullptr; }
  void swap(value_ref& o) noexcept { r_.swap(o.r_); }

 private:
  struct box final : counted_box {
    template <class... A>
    explicit box(A&&... args) : v(std::forward<A>(args)...) {
      destroy = &drop;
    }
    static void drop(counted_box* b) noexcept { delete static_cast<box*>(b); }
    const T v;
  };

  explicit value_ref(box* b) noexcept : r_(b) {}
  counted_ref r_;
};

}  // namespace singleflight::detail
