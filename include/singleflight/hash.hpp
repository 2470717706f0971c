// singleflight/hash.hpp
//
// `singleflight::default_hash`, the group's default key hasher: transparent,
// so `group<std::string, T>` can be probed with `std::string_view` or
// `const char*` without building a `std::string`, and able to hash
// `std::pair` / `std::tuple` keys out of the box.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "detail/functional.hpp"

namespace singleflight {

namespace detail {

template <class K>
concept string_like = std::convertible_to<const K&, std::string_view>;

template <class K>
concept tuple_like = requires {
  std::tuple_size<std::remove_cvref_t<K>>::value;
};

template <class K>
concept std_hashable = requires(const K& k) {
  { std::hash<std::remove_cvref_t<K>>{}(k) } -> std::convertible_to<std::size_t>;
};

template <class K>
concept default_hashable = string_like<K> || tuple_like<K> || std_hashable<K>;

// Mixes one element's hash into a running seed (the 64-bit variant of
// boost::hash_combine's constant, with a final avalanche from splitmix64).
constexpr std::size_t hash_mix(std::size_t seed, std::size_t h) noexcept {
  std::uint64_t x =
      static_cast<std::uint64_t>(seed) ^
      (static_cast<std::uint64_t>(h) + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<std::size_t>(x);
}

}  // namespace detail

// default_hash
//
// Hashes, in this order of preference:
//   * anything convertible to std::string_view, as that string_view, so
//     std::string, std::string_view, const char* and char arrays with equal
//     characters hash equally (this is what makes mixed probes find entries);
//   * std::pair / std::tuple / std::array of hashable elements, element-wise;
//   * anything else std::hash supports.
// Thread-safe (stateless). Throws only if an element's std::hash throws.
//
// The key is a contract: it must hold every input that changes the result
// (tenant, locale, API version, authorisation scope) and nothing that does
// not (request ids, timestamps). A key without the tenant serves one
// tenant's data to another.
struct default_hash {
  using is_transparent = void;

  template <detail::default_hashable K>
  std::size_t operator()(const K& key) const {
    if constexpr (detail::string_like<K>) {
      return std::hash<std::string_view>{}(std::string_view(key));
    } else if constexpr (detail::tuple_like<K>) {
      return std::apply(
          [this](const auto&... element) {
            std::size_t seed = sizeof...(element);
            ((seed = detail::hash_mix(seed, (*this)(element))), ...);
            return seed;
          },
          key);
    } else {
      return std::hash<std::remove_cvref_t<K>>{}(key);
    }
  }
};

namespace detail {

// direct_probe<K, Key, Hash, KeyEqual>: whether a table of Key hashed by Hash and compared by
// KeyEqual may be probed with a K as it is: when K is Key, or when both are strings under the
// default (transparent) hash and equality, whose hashes are known to agree. Any other probe is
// converted to Key once, before a lock is taken.
template <class K, class Key, class Hash, class KeyEqual>
inline constexpr bool direct_probe = std::same_as<std::remove_cvref_t<K>, Key> ||
                                     (std::same_as<Hash, default_hash> &&
                                      std::same_as<KeyEqual, std::equal_to<>> && string_like<K> &&
                                      string_like<Key>);

}  // namespace detail

}  // namespace singleflight
