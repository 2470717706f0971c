// bench/compile_time/group.cpp: one call of group<std::string, int>::do_ (bench/compile_time.sh
// compiles it against naive_group.cpp, the same program with a mutex and an unordered_map).
#include <singleflight/group.hpp>

#include <string>

int main(int argc, char**) {
  singleflight::group<std::string, int> g;
  return g.do_(std::string("tenant-7|user-42"), [&] { return argc; });
}
