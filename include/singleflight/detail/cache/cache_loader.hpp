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
//     run it (one type-erased copy in a counted_box, counted.hpp).
//
// Locking: none; the only state is a shared_loader's reference count (atomic,
// counted.hpp). The calls run user code: they are made with no lock of
// the cache held (cache_loads::run_sync, run_async).
#pragma once

#include <cassert>
#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "../../cache_options.hpp"
#include "../../completion.hpp"
#include "../../outcome.hpp"
#include "../../stop_token.hpp"
#include "../completion_relay.hpp"
#include "../fn_shapes.hpp"
#include "../functional.hpp"
#include "counted.hpp"
#include "value_box.hpp"

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
  value_ref<T> value;         // null: not found
  std::uint64_t version = 0;  // the key's version the load saw when it started
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
// flight or refresh that runs it (a counted reference, counted_ref, to one
// type-erased copy of the user's loader: counted.hpp), so a copy kept for
// a later refresh can never dangle.
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
  // The forms, as plain functions of the box (no std::function): what each loader type adds
  // is its holder (below) and the one of these it fills in.
  using call_fn = load_result<T> (*)(counted_box*, const Key&, stop_token);
  using start_fn = void (*)(counted_box*, const Key&, stop_token, completion<load_result<T>>);

  // async_form: the asynchronous form as a loader of its own type (loader_traits sees an
  // asynchronous loader taking the key). Shares the type-erased copy.
  class async_form {
   public:
    void operator()(const Key& k, stop_token st, completion<load_result<T>> done) const {
      start_(box_.get(), k, std::move(st), std::move(done));
    }
    // loader(): the shared_loader this form came from (the same type-erased copy).
    shared_loader loader() const noexcept { return shared_loader(box_, nullptr, start_); }

   private:
    friend class shared_loader;
    async_form(counted_ref b, start_fn s) noexcept : box_(std::move(b)), start_(s) {}
    counted_ref box_;
    start_fn start_;
  };

  shared_loader() noexcept = default;

  // Wraps a loader of any shape loader_traits accepts that takes the key, or not
  // (synchronous or asynchronous): one allocation holding a copy of it (moved from an
  // rvalue). Throws what that allocation or copy throws.
  template <class L>
  static shared_loader of(L&& loader) {
    using Ld = std::decay_t<L>;
    using traits = loader_traits<Ld, Key, T>;
    counted_ref b(new held<Ld>(std::forward<L>(loader)));
    if constexpr (traits::is_async) {
      return shared_loader(std::move(b), nullptr, &held<Ld>::start);
    } else {
      return shared_loader(std::move(b), &held<Ld>::call, nullptr);
    }
  }

  // The synchronous form. Undefined when is_async() (asserts).
  load_result<T> operator()(const Key& k, stop_token st) const {
    assert(call_ != nullptr);
    return call_(box_.get(), k, std::move(st));
  }
  // The asynchronous form. Undefined unless is_async() (asserts).
  async_form async() const noexcept {
    assert(start_ != nullptr);
    return async_form(box_, start_);
  }
  bool is_async() const noexcept { return start_ != nullptr; }
  explicit operator bool() const noexcept { return box_.get() != nullptr; }

 private:
  // held<Ld>: the box with the user's loader. call / start run it in its shape (on the
  // loader as a non-const lvalue, as a mutable lambda holding it would).
  template <class Ld>
  struct held final : counted_box {
    template <class A>
    explicit held(A&& a) : l(std::forward<A>(a)) {
      destroy = &drop;
    }
    static void drop(counted_box* b) noexcept { delete static_cast<held*>(b); }

    static load_result<T> call(counted_box* b, const Key& k, stop_token st) {
      Ld& l = static_cast<held*>(b)->l;
      if constexpr (loader_traits<Ld, Key, T>::returns_result) {
        return call_loader<T>(l, k, st);
      } else {
        return load_result<T>::value(T(call_loader<T>(l, k, st)));
      }
    }

    static void start(counted_box* b, const Key& k, stop_token st,
                      completion<load_result<T>> done) {
      Ld& l = static_cast<held*>(b)->l;
      if constexpr (loader_traits<Ld, Key, T>::async_result) {
        start_loader<T>(l, k, std::move(st), std::move(done));
      } else {
        // completion<T> form: relayed (detail/completion_relay.hpp) into the load_result form.
        auto begin = [&](completion<T> c) { start_loader<T>(l, k, st, std::move(c)); };
        detail::start_relayed<T>(begin, [d = std::move(done)](outcome<T>&& o) mutable noexcept {
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
      }
    }

    Ld l;
  };

  shared_loader(counted_ref b, call_fn c, start_fn s) noexcept
      : box_(std::move(b)), call_(c), start_(s) {}
  counted_ref box_;           // the type-erased copy, or none
  call_fn call_ = nullptr;    // the synchronous form, or null
  start_fn start_ = nullptr;  // the asynchronous form, or null
};

// is_shared_loader<L, Key, T>: L is the cache-wide loader's type (dispatched on its form).
template <class L, class Key, class T>
inline constexpr bool is_shared_loader =
    std::same_as<std::remove_cvref_t<L>, shared_loader<Key, T>>;

}  // namespace singleflight::detail
