// singleflight/detail/group/impl/owned_thread.ipp -- internal; do not include directly.
//
// owned_thread's definitions (detail/group/owned_thread.hpp): included by that header in
// header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp). The threads'
// bodies (their std::thread states) and the shared home's control block are instantiated here.
#pragma once

#include "../owned_thread.hpp"

namespace singleflight::detail {

template <class F>
owned_thread::owned_thread(started_tag, F body) : home_(std::make_shared<home>()) {
  thread_ = std::thread([h = home_, body = std::move(body)]() mutable {
    library_thread::mark();
    struct finished {
      home* h;
      ~finished() { h->done.store(true, std::memory_order_release); }  // also on unwind
    } mark{h.get()};
    body(*h);
  });
  id_ = thread_.get_id();
}

SINGLEFLIGHT_DECL owned_thread::owned_thread(loop_fn loop, void* owner)
    : owned_thread(started_tag{}, [loop, owner](home& h) { loop(owner, h); }) {}

SINGLEFLIGHT_DECL owned_thread::owned_thread(task tk)
    : owned_thread(started_tag{}, [body = std::move(tk)](home&) mutable { body(); }) {}

SINGLEFLIGHT_DECL owned_thread::owned_thread(owned_thread&&) noexcept = default;
SINGLEFLIGHT_DECL owned_thread& owned_thread::operator=(owned_thread&&) noexcept = default;
SINGLEFLIGHT_DECL owned_thread::~owned_thread() = default;

SINGLEFLIGHT_DECL bool owned_thread::join_unless_current() {
  if (!started()) return true;
  if (is_current()) return false;
  thread_.join();
  return true;
}

SINGLEFLIGHT_DECL void owned_thread::join_or_orphan() {
  if (!started()) return;
  if (is_current()) {
    home_->orphaned = true;
    thread_.detach();
    return;
  }
  thread_.join();
}

}  // namespace singleflight::detail
