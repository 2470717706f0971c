// Must NOT compile: thread_executor's threads belong to the group, so it is a
// tag, not a callable; wrapping it (which would silently turn group-owned,
// joined threads into detached ones) is rejected with a message.
// ctest: compile_fail.wrap_thread_executor (tests/compile_fail/CMakeLists.txt).
#include <singleflight/singleflight.hpp>

#include <string>

int main() {
  singleflight::options o;
  o.executor = [](singleflight::task t) { singleflight::thread_executor{}(std::move(t)); };
  singleflight::group<std::string, int> g(o);
  return g.do_("k", [] { return 0; });
}
