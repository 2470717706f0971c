// singleflight/detail/fleet/write_watches.hpp -- internal; do not include directly.
//
// detail::write_watches: fleet_cache's record of its put / invalidate / expire calls between
// their Redis write and their local step, so that a change of the key applied to the local cache
// meanwhile is known to the write, whichever caller applied it.
//
// A put stores its value locally only when nothing it heard of the key since its write was sent
// may be a later write (fleet_cache::write). The inbox is applied by one caller at a time
// (invalidation_inbox::apply): the report of a later write may be applied by another caller's
// get, before the put's own catch-up, which then finds nothing left to apply. The put would then
// store its older value locally over the drop, and keep it for its ttl. So each write watches its
// key (watch, from before the write is sent to after its local step), and every caller that
// applies a drop or a stale mark of a key, a clear or a stale mark of every key, tells the watches
// first (touch, touch_all), before it changes the local cache: a write that finds its watch
// touched takes its key for superseded; one whose watch is touched only after its local step has
// its local entry dropped again (watch::touched() read once more, after the step).
//
// Locking: `mu_`, a leaf, guards the list of watches and their flags. Nothing is called under it;
// no Key or T is touched.
#pragma once

#include <algorithm>
#include <mutex>
#include <string_view>
#include <vector>

namespace singleflight::detail {

class write_watches {
 public:
  write_watches() = default;
  write_watches(const write_watches&) = delete;
  write_watches& operator=(const write_watches&) = delete;

  // watch: one write's watch of its key, registered from construction to destruction.
  class watch {
   public:
    // Throws std::bad_alloc (nothing registered).
    watch(write_watches& owner, std::string_view text) : owner_(owner), text_(text) {
      const std::lock_guard<std::mutex> lk(owner_.mu_);
      owner_.watches_.push_back(this);
    }
    watch(const watch&) = delete;
    watch& operator=(const watch&) = delete;
    ~watch() {
      const std::lock_guard<std::mutex> lk(owner_.mu_);
      owner_.watches_.erase(std::find(owner_.watches_.begin(), owner_.watches_.end(), this));
    }

    // touched(): a change of the key (or of every key) was applied since construction.
    // Thread-safe.
    bool touched() const {
      const std::lock_guard<std::mutex> lk(owner_.mu_);
      return touched_;
    }

   private:
    friend class write_watches;
    write_watches& owner_;
    const std::string_view text_;  // the write's key text, which outlives the watch
    bool touched_ = false;         // guarded by owner_.mu_
  };

  // touch(text): a change of `text` is about to be applied to the local cache. Thread-safe.
  void touch(std::string_view text) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    for (watch* w : watches_) {
      if (w->text_ == text) w->touched_ = true;
    }
  }

  // touch_all(): a change of every key is about to be applied. Thread-safe.
  void touch_all() noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    for (watch* w : watches_) w->touched_ = true;
  }

 private:
  mutable std::mutex mu_;
  std::vector<watch*> watches_;  // guarded by mu_
};

}  // namespace singleflight::detail
