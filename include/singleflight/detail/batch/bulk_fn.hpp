// singleflight/detail/batch/bulk_fn.hpp -- internal; do not include directly.
//
// The shapes of bulk function a batch_loader accepts, as concepts, and
// bulk_call<Key, T>: any of them behind one virtual call that always
// finishes through a batch_completion:
//   R bulk(std::span<const Key>, stop_token)     synchronous, looks at the token;
//   R bulk(std::span<const Key>)                 synchronous, does not;
//   void bulk(std::span<const Key>, stop_token, batch_completion<Key, T>)
//                                                asynchronous;
// where R is a bulk_answer (bulk_results.hpp).
//
// Locking: none. bulk_call::call runs user code; the queue calls it with no
// lock held, possibly on several threads at once (one per running batch).
#pragma once

#include <concepts>
#include <exception>
#include <span>
#include <type_traits>
#include <utility>

#include "../../batch_completion.hpp"
#include "../../stop_token.hpp"
#include "../functional.hpp"
#include "../unwind.hpp"
#include "bulk_results.hpp"

namespace singleflight::detail {

template <class F, class Key, class T>
concept async_bulk_fn =
    std::invocable<F&, std::span<const Key>, stop_token, batch_completion<Key, T>> &&
    std::is_void_v<
        std::invoke_result_t<F&, std::span<const Key>, stop_token, batch_completion<Key, T>>>;

template <class F, class Key, class T>
concept token_bulk_fn =
    !async_bulk_fn<F, Key, T> && std::invocable<F&, std::span<const Key>, stop_token> &&
    bulk_answer<std::invoke_result_t<F&, std::span<const Key>, stop_token>, Key, T>;

template <class F, class Key, class T>
concept plain_bulk_fn = !async_bulk_fn<F, Key, T> && !token_bulk_fn<F, Key, T> &&
                        std::invocable<F&, std::span<const Key>> &&
                        bulk_answer<std::invoke_result_t<F&, std::span<const Key>>, Key, T>;

template <class F, class Key, class T>
concept bulk_fn_for =
    async_bulk_fn<F, Key, T> || token_bulk_fn<F, Key, T> || plain_bulk_fn<F, Key, T>;

// bulk_call: the loader's bulk function, whatever its shape.
template <class Key, class T>
class bulk_call {
 public:
  bulk_call() = default;
  bulk_call(const bulk_call&) = delete;
  bulk_call& operator=(const bulk_call&) = delete;
  virtual ~bulk_call() = default;

  // Calls the function for `keys`. A synchronous one's answer (or exception)
  // resolves `done` before this returns; an asynchronous one receives `done`.
  // Throws what an asynchronous function throws before returning (the
  // caller fails the batch with it).
  virtual void call(std::span<const Key> keys, stop_token st, batch_completion<Key, T> done) = 0;
};

template <class Key, class T, class F>
class bulk_impl final : public bulk_call<Key, T> {
 public:
  template <class G>
  explicit bulk_impl(G&& f) : f_(std::forward<G>(f)) {}

  void call(std::span<const Key> keys, stop_token st, batch_completion<Key, T> done) override {
    if constexpr (async_bulk_fn<F, Key, T>) {
      ::singleflight::detail::invoke(f_, keys, std::move(st), std::move(done));
    } else {
      try {
        if constexpr (token_bulk_fn<F, Key, T>) {
          done.set_value(::singleflight::detail::invoke(f_, keys, std::move(st)));
        } else {
          done.set_value(::singleflight::detail::invoke(f_, keys));
        }
      } catch (...) {
        SINGLEFLIGHT_RETHROW_FOREIGN();  // the bulk function ended its thread
        done.set_exception(std::current_exception());
      }
    }
  }

 private:
  F f_;
};

}  // namespace singleflight::detail
