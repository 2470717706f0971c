// Defect H of the issue "Where user code runs": "which thread is inside this
// group" was a thread_local in a function-local static of an inline function,
// so with -fvisibility=hidden each shared object had its own copy. A fn run by
// module A that calls close() (instantiated in module B) waited for its own
// thread, and B's self-deadlock check missed A's flight. Both are per group
// now; these tests run the group's members from two such modules.
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>

#include "modules.hpp"
#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;

namespace {
// a_do(g, "k", inside): its value, or -1 for closed_error.
int call(sfmod::group_t& g, sfmod::callback inside) {
  try {
    return sfmod::a_do(g, "k", inside);
  } catch (const sf::closed_error&) {
    return -1;
  }
}
}  // namespace

TEST_CASE("H: close() from inside fn with fn and close() in different modules does not deadlock",
          "[user-code][modules][close]") {
  sfmod::group_t g;
  std::atomic<int> result{0};  // -1: closed_error (close() settled fn's own flight)
  sftest::jthread t([&] { result = call(g, &sfmod::b_close); });
  sftest::must([&] { return result.load() != 0; }, "a_do with close() inside returned");
  CHECK(result == -1);
  CHECK_THROWS_AS(g.do_(std::string("k"), [] { return 0; }), sf::closed_error);
}

TEST_CASE("H: fn in module A calling do_ for its own key from module B is a logic_error",
          "[user-code][modules][self-deadlock]") {
  sfmod::group_t g;
  std::atomic<int> state{0};  // 1: returned, 2: logic_error
  sftest::jthread t([&] {
    try {
      (void)sfmod::a_do(g, "k", &sfmod::b_same_key);
      state = 1;
    } catch (const std::logic_error&) {
      state = 2;
    }
  });
  sftest::must([&] { return state.load() != 0; }, "a_do with do_ for its own key inside");
  CHECK(state == 2);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("H: close() from a nested fn in the other module waits for neither of its frames",
          "[user-code][modules][close]") {
  sfmod::group_t g;
  std::atomic<int> result{0};
  sftest::jthread t([&] { result = call(g, &sfmod::b_close_from_do); });
  sftest::must([&] { return result.load() != 0; }, "nested close() returned");
  CHECK(result == -1);
}
