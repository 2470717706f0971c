// singleflight/detail/cache/counted.hpp -- internal; do not include directly.
//
// counted_box / counted_ref: a reference-counted allocation and the
// references to it, for what the cache shares between threads: the
// type-erased copy of its loader (cache_loader.hpp, shared_loader) and each
// value's box (value_box.hpp). A counted_box is the part that depends on
// nothing: a reference count and how to destroy the box; the holder of the
// loader or the value derives from it. Not a std::shared_ptr: its control
// block and layers were instantiated again for each (Key, T); counted_ref is
// compiled once for every cache type.
//
// Thread safety: counted_refs to one box may be copied and destroyed
// concurrently from any threads (as shared_ptrs may); one counted_ref object
// is not safe to change concurrently.
// Memory ordering: an increment is relaxed (a new reference is made from an
// existing one); a decrement is acq_rel, so that every use of the box
// through any reference happens before the last one destroys it.
#pragma once

#include <atomic>
#include <cstddef>

namespace singleflight::detail {

struct counted_box {
  std::atomic<std::size_t> refs{1};                  // the counted_ref made with it holds the first
  void (*destroy)(counted_box*) noexcept = nullptr;  // set by the holder's constructor
};

class counted_ref {
 public:
  counted_ref() noexcept = default;
  // counted_ref(b): adopts the reference b was made with (b->refs == 1, or null).
  explicit counted_ref(counted_box* b) noexcept : b_(b) {}
  counted_ref(const counted_ref& o) noexcept : b_(o.b_) {
    if (b_ != nullptr) b_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  counted_ref(counted_ref&& o) noexcept : b_(o.b_) { o.b_ = nullptr; }
  // By value: copy and move assignment alike; the old box is released last.
  counted_ref& operator=(counted_ref o) noexcept {
    swap(o);
    return *this;
  }
  ~counted_ref() {
    if (b_ != nullptr && b_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) b_->destroy(b_);
  }

  void swap(counted_ref& o) noexcept {
    counted_box* const t = b_;
    b_ = o.b_;
    o.b_ = t;
  }
  counted_box* get() const noexcept { return b_; }

 private:
  counted_box* b_ = nullptr;
};

// counted_ptr<X>: a counted_ref to an X, a class deriving from counted_box and setting its
// destroy: the cache's core (cache_core.hpp), shared by the cache and its pending callbacks.
// Copies and destruction as counted_ref's; its own functions are the typed accessors.
template <class X>
class counted_ptr {
 public:
  // counted_ptr(x): adopts the reference x was made with.
  explicit counted_ptr(X* x) noexcept : r_(x) {}
  X* get() const noexcept { return static_cast<X*>(r_.get()); }
  X* operator->() const noexcept { return get(); }
  X& operator*() const noexcept { return *get(); }

 private:
  counted_ref r_;
};

}  // namespace singleflight::detail
