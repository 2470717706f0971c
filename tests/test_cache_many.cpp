// singleflight::cache::get_many and asynchronous cache-wide loaders (issue 32, item 4):
// get_many starts every key's lookup and load before it waits on any and answers one
// outcome per key, in place; an asynchronous cache-wide loader (void(const Key&, stop_token,
// completion<T>) or the load_result form) serves every load and refresh without a thread
// per key; batch_loader::cache_loader() is one, so the misses and refreshes of a get_many
// share bulk calls. The origins are held with gates or keep their completions, so loads are
// provably pending; the cache's windows run on a manual clock. Every wait is bounded.
#include <singleflight/batch_loader.hpp>
#include <singleflight/cache.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/batch.hpp"
#include "support/brittle.hpp"
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::gate;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using scache = sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, manual_clock>;

sf::cache_options opts() {
  sf::cache_options o;
  o.ttl = 1min;
  o.jitter = 0;
  o.stale_while_revalidate = 1h;
  return o;
}

std::vector<std::string> keys_of(int n, const char* prefix = "k") {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

// The threads this process has now.
std::size_t threads_now() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

template <class E>
bool holds(const sf::outcome<std::string>& o) {
  if (o.has_value()) return false;
  try {
    std::rethrow_exception(o.error());
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

// An asynchronous origin that keeps every load's completion until the test resolves it: its
// loads stay pending as long as the test wants, holding no thread.
struct held_origin {
  std::mutex m;
  std::vector<std::pair<std::string, sf::completion<sf::load_result<std::string>>>> held;  // m
  std::atomic<int> calls{0};

  auto loader() {
    return [this](const std::string& key, sf::stop_token,
                  sf::completion<sf::load_result<std::string>> done) {
      calls.fetch_add(1);
      const std::lock_guard<std::mutex> lk(m);
      held.emplace_back(key, std::move(done));
    };
  }
  std::size_t count() {
    const std::lock_guard<std::mutex> lk(m);
    return held.size();
  }
  // Resolves every held load with prefix + key (no lock held while it publishes).
  void release(const std::string& prefix) {
    std::vector<std::pair<std::string, sf::completion<sf::load_result<std::string>>>> all;
    {
      const std::lock_guard<std::mutex> lk(m);
      all.swap(held);
    }
    for (auto& [k, d] : all) d.set_value(sf::load_result<std::string>::value(prefix + k));
  }
};

bool all_cached(const scache& c, const std::vector<std::string>& keys, const std::string& prefix) {
  for (const auto& k : keys) {
    const auto p = c.peek(k);
    if (!p || !p->value || *p->value != prefix + k) return false;
  }
  return true;
}

}  // namespace

TEST_CASE(
    "a batch_loader as the cache-wide loader: get_many of 1,000 keys cold, then stale, "
    "in few bulk calls and no thread per key",
    "[cache][many][batch]") {
  manual_clock::reset();
  constexpr int n = 1000;
  sftest::bulk_record<std::string> rec;
  std::atomic<bool> holding{false};
  gate hold;
  sf::batch_options bo;
  bo.max_batch = 64;
  bo.window = 300ms;  // batches close full: 64 keys arrive well within it
  bo.max_in_flight_batches = 2;
  bo.max_threads = 2;  // the loader's own threads: the threads counted below are the cache's
  // Declared before the cache: the cache (and its loads) end first.
  sf::batch_loader<std::string, std::string> bl(
      [&](std::span<const std::string> ks, sf::stop_token st) {
        const std::size_t i = rec.enter(ks);
        if (holding.load()) hold.wait("refresh bulk calls released");
        std::vector<std::string> out;
        for (const auto& k : ks) out.push_back((holding.load() ? "new:" : "v:") + k);
        rec.leave(i, st);
        return out;
      },
      bo);
  scache c(opts(), bl.cache_loader());
  const auto keys = keys_of(n);
  const std::size_t base_threads = threads_now();

  // Cold: every key a miss, all started together.
  const auto cold = c.get_many(keys);
  REQUIRE(cold.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(cold[i].has_value());
    CHECK(cold[i].value() == "v:" + keys[i]);
  }
  const std::size_t cold_calls = rec.count();
  CHECK(cold_calls >= 16);
  CHECK(cold_calls <= 18);
  CHECK(threads_now() <= base_threads + 4);

  // Past ttl, within stale_while_revalidate: get_many answers all 1,000 from the cache while
  // the refreshes' bulk calls are held, so it waited on none of them.
  manual_clock::advance(2min);
  holding = true;
  const auto stale = c.get_many(keys);
  REQUIRE(stale.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(stale[i].has_value());
    CHECK(stale[i].value() == "v:" + keys[i]);
  }
  rec.wait(cold_calls + 1, "a refresh bulk call started");
  hold.open();
  must([&] { return all_cached(c, keys, "new:"); }, "every key refreshed");
  CHECK(rec.count() - cold_calls <= 18);
  CHECK(c.stats().background_refreshes == n);
  // No thread per key: the cache started none for its loads, the batch_loader a few.
  CHECK(threads_now() <= base_threads + 4);
}

TEST_CASE("an asynchronous cache-wide loader that never completes holds no worker",
          "[cache][many]") {
  manual_clock::reset();
  held_origin origin;
  sf::cache_options o = opts();
  o.max_threads = 4;
  scache c(o, origin.loader());
  const auto keys = keys_of(200);
  for (const auto& k : keys) c.put(k, "old:" + k);
  manual_clock::advance(2min);
  const std::size_t base_threads = threads_now();
  // 200 refreshes start and stay pending.
  const auto stale = c.get_many(keys);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(stale[i].has_value());
    CHECK(stale[i].value() == "old:" + keys[i]);
  }
  must([&] { return origin.count() == keys.size(); }, "every refresh started");
  CHECK(c.stats().loads_running == keys.size());
  CHECK(threads_now() <= base_threads + 1);  // 200 pending refreshes, no thread for them
  // Synchronous loads still find the cache's 4 threads free.
  for (int i = 0; i < 8; ++i) {
    const std::string k = "cold" + std::to_string(i);
    CHECK(c.get(
              k, [](const std::string& key) { return "s:" + key; }, {}, 20s) == "s:" + k);
  }
  CHECK(threads_now() <= base_threads + 6);  // the 4 threads, the inner group's bound timer
  origin.release("new:");
  must([&] { return all_cached(c, keys, "new:"); }, "every refresh published");
  CHECK(origin.calls.load() == static_cast<int>(keys.size()));
}

TEST_CASE("an asynchronous cache-wide loader serves get, get_entry, async_get and refreshes",
          "[cache][many]") {
  manual_clock::reset();
  std::atomic<int> calls{0};
  // The completion<T> form, resolved before it returns.
  scache c(opts(), [&](const std::string& key, sf::stop_token, sf::completion<std::string> done) {
    calls.fetch_add(1);
    if (key == "bad") {
      done.set_exception(std::make_exception_ptr(std::runtime_error("origin")));
    } else {
      done.set_value("v" + std::to_string(calls.load()) + ":" + key);
    }
  });
  CHECK(c.get("a") == "v1:a");
  CHECK(c.get_entry("a").state == sf::freshness::fresh);
  CHECK_THROWS_AS(c.get("bad", {}, 20s), std::runtime_error);
  sftest::callback_log<std::string> log;
  c.async_get("b", log.on_done());
  log.wait("async_get answered");
  REQUIRE(log.value);
  CHECK(*log.value == "v3:b");
  manual_clock::advance(2min);
  const auto e = c.get_entry("a");
  CHECK(e.state == sf::freshness::stale);
  CHECK(*e.value == "v1:a");
  must([&] { return c.peek("a") && *c.peek("a")->value == "v4:a"; }, "refreshed");
}

TEST_CASE("get_many with a bound returns by the bound and the loads still fill the cache",
          "[cache][many]") {
  manual_clock::reset();
  const auto keys = keys_of(10);
  // 300 ms, not less: a bound already passed when a key's call reaches the group starts no
  // load (docs/group.md), and under TSan on busy cores a shorter one sometimes passed first.
  // The origin is held, so every caller still leaves at the bound.
  SECTION("asynchronous cache-wide loader") {
    held_origin origin;
    scache c(opts(), origin.loader());
    const auto out = c.get_many(keys, {}, 300ms);
    REQUIRE(out.size() == keys.size());
    for (const auto& o : out) CHECK(holds<sf::timeout_error>(o));
    must([&] { return origin.count() == keys.size(); }, "every load started");
    origin.release("v:");
    must([&] { return all_cached(c, keys, "v:"); }, "the loads filled the cache");
    const auto again = c.get_many(keys, {}, 20s);
    for (std::size_t i = 0; i < keys.size(); ++i) CHECK(again[i].value() == "v:" + keys[i]);
    CHECK(origin.calls.load() == static_cast<int>(keys.size()));
  }
  SECTION("synchronous cache-wide loader on the cache's threads") {
    gate release;
    std::atomic<int> calls{0};
    scache c(opts(), [&](const std::string& key) {
      calls.fetch_add(1);
      release.wait("origin released");
      return "v:" + key;
    });
    const auto out = c.get_many(keys, {}, 300ms);
    for (const auto& o : out) CHECK(holds<sf::timeout_error>(o));
    release.open();
    must([&] { return all_cached(c, keys, "v:"); }, "the loads filled the cache");
    CHECK(calls.load() == static_cast<int>(keys.size()));
  }
  SECTION("a stopped token: cancelled_error in every slot still loading") {
    held_origin origin;
    scache c(opts(), origin.loader());
    c.put("k0", "cached");
    sf::stop_source src;
    src.request_stop();
    const auto out = c.get_many(keys, src.get_token());
    CHECK(out[0].value() == "cached");  // an answer from the cache whatever the token
    for (std::size_t i = 1; i < out.size(); ++i) CHECK(holds<sf::cancelled_error>(out[i]));
    origin.release("v:");
  }
}

TEST_CASE(
    "get_many: a key whose load fails gets its error in its slot only; duplicates share "
    "a load",
    "[cache][many][batch]") {
  manual_clock::reset();
  sf::batch_options bo;
  bo.window = 1ms;
  sf::batch_loader<std::string, std::string> bl(
      [](std::span<const std::string> ks) {
        std::vector<sf::outcome<std::string>> out;
        for (const auto& k : ks) {
          if (k == "bad") {
            out.emplace_back(std::make_exception_ptr(std::runtime_error("bad key")));
          } else if (k == "gone") {
            out.emplace_back(std::make_exception_ptr(sf::not_found_error()));
          } else {
            out.emplace_back(std::in_place, "v:" + k);
          }
        }
        return out;
      },
      bo);
  scache c(opts(), bl.cache_loader());
  const std::vector<std::string> keys{"a", "bad", "b", "gone", "a"};
  const auto out = c.get_many(keys, {}, 20s);
  REQUIRE(out.size() == 5);
  CHECK(out[0].value() == "v:a");
  CHECK(holds<std::runtime_error>(out[1]));
  CHECK(out[2].value() == "v:b");
  CHECK(holds<sf::not_found_error>(out[3]));
  CHECK(out[4].value() == "v:a");

  // With a per-call loader: one load per distinct key.
  std::atomic<int> calls{0};
  const std::vector<std::string> more{"x", "y", "x", "z", "y", "x"};
  const auto got = c.get_many(more, [&](const std::string& k) {
    calls.fetch_add(1);
    return "p:" + k;
  });
  for (std::size_t i = 0; i < more.size(); ++i) CHECK(got[i].value() == "p:" + more[i]);
  CHECK(calls.load() == 3);
}

namespace {

// A value whose moves on one watched thread are counted; the fire_at-th runs `act`.
struct move_watch {
  std::atomic<std::thread::id> thread{};
  std::atomic<int> moves{0};
  int fire_at = -1;
  std::function<void()> act;
  void moved() {
    if (thread.load(std::memory_order_acquire) != std::this_thread::get_id()) return;
    if (moves.fetch_add(1) + 1 == fire_at) act();
  }
};

move_watch watch;

struct mval {
  std::string s;
  explicit mval(std::string v) : s(std::move(v)) {}
  mval(const mval&) = default;
  mval(mval&& o) noexcept : s(std::move(o.s)) { watch.moved(); }
  mval& operator=(const mval&) = default;
  mval& operator=(mval&&) = default;
  ~mval() = default;
};

// An asynchronous origin for mval that keeps every load's completion by key.
struct held_mval_origin {
  std::mutex m;
  std::vector<std::pair<std::string, sf::completion<mval>>> held;  // m
  auto loader() {
    return [this](const std::string& key, sf::stop_token, sf::completion<mval> done) {
      const std::lock_guard<std::mutex> lk(m);
      held.emplace_back(key, std::move(done));
    };
  }
  std::size_t count() {
    const std::lock_guard<std::mutex> lk(m);
    return held.size();
  }
  sf::completion<mval> take(const std::string& key) {
    const std::lock_guard<std::mutex> lk(m);
    for (auto& [k, d] : held) {
      if (k == key) return std::move(d);
    }
    return {};
  }
};

}  // namespace

TEST_CASE("get_many: a T move that blocks while one key is delivered does not stall another's",
          "[cache][many]") {
  // Each key's outcome is moved into get_many's slot on the thread that settles its load. T's
  // move is user code: it must not run under the lock that every other key's delivery takes.
  // The moves of one delivery are counted once (the last is the one into the slot); then a
  // second get_many blocks in that move until another key's delivery returns (bounded).
  sf::cache<std::string, mval> c(sf::cache_options{});
  held_mval_origin origin;
  const auto run = [&](const std::string& a, const std::string& b, auto&& during_last_move) {
    const std::vector<std::string> keys{a, b};
    std::vector<sf::outcome<mval>> out;
    sftest::thread caller([&] { out = c.get_many(keys, origin.loader()); });
    must([&] { return origin.count() >= 2; }, "both loads start");
    sftest::thread resolver([&, d = origin.take(a)]() mutable {
      watch.moves.store(0);
      watch.thread.store(std::this_thread::get_id(), std::memory_order_release);
      d.set_value(mval("va"));
      watch.thread.store(std::thread::id{});
    });
    resolver.join("a's delivery returns");
    during_last_move.finish(origin, b);
    caller.join("get_many returns");
    REQUIRE(out.size() == 2);
    CHECK(out[0].value().s == "va");
    CHECK(out[1].value().s == "vb");
    origin.held.clear();
  };

  // Count the moves of one delivery.
  struct plain {
    void finish(held_mval_origin& o, const std::string& b) { o.take(b).set_value(mval("vb")); }
  };
  watch.fire_at = -1;
  run("a1", "b1", plain{});
  const int last = watch.moves.load();
  REQUIRE(last > 0);

  // Again, blocking in the last move (into the slot) until b's delivery has returned.
  std::atomic<bool> b_done{false};
  bool b_in_time = false;
  std::unique_ptr<sftest::thread> b_resolver;
  watch.fire_at = last;
  watch.act = [&] {
    b_resolver = std::make_unique<sftest::thread>([&, d = origin.take("b2")]() mutable {
      d.set_value(mval("vb"));
      b_done.store(true);
    });
    b_in_time = sftest::becomes([&] { return b_done.load(); }, 3s);
  };
  struct joined {
    std::unique_ptr<sftest::thread>* t;
    void finish(held_mval_origin&, const std::string&) { (*t)->join("b's delivery returns"); }
  };
  run("a2", "b2", joined{&b_resolver});
  watch.fire_at = -1;
  CHECK(b_in_time);
}

namespace {

using sftest::brittle;
using sftest::move_threw;

using bcache = sf::cache<std::string, brittle>;

const auto load_brittle = [](const std::string& k) { return brittle(k.starts_with("bad")); };

sftest::fire_task<std::string> co_kind(bcache& c, std::string key) {
  try {
    const brittle b = co_await c.co_get(key, load_brittle);
    co_return b.bad ? "bad value" : "value";
  } catch (const move_threw&) {
    co_return "move threw";
  }
}

}  // namespace

TEST_CASE("get_many: a T whose move into the caller's slot throws fails that key only",
          "[cache][many]") {
  // Catches: each key's callback (noexcept) moved the caller's copy into its get_many slot:
  // a throwing move called std::terminate, and the slot was never counted. The key fails
  // with that exception, the others are answered; then co_get, whose result is moved the
  // same way, throws it in the coroutine.
  bcache c(sf::cache_options{});
  std::vector<sf::outcome<brittle>> out;
  sftest::thread caller([&] {
    out = c.get_many(std::vector<std::string>{"bad", "good"}, load_brittle);
  });
  caller.join("get_many returns");
  REQUIRE(out.size() == 2);
  REQUIRE_FALSE(out[0].has_value());
  CHECK(sftest::holds<move_threw>(out[0].error()));
  CHECK(out[1].has_value());

  // Keys not cached yet: their outcomes come from a load (a hit's copy throws on the
  // lookup's path, which already made that the caller's outcome).
  sftest::fire_task<std::string> bad = co_kind(c, "bad-co");
  bad.wait("co_get of bad ends");
  CHECK(bad.get().value == std::optional<std::string>("move threw"));
  sftest::fire_task<std::string> good = co_kind(c, "good-co");
  good.wait("co_get of good ends");
  CHECK(good.get().value == std::optional<std::string>("value"));
}
