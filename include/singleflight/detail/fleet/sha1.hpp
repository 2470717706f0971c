// singleflight/detail/fleet/sha1.hpp -- internal; do not include directly.
//
// detail::sha1_hex: the SHA-1 of a string as 40 lowercase hex digits, which
// is how Redis names a cached Lua script (EVALSHA). Not used for anything that
// needs a cryptographic hash. No state, no lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace singleflight::detail {

inline std::string sha1_hex(std::string_view data) {
  std::uint32_t h[5] = {0x67452301U, 0xEFCDAB89U, 0x98BADCFEU, 0x10325476U, 0xC3D2E1F0U};
  const auto rotl = [](std::uint32_t x, int n) { return (x << n) | (x >> (32 - n)); };
  const auto block = [&](const unsigned char* p) {
    std::array<std::uint32_t, 80> w{};
    for (int i = 0; i < 16; ++i) {
      w[i] = (std::uint32_t{p[4 * i]} << 24) | (std::uint32_t{p[4 * i + 1]} << 16) |
             (std::uint32_t{p[4 * i + 2]} << 8) | std::uint32_t{p[4 * i + 3]};
    }
    for (int i = 16; i < 80; ++i) w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; ++i) {
      std::uint32_t f = 0;
      std::uint32_t k = 0;
      if (i < 20) {
        f = (b & c) | (~b & d);
        k = 0x5A827999U;
      } else if (i < 40) {
        f = b ^ c ^ d;
        k = 0x6ED9EBA1U;
      } else if (i < 60) {
        f = (b & c) | (b & d) | (c & d);
        k = 0x8F1BBCDCU;
      } else {
        f = b ^ c ^ d;
        k = 0xCA62C1D6U;
      }
      const std::uint32_t t = rotl(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = rotl(b, 30);
      b = a;
      a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
  };

  std::size_t i = 0;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  for (; i + 64 <= data.size(); i += 64) block(bytes + i);
  // The tail, the 0x80 marker, zero padding and the 64-bit length in bits.
  std::array<unsigned char, 128> tail{};
  // Below 64 after the loop; the mask says so to the optimiser (g++ 12 -O3 otherwise warns that
  // tail[rest] may be past the array: -Wstringop-overflow).
  const std::size_t rest = (data.size() - i) & 63U;
  for (std::size_t j = 0; j < rest; ++j) tail[j] = bytes[i + j];
  tail[rest] = 0x80;
  const std::size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8U;
  for (int j = 0; j < 8; ++j) {
    tail[tail_len - 1 - static_cast<std::size_t>(j)] = static_cast<unsigned char>(bits >> (8 * j));
  }
  block(tail.data());
  if (tail_len == 128) block(tail.data() + 64);

  static constexpr char digits[] = "0123456789abcdef";
  std::string out(40, '0');
  for (int j = 0; j < 5; ++j) {
    for (int n = 0; n < 8; ++n) {
      out[static_cast<std::size_t>(j * 8 + n)] = digits[(h[j] >> (28 - 4 * n)) & 0xFU];
    }
  }
  return out;
}

}  // namespace singleflight::detail
