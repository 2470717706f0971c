// singleflight/detail/group/fn_shape.hpp -- internal; do not include directly.
//
// The shapes of fn a group accepts, as concepts, and the result of each:
//   T fn(stop_token)                  a sync fn that looks at the flight's token;
//   T fn()                            a sync fn that does not;
//   void fn(stop_token, completion<T>) an async fn: starts the work, returns at
//                                     once, finishes it through the completion.
#pragma once

#include <concepts>
#include <type_traits>

#include "../../completion.hpp"
#include "../../stop_token.hpp"

namespace singleflight::detail {

template <class F, class T>
concept async_fn = std::invocable<F&, stop_token, completion<T>> &&
    std::is_void_v<std::invoke_result_t<F&, stop_token, completion<T>>>;

template <class F>
concept takes_token = std::invocable<F&, stop_token>;

template <class F, class T>
concept flight_fn = async_fn<F, T> || takes_token<F> || std::invocable<F&>;

// What a synchronous fn returns (an async fn "returns" T through its completion).
template <class F, class T>
struct fn_result {
  using type = std::invoke_result_t<F&>;
};
template <class F, class T>
requires(takes_token<F> && !async_fn<F, T>) struct fn_result<F, T> {
  using type = std::invoke_result_t<F&, stop_token>;
};
template <class F, class T>
requires async_fn<F, T>
struct fn_result<F, T> {
  using type = T;
};

}  // namespace singleflight::detail
