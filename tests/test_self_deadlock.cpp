// Guarantee 11: a fn that calls do_ / do_fresh for its own key on the thread
// running it would wait for itself forever; the group throws std::logic_error
// instead. Calls for other keys from inside fn (re-entrancy) work, and the
// same key from another thread is an ordinary join.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

enum outcome : int { not_called = 0, logic_error = 1, other_error = 2, returned = 3 };

template <class Call>
int classify(Call call) {
  try {
    (void)call();
    return returned;
  } catch (const std::logic_error&) {
    return logic_error;
  } catch (...) {
    return other_error;
  }
}

sf::options where(int mode) {
  sf::options o;
  if (mode == 1) o.executor = sf::thread_executor{};
  if (mode == 2) o.executor = [](sf::task t) { t(); };
  return o;
}

}  // namespace

TEST_CASE("fn calling do_ or do_fresh for its own key throws std::logic_error", "[self_deadlock]") {
  const int mode = GENERATE(0, 1, 2);  // inline, thread_executor, synchronous executor
  CAPTURE(mode);
  group_t g{where(mode)};
  std::atomic<int> nested_do{not_called};
  std::atomic<int> nested_fresh{not_called};
  std::atomic<int> fn_calls{0};

  const int v = g.do_("k", [&] {
    ++fn_calls;
    nested_do = classify([&] { return g.do_("k", [] { return -1; }); });
    nested_fresh = classify([&] { return g.do_fresh("k", [] { return -2; }); });
    return 1;
  });
  CHECK(v == 1);
  CHECK(nested_do == logic_error);
  CHECK(nested_fresh == logic_error);
  CHECK(fn_calls == 1);
  const auto s = g.stats();
  CHECK(s.flights == 1);
  CHECK(s.rejections == 2);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("fn calling do_ for another key works (re-entrancy)", "[self_deadlock]") {
  const int mode = GENERATE(0, 1, 2);
  CAPTURE(mode);
  group_t g{where(mode)};
  sf::call_info inner;
  const int v = g.do_("outer", [&] {
    const int w = g.do_(
        "inner", [] { return 20; }, {}, inner);
    return w + 1;
  });
  CHECK(v == 21);
  CHECK(inner.role == sf::role::leader);
  CHECK(g.stats().flights == 2);
  CHECK(g.in_flight() == 0);
}

// The check walks every flight this thread is running: A's fn calls B, whose
// fn calls A again on the same thread.
TEST_CASE("a nested cycle back to an outer flight's key throws std::logic_error",
          "[self_deadlock]") {
  const int mode = GENERATE(0, 2);  // inline and synchronous executor: one thread throughout
  CAPTURE(mode);
  group_t g{where(mode)};
  std::atomic<int> cycle{not_called};
  const int v = g.do_("a", [&] {
    return g.do_("b", [&] {
      cycle = classify([&] { return g.do_("a", [] { return -1; }); });
      return 2;
    });
  });
  CHECK(v == 2);
  CHECK(cycle == logic_error);
}

// The same key from another thread, while the fn runs, is an ordinary join:
// the detection is per thread, not per key.
TEST_CASE("the same key from another thread joins rather than throwing", "[self_deadlock]") {
  group_t g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  sftest::result<int> leader, other;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&] {
      fn_started = true;
      release.wait("release fn");
      return 1;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto to = sftest::spawn(other, [&] { return g.do_("k", [] { return -1; }); });
  sftest::must([&] { return g.stats().joins == 1; }, "other thread joined");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(to, other, "other");
  CHECK(*leader.value == 1);
  CHECK(*other.value == 1);
}

// After its deadline a flight is settled but its fn still runs and its entry
// stays. A fn calling its own key then must still get logic_error, not wait
// (as an observer) for itself until its wait's deadline.
TEST_CASE(
    "a timed-out fn calling its own key throws std::logic_error instead of waiting for "
    "itself",
    "[self_deadlock][deadline]") {
  sf::options o;
  o.timeout = 200ms;
  group_t g{o};
  std::atomic<int> nested{not_called};
  sftest::result<int> leader;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      sftest::must([&] { return st.stop_requested(); }, "deadline stops the token");
      // Waiting for itself would end, at the wait's own deadline, in
      // timeout_error rather than logic_error.
      nested = classify([&] { return g.do_("k", [] { return -1; }); });
      return 1;
    });
  });
  sftest::finish(tl, leader, "leader");
  CHECK(leader.threw<sf::timeout_error>());
  CHECK(nested == logic_error);
}
