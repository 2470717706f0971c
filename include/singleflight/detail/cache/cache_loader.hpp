// singleflight/detail/cache/cache_loader.hpp -- internal; do not include directly.
//
// The loader vocabulary of singleflight::cache, shared by every layer of
// cache_core (cache_core.hpp) and by cache.hpp:
//   * async_loader_for / loader_traits<L, T>: which kind of loader L is — a
//     synchronous one, called with a stop_token or with nothing, returning T
//     or load_result<T>; or an asynchronous one, finishing through a
//     completion<T> or a completion<load_result<T>> — and whether it is a
//     loader for T at all (cache.hpp's static_assert);
//   * loaded<T, Clock>: what one load hands to every caller of its flight;
//   * call_loader<T>(loader, st): calls a synchronous loader, passing `st`
//     only to one that takes it.
//
// Locking: none; nothing here has state. call_loader runs user code: it is
// called with no lock of the cache held (cache_loads::run_sync).
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../stop_token.hpp"

namespace singleflight::detail {

// A loader that finishes through a completion (asynchronous).
template <class L, class R>
concept async_loader_for = std::invocable<L&, stop_token, completion<R>> &&
    std::is_void_v<std::invoke_result_t<L&, stop_token, completion<R>>>;

// What kind of loader L is, for a cache of T.
template <class L, class T>
struct loader_traits {
  static constexpr bool async_value = async_loader_for<L, T>;
  static constexpr bool async_result = !async_value && async_loader_for<L, load_result<T>>;
  static constexpr bool is_async = async_value || async_result;
  static constexpr bool takes_token = !is_async && std::invocable<L&, stop_token>;
  static constexpr bool plain = !is_async && !takes_token && std::invocable<L&>;

  static auto sync_result_type() {
    if constexpr (takes_token) {
      return std::type_identity<std::invoke_result_t<L&, stop_token>>{};
    } else if constexpr (plain) {
      return std::type_identity<std::invoke_result_t<L&>>{};
    } else {
      return std::type_identity<void>{};
    }
  }
  using sync_result = typename decltype(sync_result_type())::type;
  static constexpr bool returns_result =
      std::same_as<std::remove_cvref_t<sync_result>, load_result<T>>;
  static constexpr bool valid =
      is_async ||
      ((takes_token || plain) &&
       (returns_result || (!std::is_void_v<sync_result> && std::convertible_to<sync_result, T>)));
};

// What one load hands to every caller of its flight.
template <class T, class Clock>
struct loaded {
  std::shared_ptr<const T> value;  // null: not found
  std::uint64_t version = 0;       // the key's version the load saw when it started
  typename Clock::time_point written{};
};

// call_loader<T>(loader, st): a synchronous loader's result (what it returns,
// T or load_result<T>; what it throws propagates). Thread safety: whatever
// the loader's own is.
template <class T, class L>
decltype(auto) call_loader(L& loader, const stop_token& st) {
  if constexpr (detail::loader_traits<L, T>::takes_token) {
    return std::invoke(loader, st);
  } else {
    return std::invoke(loader);
  }
}

}  // namespace singleflight::detail
