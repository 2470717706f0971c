// singleflight/detail/cache/cache_loader.hpp -- internal; do not include directly.
//
// The loader vocabulary of singleflight::cache, shared by every layer of
// cache_core (cache_core.hpp) and by cache_calls.hpp:
//   * loader_traits<L, Key, T>: which shape L has (detail/fn_shapes.hpp: with
//     or without the key, with or without a stop_token, or asynchronous),
//     whether it yields T or load_result<T>, and whether it is a loader for
//     a cache of T at all (cache.hpp's static_assert);
//   * loaded<T, Clock>: what one load hands to every caller of its flight;
//   * call_loader<T>(loader, key, st) / start_loader<T>(loader, key, st,
//     done): call a loader in its shape;
//   * shared_loader<Key, T>: a cache-wide loader, shared by the cache and the
//     flights and refreshes that run it.
//
// Locking: none; nothing here has state. The calls run user code: they are
// made with no lock of the cache held (cache_loads::run_sync, run_async).
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../stop_token.hpp"
#include "../fn_shapes.hpp"

namespace singleflight::detail {

// What kind of loader L is, for a cache of T keyed by Key.
template <class L, class Key, class T>
struct loader_traits {
  static constexpr fn_form value_form = form_of<L, Key, T>();
  static constexpr fn_form result_form = form_of<L, Key, load_result<T>>();
  // Asynchronous: finishes through a completion<T>, or a completion<load_result<T>>.
  static constexpr bool async_value = is_async_form(value_form);
  static constexpr bool async_result = !async_value && is_async_form(result_form);
  static constexpr bool is_async = async_value || async_result;
  static constexpr fn_form form = async_result ? result_form : value_form;
  static constexpr bool takes_key = takes_key_form(form);
  using sync_result_t = typename sync_result<L, Key, form>::type;  // void when async
  static constexpr bool returns_result =
      std::same_as<std::remove_cvref_t<sync_result_t>, load_result<T>>;
  static constexpr bool valid =
      form != fn_form::none &&
      (is_async || returns_result ||
       (!std::is_void_v<sync_result_t> && std::convertible_to<sync_result_t, T>));
};

// What one load hands to every caller of its flight.
template <class T, class Clock>
struct loaded {
  std::shared_ptr<const T> value;  // null: not found
  std::uint64_t version = 0;       // the key's version the load saw when it started
  typename Clock::time_point written{};
};

// call_loader<T>(loader, key, st): a synchronous loader's result (what it
// returns, T or load_result<T>; what it throws propagates). Thread safety:
// whatever the loader's own is.
template <class T, class L, class Key>
decltype(auto) call_loader(L& loader, const Key& key, const stop_token& st) {
  return call_sync<loader_traits<L, Key, T>::form>(loader, key, st);
}

// start_loader<T>(loader, key, st, done): starts an asynchronous loader,
// which finishes through `done` (X: T or load_result<T>).
template <class T, class L, class Key, class X>
void start_loader(L& loader, const Key& key, stop_token st, completion<X> done) {
  call_async<loader_traits<L, Key, T>::form>(loader, key, std::move(st), std::move(done));
}

// shared_loader<Key, T>: a cache-wide loader, owned by the cache and by every
// flight or refresh that runs it (a shared_ptr to one type-erased copy of
// the user's loader), so a copy kept for a later refresh can never dangle.
// Called as load_result<T>(const Key&, stop_token), concurrently for
// different keys: the user's loader must allow that. Empty when the cache
// was built without one.
template <class Key, class T>
class shared_loader {
 public:
  using fn = std::function<load_result<T>(const Key&, stop_token)>;

  shared_loader() noexcept = default;

  // Wraps a synchronous loader of any shape loader_traits accepts.
  template <class L>
  static shared_loader of(L&& loader) {
    using Ld = std::decay_t<L>;
    using traits = loader_traits<Ld, Key, T>;
    auto f = std::make_shared<fn>(
        [l = Ld(std::forward<L>(loader))](const Key& k, stop_token st) mutable -> load_result<T> {
          if constexpr (traits::returns_result) {
            return call_loader<T>(l, k, st);
          } else {
            return load_result<T>::value(T(call_loader<T>(l, k, st)));
          }
        });
    return shared_loader(std::move(f));
  }

  load_result<T> operator()(const Key& k, stop_token st) const { return (*f_)(k, std::move(st)); }
  explicit operator bool() const noexcept { return f_ != nullptr; }

 private:
  explicit shared_loader(std::shared_ptr<fn> f) noexcept : f_(std::move(f)) {}
  std::shared_ptr<fn> f_;
};

}  // namespace singleflight::detail
