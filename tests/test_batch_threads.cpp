// singleflight::batch_loader: its threads and its shutdown (issue 31, on detail::worker_threads).
// close() from two threads at once, from two bulk calls, from two delivery callbacks: every
// close returns (each joined the window thread, or the other's worker, or waited for the other
// callback before); a hung origin holds at most batch_options::max_threads threads (64 by
// default; one per batch before). Batches close by max_batch; running bulk calls are held with
// gates; every wait is bounded (a hang aborts with its name), the closes' by `returns`.
#include <singleflight/batch_loader.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/batch.hpp"
#include "support/catch.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::gate;
using sftest::must;
using sftest::no_window;
using loader_t = sf::batch_loader<std::string, std::string>;

// How long a close that must not wait for anything may take (sanitizers, two busy cores).
constexpr std::chrono::milliseconds returns = 2s;

std::vector<std::string> echo(std::span<const std::string> keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

}  // namespace

TEST_CASE("close() from two threads at once: both return, the window thread joined once",
          "[batch][close][threads]") {
  // Catches: both closers joining the window thread (a hang, or TSan's abort in pthread_join).
  // The closers are released together; the old code hung within a few rounds, at most ~150.
  for (int round = 0; round < 200; ++round) {
    std::optional<loader_t> l;
    l.emplace([](std::span<const std::string> keys) { return echo(keys); });
    std::atomic<int> ready{0}, closed{0};
    auto closer = [&] {
      ++ready;
      must([&] { return ready.load() == 2; }, "both closers ready");
      l->close();
      ++closed;
    };
    sftest::thread c1(closer);
    sftest::thread c2(closer);
    must([&] { return closed.load() == 2; }, "both closes return", returns);
    c1.join("c1");
    c2.join("c2");
  }
}

TEST_CASE("two bulk calls that each call close() return, and so does the destructor",
          "[batch][close][threads][reentrant]") {
  // Catches: each bulk call's close joining the window thread or the other's worker.
  for (int round = 0; round < 50; ++round) {
    std::optional<loader_t> l;
    std::atomic<int> entered{0}, returned{0};
    l.emplace(
        [&](std::span<const std::string> keys) {
          ++entered;
          must([&] { return entered.load() == 2; }, "both bulk calls run");
          l->close();
          ++returned;
          return echo(keys);
        },
        no_window(1));
    std::atomic<int> settled{0};
    l->async_load("a", [&](sf::outcome<std::string>) { ++settled; });
    l->async_load("b", [&](sf::outcome<std::string>) { ++settled; });
    must([&] { return returned.load() == 2; }, "both closes inside the bulk calls return", returns);
    must([&] { return settled.load() == 2; }, "both keys settle");
    std::atomic<bool> destroyed{false};
    sftest::thread d([&] {
      l.reset();
      destroyed = true;
    });
    must([&] { return destroyed.load(); }, "the destructor returns", returns);
    d.join("destroyer");
  }
}

TEST_CASE("two delivery callbacks that each call close() both return",
          "[batch][close][threads][reentrant]") {
  // Catches: each callback's close waiting for the other's delivery, which is that close.
  loader_t l([](std::span<const std::string> keys) { return echo(keys); }, no_window(1));
  std::atomic<int> in_callback{0}, closed{0};
  auto on_done = [&](sf::outcome<std::string>) {
    ++in_callback;
    must([&] { return in_callback.load() == 2; }, "both callbacks run");
    l.close();
    ++closed;
  };
  l.async_load("a", on_done);
  l.async_load("b", on_done);
  must([&] { return closed.load() == 2; }, "both closes inside the callbacks return", returns);
  l.close();
}

TEST_CASE("a hung origin holds at most 64 threads by default", "[batch][threads][cap]") {
  // Catches: a new thread for every dispatched batch (batches of one key: one per key).
  gate hold;
  std::atomic<std::size_t> running{0};
  std::atomic<int> settled{0};
  const std::size_t keys = 100;
  {
    loader_t l(
        [&](std::span<const std::string> ks) {
          ++running;
          hold.wait("the test releases the origin");
          return echo(ks);
        },
        no_window(1));
    for (std::size_t i = 0; i < keys; ++i) {
      l.async_load("k" + std::to_string(i), [&](sf::outcome<std::string> r) {
        if (r.has_value()) ++settled;
      });
    }
    must([&] { return running.load() >= 64; }, "64 bulk calls run");
    CHECK_FALSE(sftest::becomes([&] { return running.load() > 64; }, 200ms));
    hold.open();
    must([&] { return settled.load() == static_cast<int>(keys); }, "every key answered");
  }
  CHECK(running.load() == keys);
}

TEST_CASE("batch_options::max_threads bounds the bulk calls' threads", "[batch][threads][cap]") {
  CHECK(sf::batch_options{}.max_threads == 64);
  gate hold;
  std::atomic<std::size_t> running{0};
  std::atomic<int> settled{0};
  sf::batch_options o = no_window(1);
  o.max_threads = 3;
  loader_t l(
      [&](std::span<const std::string> ks) {
        ++running;
        hold.wait("the test releases the origin");
        return echo(ks);
      },
      o);
  for (int i = 0; i < 10; ++i) {
    l.async_load("k" + std::to_string(i), [&](sf::outcome<std::string> r) {
      if (r.has_value()) ++settled;
    });
  }
  must([&] { return running.load() >= 3; }, "3 bulk calls run");
  CHECK_FALSE(sftest::becomes([&] { return running.load() > 3; }, 200ms));
  CHECK(l.stats().running_batches == 10);  // dispatched: running or waiting for a thread
  hold.open();
  must([&] { return settled.load() == 10; }, "every key answered");
}

TEST_CASE(
    "close_for: a bulk call that ignores its token is reported still running, then close() "
    "waits for it",
    "[batch][close]") {
  gate release;
  std::atomic<int> entered{0};
  auto l = std::make_unique<loader_t>(
      [&](std::span<const std::string> keys) {
        entered.fetch_add(1);
        release.wait("released");  // ignores its token
        return echo(keys);
      },
      no_window());
  std::atomic<int> closed_errors{0};
  std::atomic<int> answered{0};
  l->async_load("a", [&](sf::outcome<std::string> o) {
    if (o.has_value()) return;
    try {
      std::rethrow_exception(o.error());
    } catch (const sf::closed_error&) {
      closed_errors.fetch_add(1);
    } catch (...) {
    }
    answered.fetch_add(1);
  });
  l->flush();
  must([&] { return entered.load() == 1; }, "the bulk call started");
  const sf::batch_close_result r = l->close_for(20ms);
  CHECK_FALSE(r.drained);
  CHECK(r.running_batches == 1);
  CHECK(r.keys_in_flight == 1);
  must([&] { return answered.load() == 1; }, "the caller settled");
  CHECK(closed_errors == 1);
  CHECK_THROWS_AS(l->load("b"), sf::closed_error);
  release.open();
  l->close();
  CHECK(l->stats().running_batches == 0);
  l.reset();
}

TEST_CASE("close_for with nothing running drains at once", "[batch][close]") {
  sf::batch_options o;
  o.window = 0ns;
  loader_t l(echo, o);
  CHECK(l.load("a") == "a");
  const sf::batch_close_result r = l.close_for(std::chrono::hours(1));
  CHECK(r.drained);
  CHECK(r.running_batches == 0);
  CHECK(r.keys_in_flight == 0);
  CHECK_THROWS_AS(l.load("b"), sf::closed_error);
}
