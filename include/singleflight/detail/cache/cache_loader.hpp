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
//   * shared_loader<Key, T>: a cache-wide loader (synchronous or
//     asynchronous), shared by the cache and the flights and refreshes that
//     run it.
//
// Locking: none; nothing here has state. The calls run user code: they are
// made with no lock of the cache held (cache_loads::run_sync, run_async).
#pragma once

#include <cassert>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../outcome.hpp"
#include "../../stop_token.hpp"
#include "../completion_relay.hpp"
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
// It holds one of two forms, fixed at construction:
//   * synchronous: called as load_result<T>(const Key&, stop_token);
//   * asynchronous (is_async()): started through async(), an async_form
//     called as void(const Key&, stop_token, completion<load_result<T>>) — a
//     loader finishing through a completion<T> is wrapped into that form.
// The cache dispatches on the form once per call (cache_calls), so a load
// through an asynchronous form takes the asynchronous path everywhere
// (no thread waits on it). Called concurrently for different keys: the
// user's loader must allow that. Empty when the cache was built without one.
template <class Key, class T>
class shared_loader {
 public:
  using fn = std::function<load_result<T>(const Key&, stop_token)>;
  using async_fn = std::function<void(const Key&, stop_token, completion<load_result<T>>)>;

  // async_form: the asynchronous form as a loader of its own type (loader_traits sees an
  // asynchronous loader taking the key). Shares the type-erased copy.
  class async_form {
   public:
    void operator()(const Key& k, stop_token st, completion<load_result<T>> done) const {
      (*f_)(k, std::move(st), std::move(done));
    }
    // loader(): the shared_loader this form came from (the same type-erased copy).
    shared_loader loader() const noexcept { return shared_loader(nullptr, f_); }

   private:
    friend class shared_loader;
    explicit async_form(std::shared_ptr<async_fn> f) noexcept : f_(std::move(f)) {}
    std::shared_ptr<async_fn> f_;
  };

  shared_loader() noexcept = default;

  // Wraps a loader of any shape loader_traits accepts that takes the key, or not
  // (synchronous or asynchronous).
  template <class L>
  static shared_loader of(L&& loader) {
    using Ld = std::decay_t<L>;
    using traits = loader_traits<Ld, Key, T>;
    if constexpr (traits::async_result) {
      auto f = std::make_shared<async_fn>(
          [l = Ld(std::forward<L>(loader))](const Key& k, stop_token st,
                                            completion<load_result<T>> done) mutable {
            start_loader<T>(l, k, std::move(st), std::move(done));
          });
      return shared_loader(nullptr, std::move(f));
    } else if constexpr (traits::async_value) {
      // completion<T> form: relayed (detail/completion_relay.hpp) into the load_result form.
      auto f = std::make_shared<async_fn>(
          [l = Ld(std::forward<L>(loader))](const Key& k, stop_token st,
                                            completion<load_result<T>> done) mutable {
            auto start = [&](completion<T> c) { start_loader<T>(l, k, st, std::move(c)); };
            detail::start_relayed<T>(start, [d = std::move(done)](outcome<T>&& o) mutable noexcept {
              if (!o.has_value()) {
                d.set_exception(o.error());
                return;
              }
              try {
                d.set_value(load_result<T>::value(std::move(o).value()));
              } catch (...) {  // T's move threw: the load fails with that
                if (d) d.set_exception(std::current_exception());
              }
            });
          });
      return shared_loader(nullptr, std::move(f));
    } else {
      auto f = std::make_shared<fn>(
          [l = Ld(std::forward<L>(loader))](const Key& k, stop_token st) mutable -> load_result<T> {
            if constexpr (traits::returns_result) {
              return call_loader<T>(l, k, st);
            } else {
              return load_result<T>::value(T(call_loader<T>(l, k, st)));
            }
          });
      return shared_loader(std::move(f), nullptr);
    }
  }

  // The synchronous form. Undefined when is_async() (asserts).
  load_result<T> operator()(const Key& k, stop_token st) const {
    assert(f_ != nullptr);
    return (*f_)(k, std::move(st));
  }
  // The asynchronous form. Undefined unless is_async() (asserts).
  async_form async() const noexcept {
    assert(a_ != nullptr);
    return async_form(a_);
  }
  bool is_async() const noexcept { return a_ != nullptr; }
  explicit operator bool() const noexcept { return f_ != nullptr || a_ != nullptr; }

 private:
  shared_loader(std::shared_ptr<fn> f, std::shared_ptr<async_fn> a) noexcept
      : f_(std::move(f)), a_(std::move(a)) {}
  std::shared_ptr<fn> f_;        // the synchronous form, or null
  std::shared_ptr<async_fn> a_;  // the asynchronous form, or null
};

// is_shared_loader<L, Key, T>: L is the cache-wide loader's type (dispatched on its form).
template <class L, class Key, class T>
inline constexpr bool is_shared_loader =
    std::same_as<std::remove_cvref_t<L>, shared_loader<Key, T>>;

}  // namespace singleflight::detail
