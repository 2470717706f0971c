// singleflight/codec.hpp
//
// `singleflight::codec<T>` turns a value into bytes and back;
// `singleflight::key_codec<Key>` turns a key into a stable string. The fleet
// layer (fleet.hpp) stores values in Redis through the first and names them
// through the second; neither needs Redis, so this header has no dependency.
//
//   template <>
//   struct singleflight::codec<profile> {
//     static constexpr std::string_view tag = "profile/v2";  // optional, see below
//     std::string encode(const profile& p) const { return p.to_json(); }
//     profile decode(std::string_view bytes) const { return profile::from_json(bytes); }
//   };
//
// Provided: codec<std::string>, codec<T> for every arithmetic T (bool,
// characters, integers, floating point), key_codec for strings, integers and
// std::pair / std::tuple of them.
//
// Rules for a codec (what the fleet relies on):
//   * decode(encode(v)) == v, on every process of the fleet (so: no pointers,
//     no host byte order unless the fleet is homogeneous);
//   * decode throws on bytes it cannot turn into a T (any exception type):
//     the fleet then counts a decode failure and treats the key as a miss;
//     it must never return a wrong T for foreign bytes (the record around the
//     payload carries a checksum, so bytes are never truncated or corrupted
//     in transit; "foreign" means a value written by another program or by a
//     codec of another type under the same key);
//   * `tag` (optional, a std::string_view without '|'): stored with the value
//     and compared on read, so two fleets with different value types that
//     share a key prefix see each other's values as misses, not as garbage.
//     Change it when the encoding changes incompatibly ("profile/v2").
//
// Thread safety: the fleet calls encode and decode concurrently from several
// threads on one codec object: they must be safe to call concurrently (the
// provided codecs are stateless).
#pragma once

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <version>
#if !defined(__cpp_lib_to_chars)
// No floating-point std::from_chars (libc++ before 20): floating-point decode
// uses POSIX strtod_l in the "C" locale instead (below).
#include <locale.h>
#include <stdlib.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif
#include <cerrno>
#include <cmath>
#endif
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include "errors.hpp"  // SINGLEFLIGHT_EXCEPTION_VISIBLE

namespace singleflight {

// decode_error
//
// Thrown by the provided codecs' decode for bytes that are not an encoding of
// the type. A std::runtime_error (not a singleflight::error: it never reaches
// a caller of the fleet, which turns it into a miss).
class SINGLEFLIGHT_EXCEPTION_VISIBLE decode_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// codec<T>
//
// The primary template is deliberately left undefined: a fleet of a T with no
// codec fails to compile with a message that says what to write.
template <class T>
struct codec;

// codec<std::string>: the bytes themselves.
template <>
struct codec<std::string> {
  static constexpr std::string_view tag = "string";
  std::string encode(const std::string& v) const { return v; }
  std::string decode(std::string_view bytes) const { return std::string(bytes); }
};

namespace detail {

template <class T>
constexpr std::string_view arithmetic_tag() noexcept {
  if constexpr (std::is_same_v<T, bool>) {
    return "bool";
  } else if constexpr (std::is_floating_point_v<T>) {
    if constexpr (sizeof(T) == 4) return "f32";
    if constexpr (sizeof(T) == 8) return "f64";
    return "f128";
  } else if constexpr (std::is_signed_v<T>) {
    if constexpr (sizeof(T) == 1) return "i8";
    if constexpr (sizeof(T) == 2) return "i16";
    if constexpr (sizeof(T) == 4) return "i32";
    return "i64";
  } else {
    if constexpr (sizeof(T) == 1) return "u8";
    if constexpr (sizeof(T) == 2) return "u16";
    if constexpr (sizeof(T) == 4) return "u32";
    return "u64";
  }
}

#if !defined(__cpp_lib_to_chars)
// float_from_text: from_chars's grammar for what to_chars writes ("-0.1",
// "1e+300", "4.9e-324", "inf", "nan"), where the standard library has no
// floating-point from_chars: no leading whitespace or '+', no hex, no
// trailing bytes, out of range rejected (a subnormal is in range); the digits
// are read by strtod_l in the "C" locale (whatever the global locale's
// decimal point), which rounds correctly, as from_chars does.
template <class T>
T float_from_text(std::string_view s) {
  const auto bad = [] { return decode_error("singleflight::codec: not a number of this type"); };
  std::string_view body = s;
  const bool negative = body.starts_with('-');
  if (negative) body.remove_prefix(1);
  if (body == "inf" || body == "nan") {
    const T v =
        body == "inf" ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::quiet_NaN();
    return negative ? -v : v;
  }
  if (body.empty() || body.front() < '0' || body.front() > '9') throw bad();
  for (const char c : body) {
    if ((c < '0' || c > '9') && c != '.' && c != 'e' && c != 'E' && c != '-' && c != '+') {
      throw bad();
    }
  }
  static const locale_t c_locale = ::newlocale(LC_ALL_MASK, "C", locale_t{});
  if (c_locale == locale_t{}) throw std::bad_alloc();
  const std::string text(s);  // NUL-terminated
  char* end = nullptr;
  errno = 0;
  T v{};
  if constexpr (sizeof(T) == sizeof(float)) {
    v = ::strtof_l(text.c_str(), &end, c_locale);
  } else if constexpr (sizeof(T) == sizeof(double)) {
    v = ::strtod_l(text.c_str(), &end, c_locale);
  } else {
    v = ::strtold_l(text.c_str(), &end, c_locale);
  }
  if (end != text.c_str() + text.size()) throw bad();
  if (errno == ERANGE && (v == T(0) || std::isinf(v))) throw bad();  // not subnormal: out of range
  return v;
}
#endif

// Decimal text with std::to_chars (shortest round-trip form for floating
// point), so values are readable with redis-cli and portable across hosts.
template <class T>
std::string to_text(T v) {
  char buf[128];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

template <class T>
T from_text(std::string_view s) {
#if !defined(__cpp_lib_to_chars)
  if constexpr (std::is_floating_point_v<T>) {
    return float_from_text<T>(s);
  } else
#endif
  {
    T v{};
    const char* first = s.data();
    const char* last = s.data() + s.size();
    // from_chars accepts no leading '+' or whitespace; reject empty input and
    // trailing bytes too: "12abc" is not 12.
    const auto r = std::from_chars(first, last, v);
    if (s.empty() || r.ec != std::errc() || r.ptr != last) {
      throw decode_error("singleflight::codec: not a number of this type");
    }
    return v;
  }
}

}  // namespace detail

// codec<T> for arithmetic T: decimal text ("42", "-7", "0.1"); bool as "0" / "1".
// decode throws decode_error for anything else (out of range, trailing bytes,
// empty).
template <class T>
requires std::is_arithmetic_v<T>
struct codec<T> {
  static constexpr std::string_view tag = detail::arithmetic_tag<T>();

  std::string encode(const T& v) const {
    if constexpr (std::is_same_v<T, bool>) {
      return v ? "1" : "0";
    } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, wchar_t> ||
                         std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> ||
                         std::is_same_v<T, char32_t>) {
      return detail::to_text(static_cast<std::int64_t>(v));
    } else {
      return detail::to_text(v);
    }
  }

  T decode(std::string_view bytes) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (bytes == "1") return true;
      if (bytes == "0") return false;
      throw decode_error("singleflight::codec<bool>: expected \"0\" or \"1\"");
    } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, wchar_t> ||
                         std::is_same_v<T, char8_t> || std::is_same_v<T, char16_t> ||
                         std::is_same_v<T, char32_t>) {
      const auto wide = detail::from_text<std::int64_t>(bytes);
      if (wide < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
          wide > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
        throw decode_error("singleflight::codec: character code out of range");
      }
      return static_cast<T>(wide);
    } else {
      return detail::from_text<T>(bytes);
    }
  }
};

// key_codec<Key>
//
// `std::string encode(const Key&)`: the key's text in Redis key names. It must
// be stable (the same key gives the same text in every process and every
// build) and injective (two keys that must not share a value never give the
// same text). Like the key itself it is a contract: everything that changes
// the result, and nothing that doesn't.
//
// The text is stored in Redis in clear (in key and channel names). When keys
// hold personal data, specialise key_codec to hash them (e.g. SHA-256 of the
// provided encoding, hex), at the price of unreadable names in redis-cli.
//
// The primary template is undefined: specialise it for your key types, or
// build keys from the provided ones.
template <class Key>
struct key_codec;

// Strings: the characters themselves (any bytes; Redis names are binary-safe).
// Transparent: a key_codec<std::string> also encodes std::string_view and
// const char* probes without building a std::string first.
template <>
struct key_codec<std::string> {
  using is_transparent = void;
  std::string encode(std::string_view k) const { return std::string(k); }
};

template <>
struct key_codec<std::string_view> : key_codec<std::string> {};

// Integers: decimal text.
template <class Key>
requires std::is_integral_v<Key> &&(!std::is_same_v<Key, bool>)struct key_codec<Key> {
  std::string encode(Key k) const { return detail::to_text(k); }
};

namespace detail {

template <class E>
concept key_encodable = requires(const E& e) {
  { key_codec<std::remove_cvref_t<E>>{}.encode(e) } -> std::convertible_to<std::string>;
};

// Appends one element of a composite key as "<length>:<text>", '|'-separated.
template <class E>
void append_key_part(std::string& out, const E& e) {
  const std::string part = key_codec<std::remove_cvref_t<E>>{}.encode(e);
  if (!out.empty()) out += '|';
  out += to_text(part.size());
  out += ':';
  out += part;
}

}  // namespace detail

// std::pair / std::tuple of encodable elements: each element's text, prefixed
// by its length, so that ("a|b", "c") and ("a", "b|c") never collide:
// ("tenant-7", 42) -> "8:tenant-7|2:42".
template <class... E>
requires(detail::key_encodable<E>&&...) struct key_codec<std::tuple<E...>> {
  std::string encode(const std::tuple<E...>& k) const {
    std::string out;
    std::apply([&out](const auto&... e) { (detail::append_key_part(out, e), ...); }, k);
    return out;
  }
};

template <class A, class B>
requires(detail::key_encodable<A>&& detail::key_encodable<B>) struct key_codec<std::pair<A, B>> {
  std::string encode(const std::pair<A, B>& k) const {
    std::string out;
    detail::append_key_part(out, k.first);
    detail::append_key_part(out, k.second);
    return out;
  }
};

}  // namespace singleflight
