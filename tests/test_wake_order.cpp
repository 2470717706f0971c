// The settling thread notifies a flight's waiters in the order they joined:
// the longest wait ends first. Callbacks and coroutines run one after
// another on that thread, so their order is observable directly.
#include <singleflight/singleflight.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/sync.hpp"

namespace {
namespace sf = singleflight;
using group_t = sf::group<std::string, int>;

sftest::fire_task<int> co_join(group_t& g, sftest::completion_box<int>& box,
                               std::vector<int>& order, int me) {
  auto fn = box.fn();
  const int v = co_await g.co_do(std::string("k"), fn);
  order.push_back(me);  // runs on the settling thread, one resumption at a time
  co_return v;
}
}  // namespace

TEST_CASE("waiters are notified in the order they joined", "[async][order]") {
  // Catches: a LIFO wake batch (the first waiter to arrive resumed last).
  constexpr int n = 64;
  group_t g;
  sftest::completion_box<int> box;
  std::vector<int> order;
  std::vector<sftest::fire_task<int>> tasks;
  for (int i = 0; i < n; ++i) {
    if (i % 2 == 0) {
      tasks.push_back(co_join(g, box, order, i));
    } else {
      g.async_do("k", box.fn(), [&order, i](sf::outcome<int> o) {
        if (o.has_value()) order.push_back(i);
      });
    }
  }
  REQUIRE(g.stats().joins == n - 1);
  REQUIRE(order.empty());
  auto c = box.take("the flight's completion");
  c.second.set_value(1);  // notifies all n inline, here
  REQUIRE(order.size() == n);
  for (int i = 0; i < n; ++i) CHECK(order[static_cast<std::size_t>(i)] == i);
}
