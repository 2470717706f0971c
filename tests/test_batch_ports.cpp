// singleflight::batch_loader against the test suites of graphql/dataloader (JavaScript:
// src/__tests__/dataloader.test.js and abuse.test.js) and graph-gophers/dataloader (Go:
// dataloader_test.go): each case that applies to a loader without a per-request memo cache, as
// a test named after it ("dataloader: <its name>" and "gophers: <its name>"). The cases are
// rewritten for this API (no code of theirs is here). JavaScript's "next tick" is a window no
// test waits for (sftest::forever) closed by flush() or max_batch; a promise is async_load's
// callback; Go's thunk is the same.
//
// Cases that do not apply, and why:
//  graphql/dataloader, dataloader.test.js
//   * references the loader as "this" in the batch function / in the cache key function;
//     Custom batch scheduler is provided loader as this context: JavaScript's `this` binding.
//   * batches cached requests; max batch size respects cached results; caches repeated
//     requests; clears single value in loader; clears all values in loader; allows priming the
//     cache (and does not prime keys that already exist, allows forcefully priming the cache,
//     allows priming the cache with a promise); Caches failed fetches; Handles priming the
//     cache with an error; Can clear values from cache after errors; Does not interact with a
//     cache when cache is disabled; Does not call cacheKeyFn when cache is disabled; Complex
//     cache behavior via clearAll(); the four "Accepts object key in custom cacheKey function"
//     cases; Accepts a custom cache map implementation: the per-request memo cache (get, set,
//     delete, clear, prime, cacheKeyFn, cacheMap), which a batch_loader does not have (it is
//     not a cache; its keys are compared with Hash/KeyEqual, tested by "Accepts objects as
//     keys"). "Caches failed fetches" is the opposite of this loader's contract: a failure is
//     forgotten (test_batch_loader.cpp, semantics 4).
//   * allows giving the loader a name: no name property (metrics get labels at registration).
//   * Keys are repeated in batch when cache disabled: the opposite of this loader's contract:
//     each distinct key appears once in a batch (its callers share one flight).
//  graphql/dataloader, abuse.test.js
//   * Loader creation requires a function; Load function requires an key; LoadMany function
//     requires a list of key; Batch function must return a Promise, not null / not a value /
//     of an Array, not null; Requires a number for maxBatchSize; Requires a function for
//     cacheKeyFn / batchScheduleFn: type errors, rejected at compile time here (a bulk function
//     of the wrong shape: tests/compile_fail/batch_bulk_shape.cpp).
//   * Cache should have get, set, delete, and clear methods: no cache map.
//   * Requires a positive number for maxBatchSize: max_batch is unsigned and 0 means "no
//     limit" (batch_options); the check that remains is the window's ("a negative window").
//  graph-gophers/dataloader, dataloader_test.go
//   * test Load Method cache error; test Load Method not caching results with errors of type
//     SkipCacheError; allows primed cache; allows clear value in cache; clears cache on batch
//     with WithClearCacheOnBatch; allows clearAll values in cache; all methods on NoCache are
//     Noops: the memo cache (Prime, Clear, ClearAll, error caching).
#include <singleflight/batch_loader.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/batch.hpp"
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using sftest::bulk_record;
using sftest::callback_log;
using sftest::gate;
using sftest::identity_bulk;
using sftest::must;
using sftest::no_window;

using int_calls = std::vector<std::vector<int>>;
using str_calls = std::vector<std::vector<std::string>>;

// keep_errors: a test that reads an exception a bulk call delivered declares what holds it
// before the loader, so that it outlives the loader's threads: the thread that delivered it
// may drop the last other reference after the test has read it, which is safe (exception_ptr's
// count is atomic) but invisible to TSan, as libstdc++ is not instrumented (RELIABILITY.md 14).
// The loader's destructor joins its threads first.

// A window short enough for blocking calls to be answered without flush().
sf::batch_options short_window(std::size_t max_batch = 0) {
  sf::batch_options o;
  o.window = 1ms;
  o.max_batch = max_batch;
  return o;
}

template <class L>
void pending(const L& l, std::uint64_t n, const char* name) {
  must([&] { return l.stats().pending_keys == n; }, name);
}

// evens: the value of an even key, an error for an odd one (graphql/dataloader's evenLoader).
auto evens(bulk_record<int>& rec) {
  return [&rec](std::span<const int> keys) {
    const std::size_t i = rec.enter(keys);
    std::vector<sf::outcome<int>> out;
    for (int k : keys) {
      if (k % 2 == 0) {
        out.emplace_back(std::in_place, k);
      } else {
        out.emplace_back(std::make_exception_ptr(std::runtime_error("Odd: " + std::to_string(k))));
      }
    }
    rec.leave(i, {});
    return out;
  };
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "?";
  }
}

}  // namespace

// ---- graphql/dataloader: Primary API
// -------------------------------------------------------------

TEST_CASE("dataloader: builds a really really simple data loader", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  sf::batch_loader<int, int> l(identity_bulk(rec), short_window());
  CHECK(l.load(1) == 1);
}

TEST_CASE("dataloader: supports loading multiple keys in one call", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  sf::batch_loader<int, int> l(identity_bulk(rec), short_window());
  const auto values = l.load_many(std::vector<int>{1, 2});
  REQUIRE(values.size() == 2);
  CHECK(values[0].value() == 1);
  CHECK(values[1].value() == 2);
  CHECK(l.load_many(std::vector<int>{}).empty());
  CHECK(rec.keys() == int_calls{{1, 2}});
}

TEST_CASE("dataloader: supports loading multiple keys in one call with errors",
          "[batch][ports][dataloader]") {
  std::vector<sf::outcome<std::string>> values;  // before the loader: see keep_errors
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string> keys) {
        std::vector<sf::outcome<std::string>> out;
        for (const auto& k : keys) {
          if (k == "bad") {
            out.emplace_back(std::make_exception_ptr(std::runtime_error("Bad Key")));
          } else {
            out.emplace_back(std::in_place, k);
          }
        }
        return out;
      },
      short_window());
  values = l.load_many(std::vector<std::string>{"a", "b", "bad"});
  CHECK(values[0].value() == "a");
  CHECK(values[1].value() == "b");
  CHECK(message_of(values[2].error()) == "Bad Key");
}

TEST_CASE("dataloader: batches multiple requests", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  sf::batch_loader<int, int> l(identity_bulk(rec), no_window());
  callback_log<int> one, two;
  l.async_load(1, one.on_done());
  l.async_load(2, two.on_done());
  l.flush();
  one.wait("1");
  two.wait("2");
  CHECK(*one.value == 1);
  CHECK(*two.value == 2);
  CHECK(rec.keys() == int_calls{{1, 2}});
}

TEST_CASE("dataloader: batches multiple requests with max batch sizes",
          "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  sf::batch_loader<int, int> l(identity_bulk(rec), no_window(2));
  std::vector<callback_log<int>> logs(3);
  for (int i = 0; i < 3; ++i) l.async_load(i + 1, logs[i].on_done());
  l.flush();
  for (int i = 0; i < 3; ++i) {
    logs[i].wait("answered");
    CHECK(*logs[i].value == i + 1);
  }
  CHECK(rec.sorted_keys() == int_calls{{1, 2}, {3}});
}

TEST_CASE("dataloader: applies maxBatchSize correctly with duplicate keys",
          "[batch][ports][dataloader]") {
  // A key asked for again joins its flight: it does not count again toward max_batch.
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window(3));
  const std::vector<std::string> values{"a", "b", "a", "a", "a", "b", "c"};
  std::vector<callback_log<std::string>> logs(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) l.async_load(values[i], logs[i].on_done());
  for (std::size_t i = 0; i < values.size(); ++i) {
    logs[i].wait("answered");
    CHECK(*logs[i].value == values[i]);
  }
  CHECK(rec.keys() == str_calls{{"a", "b", "c"}});
}

TEST_CASE("dataloader: coalesces identical requests", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  sf::batch_loader<int, int> l(identity_bulk(rec), no_window());
  callback_log<int> a, b;
  l.async_load(1, a.on_done());
  l.async_load(1, b.on_done());
  l.flush();
  a.wait("1a");
  b.wait("1b");
  CHECK(*a.value == 1);
  CHECK(*b.value == 1);
  CHECK(rec.keys() == int_calls{{1}});
}

TEST_CASE("dataloader: coalesces identical requests across sized batches",
          "[batch][ports][dataloader]") {
  // The first batch is still running when 1 is asked for again: the caller joins it.
  bulk_record<int> rec;
  gate release;
  sf::batch_loader<int, int> l(identity_bulk(rec, &release), no_window(2));
  std::vector<callback_log<int>> logs(4);
  l.async_load(1, logs[0].on_done());
  l.async_load(2, logs[1].on_done());
  rec.wait(1, "[1, 2] running");
  l.async_load(1, logs[2].on_done());
  l.async_load(3, logs[3].on_done());
  l.flush();
  rec.wait(2, "[3] running");
  release.open();
  const int expected[] = {1, 2, 1, 3};
  for (int i = 0; i < 4; ++i) {
    logs[i].wait("answered");
    CHECK(*logs[i].value == expected[i]);
  }
  CHECK(rec.sorted_keys() == int_calls{{1, 2}, {3}});
}

// ---- graphql/dataloader: Represents Errors
// -------------------------------------------------------

TEST_CASE("dataloader: Resolves to error to indicate failure", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  std::optional<sf::outcome<int>> one;  // before the loader: see keep_errors
  sf::batch_loader<int, int> l(evens(rec), short_window());
  one.emplace(l.try_load(1));
  CHECK(one->status() == sf::status::failed);
  CHECK(message_of(one->error()) == "Odd: 1");
  CHECK(l.load(2) == 2);
  CHECK(rec.keys() == int_calls{{1}, {2}});
}

TEST_CASE("dataloader: Can represent failures and successes simultaneously",
          "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  callback_log<int> one, two;  // before the loader: see keep_errors
  sf::batch_loader<int, int> l(evens(rec), no_window());
  l.async_load(1, one.on_done());
  l.async_load(2, two.on_done());
  l.flush();
  one.wait("1");
  two.wait("2");
  CHECK(message_of(one.error) == "Odd: 1");
  CHECK(*two.value == 2);
  CHECK(rec.keys() == int_calls{{1, 2}});
}

TEST_CASE("dataloader: Propagates error to all loads", "[batch][ports][dataloader]") {
  bulk_record<int> rec;
  callback_log<int> one, two;  // before the loader: see keep_errors
  sf::batch_loader<int, int> l(
      [&](std::span<const int> keys) -> std::vector<int> {
        rec.enter(keys);
        throw std::runtime_error("I am a terrible loader");
      },
      no_window());
  l.async_load(1, one.on_done());
  l.async_load(2, two.on_done());
  l.flush();
  one.wait("1");
  two.wait("2");
  CHECK(message_of(one.error) == "I am a terrible loader");
  CHECK(two.error == one.error);  // the same exception object
  CHECK(rec.keys() == int_calls{{1, 2}});
}

// ---- graphql/dataloader: Accepts any kind of key
// -------------------------------------------------

namespace {
struct object_key {
  int id;
  std::string tag;
  bool operator==(const object_key&) const = default;
};
struct object_hash {
  std::size_t operator()(const object_key& k) const {
    return std::hash<int>()(k.id) ^ (std::hash<std::string>()(k.tag) << 1);
  }
};
}  // namespace

TEST_CASE("dataloader: Accepts objects as keys", "[batch][ports][dataloader]") {
  bulk_record<object_key> rec;
  sf::batch_loader<object_key, object_key, object_hash> l(identity_bulk(rec), no_window());
  const object_key a{1, "a"};
  const object_key b{2, "b"};
  callback_log<object_key> va, vb;
  l.async_load(a, va.on_done());
  l.async_load(b, vb.on_done());
  l.flush();
  va.wait("a");
  vb.wait("b");
  CHECK(*va.value == a);
  CHECK(*vb.value == b);
  REQUIRE(rec.count() == 1);
  CHECK(rec.at(0).keys == std::vector<object_key>{a, b});
}

// ---- graphql/dataloader: Accepts options
// ---------------------------------------------------------

TEST_CASE("dataloader: May disable batching", "[batch][ports][dataloader]") {
  // {batch: false} is max_batch = 1: every key its own bulk call, dispatched at once (one at a
  // time here, so that the calls' order is the keys').
  bulk_record<int> rec;
  auto opts = no_window(1);
  opts.max_in_flight_batches = 1;
  sf::batch_loader<int, int> l(identity_bulk(rec), opts);
  callback_log<int> one, two;
  l.async_load(1, one.on_done());
  l.async_load(2, two.on_done());
  one.wait("1");
  two.wait("2");
  CHECK(rec.keys() == int_calls{{1}, {2}});
}

TEST_CASE("dataloader: May disable caching", "[batch][ports][dataloader]") {
  // There is no cache to disable: keys asked for again after their batch was delivered are
  // loaded again.
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  CHECK(l.load_many(std::vector<std::string>{"A", "B"})[1].value() == "B");
  CHECK(l.load_many(std::vector<std::string>{"A", "C"})[1].value() == "C");
  CHECK(l.load_many(std::vector<std::string>{"A", "B", "C"})[2].value() == "C");
  CHECK(rec.keys() == str_calls{{"A", "B"}, {"A", "C"}, {"A", "B", "C"}});
}

TEST_CASE("dataloader: cacheMap may be set to null to disable cache",
          "[batch][ports][dataloader]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  CHECK(l.load("A") == "A");
  CHECK(l.load("A") == "A");
  CHECK(rec.keys() == str_calls{{"A"}, {"A"}});
}

// ---- graphql/dataloader: It allows custom schedulers
// ---------------------------------------------

TEST_CASE("dataloader: Supports manual dispatch", "[batch][ports][dataloader]") {
  // flush() is the manual dispatch; A is still loading (held) when asked for again, so it is
  // joined; D is never dispatched and gets closed_error when the loader goes.
  bulk_record<std::string> rec;
  gate release;
  callback_log<std::string> d;
  {
    sf::batch_loader<std::string, std::string> l(identity_bulk(rec, &release), no_window());
    callback_log<std::string> a, b, a2, c;
    l.async_load("A", a.on_done());
    l.async_load("B", b.on_done());
    l.flush();
    rec.wait(1, "[A, B] running");
    l.async_load("A", a2.on_done());
    l.async_load("C", c.on_done());
    l.flush();
    rec.wait(2, "[C] running");
    l.async_load("D", d.on_done());
    release.open();
    for (auto* log : {&a, &b, &a2, &c}) log->wait("answered");
    CHECK(rec.keys() == str_calls{{"A", "B"}, {"C"}});
  }
  d.wait("D at close");
  CHECK(d.threw<sf::closed_error>());
  CHECK(rec.count() == 2);
}

// ---- graphql/dataloader: It is resilient to job queue ordering
// -----------------------------------

TEST_CASE("dataloader: batches loads occuring within promises", "[batch][ports][dataloader]") {
  // Keys asked for from callbacks of other work, on other threads, while the batch is open, go
  // in the same batch: the window does not depend on any one thread's scheduling.
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  std::vector<callback_log<std::string>> logs(4);
  l.async_load("A", logs[0].on_done());
  sftest::on_new_thread(
      [&] {
        l.async_load("B", logs[1].on_done());
        sftest::on_new_thread(
            [&] {
              l.async_load("C", logs[2].on_done());
              sftest::on_new_thread([&] { l.async_load("D", logs[3].on_done()); }, "D");
            },
            "C");
      },
      "B");
  l.flush();
  for (auto& log : logs) log.wait("answered");
  CHECK(rec.keys() == str_calls{{"A", "B", "C", "D"}});
}

namespace {
struct strings_hash {
  std::size_t operator()(const std::vector<std::string>& v) const {
    std::size_t h = v.size();
    for (const auto& s : v) h = h * 31 + std::hash<std::string>()(s);
    return h;
  }
};
}  // namespace

TEST_CASE("dataloader: can call a loader from a loader", "[batch][ports][dataloader]") {
  // aLoader's and bLoader's bulk functions each ask deepLoader (blocking) for their whole key
  // list; deepLoader's batch fills with both lists (max_batch 2) and loads them in one call.
  using strings = std::vector<std::string>;
  bulk_record<strings> deep_rec;
  sf::batch_loader<strings, strings, strings_hash> deep(identity_bulk(deep_rec), no_window(2));
  bulk_record<std::string> a_rec, b_rec;
  auto via_deep = [&deep](bulk_record<std::string>& rec) {
    return [&deep, &rec](std::span<const std::string> keys) {
      const std::size_t i = rec.enter(keys);
      const strings got = deep.load(strings(keys.begin(), keys.end()));
      rec.leave(i, {});
      return got;
    };
  };
  sf::batch_loader<std::string, std::string> a(via_deep(a_rec), no_window(2));
  sf::batch_loader<std::string, std::string> b(via_deep(b_rec), no_window(2));
  std::vector<callback_log<std::string>> logs(4);
  a.async_load("A1", logs[0].on_done());
  b.async_load("B1", logs[1].on_done());
  a.async_load("A2", logs[2].on_done());
  b.async_load("B2", logs[3].on_done());
  const char* expected[] = {"A1", "B1", "A2", "B2"};
  for (int i = 0; i < 4; ++i) {
    logs[i].wait("answered");
    CHECK(*logs[i].value == expected[i]);
  }
  CHECK(a_rec.keys() == str_calls{{"A1", "A2"}});
  CHECK(b_rec.keys() == str_calls{{"B1", "B2"}});
  REQUIRE(deep_rec.count() == 1);
  const auto lists = deep_rec.at(0).keys;
  CHECK(std::set<strings>(lists.begin(), lists.end()) ==
        std::set<strings>{{"A1", "A2"}, {"B1", "B2"}});
}

// ---- graphql/dataloader: abuse.test.js
// -----------------------------------------------------------

TEST_CASE("dataloader: Batch function must return a Promise, not error synchronously",
          "[batch][ports][dataloader][abuse]") {
  // A bulk function that throws at once fails every key of its batch with that exception.
  std::optional<sf::outcome<int>> o;  // before the loader: see keep_errors
  sf::batch_loader<int, int> l(
      [](std::span<const int>) -> std::vector<int> {
        throw std::logic_error("Mock Synchronous Error");
      },
      short_window());
  o.emplace(l.try_load(1));
  CHECK(o->status() == sf::status::failed);
  CHECK(message_of(o->error()) == "Mock Synchronous Error");
}

TEST_CASE("dataloader: Batch function must promise an Array of correct length",
          "[batch][ports][dataloader][abuse]") {
  std::optional<sf::outcome<int>> o;  // before the loader: see keep_errors
  sf::batch_loader<int, int> l([](std::span<const int>) { return std::vector<int>{}; },
                               short_window());
  o.emplace(l.try_load(1));
  CHECK(sftest::holds<sf::batch_size_error>(o->error()));
  CHECK(message_of(o->error()) ==
        "singleflight::batch_loader: the bulk function returned 0 results for 1 keys (a "
        "sequence result must hold one result per key, in the keys' order)");
}

// ---- graph-gophers/dataloader
// --------------------------------------------------------------------

TEST_CASE("gophers: test Load method", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  CHECK(l.load("1") == "1");
}

TEST_CASE("gophers: test thunk does not contain race conditions", "[batch][ports][gophers]") {
  // Two threads waiting for one key's result at once.
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  sftest::result<std::string> r1, r2;
  auto t1 = sftest::spawn(r1, [&] { return l.load("1"); });
  auto t2 = sftest::spawn(r2, [&] { return l.load("1"); });
  must([&] { return l.stats().calls == 2; }, "both attached");
  pending(l, 1, "the key is in the open batch");  // the leader's flight has put it there
  l.flush();
  sftest::finish(t1, r1, "t1");
  sftest::finish(t2, r2, "t2");
  CHECK(*r1.value == "1");
  CHECK(*r2.value == "1");
  CHECK(rec.count() == 1);
}

TEST_CASE("gophers: test Load Method Panic Safety", "[batch][ports][gophers]") {
  // A bulk function throwing something that is not a std::exception: an error for the key,
  // nothing escapes the loader's thread.
  std::optional<sf::outcome<std::string>> o;  // before the loader: see keep_errors
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string>) -> std::vector<std::string> {
        throw sftest::not_an_exception{1};
      },
      short_window());
  o.emplace(l.try_load("1"));
  CHECK(sftest::holds<sftest::not_an_exception>(o->error()));
}

TEST_CASE("gophers: test Load Method Panic Safety in multiple keys", "[batch][ports][gophers]") {
  // Fails a batch of several keys; a later load of one of them is not answered with the old
  // failure.
  std::atomic<int> calls{0};
  std::vector<sf::outcome<std::string>> failed;  // before the loader: see keep_errors
  sf::batch_loader<std::string, std::string> l(
      [&](std::span<const std::string> keys) {
        calls.fetch_add(1);
        if (keys.size() > 1) throw std::runtime_error("Programming error");
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      short_window());
  failed = l.load_many(std::vector<std::string>{"0", "1", "2"});
  for (const auto& o : failed) CHECK(message_of(o.error()) == "Programming error");
  for (int i = 0; i < 3; ++i) CHECK(l.load("1") == "1");
  CHECK(calls == 4);
}

namespace {
// A tracer that re-enters the loader from its callbacks (graph-gophers' TracerWithThunkReading
// reads the result inside its finish functions).
struct reentrant_tracer final : sf::flight_tracer {
  sf::batch_loader<std::string, std::string>* loader = nullptr;
  std::atomic<int> settles{0};
  void* on_start(const sf::flight_event&) noexcept override {
    if (loader != nullptr) (void)loader->stats();
    return nullptr;
  }
  void on_settle(const sf::flight_settled&, void*) noexcept override {
    if (loader != nullptr) {
      (void)loader->stats();
      (void)loader->in_flight();
    }
    settles.fetch_add(1);
  }
};
}  // namespace

TEST_CASE("gophers: test Load method does not create a deadlock mutex condition",
          "[batch][ports][gophers]") {
  auto tracer = std::make_shared<reentrant_tracer>();
  bulk_record<std::string> rec;
  auto opts = short_window(1);
  opts.flight.tracer = tracer;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), opts);
  tracer->loader = &l;
  CHECK(l.load("1") == "1");
  SECTION("and LoadMany (test LoadMany method does not create a deadlock mutex condition)") {
    const auto out = l.load_many(std::vector<std::string>{"1", "2", "3"});
    for (const auto& o : out) CHECK(!o.value().empty());
  }
  must([&] { return tracer->settles.load() >= 1; }, "settled");
}

TEST_CASE("gophers: test LoadMany returns errors", "[batch][ports][gophers]") {
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string> keys) {
        std::vector<sf::outcome<std::string>> out;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          out.emplace_back(std::make_exception_ptr(std::runtime_error("this is a test error")));
        }
        return out;
      },
      short_window());
  const auto out = l.load_many(std::vector<std::string>{"1", "2", "3"});
  REQUIRE(out.size() == 3);
  for (const auto& o : out) CHECK(o.status() == sf::status::failed);
}

TEST_CASE("gophers: test LoadMany returns len(errors) == len(keys)", "[batch][ports][gophers]") {
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string> keys) {
        std::vector<sf::outcome<std::string>> out;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          if (i == 0) {
            out.emplace_back(std::make_exception_ptr(std::runtime_error("always error")));
          } else {
            out.emplace_back(std::in_place, keys[i]);
          }
        }
        return out;
      },
      short_window(3));
  const auto out = l.load_many(std::vector<std::string>{"1", "2", "3"});
  REQUIRE(out.size() == 3);
  int errors = 0;
  for (const auto& o : out) errors += o.has_value() ? 0 : 1;
  CHECK(errors == 1);
}

TEST_CASE("gophers: test LoadMany returns nil []error when no errors occurred",
          "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  for (const auto& o : l.load_many(std::vector<std::string>{"1", "2", "3"})) {
    CHECK(o.status() == sf::status::value);
  }
}

TEST_CASE("gophers: test thunkmany does not contain race conditions", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  const std::vector<std::string> keys{"1", "2", "3"};
  sftest::result<bool> r1, r2;
  auto ok = [&] {
    const auto out = l.load_many(keys);
    return out[0].value() == "1" && out[1].value() == "2" && out[2].value() == "3";
  };
  auto t1 = sftest::spawn(r1, ok);
  auto t2 = sftest::spawn(r2, ok);
  sftest::finish(t1, r1, "t1");
  sftest::finish(t2, r2, "t2");
  CHECK(*r1.value);
  CHECK(*r2.value);
}

TEST_CASE("gophers: test Load Many Method Panic Safety", "[batch][ports][gophers]") {
  std::vector<sf::outcome<std::string>> failed;  // before the loader: see keep_errors
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string> keys) {
        if (keys.size() > 1) throw sftest::not_an_exception{2};
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      short_window());
  failed = l.load_many(std::vector<std::string>{"1", "2"});
  CHECK(sftest::holds<sftest::not_an_exception>(failed[0].error()));
  const auto again = l.load_many(std::vector<std::string>{"1"});
  CHECK(again[0].value() == "1");
}

TEST_CASE("gophers: test LoadMany method", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), short_window());
  const auto out = l.load_many(std::vector<std::string>{"1", "2", "3"});
  CHECK(out[0].value() == "1");
  CHECK(out[1].value() == "2");
  CHECK(out[2].value() == "3");
}

TEST_CASE("gophers: batches many requests", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  callback_log<std::string> f1, f2;
  l.async_load("1", f1.on_done());
  l.async_load("2", f2.on_done());
  l.flush();
  f1.wait("1");
  f2.wait("2");
  CHECK(rec.keys() == str_calls{{"1", "2"}});
}

TEST_CASE("gophers: number of results matches number of keys", "[batch][ports][gophers]") {
  std::vector<callback_log<std::string>> logs(10);  // before the loader: see keep_errors
  sf::batch_loader<std::string, std::string> l(
      [](std::span<const std::string> keys) {
        return std::vector<std::string>(keys.begin(), keys.end() - 1);  // one short
      },
      no_window());
  for (int i = 0; i < 10; ++i) l.async_load(std::to_string(i), logs[i].on_done());
  l.flush();
  for (auto& log : logs) {
    log.wait("answered");
    CHECK(log.threw<sf::batch_size_error>());
  }
}

TEST_CASE("gophers: responds to max batch size", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window(2));
  std::vector<callback_log<std::string>> logs(3);
  for (int i = 0; i < 3; ++i) l.async_load(std::to_string(i + 1), logs[i].on_done());
  l.flush();
  for (auto& log : logs) log.wait("answered");
  CHECK(rec.sorted_keys() == str_calls{{"1", "2"}, {"3"}});
}

TEST_CASE("gophers: caches repeated requests", "[batch][ports][gophers]") {
  // Go's "cache" here is the coalescing of one batch: both callers of "1" share it, and the
  // batch closes no earlier than its window after the first of them asked.
  bulk_record<std::string> rec;
  sf::batch_options o;
  o.window = 16ms;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), o);
  const auto start = std::chrono::steady_clock::now();
  callback_log<std::string> f1, f2;
  l.async_load("1", f1.on_done());
  l.async_load("1", f2.on_done());
  f1.wait("1");
  f2.wait("1 again");
  CHECK(rec.at(0).at - start >= 16ms);
  CHECK(rec.keys() == str_calls{{"1"}});
}

TEST_CASE("gophers: doesn't wait for timeout if Flush() is called", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  callback_log<std::string> f1, f2;
  l.async_load("1", f1.on_done());
  l.async_load("2", f2.on_done());
  l.flush();  // the window is an hour: answered at all means flush() dispatched
  f1.wait("1");
  f2.wait("2");
  CHECK(rec.keys() == str_calls{{"1", "2"}});
}

TEST_CASE("gophers: Nothing for Flush() to do on empty loader with current batch",
          "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  l.flush();
  CHECK(rec.count() == 0);
  CHECK(l.stats().skipped_batches == 0);
}

TEST_CASE("gophers: no cache does not cache anything", "[batch][ports][gophers]") {
  bulk_record<std::string> rec;
  sf::batch_loader<std::string, std::string> l(identity_bulk(rec), no_window());
  std::vector<callback_log<std::string>> logs(3);
  const char* keys[] = {"1", "A", "B"};
  for (int i = 0; i < 3; ++i) l.async_load(keys[i], logs[i].on_done());
  l.flush();
  for (auto& log : logs) log.wait("answered");
  CHECK(rec.keys() == str_calls{{"1", "A", "B"}});
  callback_log<std::string> again;
  l.async_load("A", again.on_done());
  l.flush();
  again.wait("A again");
  CHECK(rec.count() == 2);
}
