// A group and a cache with many shards (256), used from several threads, then
// read (stats(), in_flight(), size()), closed from two threads at once and
// destroyed. The default is 8 shards per hardware thread (up to 256), so a
// 32-core machine builds groups like these without asking.
//
// What it pins: nothing the library does holds more than a few shard locks
// at once. ThreadSanitizer's deadlock detector follows at most 64 locks held
// by one thread; a stats() or close() that locks every shard at once makes it
// fail with "CHECK failed: sanitizer_deadlock_detector.h:67 ... (0x40, 0x40)"
// and hang (RELIABILITY.md hazard 15). So these tests matter under the tsan
// preset (they run in every preset: the counts they check hold everywhere).
#include <singleflight/cache.hpp>
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::gate;
using sftest::must;
using sftest::result;

constexpr std::size_t many = 256;  // > 64: past ThreadSanitizer's lock bound
constexpr int workers = 4;
constexpr int keys_each = 64;

}  // namespace

TEST_CASE("a group of 256 shards is used, read, closed from two threads and destroyed",
          "[shards]") {
  sf::options o;
  o.shards = many;
  auto g = std::make_unique<sf::group<int, int>>(o);

  // A flight held open (key -1), which every worker joins once its own
  // flights (distinct keys, spread over the shards) are done.
  gate held;
  result<int> lead;
  auto tl = sftest::spawn(lead, [&] {
    return g->do_(-1, [&] {
      held.wait("held flight released");
      return 7;
    });
  });
  must([&] { return g->stats().flights == 1; }, "held flight started");

  std::atomic<int> wrong{0};
  std::vector<std::unique_ptr<sftest::thread>> ts;
  for (int t = 0; t < workers; ++t) {
    ts.push_back(std::make_unique<sftest::thread>([&, t] {
      for (int i = 0; i < keys_each; ++i) {
        const int key = t * 1000 + i;
        if (g->do_(key, [key] { return key; }) != key) wrong.fetch_add(1);
      }
      if (g->do_(-1, [] { return -1; }) != 7) wrong.fetch_add(1);
    }));
  }
  // stats() and in_flight() while the workers run.
  must([&] { return g->stats().joins == workers && g->in_flight() == 1; }, "every worker joined");
  held.open();
  for (auto& t : ts) t->join("worker finished");
  sftest::finish(tl, lead, "held flight's leader returned");
  REQUIRE(lead.value == 7);
  CHECK(wrong == 0);

  const sf::stats s = g->stats();
  CHECK(s.flights == 1 + workers * keys_each);
  CHECK(s.fn_starts == s.flights);
  CHECK(s.joins == workers);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
  CHECK(s.in_flight == 0);
  CHECK(g->in_flight() == 0);

  // close() from two threads at once while a flight runs: the flight's token
  // is stopped, its caller gets closed_error, both closes return once its fn
  // has returned.
  std::atomic<bool> fn_running{false};
  result<int> running;
  auto tr = sftest::spawn(running, [&] {
    return g->do_(-2, [&](sf::stop_token st) {
      fn_running = true;
      must([&] { return st.stop_requested(); }, "close() stops the running flight");
      return 2;
    });
  });
  must([&] { return fn_running.load(); }, "flight running");
  sftest::thread c1([&] { g->close(); });
  sftest::thread c2([&] { g->close(); });
  c1.join("first close returned");
  c2.join("second close returned");
  sftest::finish(tr, running, "running flight's caller returned");
  CHECK(running.threw<sf::closed_error>());
  CHECK(g->in_flight() == 0);

  // Every shard is closed: keys spread over all of them are rejected.
  int rejected = 0;
  for (int key = 0; key < 4 * static_cast<int>(many); ++key) {
    try {
      (void)g->do_(key, [] { return 0; });
    } catch (const sf::closed_error&) {
      ++rejected;
    }
  }
  CHECK(rejected == 4 * static_cast<int>(many));
  CHECK(g->stats().rejections == static_cast<std::uint64_t>(rejected));
  g.reset();  // the destructor: close() again, then the threads
}

TEST_CASE("a cache whose group has 256 shards is used, read, closed and destroyed", "[shards]") {
  sf::cache_options o;
  o.ttl = 1h;
  o.jitter = 0;
  o.flight.shards = many;
  std::atomic<int> loads{0};
  std::atomic<bool> held_running{false};
  auto c = std::make_unique<sf::cache<int, int>>(o, [&](const int& key, sf::stop_token st) {
    if (key == -1) {  // held until close() stops it
      held_running = true;
      must([&] { return st.stop_requested(); }, "close() stops the held load");
      return -1;
    }
    loads.fetch_add(1);
    return key * 2;
  });

  std::atomic<int> wrong{0};
  {
    std::vector<std::unique_ptr<sftest::thread>> ts;
    for (int t = 0; t < workers; ++t) {
      ts.push_back(std::make_unique<sftest::thread>([&] {
        for (int round = 0; round < 2; ++round) {  // loads or joins, then hits
          for (int key = 0; key < keys_each; ++key) {
            if (c->get(key) != key * 2) wrong.fetch_add(1);
          }
        }
      }));
    }
    (void)c->stats();  // while the workers run
    (void)c->flight_stats();
    for (auto& t : ts) t->join("cache worker finished");
  }
  CHECK(wrong == 0);
  CHECK(loads == keys_each);  // one per key: a long ttl, no refresh
  const sf::cache_stats cs = c->stats();
  CHECK(cs.loads == static_cast<std::uint64_t>(keys_each));
  CHECK(cs.size == static_cast<std::size_t>(keys_each));
  CHECK(cs.hits >= static_cast<std::uint64_t>(workers * keys_each));  // the second round
  CHECK(c->size() == static_cast<std::size_t>(keys_each));
  const sf::stats fs = c->flight_stats();
  // At least one flight per key; more when a caller missed just before a load published and
  // its flight then found the value (a flight checks the cache again before calling the
  // loader): `loads` above is the one-origin-call-per-key guarantee.
  CHECK(fs.flights >= static_cast<std::uint64_t>(keys_each));
  CHECK(fs.in_flight == 0);

  // close() from two threads while a load runs; then every call is rejected.
  result<int> held;
  auto th = sftest::spawn(held, [&] { return c->get(-1); });
  must([&] { return held_running.load(); }, "held load running");
  sftest::thread c1([&] { c->close(); });
  sftest::thread c2([&] { c->close(); });
  c1.join("first cache close returned");
  c2.join("second cache close returned");
  sftest::finish(th, held, "held load's caller returned");
  CHECK(held.threw<sf::closed_error>());
  CHECK_THROWS_AS(c->get(keys_each + 1), sf::closed_error);
  CHECK(c->flight_stats().in_flight == 0);
  c.reset();  // the destructor: close() again, then the entries
}
