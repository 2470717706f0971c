// singleflight/detail/fn_shapes.hpp -- internal; do not include directly.
//
// The shapes of work every layer accepts, defined once: a group's fn, a cache's loader (per
// call or cache-wide), the fleet's loader. For a result R and a key type Key:
//
//   form        shape                                          who accepts it
//   plain       R f()                                          group, cache, fleet
//   token       R f(stop_token)                                group, cache, fleet
//   async       void f(stop_token, completion<R>)              group, cache
//   key         R f(const Key&)                                cache, fleet
//   key_token   R f(const Key&, stop_token)                    cache, fleet
//   key_async   void f(const Key&, stop_token, completion<R>)  cache
//
// A group hands its fn no key (the caller's closure has it); a loader the cache or the fleet
// keeps or copies is better off receiving it (nothing of the request to capture). The key
// forms are the `key_*` ones; form_of<F, Key, R>() says which shape F has, trying them in the
// order key_async, async, key_token, token, key, plain (the first that F accepts), so a
// generic lambda gets the richest call it accepts; `none`: F is none of them. call_sync() and
// call_async() call F in its shape. An async form "returns" R through its completion.
//
// The token is singleflight::stop_token (std::stop_token where the standard library has it,
// the bundled one elsewhere: stop_token.hpp), in every layer.
//
// Locking: none; nothing here has state. The calls run user code: callers hold no lock.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "../completion.hpp"
#include "../stop_token.hpp"
#include "functional.hpp"

namespace singleflight::detail {

enum class fn_form : unsigned char { none, plain, token, async, key, key_token, key_async };

// The non-key forms, as concepts (the group's vocabulary).
template <class F, class R>
concept async_fn = std::invocable<F&, stop_token, completion<R>> &&
    std::is_void_v<std::invoke_result_t<F&, stop_token, completion<R>>>;

template <class F>
concept takes_token = std::invocable<F&, stop_token>;

// A fn a group runs: token, plain or async.
template <class F, class R>
concept flight_fn = async_fn<F, R> || takes_token<F> || std::invocable<F&>;

// The key forms.
template <class F, class Key, class R>
concept key_async_fn = std::invocable<F&, const Key&, stop_token, completion<R>> &&
    std::is_void_v<std::invoke_result_t<F&, const Key&, stop_token, completion<R>>>;

template <class F, class Key>
concept takes_key_and_token = std::invocable<F&, const Key&, stop_token>;

template <class F, class Key>
concept takes_key = std::invocable<F&, const Key&>;

// form_of<F, Key, R>(): F's shape (see the top of this file). Key = void: no key forms.
template <class F, class Key, class R>
constexpr fn_form form_of() noexcept {
  if constexpr (!std::is_void_v<Key> && key_async_fn<F, Key, R>) {
    return fn_form::key_async;
  } else if constexpr (async_fn<F, R>) {
    return fn_form::async;
  } else if constexpr (!std::is_void_v<Key> && takes_key_and_token<F, Key>) {
    return fn_form::key_token;
  } else if constexpr (takes_token<F>) {
    return fn_form::token;
  } else if constexpr (!std::is_void_v<Key> && takes_key<F, Key>) {
    return fn_form::key;
  } else if constexpr (std::invocable<F&>) {
    return fn_form::plain;
  } else {
    return fn_form::none;
  }
}

constexpr bool is_async_form(fn_form f) noexcept {
  return f == fn_form::async || f == fn_form::key_async;
}
constexpr bool takes_key_form(fn_form f) noexcept {
  return f == fn_form::key || f == fn_form::key_token || f == fn_form::key_async;
}

// What a synchronous F of form `Form` returns (void for the async forms and none).
template <class F, class Key, fn_form Form>
struct sync_result {
  using type = void;
};
template <class F, class Key>
struct sync_result<F, Key, fn_form::plain> {
  using type = std::invoke_result_t<F&>;
};
template <class F, class Key>
struct sync_result<F, Key, fn_form::token> {
  using type = std::invoke_result_t<F&, stop_token>;
};
template <class F, class Key>
struct sync_result<F, Key, fn_form::key> {
  using type = std::invoke_result_t<F&, const Key&>;
};
template <class F, class Key>
struct sync_result<F, Key, fn_form::key_token> {
  using type = std::invoke_result_t<F&, const Key&, stop_token>;
};

// fn_result<F, R>: what a group's fn yields: its return type, or R for an async fn.
template <class F, class R>
struct fn_result {
  static constexpr fn_form form = form_of<F, void, R>();
  using type =
      std::conditional_t<is_async_form(form), R, typename sync_result<F, void, form>::type>;
};

// call_sync<Form>(f, key, st): calls a synchronous F of form `Form`, passing the key and the
// token only to a shape that takes them; returns what F returns, propagates what it throws.
template <fn_form Form, class F, class K>
decltype(auto) call_sync(F& f, const K& key, const stop_token& st) {
  static_assert(!is_async_form(Form) && Form != fn_form::none);
  if constexpr (Form == fn_form::key_token) {
    return ::singleflight::detail::invoke(f, key, st);
  } else if constexpr (Form == fn_form::token) {
    return ::singleflight::detail::invoke(f, st);
  } else if constexpr (Form == fn_form::key) {
    return ::singleflight::detail::invoke(f, key);
  } else {
    return ::singleflight::detail::invoke(f);
  }
}

// call_async<Form>(f, key, st, done): starts an asynchronous F of form `Form`.
template <fn_form Form, class F, class K, class R>
void call_async(F& f, const K& key, stop_token st, completion<R> done) {
  static_assert(is_async_form(Form));
  if constexpr (Form == fn_form::key_async) {
    ::singleflight::detail::invoke(f, key, std::move(st), std::move(done));
  } else {
    ::singleflight::detail::invoke(f, std::move(st), std::move(done));
  }
}

}  // namespace singleflight::detail
