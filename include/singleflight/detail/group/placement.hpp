// singleflight/detail/group/placement.hpp -- internal; do not include directly.
//
// Where a synchronous flight body runs, when its caller knows it at compile time. A blocking
// call's leader (blocking_calls::lead) runs a sync fn on its own thread when the group has no
// executor (lead_inline) and as a task otherwise (execution::hand_off, task_impl, run_task),
// so for a plain fn the group compiles both paths. A caller that knows which one its body
// takes wraps the body, and the group compiles only that path:
//
//   inline_only<F>  passed only to a group without an executor: always lead_inline;
//   task_only<F>    passed only to a group with an executor, or to async_do: always a task.
//
// For a body that inlines a whole load (the cache's), the path never taken is among the
// largest functions of a translation unit. Passing inline_only to a group with an executor,
// or to async_do, or task_only to a blocking call on a group without an executor, is
// undefined (a debug assertion in blocking_calls::lead).
//
// Each holds F by value and calls it with the flight's token; neither adds state.
//
// Locking: none; nothing here has state.
#pragma once

#include <utility>

#include "../../stop_token.hpp"

namespace singleflight::detail {

template <class F>
struct inline_only {
  F fn;
  decltype(auto) operator()(stop_token st) { return fn(std::move(st)); }
};

template <class F>
struct task_only {
  F fn;
  decltype(auto) operator()(stop_token st) { return fn(std::move(st)); }
};

template <class F>
inline constexpr bool is_inline_only = false;
template <class F>
inline constexpr bool is_inline_only<inline_only<F>> = true;

template <class F>
inline constexpr bool is_task_only = false;
template <class F>
inline constexpr bool is_task_only<task_only<F>> = true;

}  // namespace singleflight::detail
