// bench/compile_time/group_two_types.cpp: group.cpp with a second group type, group<int,
// std::string>, in the same translation unit: compared with group.cpp, what each further (Key, T)
// costs a TU (a service has many groups). docs/performance.md "Compile time" counts its functions.
#include <singleflight/group.hpp>

#include <string>

int main(int argc, char**) {
  singleflight::group<std::string, int> g;
  singleflight::group<int, std::string> h;
  const int a = g.do_(std::string("tenant-7|user-42"), [&] { return argc; });
  const std::string b = h.do_(argc, [&] { return std::string("tenant-7"); });
  return a + static_cast<int>(b.size());
}
