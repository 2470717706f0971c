// tests/support/keys.hpp: numbered test keys.
#pragma once

#include <string>

namespace sftest {

// stem_key("k", 7) == "k7". Not `"k" + std::to_string(i)`: g++ 12 at -O3 reports a false
// -Wrestrict inside std::string's operator+ (and insert) for a one-character literal, an
// error with -Werror in the release preset (GCC bug 105651).
inline std::string stem_key(const char* stem, long long i) {
  return std::string(stem).append(std::to_string(i));
}

}  // namespace sftest
