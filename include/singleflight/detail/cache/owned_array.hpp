// singleflight/detail/cache/owned_array.hpp -- internal; do not include directly.
//
// owned_array<X>: an array made with new X[n], deleted with its holder: the
// cache table's shards and each shard's buckets (cache_table.hpp). The
// operations of std::unique_ptr<X[]> the table uses, and no more: each X
// instantiates these few functions, not unique_ptr's layers (__uniq_ptr_impl,
// its tuple, default_delete), which each (Key, T) of a cache used to pay for
// twice (its shards and its buckets). Indexing is a plain pointer access,
// as unique_ptr's is.
// Not thread-safe: its holder's lock (or the table's construction and
// destruction) orders every reset() before the reads that may see it.
#pragma once

#include <cstddef>

namespace singleflight::detail {

template <class X>
class owned_array {
 public:
  owned_array() noexcept = default;
  // owned_array(p): owns p, an array from new X[n] (or null).
  explicit owned_array(X* p) noexcept : p_(p) {}
  owned_array(const owned_array&) = delete;
  owned_array& operator=(const owned_array&) = delete;
  ~owned_array() { delete[] p_; }

  // reset(p): owns p instead; the old array is deleted after the pointer is
  // replaced, as unique_ptr::reset does.
  void reset(X* p) noexcept {
    X* const old = p_;
    p_ = p;
    delete[] old;
  }
  // The element at i; undefined if empty or i out of range.
  X& operator[](std::size_t i) const noexcept { return p_[i]; }
  // The array, or null.
  X* get() const noexcept { return p_; }

 private:
  X* p_ = nullptr;
};

}  // namespace singleflight::detail
