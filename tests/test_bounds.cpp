// Guarantee 10: options.max_in_flight caps the map entries (flights whose fn
// has not returned). Starting one more throws overloaded_error; joining is
// never capped.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;

sf::options capped(std::size_t n, bool with_executor = false) {
  sf::options o;
  o.max_in_flight = n;
  if (with_executor) o.executor = sf::thread_executor{};
  return o;
}

}  // namespace

TEST_CASE("max_in_flight: a third key is overloaded, joining still works, slots free up",
          "[bounds]") {
  group_t g{capped(2)};
  sftest::gate release;
  std::atomic<int> started{0};
  std::atomic<int> fn_calls{0};
  auto blocked = [&](int v) {
    return [&, v] {
      ++fn_calls;
      ++started;
      release.wait("release fns");
      return v;
    };
  };
  sftest::result<int> a, b, a2;
  auto ta = sftest::spawn(a, [&] { return g.do_("a", blocked(1)); });
  auto tb = sftest::spawn(b, [&] { return g.do_("b", blocked(2)); });
  sftest::must([&] { return started == 2; }, "two flights running");

  sf::call_info info{sf::role::leader, 7};
  CHECK_THROWS_AS(g.do_("c", blocked(3), {}, info), sf::overloaded_error);
  CHECK(info.role == sf::role::none);
  CHECK(fn_calls == 2);
  auto s = g.stats();
  CHECK(s.overloaded == 1);
  CHECK(s.rejections == 1);
  CHECK(s.in_flight == 2);

  auto ta2 = sftest::spawn(a2, [&] { return g.do_("a", blocked(-1)); });
  sftest::must([&] { return g.stats().joins == 1; }, "joining a capped group works");

  release.open();
  sftest::finish(ta, a, "a");
  sftest::finish(tb, b, "b");
  sftest::finish(ta2, a2, "a2");
  CHECK(*a.value == 1);
  CHECK(*b.value == 2);
  CHECK(*a2.value == 1);
  CHECK(g.in_flight() == 0);

  CHECK(g.do_("c", [] { return 3; }) == 3);
  CHECK(g.do_("d", [] { return 4; }) == 4);
  s = g.stats();
  CHECK(s.overloaded == 1);
  CHECK(s.rejections == 1);
  CHECK(s.flights == 4);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

// A stopped flight whose fn is still winding down keeps its entry, so it
// still takes a slot until the fn returns.
TEST_CASE("max_in_flight: a stopped fn still winding down holds its slot", "[bounds]") {
  group_t g{capped(2, /*with_executor=*/true)};
  sftest::gate release_a, release_b;
  std::atomic<int> started{0};
  std::atomic<bool> a_saw_stop{false};
  sf::stop_source a_stop;

  sftest::result<int> a, b;
  auto ta = sftest::spawn(a, [&] {
    return g.do_(
        "a",
        [&](sf::stop_token st) {
          ++started;
          sftest::must([&] { return st.stop_requested(); }, "a's only waiter left");
          a_saw_stop = true;
          release_a.wait("release a");
          return 1;
        },
        a_stop.get_token());
  });
  auto tb = sftest::spawn(b, [&] {
    return g.do_("b", [&] {
      ++started;
      release_b.wait("release b");
      return 2;
    });
  });
  sftest::must([&] { return started == 2; }, "two flights running");
  a_stop.request_stop();
  sftest::finish(ta, a, "a's caller leaves");
  CHECK(a.threw<sf::cancelled_error>());
  sftest::must([&] { return a_saw_stop.load(); }, "a's fn stopped");

  CHECK(g.in_flight() == 2);
  CHECK_THROWS_AS(g.do_("c", [] { return 3; }), sf::overloaded_error);

  release_a.open();
  sftest::must([&] { return g.in_flight() == 1; }, "a's fn returned");
  CHECK(g.do_("c", [] { return 3; }) == 3);
  release_b.open();
  sftest::finish(tb, b, "b");
  CHECK(*b.value == 2);
  CHECK(g.stats().overloaded == 1);
}
