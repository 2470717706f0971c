// singleflight::batch_loader: the five semantics of its contract (batch_loader.hpp, "Guarantees"),
// each with the test that fails without it, then the bulk-function shapes, the caller-facing
// forms (load, try_load, async_load, co_load, load_many), the options, close(), the counters and
// the loader behind a cache. Batches are closed by max_batch or flush() with a window no test
// waits for (sftest::forever), never by timing; running batches are held open with gates; every
// wait is bounded; workers record into logs read by the test's own thread.
#include <singleflight/batch_loader.hpp>
#include <singleflight/cache.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/batch.hpp"
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"
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
using keys_t = std::vector<std::vector<std::string>>;
using loader_t = sf::batch_loader<std::string, std::string>;

template <class E>
bool holds(const std::exception_ptr& e) {
  return sftest::holds<E>(e);
}

// keep_errors: a test that reads an exception a bulk call delivered declares what holds it
// before the loader, so that it outlives the loader's threads (joined by its destructor): the
// thread that delivered it may drop the last other reference after the test has read it, safe
// (exception_ptr's count is atomic) but invisible to TSan, as libstdc++ is not instrumented
// (RELIABILITY.md 14).

// A window short enough for blocking calls (load_many) to be answered without flush(); the
// tests that use it check nothing about timing.
sf::batch_options short_window() {
  sf::batch_options o;
  o.window = 1ms;
  return o;
}

// Waits (bounded) until the loader has n keys waiting for dispatch.
template <class L>
void pending(const L& l, std::uint64_t n, const char* name) {
  must([&] { return l.stats().pending_keys == n; }, name);
}

}  // namespace

// ---- 1. keys within the window go in one bulk call ---------------------------------------------

TEST_CASE("keys asked for while a batch is open go in one bulk call, each distinct key once",
          "[batch][s1]") {
  // Catches: a bulk call per key (no batching), a window that closes on its own before flush(),
  // a key sent twice because two callers asked for it.
  bulk_record<std::string> rec;
  std::vector<callback_log<std::string>> logs(6);
  loader_t l(identity_bulk(rec), no_window());
  const std::vector<std::string> asked{"a", "b", "a", "c", "b", "a"};
  for (std::size_t i = 0; i < asked.size(); ++i) l.async_load(asked[i], logs[i].on_done());
  pending(l, 3, "three distinct keys pending");
  CHECK_FALSE(sftest::becomes([&] { return rec.count() > 0; }, 50ms));  // the batch stays open
  l.flush();
  for (auto& log : logs) log.wait("every caller answered");
  CHECK(rec.keys() == keys_t{{"a", "b", "c"}});
  for (std::size_t i = 0; i < asked.size(); ++i) {
    REQUIRE(logs[i].value);
    CHECK(*logs[i].value == asked[i]);
  }
  const auto s = l.stats();
  CHECK(s.batches == 1);
  CHECK(s.keys == 3);
  CHECK(s.largest_batch == 3);
  CHECK(s.calls == 6);
  CHECK(s.joins == 3);
  CHECK(s.pending_keys == 0);
}

TEST_CASE("a batch holding max_batch keys is dispatched at once, without its window",
          "[batch][s1]") {
  // Catches: a full batch that waits for its window (here an hour: the test would hang), a batch
  // that takes more than max_batch keys.
  bulk_record<std::string> rec;
  std::vector<callback_log<std::string>> logs(7);
  loader_t l(identity_bulk(rec), no_window(3));
  for (int i = 0; i < 7; ++i) l.async_load(std::to_string(i), logs[i].on_done());
  rec.wait(2, "two full batches dispatched");
  for (int i = 0; i < 6; ++i) logs[i].wait("keys of full batches answered");
  pending(l, 1, "the seventh key still waits");
  CHECK_FALSE(logs[6].is_done());
  l.flush();
  logs[6].wait("flushed");
  CHECK(rec.sorted_keys() == keys_t{{"0", "1", "2"}, {"3", "4", "5"}, {"6"}});
}

TEST_CASE("the window closes a batch by itself, no earlier than its length after the first key",
          "[batch][s1]") {
  // Catches: a window that never closes without flush(), or one shorter than asked (measured
  // from the first key's arrival: a lower bound, which no scheduling delay can break).
  bulk_record<std::string> rec;
  callback_log<std::string> a, b;
  sf::batch_options o;
  o.window = 30ms;
  loader_t l(identity_bulk(rec), o);
  const auto before = std::chrono::steady_clock::now();
  l.async_load("a", a.on_done());
  l.async_load("b", b.on_done());
  a.wait("the window closed by itself");
  b.wait("b answered");
  REQUIRE(rec.count() >= 1);
  CHECK(rec.at(0).at - before >= 30ms);
  CHECK(rec.at(0).keys.front() == "a");
}

TEST_CASE("load_many's keys share one bulk call even with a window of 0", "[batch][s1]") {
  // Catches: load_many adding its keys one by one to a batch that the window thread may close
  // between two of them (window 0 closes a batch as soon as that thread sees it).
  bulk_record<std::string> rec;
  sf::batch_options o;
  o.window = 0ns;
  o.max_batch = 64;
  loader_t l(identity_bulk(rec), o);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> keys;
    for (int i = 0; i < 40; ++i) keys.push_back(std::to_string(round) + ":" + std::to_string(i));
    const auto out = l.load_many(keys);
    REQUIRE(out.size() == keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) CHECK(out[i].value() == keys[i]);
  }
  CHECK(rec.count() == 20);
  CHECK(l.stats().largest_batch == 40);
}

// ---- 2. a key in flight is joined
// ----------------------------------------------------------------

TEST_CASE("a key in a running bulk call is joined, not loaded again", "[batch][s2]") {
  // Catches: a key's flight that ends at dispatch (a caller arriving during the bulk call would
  // put the key into a second batch).
  bulk_record<std::string> rec;
  gate release;
  callback_log<std::string> first, second;
  loader_t l(identity_bulk(rec, &release), no_window(1));
  l.async_load("a", first.on_done());
  rec.wait(1, "the bulk call runs");
  l.async_load("a", second.on_done());
  CHECK(l.stats().joins == 1);
  CHECK(l.stats().pending_keys == 0);
  release.open();
  first.wait("first answered");
  second.wait("second answered");
  CHECK(*first.value == "a");
  CHECK(*second.value == "a");
  CHECK(rec.keys() == keys_t{{"a"}});
}

TEST_CASE("blocking callers of one key on many threads share one place in one batch",
          "[batch][s2]") {
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window());
  constexpr int n = 8;
  std::vector<sftest::result<std::string>> r(n);
  std::vector<sftest::jthread> threads;
  for (int i = 0; i < n; ++i) {
    threads.push_back(sftest::spawn(r[i], [&l, i] { return l.load(i % 2 == 0 ? "x" : "y"); }));
  }
  must([&] { return l.stats().calls == n; }, "every caller attached");
  pending(l, 2, "x and y pending");
  l.flush();
  for (int i = 0; i < n; ++i) sftest::finish(threads[i], r[i], "caller returned");
  for (int i = 0; i < n; ++i) CHECK(*r[i].value == (i % 2 == 0 ? "x" : "y"));
  REQUIRE(rec.count() == 1);
  const auto call = rec.at(0);
  CHECK(std::set<std::string>(call.keys.begin(), call.keys.end()) ==
        std::set<std::string>{"x", "y"});
  CHECK(call.keys.size() == 2);
}

// ---- 3. the bulk call belongs to the loader
// ------------------------------------------------------

TEST_CASE("first_caller_leaving_does_not_stop_the_batch (graph-gophers/dataloader#121)",
          "[batch][s3]") {
  // The batch runs with the loader's token and on the loader's thread, not with the first
  // caller's context. Catches: a bulk call handed the first caller's token (stopped when that
  // caller leaves), or run on its thread.
  bulk_record<std::string> rec;
  gate release;
  callback_log<std::string> a, b;
  loader_t l(identity_bulk(rec, &release), no_window());
  sf::stop_source first;
  l.async_load("a", a.on_done(), first.get_token());
  l.async_load("b", b.on_done());
  pending(l, 2, "both pending");
  l.flush();
  rec.wait(1, "the bulk call runs");
  first.request_stop();
  a.wait("the first caller left");
  CHECK(a.threw<sf::cancelled_error>());
  release.open();
  b.wait("b answered");
  REQUIRE(b.value);
  CHECK(*b.value == "b");
  must([&] { return rec.at(0).returned; }, "bulk returned");
  const auto call = rec.at(0);
  CHECK_FALSE(call.stopped);
  CHECK(call.keys == std::vector<std::string>{"a", "b"});
  CHECK(call.thread != std::this_thread::get_id());
  CHECK(l.stats().stopped_batches == 0);
}

TEST_CASE("a bulk call's token fires once every waiter of every key in it has left",
          "[batch][s3]") {
  // Catches: cancellation that never reaches the batch (ChilliCream/graphql-platform#7470,
  // strawberry PR #4379): the bulk function here returns only when its token fires.
  bulk_record<std::string> rec;
  std::atomic<bool> saw_stop{false};
  callback_log<std::string> a, b, b2;
  loader_t l(
      [&](std::span<const std::string> keys, sf::stop_token st) {
        const std::size_t i = rec.enter(keys);
        must([&] { return st.stop_requested(); }, "the bulk call's token fires");
        saw_stop = true;
        rec.leave(i, st);
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      no_window());
  sf::stop_source sa, sb, sb2;
  l.async_load("a", a.on_done(), sa.get_token());
  l.async_load("b", b.on_done(), sb.get_token());
  l.async_load("b", b2.on_done(), sb2.get_token());
  pending(l, 2, "a and b pending");
  l.flush();
  rec.wait(1, "the bulk call runs");
  sa.request_stop();
  sb.request_stop();
  CHECK_FALSE(sftest::becomes([&] { return saw_stop.load(); }, 30ms));  // b2 still waits
  sb2.request_stop();
  must([&] { return rec.at(0).returned; }, "bulk returned on its token");
  CHECK(saw_stop);
  for (auto* log : {&a, &b, &b2}) {
    log->wait("caller left");
    CHECK(log->threw<sf::cancelled_error>());
  }
  must([&] { return l.in_flight() == 0; }, "keys freed after the bulk call returned");
  CHECK(l.stats().stopped_batches == 1);
}

TEST_CASE("a key whose waiters all left before dispatch is dropped from its batch", "[batch][s3]") {
  // Catches: an abandoned key still sent to the origin, or kept taken until its batch runs (a
  // newcomer would then wait for the window instead of starting the key again at once).
  bulk_record<std::string> rec;
  callback_log<std::string> a, b, again;
  loader_t l(identity_bulk(rec), no_window());
  sf::stop_source sa;
  l.async_load("a", a.on_done(), sa.get_token());
  l.async_load("b", b.on_done());
  pending(l, 2, "a and b pending");
  sa.request_stop();
  a.wait("a left");
  CHECK(a.threw<sf::cancelled_error>());
  CHECK(l.stats().dropped_keys == 1);
  CHECK(l.stats().pending_keys == 1);
  CHECK(l.in_flight() == 1);  // a's key is free at once
  l.async_load("a", again.on_done());
  pending(l, 2, "a is back");
  l.flush();
  again.wait("a answered");
  b.wait("b answered");
  CHECK(*again.value == "a");
  CHECK(rec.keys() == keys_t{{"b", "a"}});
}

TEST_CASE("a batch whose keys were all dropped is not run", "[batch][s3]") {
  // Catches: a bulk call with no key, or with keys nobody wants.
  bulk_record<std::string> rec;
  callback_log<std::string> a, b;
  loader_t l(identity_bulk(rec), no_window());
  sf::stop_source sa, sb;
  l.async_load("a", a.on_done(), sa.get_token());
  l.async_load("b", b.on_done(), sb.get_token());
  pending(l, 2, "a and b pending");
  sa.request_stop();
  sb.request_stop();
  l.flush();
  must([&] { return l.stats().skipped_batches == 1; }, "the batch is skipped");
  CHECK(rec.count() == 0);
  CHECK(l.stats().batches == 0);
  CHECK(l.in_flight() == 0);
}

TEST_CASE("a caller's wait_bound leaves like its token does; flight.timeout bounds each key",
          "[batch][s3]") {
  bulk_record<std::string> rec;
  SECTION("wait_bound") {
    loader_t l(identity_bulk(rec), no_window());
    const auto o = l.try_load("a", {}, 20ms);
    CHECK(o.status() == sf::status::timeout);
    must([&] { return l.stats().dropped_keys == 1; }, "dropped");
  }
  SECTION("flight.timeout") {
    auto opts = no_window();
    opts.flight.timeout = 20ms;
    loader_t l(identity_bulk(rec), opts);
    callback_log<std::string> a;
    l.async_load("a", a.on_done());
    a.wait("deadline");
    CHECK(a.threw<sf::timeout_error>());
    must([&] { return l.stats().dropped_keys == 1; }, "dropped");
  }
  CHECK(rec.count() == 0);
}

TEST_CASE("ownership::group: a key nobody waits for any more is still loaded", "[batch][s3]") {
  bulk_record<std::string> rec;
  auto opts = no_window();
  opts.flight.owner = sf::ownership::group;
  loader_t l(identity_bulk(rec), opts);
  callback_log<std::string> a;
  sf::stop_source sa;
  l.async_load("a", a.on_done(), sa.get_token());
  sa.request_stop();
  a.wait("left");
  l.flush();
  rec.wait(1, "still loaded");
  CHECK(rec.keys() == keys_t{{"a"}});
}

// ---- 4. failures are shared, then forgotten
// ------------------------------------------------------

TEST_CASE("a bulk failure reaches every key's waiters as the same object, then is forgotten",
          "[batch][s4]") {
  // Catches: an error copied per waiter, or cached for the loader's lifetime
  // (graphql/dataloader#258): the next load of the key calls the origin again.
  std::atomic<int> calls{0};
  loader_t l(
      [&](std::span<const std::string> keys) {
        if (calls.fetch_add(1) == 0) throw sftest::not_an_exception{7};
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      no_window());
  std::vector<callback_log<std::string>> logs(3);
  l.async_load("a", logs[0].on_done());
  l.async_load("b", logs[1].on_done());
  l.async_load("a", logs[2].on_done());
  pending(l, 2, "pending");
  l.flush();
  for (auto& log : logs) log.wait("failed");
  const void* first = sftest::address_of<sftest::not_an_exception>(logs[0].error);
  REQUIRE(first != nullptr);
  for (auto& log : logs) CHECK(sftest::address_of<sftest::not_an_exception>(log.error) == first);
  CHECK(l.stats().failed_batches == 1);
  callback_log<std::string> again;
  l.async_load("a", again.on_done());
  l.flush();
  again.wait("loaded again");
  CHECK(*again.value == "a");
  CHECK(calls == 2);
}

// ---- 5. threads, locks, re-entrancy ------------------------------------------------------------

TEST_CASE("neither the window nor the bulk call runs on a caller's thread", "[batch][s5]") {
  // Catches: a window timed on the first caller's thread (async_load would not return before
  // the batch closed), a bulk call run by the caller that filled the batch.
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window(2));
  callback_log<std::string> a, b;
  l.async_load("a", a.on_done());  // returns with the window open (an hour)
  CHECK_FALSE(a.is_done());
  l.async_load("b", b.on_done());  // fills the batch: dispatched, not run here
  a.wait("a answered");
  b.wait("b answered");
  REQUIRE(rec.count() == 1);
  CHECK(rec.at(0).thread != std::this_thread::get_id());
  CHECK(a.thread == rec.at(0).thread);  // delivered by the thread that ran the bulk call
  sftest::result<std::string> r;
  std::thread::id caller;
  {
    auto t = sftest::spawn(r, [&] {
      caller = std::this_thread::get_id();
      return l.load("c");
    });
    pending(l, 1, "c pending");
    l.flush();
    sftest::finish(t, r, "blocking caller");
  }
  CHECK(rec.at(1).thread != caller);
}

TEST_CASE("a callback blocking on a key of its own batch gets it: the rest is delivered first",
          "[batch][s5][reentrant]") {
  // Catches: a delivery loop that holds the batch's later keys while a callback blocks on one
  // of them (a deadlock: the test would hang).
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window());
  std::optional<std::string> inner;
  callback_log<std::string> a, b;
  a.probe = [&] { inner = l.load("b"); };
  l.async_load("a", a.on_done());
  l.async_load("b", b.on_done());
  pending(l, 2, "pending");
  l.flush();
  a.wait("a's callback returned");
  b.wait("b answered");
  REQUIRE(inner);
  CHECK(*inner == "b");
  CHECK(rec.count() == 1);  // joined b's flight: no second load
}

TEST_CASE("the bulk function asking (blocking) for a key of its own batch gets logic_error",
          "[batch][s5][reentrant]") {
  std::atomic<int> logic_errors{0};
  std::atomic<int> other_loads{0};
  loader_t* self = nullptr;
  sf::batch_options o;
  o.window = 0ns;
  loader_t l(
      [&](std::span<const std::string> keys) {
        if (keys.front() == "a") {
          try {
            (void)self->load("a");
          } catch (const std::logic_error&) {
            logic_errors.fetch_add(1);
          }
          // Another key goes into another batch, run on another worker: fine.
          if (self->load("z") == "z") other_loads.fetch_add(1);
          (void)self->stats();
          self->flush();
        }
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      o);
  self = &l;
  CHECK(l.load("a") == "a");
  CHECK(logic_errors == 1);
  CHECK(other_loads == 1);
}

TEST_CASE(
    "a thread's frames belong to their loader: a bulk function may load its own key from "
    "another loader of the same type",
    "[batch][s5][reentrant]") {
  // Catches: a thread's record of being inside a loader's bulk call that is not keyed by the
  // loader (the other loader's call would be refused with logic_error, or drain the wrong one).
  std::atomic<int> logic_errors{0};
  std::atomic<int> other_loads{0};
  sf::batch_options o;
  o.window = 0ns;
  loader_t other(
      [](std::span<const std::string> keys) {
        std::vector<std::string> out;
        for (const auto& k : keys) out.push_back(k + "!");
        return out;
      },
      o);
  loader_t l(
      [&](std::span<const std::string> keys) {
        try {
          if (other.load(keys.front()) == keys.front() + "!") other_loads.fetch_add(1);
        } catch (const std::logic_error&) {
          logic_errors.fetch_add(1);
        }
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      o);
  CHECK(l.load("a") == "a");
  CHECK(logic_errors == 0);
  CHECK(other_loads == 1);
}

TEST_CASE("close() from a callback delivers the rest of the batch and returns",
          "[batch][s5][reentrant][close]") {
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window());
  callback_log<std::string> a, b, after;
  a.probe = [&] { l.close(); };
  l.async_load("a", a.on_done());
  l.async_load("b", b.on_done());
  pending(l, 2, "pending");
  l.flush();
  a.wait("a's callback closed the loader");
  b.wait("b answered");
  CHECK(*b.value == "b");
  l.async_load("c", after.on_done());
  CHECK(after.threw<sf::closed_error>());
}

TEST_CASE("close() from inside the bulk function returns; the destructor finishes",
          "[batch][s5][reentrant][close]") {
  std::atomic<bool> closed_inside{false};
  std::optional<loader_t> l;
  callback_log<std::string> a;
  l.emplace(
      [&](std::span<const std::string> keys) {
        l->close();
        closed_inside = true;
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      no_window());
  l->async_load("a", a.on_done());
  l->flush();
  a.wait("a answered");
  CHECK(a.threw<sf::closed_error>());  // the close settled the key before the bulk answered
  l.reset();                           // waits for the bulk call, joins its worker
  CHECK(closed_inside);
}

TEST_CASE("a callback may ask for its own key again: a fresh flight, a later batch",
          "[batch][s5][reentrant]") {
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window(1));
  callback_log<std::string> first, second;
  first.probe = [&] { l.async_load("a", second.on_done()); };
  l.async_load("a", first.on_done());
  first.wait("first");
  second.wait("second");
  CHECK(rec.keys() == keys_t{{"a"}, {"a"}});
}

// ---- bulk-function shapes and per-key results
// ----------------------------------------------------

TEST_CASE("per-key results: outcomes with errors, load_result not_found, a map's missing key",
          "[batch][shapes]") {
  SECTION("a sequence of outcome<T>") {
    std::vector<sf::outcome<int>> got;  // before the loader: see keep_errors
    sf::batch_loader<int, int> l(
        [](std::span<const int> keys) {
          std::vector<sf::outcome<int>> out;
          for (int k : keys) {
            if (k % 2 == 0) {
              out.emplace_back(std::in_place, k * 10);
            } else {
              out.emplace_back(std::make_exception_ptr(std::runtime_error("odd")));
            }
          }
          return out;
        },
        short_window());
    const std::vector<int> keys{1, 2, 3, 4};
    got = l.load_many(keys);
    CHECK(got[0].status() == sf::status::failed);
    CHECK(got[1].value() == 20);
    CHECK(got[2].status() == sf::status::failed);
    CHECK(got[3].value() == 40);
    CHECK(l.stats().batches == 1);
  }
  SECTION("a sequence of load_result<T>") {
    std::vector<sf::outcome<int>> got;  // before the loader: see keep_errors
    sf::batch_loader<int, int> l(
        [](std::span<const int> keys, sf::stop_token) {
          std::vector<sf::load_result<int>> out;
          for (int k : keys) {
            out.push_back(k > 0 ? sf::load_result<int>::value(k)
                                : sf::load_result<int>::not_found());
          }
          return out;
        },
        short_window());
    const std::vector<int> keys{5, -1};
    got = l.load_many(keys);
    CHECK(got[0].value() == 5);
    CHECK(holds<sf::not_found_error>(got[1].error()));
  }
  SECTION("a map: a key it lacks is not_found") {
    std::vector<sf::outcome<int>> got;  // before the loader: see keep_errors
    std::optional<sf::outcome<int>> missing;
    sf::batch_loader<std::string, int> l(
        [](std::span<const std::string> keys) {
          std::unordered_map<std::string, int> out;
          for (const auto& k : keys) {
            if (k != "missing") out.emplace(k, static_cast<int>(k.size()));
          }
          return out;
        },
        short_window());
    const std::vector<std::string> keys{"abc", "missing", "de"};
    got = l.load_many(keys);
    CHECK(got[0].value() == 3);
    CHECK(holds<sf::not_found_error>(got[1].error()));
    CHECK(got[2].value() == 2);
    missing.emplace(l.try_load("missing"));
    CHECK(holds<sf::not_found_error>(missing->error()));
  }
  SECTION("a std::map to outcome<T>") {
    sf::batch_loader<int, std::string> l(
        [](std::span<const int> keys) {
          std::map<int, sf::outcome<std::string>> out;
          for (int k : keys) out.emplace(k, sf::outcome<std::string>(std::in_place, "v"));
          return out;
        },
        short_window());
    CHECK(l.load_many(std::vector<int>{1, 2})[1].value() == "v");
  }
}

TEST_CASE("a sequence of the wrong length fails every key of its batch with batch_size_error",
          "[batch][shapes]") {
  // Catches: results silently misaligned with keys (a key given another key's value).
  std::vector<sf::outcome<std::string>> out;  // before the loader: see keep_errors
  loader_t l([](std::span<const std::string>) { return std::vector<std::string>{"only one"}; },
             short_window());
  const std::vector<std::string> keys{"a", "b", "c"};
  out = l.load_many(keys);
  for (const auto& o : out) {
    REQUIRE(holds<sf::batch_size_error>(o.error()));
    try {
      std::rethrow_exception(o.error());
    } catch (const sf::batch_size_error& e) {
      CHECK(e.expected() == 3);
      CHECK(e.got() == 1);
      CHECK(std::string(e.what()).find("returned 1 results for 3 keys") != std::string::npos);
    }
  }
  CHECK(out[0].error() == out[2].error());  // one exception object for the batch
  CHECK(l.stats().failed_batches == 1);
}

TEST_CASE("an asynchronous bulk function: resolved on another thread, dropped, or throwing",
          "[batch][shapes][async]") {
  using completion_t = sf::batch_completion<std::string, std::string>;
  std::mutex m;
  std::vector<completion_t> held;
  std::atomic<int> mode{0};        // 0: park the completion; 1: drop it; 2: drop it, then throw
  callback_log<std::string> a, b;  // before the loader: see keep_errors
  loader_t l(
      [&](std::span<const std::string>, sf::stop_token, completion_t done) {
        if (mode == 1) return;  // done destroyed unresolved
        if (mode == 2) {
          completion_t gone = std::move(done);
          (void)gone;
          throw std::runtime_error("thrown after the completion died");
        }
        const std::lock_guard<std::mutex> lk(m);
        held.push_back(std::move(done));
      },
      no_window());
  SECTION("resolved on another thread: delivered there") {
    l.async_load("a", a.on_done());
    l.async_load("b", b.on_done());
    l.flush();
    must(
        [&] {
          const std::lock_guard<std::mutex> lk(m);
          return held.size() == 1;
        },
        "completion parked");
    completion_t c;
    {
      const std::lock_guard<std::mutex> lk(m);
      c = std::move(held.front());
    }
    CHECK(std::vector<std::string>(c.keys().begin(), c.keys().end()) ==
          std::vector<std::string>{"a", "b"});
    const auto resolver = sftest::on_new_thread(
        [&] {
          c.set_value(std::vector<std::string>{"A", "B"});
        },
        "set_value");
    a.wait("a");
    b.wait("b");
    CHECK(*a.value == "A");
    CHECK(*b.value == "B");
    CHECK(a.thread == resolver);
  }
  SECTION("dropped: broken_promise_error") {
    mode = 1;
    l.async_load("a", a.on_done());
    l.flush();
    a.wait("a");
    CHECK(a.threw<sf::broken_promise_error>());
  }
  SECTION("thrown before returning: that exception, even though the completion died first") {
    mode = 2;
    l.async_load("a", a.on_done());
    l.flush();
    a.wait("a");
    CHECK(a.threw<std::runtime_error>());
    CHECK_FALSE(a.threw<sf::broken_promise_error>());
  }
}

// ---- caller-facing forms, options
// ------------------------------------------------------------------

namespace {
sftest::fire_task<std::string> co_get(loader_t& l, std::string key) {
  co_return co_await l.co_load(key);
}
}  // namespace

TEST_CASE("co_load suspends until the batch is delivered and resumes on the delivering thread",
          "[batch][coro]") {
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), no_window());
  auto t1 = co_get(l, "a");
  auto t2 = co_get(l, "b");
  CHECK_FALSE(t1.done());
  pending(l, 2, "pending");
  l.flush();
  t1.wait("t1");
  t2.wait("t2");
  CHECK(*t1.get().value == "a");
  CHECK(*t2.get().value == "b");
  CHECK(t1.get().finished_on == rec.at(0).thread);
  CHECK(rec.count() == 1);
}

TEST_CASE("max_in_flight_batches: a due batch waits for a running one, and keeps taking keys",
          "[batch][options]") {
  bulk_record<std::string> rec;
  gate release;
  auto opts = no_window(2);
  opts.max_in_flight_batches = 1;
  loader_t l(identity_bulk(rec, &release), opts);
  std::vector<callback_log<std::string>> logs(5);
  for (int i = 0; i < 5; ++i) l.async_load(std::to_string(i), logs[i].on_done());
  rec.wait(1, "first batch runs");
  CHECK_FALSE(sftest::becomes([&] { return rec.count() > 1; }, 30ms));
  CHECK(l.stats().running_batches == 1);
  CHECK(l.stats().pending_keys == 3);
  release.open();
  rec.wait(2, "second batch runs");
  l.flush();
  for (auto& log : logs) log.wait("answered");
  CHECK(rec.keys() == keys_t{{"0", "1"}, {"2", "3"}, {"4"}});
}

TEST_CASE("flight.executor runs the bulk calls; a dropped task fails its batch",
          "[batch][options]") {
  bulk_record<std::string> rec;
  sftest::manual_executor ex;
  auto opts = no_window();
  opts.flight.executor = ex.executor();
  loader_t l(identity_bulk(rec), opts);
  callback_log<std::string> a, b;
  l.async_load("a", a.on_done());
  l.flush();
  auto t = ex.take("task handed over");
  CHECK(rec.count() == 0);
  t();  // runs here
  a.wait("a");
  CHECK(*a.value == "a");
  CHECK(rec.at(0).thread == std::this_thread::get_id());
  l.async_load("b", b.on_done());
  l.flush();
  { auto dropped = ex.take("second task"); }
  b.wait("b");
  CHECK(holds<sf::error>(b.error));
  CHECK(l.stats().failed_batches == 1);
}

TEST_CASE("close() fails pending keys, stops running bulk calls, waits, and rejects new calls",
          "[batch][close]") {
  std::atomic<bool> stopped_seen{false};
  bulk_record<std::string> rec;
  std::optional<loader_t> l;
  l.emplace(
      [&](std::span<const std::string> keys, sf::stop_token st) {
        const std::size_t i = rec.enter(keys);
        must([&] { return st.stop_requested(); }, "close stops the bulk call");
        stopped_seen = true;
        rec.leave(i, st);
        return std::vector<std::string>(keys.begin(), keys.end());
      },
      no_window());
  callback_log<std::string> running, waiting, after;
  l->async_load("r", running.on_done());
  l->flush();
  rec.wait(1, "running");
  l->async_load("p", waiting.on_done());
  pending(*l, 1, "p pending");
  l->close();
  CHECK(stopped_seen);
  running.wait("r");
  waiting.wait("p");
  CHECK(running.threw<sf::closed_error>());
  CHECK(waiting.threw<sf::closed_error>());
  l->async_load("x", after.on_done());
  CHECK(after.threw<sf::closed_error>());
  l.reset();
}

TEST_CASE("batch_stats and metrics::batch_metrics", "[batch][stats]") {
  bulk_record<std::string> rec;
  loader_t l(identity_bulk(rec), short_window());
  const std::vector<std::string> keys{"a", "b", "a"};
  (void)l.load_many(keys);
  const auto s = l.stats();
  CHECK(s.calls == 3);
  CHECK(s.joins == 1);
  CHECK(s.batches == 1);
  CHECK(s.keys == 2);
  CHECK(l.flight_stats().flights == 2);
  std::set<std::string_view> names;
  for (const auto& d : sf::metrics::batch_metrics) {
    CHECK(d.name.rfind("singleflight_batch_", 0) == 0);
    names.insert(d.name);
    REQUIRE(d.read != nullptr);
  }
  CHECK(names.size() == sf::metrics::batch_metrics.size());
  CHECK(sf::metrics::batch_metrics[2].read(s) == 1.0);  // batches
  CHECK(sf::metrics::batch_metrics[3].read(s) == 2.0);  // keys
}

TEST_CASE("a negative window is rejected", "[batch][options]") {
  sf::batch_options o;
  o.window = -1ns;
  CHECK_THROWS_AS(loader_t(
                      [](std::span<const std::string> k) {
                        return std::vector<std::string>(k.begin(), k.end());
                      },
                      o),
                  std::invalid_argument);
}

// ---- behind a cache
// ------------------------------------------------------------------------------

TEST_CASE("behind a cache: refreshes of many keys falling due together share bulk calls",
          "[batch][cache]") {
  // The cache's async loader shape (void(stop_token, completion<load_result<T>>)) through
  // loader_for(key): every stale read starts a background refresh, and the refreshes, started
  // together, become ceil(n / max_batch) bulk calls instead of n loads; no reader waits.
  constexpr int n = 200;
  constexpr std::size_t max_batch = 64;
  sftest::manual_clock::reset();
  bulk_record<int> rec;
  sf::batch_loader<int, int> loader(
      [&](std::span<const int> keys) {
        const std::size_t i = rec.enter(keys);
        std::vector<sf::load_result<int>> out;
        for (int k : keys) {
          out.push_back(k == -1 ? sf::load_result<int>::not_found()
                                : sf::load_result<int>::value(k + 1000));
        }
        rec.leave(i, {});
        return out;
      },
      no_window(max_batch));
  sf::cache_options co;
  co.ttl = 1s;
  co.jitter = 0;
  co.stale_while_revalidate = 1h;
  sf::cache<int, int, sf::default_hash, std::equal_to<>, sftest::manual_clock> c(co);
  for (int k = 0; k < n; ++k) c.put(k, k);
  sftest::manual_clock::advance(2s);  // every key stale at once
  for (int k = 0; k < n; ++k) {
    const auto e = c.get_entry(k, loader.loader_for(k));
    CHECK(e.state == sf::freshness::stale);  // answered at once: no reader waits
    CHECK(*e.value == k);
  }
  // The full batches went at once; the rest waits in the open batch.
  must([&] { return rec.count() == n / max_batch; }, "full batches dispatched");
  pending(loader, n % max_batch, "the rest pending");
  loader.flush();
  must(
      [&] {
        for (int k = 0; k < n; ++k) {
          const auto p = c.peek(k);
          if (!p || *p->value != k + 1000) return false;
        }
        return true;
      },
      "every key refreshed");
  CHECK(rec.count() == (n + max_batch - 1) / max_batch);
  CHECK(c.stats().background_refreshes == n);
  // A miss through the same loader: not_found becomes the cache's "no such key".
  sftest::result<bool> miss;
  auto t = sftest::spawn(miss, [&] { return c.get_entry(-1, loader.loader_for(-1)).found(); });
  pending(loader, 1, "the miss pending");
  loader.flush();
  sftest::finish(t, miss, "the miss answered");
  REQUIRE(miss.value);
  CHECK_FALSE(*miss.value);
}

// ---- the docs' example -------------------------------------------------------------------------

TEST_CASE("docs: the quick example (docs/batch_loader.md)", "[batch][docs]") {
  // A bulk origin: one round trip answers any number of keys (here, a map).
  const std::map<std::string, std::string> db{{"7|42", "Ada"}, {"7|43", "Grace"}};
  // --- snippet: batch-quick ---
  singleflight::batch_loader<std::string, std::string> names(
      [&db](std::span<const std::string> keys, singleflight::stop_token) {
        std::unordered_map<std::string, std::string> found;  // a key left out: not_found_error
        for (const std::string& k : keys) {
          if (auto it = db.find(k); it != db.end()) found.emplace(k, it->second);
        }
        return found;  // one origin call for the whole batch
      },
      {.max_batch = 100, .window = std::chrono::milliseconds(2)});

  std::vector<std::thread> requests;  // keys: tenant|user (the key is a contract)
  for (const char* key : {"7|42", "7|43", "7|42"}) {
    requests.emplace_back([&names, key] {
      std::string name = names.load(key);  // waits at most the window, plus the origin
    });
  }
  for (std::thread& r : requests) r.join();
  // Requests arriving within 2 ms of the first share one bulk call: here one call for 2 keys.
  // --- end snippet ---
  const auto s = names.stats();
  CHECK(s.batches >= 1);
  CHECK(s.batches <= 3);
  CHECK(s.calls == 3);
  CHECK(names.load("7|43") == "Grace");
  CHECK(names.try_load("7|99").status() == sf::status::failed);  // not_found_error
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

}  // namespace

TEST_CASE("load_many: a T move that blocks while one key is delivered does not stall another's",
          "[batch][many]") {
  // Each key's outcome is moved into load_many's slot on the thread that resolves its batch.
  // T's move is user code: it must not run under the lock every other key's delivery takes.
  // The moves of one delivery are counted once (the last is the one into the slot); then a
  // second load_many blocks in that move until another batch's delivery returns (bounded).
  using completion_t = sf::batch_completion<std::string, mval>;
  std::mutex m;
  std::map<std::string, completion_t> held;  // m
  sf::batch_loader<std::string, mval> l(
      [&](std::span<const std::string> keys, sf::stop_token, completion_t done) {
        const std::lock_guard<std::mutex> lk(m);
        held.emplace(keys.front(), std::move(done));
      },
      no_window(1));  // one key per batch: a batch (and a delivery) per key
  const auto take = [&](const std::string& k) {
    const std::lock_guard<std::mutex> lk(m);
    completion_t c = std::move(held.at(k));
    held.erase(k);
    return c;
  };
  const auto run = [&](const std::string& a, const std::string& b, auto&& then) {
    const std::vector<std::string> keys{a, b};
    std::vector<sf::outcome<mval>> out;
    sftest::thread caller([&] { out = l.load_many(keys); });
    must(
        [&] {
          const std::lock_guard<std::mutex> lk(m);
          return held.size() == 2;
        },
        "both batches start");
    sftest::thread resolver([&, c = take(a)]() mutable {
      watch.moves.store(0);
      watch.thread.store(std::this_thread::get_id(), std::memory_order_release);
      std::vector<mval> v;
      v.emplace_back("va");
      c.set_value(std::move(v));
      watch.thread.store(std::thread::id{});
    });
    resolver.join("a's delivery returns");
    then(b);
    caller.join("load_many returns");
    REQUIRE(out.size() == 2);
    CHECK(out[0].value().s == "va");
    CHECK(out[1].value().s == "vb");
  };
  const auto resolve_b = [&](const std::string& b) {
    std::vector<mval> v;
    v.emplace_back("vb");
    take(b).set_value(std::move(v));
  };

  // Count the moves of one delivery.
  watch.fire_at = -1;
  run("a1", "b1", resolve_b);
  const int last = watch.moves.load();
  REQUIRE(last > 0);

  // Again, blocking in the last move (into the slot) until b's delivery has returned.
  std::atomic<bool> b_done{false};
  bool b_in_time = false;
  std::unique_ptr<sftest::thread> b_resolver;
  watch.fire_at = last;
  watch.act = [&] {
    b_resolver = std::make_unique<sftest::thread>([&] {
      resolve_b("b2");
      b_done.store(true);
    });
    b_in_time = sftest::becomes([&] { return b_done.load(); }, 3s);
  };
  run("a2", "b2", [&](const std::string&) { b_resolver->join("b's delivery returns"); });
  watch.fire_at = -1;
  CHECK(b_in_time);
}

TEST_CASE(
    "load_many: its token and wait_bound apply to each key; it leaves a running batch at them "
    "while the batch goes on for the keys' other callers",
    "[batch][many][s3]") {
  // load_many(keys, caller[, bound]): the caller's token and bound apply to each key. Its keys
  // are in a running bulk call that other callers also wait for: load_many returns at the stop
  // (cancelled_error) or the bound (timeout_error) for every key, a repeated key included,
  // while the bulk call runs on, unstopped, and answers the other callers.
  bulk_record<std::string> rec;
  gate release;
  callback_log<std::string> a, b;
  loader_t l(identity_bulk(rec, &release), no_window());
  l.async_load("a", a.on_done());
  l.async_load("b", b.on_done());
  pending(l, 2, "both pending");
  l.flush();
  rec.wait(1, "the bulk call runs");
  const std::vector<std::string> keys{"a", "b", "a"};

  sf::stop_source stop;
  std::vector<sf::outcome<std::string>> by_token;
  sftest::thread t1([&] { by_token = l.load_many(keys, stop.get_token()); });
  // calls: a, b, then load_many's repeat (counted first), its "a" and its "b".
  must([&] { return l.stats().calls >= 5; }, "load_many joined both keys");
  stop.request_stop();
  t1.join("load_many returns at its stop");

  std::vector<sf::outcome<std::string>> by_bound;
  sftest::thread t2([&] { by_bound = l.load_many(keys, {}, 20ms); });
  t2.join("load_many returns at its bound");

  std::vector<sf::outcome<std::string>> stopped_before;
  {
    sf::stop_source gone;
    gone.request_stop();
    stopped_before = l.load_many(std::vector<std::string>{"c", "d"}, gone.get_token());
  }
  CHECK_FALSE(a.is_done());  // the bulk call is still held
  release.open();
  a.wait("a answered");
  b.wait("b answered");

  REQUIRE(by_token.size() == 3);
  for (const auto& o : by_token) CHECK(o.status() == sf::status::cancelled);
  REQUIRE(by_bound.size() == 3);
  for (const auto& o : by_bound) CHECK(o.status() == sf::status::timeout);
  REQUIRE(stopped_before.size() == 2);
  for (const auto& o : stopped_before) CHECK(o.status() == sf::status::cancelled);
  REQUIRE(a.value);
  REQUIRE(b.value);
  CHECK(*a.value == "a");
  CHECK(*b.value == "b");
  must([&] { return rec.at(0).returned; }, "bulk returned");
  CHECK_FALSE(rec.at(0).stopped);
  CHECK(rec.count() == 1);  // "c" and "d" were never loaded
  CHECK(l.stats().stopped_batches == 0);
}
