// singleflight/detail/batch/bulk_results.hpp -- internal; do not include directly.
//
// What a bulk function may answer for a batch of keys, and how that answer
// becomes one result per key:
//   * a sized sequence aligned with the keys, each element either something
//     that converts to T, a load_result<T> (empty: not_found_error), or an
//     outcome<T> (a value or that key's exception); another length than the
//     keys' fails every key with batch_size_error;
//   * a map (anything with mapped_type, find(key) and end()) whose mapped
//     values are any of the three: a key it does not hold is not_found_error.
// collect_results() writes one key_result per key; a conversion that throws
// (T's constructor) fails that key only.
//
// Locking: none; nothing here has state. Runs user code (T's conversions and
// copies, the map's find): called with no lock of the loader held.
#pragma once

#include <concepts>
#include <cstddef>
#include <exception>
#include <iterator>
#include <optional>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../batch_options.hpp"
#include "../../cache_options.hpp"
#include "../../outcome.hpp"

namespace singleflight::detail {

// One key's answer: a value, or the exception for that key.
template <class T>
struct key_result {
  std::optional<T> value;
  std::exception_ptr error;
};

template <class E, class T>
concept key_answer =
    std::convertible_to<E, T> || std::same_as<std::remove_cvref_t<E>, load_result<T>> ||
    std::same_as<std::remove_cvref_t<E>, outcome<T>>;

template <class R, class Key, class T>
concept map_answer = requires(std::remove_reference_t<R>& r, const Key& k) {
  typename std::remove_cvref_t<R>::mapped_type;
  r.find(k) != r.end();
  r.find(k)->second;
}
&&key_answer<decltype((std::declval<std::remove_reference_t<R>&>().begin()->second)), T>;

template <class R, class T>
concept sequence_answer = std::ranges::sized_range<std::remove_reference_t<R>> &&
    key_answer<std::ranges::range_reference_t<std::remove_reference_t<R>>, T>;

// Something a bulk function may return (or pass to batch_completion::set_value).
template <class R, class Key, class T>
concept bulk_answer = map_answer<R, Key, T> || sequence_answer<R, T>;

// answer_one(e, out, missing): one element into one key's result; missing()
// is the not_found_error to give an empty load_result. `Move`: the element
// may be moved from.
template <class T, bool Move, class E, class Missing>
void answer_one(E& e, key_result<T>& out, Missing& missing) noexcept {
  using D = std::remove_cvref_t<E>;
  try {
    if constexpr (std::convertible_to<E&, T>) {
      if constexpr (Move && !std::is_const_v<E>) {
        out.value.emplace(std::move(e));
      } else {
        out.value.emplace(e);
      }
    } else if constexpr (std::same_as<D, load_result<T>>) {
      if (!e.loaded) {
        out.error = missing();
      } else if constexpr (Move && !std::is_const_v<E>) {
        out.value.emplace(std::move(*e.loaded));
      } else {
        out.value.emplace(*e.loaded);
      }
    } else {
      static_assert(std::same_as<D, outcome<T>>);
      if (!e.has_value()) {
        out.error = e.error();
      } else if constexpr (Move && !std::is_const_v<E>) {
        out.value.emplace(std::move(e).value());
      } else {
        out.value.emplace(e.value());
      }
    }
  } catch (...) {
    out.value.reset();
    out.error = std::current_exception();
  }
}

// collect_results(answer, keys, out): out[i] is keys[i]'s result. Returns the
// exception that fails every key instead (a sequence of the wrong length),
// or null. `out` has keys.size() elements.
template <class T, class Key, class R>
std::exception_ptr collect_results(R&& answer, std::span<const Key> keys,
                                   std::vector<key_result<T>>& out) {
  constexpr bool move = !std::is_lvalue_reference_v<R>;
  std::exception_ptr not_found;
  // One not_found_error object for every missing key of the batch.
  auto missing = [&]() -> const std::exception_ptr& {
    if (!not_found) not_found = std::make_exception_ptr(not_found_error());
    return not_found;
  };
  if constexpr (map_answer<R, Key, T>) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      try {
        auto it = answer.find(keys[i]);
        if (it == answer.end()) {
          out[i].error = missing();
        } else {
          answer_one<T, move>(it->second, out[i], missing);
        }
      } catch (...) {  // the map's find (Hash, compare) threw: this key only
        out[i].error = std::current_exception();
      }
    }
    return nullptr;
  } else {
    const auto n = static_cast<std::size_t>(std::ranges::size(answer));
    if (n != keys.size()) return std::make_exception_ptr(batch_size_error(keys.size(), n));
    std::size_t i = 0;
    for (auto&& e : answer) answer_one<T, move>(e, out[i++], missing);
    return nullptr;
  }
}

}  // namespace singleflight::detail
