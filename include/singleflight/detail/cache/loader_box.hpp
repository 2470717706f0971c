// singleflight/detail/cache/loader_box.hpp -- internal; do not include directly.
//
// loader_box / box_ref: the shared, type-erased copy of a cache's loader
// (cache_loader.hpp, shared_loader) and the references to it. A loader_box
// is the part that does not depend on the loader, Key or T: a reference
// count and how to destroy the box; shared_loader derives its holder of the
// user's loader from it. Not a std::shared_ptr<std::function<...>>: its
// control block, the function and its handler were instantiated again for
// each (Key, T); box_ref is compiled once for every cache type.
//
// Thread safety: box_refs to one box may be copied and destroyed
// concurrently from any threads (as shared_ptrs may); one box_ref object is
// not safe to change concurrently.
// Memory ordering: an increment is relaxed (a new reference is made from an
// existing one); a decrement is acq_rel, so that every use of the box
// through any reference happens before the last one destroys it.
#pragma once

#include <atomic>
#include <cstddef>

namespace singleflight::detail {

struct loader_box {
  std::atomic<std::size_t> refs{1};                 // the box_ref made with it holds the first
  void (*destroy)(loader_box*) noexcept = nullptr;  // set by the holder's constructor
};

class box_ref {
 public:
  box_ref() noexcept = default;
  // box_ref(b): adopts the reference b was made with (b->refs == 1, or null).
  explicit box_ref(loader_box* b) noexcept : b_(b) {}
  box_ref(const box_ref& o) noexcept : b_(o.b_) {
    if (b_ != nullptr) b_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  box_ref(box_ref&& o) noexcept : b_(o.b_) { o.b_ = nullptr; }
  // By value: copy and move assignment alike; the old box is released last.
  box_ref& operator=(box_ref o) noexcept {
    loader_box* const t = b_;
    b_ = o.b_;
    o.b_ = t;
    return *this;
  }
  ~box_ref() {
    if (b_ != nullptr && b_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) b_->destroy(b_);
  }

  loader_box* get() const noexcept { return b_; }

 private:
  loader_box* b_ = nullptr;
};

}  // namespace singleflight::detail
