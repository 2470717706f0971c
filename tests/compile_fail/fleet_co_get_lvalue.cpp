// Must NOT compile: fleet::co_get's awaitable refers to its key and loader (as group::co_do's
// and cache::co_get's do), so it is awaited in the expression that made it; co_await on a
// stored one is rejected with a message.
// ctest: compile_fail.fleet_co_get_lvalue (tests/compile_fail/CMakeLists.txt).
#include <singleflight/fleet.hpp>

#include <coroutine>
#include <exception>
#include <string>

namespace {

struct task {
  struct promise_type {
    task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

task read(singleflight::fleet<std::string, std::string>& f) {
  auto loader = [] { return std::string("v"); };
  auto op = f.co_get(std::string("k"), loader);  // the key is a temporary: it dies here
  (void)co_await op;
}

}  // namespace

int main() {
  singleflight::fleet<std::string, std::string> f;
  read(f);
  return 0;
}
