// Must NOT compile: fleet_cache::co_get's awaitable owns its key's text and a copy of the
// loader, so it may be stored, but it is awaited once, as an rvalue (co_await std::move(op));
// co_await on an lvalue is rejected with a message.
// ctest: compile_fail.fleet_cache_co_get_lvalue (tests/compile_fail/CMakeLists.txt).
#include <singleflight/fleet_cache.hpp>

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

task read(singleflight::fleet_cache<std::string, std::string>& c) {
  auto op = c.co_get(std::string("k"), [] { return std::string("v"); });
  (void)co_await op;
}

}  // namespace

int main() {
  singleflight::fleet_cache<std::string, std::string> c;
  read(c);
  return 0;
}
