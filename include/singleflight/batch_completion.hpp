// singleflight/batch_completion.hpp
//
// `singleflight::batch_completion<Key, T>`: the handle an asynchronous bulk
// function uses to finish its batch. A batch_loader calls such a function as
//
//   void bulk(std::span<const Key> keys, singleflight::stop_token st,
//             singleflight::batch_completion<Key, T> done);
//
// It starts the work and returns at once; the work later calls
// `done.set_value(results)` or `done.set_exception(e)`, on any thread.
#pragma once

#include <cassert>
#include <exception>
#include <memory>
#include <span>
#include <utility>

#include "detail/batch/batch.hpp"
#include "detail/batch/bulk_results.hpp"

namespace singleflight {

namespace detail {
struct batch_completion_access;
}

// batch_completion
//
// Move-only; resolves its batch at most once. Until it is resolved every key
// of the batch counts as loading: its flight stays in the loader (no second
// load of it starts), and close() waits for it.
//
// Thread safety: one batch_completion must not be used from two threads at
// once; any single thread may resolve it, the bulk function included, before
// it returns. Resolving delivers every key's result on the resolving thread:
// the waiting callbacks run and the waiting coroutines resume there, inline,
// with no lock of the loader held, in the keys' order.
//
// Destroyed (or assigned over) without being resolved, it fails every key
// with broken_promise_error. If the bulk function throws before returning,
// the batch fails with that exception instead, even when the completion died
// in the unwind.
//
// Calling set_value or set_exception on an empty completion (moved from or
// already resolved) is undefined; it asserts in debug builds.
template <class Key, class T>
class batch_completion {
  using batch_t = detail::batch<Key, T>;

 public:
  batch_completion() noexcept = default;  // empty
  batch_completion(batch_completion&& o) noexcept : b_(std::move(o.b_)) {}
  batch_completion& operator=(batch_completion&& o) noexcept {
    if (this != &o) {
      drop();
      b_ = std::move(o.b_);
    }
    return *this;
  }
  batch_completion(const batch_completion&) = delete;
  batch_completion& operator=(const batch_completion&) = delete;
  ~batch_completion() { drop(); }

  // keys(): the batch's keys, in the order results are expected. Valid until
  // this completion is resolved, moved from or destroyed.
  std::span<const Key> keys() const noexcept {
    assert(b_ != nullptr && "singleflight::batch_completion::keys on an empty completion");
    return b_->keys;
  }

  // set_value(results): every key's result, in any shape a synchronous bulk
  // function may return (batch_loader.hpp): a sequence aligned with keys()
  // (of T, load_result<T> or outcome<T>; another length fails every key with
  // batch_size_error), or a map from key to any of those (a key it lacks is
  // not_found_error). Moves the results out of an rvalue. Leaves *this empty.
  // Throws nothing: a conversion that throws fails its key.
  template <class R>
  requires detail::bulk_answer<R, Key, T>
  void set_value(R&& results) noexcept {
    assert(b_ != nullptr && "singleflight::batch_completion::set_value on an empty completion");
    std::shared_ptr<batch_t> b = std::move(b_);
    if (b->resolved.exchange(true, std::memory_order_acq_rel)) return;
    try {
      b->results.resize(b->keys.size());
      b->whole_error = detail::collect_results<T, Key>(std::forward<R>(results),
                                                       std::span<const Key>(b->keys), b->results);
    } catch (...) {  // the results' storage
      b->whole_error = std::current_exception();
    }
    b->sink->results_ready(std::move(b));
  }

  // set_exception(e): every key of the batch fails with `e` (the same
  // exception object for each waiter). A null `e` is undefined (asserts).
  // Leaves *this empty.
  void set_exception(std::exception_ptr e) noexcept {
    assert(b_ != nullptr && "singleflight::batch_completion::set_exception on an empty completion");
    assert(e && "singleflight::batch_completion::set_exception with a null exception_ptr");
    std::shared_ptr<batch_t> b = std::move(b_);
    if (b->resolved.exchange(true, std::memory_order_acq_rel)) return;
    b->whole_error = std::move(e);
    b->sink->results_ready(std::move(b));
  }

  // True while the completion holds an unresolved batch.
  explicit operator bool() const noexcept { return b_ != nullptr; }

 private:
  friend struct detail::batch_completion_access;
  explicit batch_completion(std::shared_ptr<batch_t> b) noexcept : b_(std::move(b)) {}

  void drop() noexcept {
    if (!b_) return;
    detail::batch_dropped(std::move(b_));
  }

  std::shared_ptr<batch_t> b_;
};

namespace detail {
// The loader's way to make a batch_completion.
struct batch_completion_access {
  template <class Key, class T>
  static batch_completion<Key, T> make(std::shared_ptr<batch<Key, T>> b) noexcept {
    return batch_completion<Key, T>(std::move(b));
  }
};
}  // namespace detail

}  // namespace singleflight
