// singleflight/detail/cache/loader_ref.hpp -- internal; do not include directly.
//
// loader_ref<Key, T>: a caller's synchronous loader, borrowed (not copied) for one call of
// the cache's slow path, so that the slow path (the lookup's answer, the load as a flight of
// the cache's group, a refresh) is one function per cache type rather than one per loader
// type: each loader type adds only the two small functions below (call it and box its value,
// copy it), and a program can compile that path once for all its translation units
// (SINGLEFLIGHT_EXTERN_CACHE, cache.hpp).
//   * load(key, st, found, ttl): the loader called in its shape (detail/fn_shapes.hpp), its
//     value boxed straight into a value_ref<T> (cache_loads::run_sync's path for a borrowed
//     loader: no load_result<T> in between);
//   * share(): a shared_loader holding a copy of the loader, for a flight body or a refresh
//     that outlives the call (what cache_calls::with_erased made of the loader itself); the
//     cache-wide loader is shared as it is, without a second box.
// operator() is declared only, for loader_traits (a synchronous loader taking the key and a
// token that returns load_result<T>, as shared_loader's synchronous form); nothing calls it.
// An asynchronous loader is never borrowed this way: it always runs as a shared_loader.
//
// Locking: none. Valid only while the loader it refers to lives (the call's frame); user code
// (the loader, its copy) runs in the caller's call, under no lock of the cache.
#pragma once

#include <concepts>
#include <memory>
#include <optional>
#include <type_traits>

#include "../../cache_options.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "cache_loader.hpp"
#include "value_box.hpp"

namespace singleflight::detail {

template <class Key, class T>
class loader_ref {
 public:
  // Refers to `loader` (synchronous, a shape loader_traits accepts for a cache of T keyed by
  // Key, or the cache-wide loader in its synchronous form) for as long as it lives.
  template <class Ld>
  requires(!std::same_as<std::remove_cv_t<Ld>, loader_ref> &&
           !loader_traits<std::remove_cv_t<Ld>, Key,
                          T>::is_async) explicit loader_ref(Ld& loader) noexcept
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(loader)))),
        load_(&load<Ld>),
        share_(&share<Ld>) {}

  // Declared, not defined: what loader_traits reads (see the top of this file). The cache
  // calls a borrowed loader through load(); a call of this would not link.
  load_result<T> operator()(const Key& k, stop_token st) const;

  // The loader's value boxed (null and found = false: not found), and the ttl its
  // load_result asked for. Throws what the loader throws.
  value_ref<T> load(const Key& k, const stop_token& st, bool& found,
                    std::optional<std::chrono::nanoseconds>& ttl) const {
    return load_(obj_, k, st, found, ttl);
  }

  // A shared_loader with a copy of the loader. Throws what that copy (or its allocation)
  // throws.
  shared_loader<Key, T> share() const { return share_(obj_); }

 private:
  using load_fn = value_ref<T> (*)(void*, const Key&, const stop_token&, bool&,
                                   std::optional<std::chrono::nanoseconds>&);
  using share_fn = shared_loader<Key, T> (*)(void*);

  template <class Ld>
  static value_ref<T> load(void* obj, const Key& k, const stop_token& st, bool& found,
                           std::optional<std::chrono::nanoseconds>& ttl) {
    Ld& l = *static_cast<Ld*>(obj);
    if constexpr (loader_traits<Ld, Key, T>::returns_result) {
      load_result<T> res = call_loader<T>(l, k, st);
      found = res.loaded.has_value();
      ttl = res.ttl;
      return found ? value_ref<T>::make(std::move(*res.loaded)) : value_ref<T>();
    } else {
      found = true;
      return value_ref<T>::make(call_loader<T>(l, k, st));
    }
  }

  template <class Ld>
  static shared_loader<Key, T> share(void* obj) {
    Ld& l = *static_cast<Ld*>(obj);
    if constexpr (is_shared_loader<Ld, Key, T>) {
      return l;  // the cache-wide loader: one more reference to its box
    } else {
      return shared_loader<Key, T>::of(std::as_const(l));
    }
  }

  void* obj_;
  load_fn load_;
  share_fn share_;
};

}  // namespace singleflight::detail
