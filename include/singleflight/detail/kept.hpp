// singleflight/detail/kept.hpp -- internal; do not include directly.
//
// kept<X>: an X constructed at most once in place and destroyed with its holder: what an
// asynchronous caller keeps of its fn and key once it has to wait for a stopped fn (and may
// lead after going round again). The operations of std::optional<X> the group uses, and no
// more: each X instantiates these few functions, not std::optional's layers
// (_Optional_payload, _Optional_base, _Storage), which a call path pays for each body type.
// Not thread-safe: its holder's owner alone touches it.
#pragma once

#include <cassert>
#include <memory>
#include <utility>

namespace singleflight::detail {

template <class X>
class kept {
 public:
  kept() noexcept {}  // NOLINT(modernize-use-equals-default): the union holds nothing yet
  kept(const kept&) = delete;
  kept& operator=(const kept&) = delete;
  ~kept() {
    if (full_) std::destroy_at(&v_);
  }

  // emplace(args...): constructs the X (what X's constructor throws leaves it empty).
  // Undefined if it holds one already (a debug assertion).
  template <class... A>
  X& emplace(A&&... args) {
    assert(!full_ && "singleflight: kept<X> filled twice");
    std::construct_at(&v_, std::forward<A>(args)...);
    full_ = true;
    return v_;
  }
  explicit operator bool() const noexcept { return full_; }
  // The X; undefined if empty.
  X& operator*() noexcept { return v_; }

 private:
  union {
    X v_;
  };
  bool full_ = false;
};

}  // namespace singleflight::detail
