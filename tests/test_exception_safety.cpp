// Guarantee 12 (and the exception half of 4): Hash, KeyEqual, Key's copy,
// T's copy and allocation may throw; a throw before the call attached leaves
// the group unchanged; fn's exceptions of any type reach every waiter as the
// same object, and the entry is gone before the waiters wake.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/alloc.hpp"  // this executable's operator new/delete
#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/pool.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;

// Allocation failure injection (support/alloc.hpp): the n-th allocation made by this thread
// after arming fails with bad_alloc; other threads are never affected. Not under
// ThreadSanitizer, whose runtime owns operator new: the sweeps say they were skipped.
constexpr bool injects_allocation_failures = sftest::alloc::replaced;

// ---- a key whose hash, equality and copy can be made to throw ---------------

struct hash_failure {};
struct eq_failure {};
struct copy_failure {};

struct key {
  int id = 0;
  bool poison_hash = false;
  bool poison_eq = false;
  bool poison_copy = false;

  key(int i, bool h = false, bool e = false, bool c = false)
      : id(i), poison_hash(h), poison_eq(e), poison_copy(c) {}
  key(const key& o) : id(o.id), poison_hash(o.poison_hash), poison_eq(o.poison_eq) {
    if (o.poison_copy) throw copy_failure{};
  }
  // A copy too: a thread's pooled flight takes its next key by assignment.
  key& operator=(const key& o) {
    if (o.poison_copy) throw copy_failure{};
    id = o.id;
    poison_hash = o.poison_hash;
    poison_eq = o.poison_eq;
    poison_copy = false;
    return *this;
  }
};

struct key_hash {
  std::size_t operator()(const key& k) const {
    if (k.poison_hash) throw hash_failure{};
    return std::hash<int>{}(k.id);
  }
};

struct key_eq {
  bool operator()(const key& a, const key& b) const {
    if (a.poison_eq || b.poison_eq) throw eq_failure{};
    return a.id == b.id;
  }
};

using key_group = sf::group<key, int, key_hash, key_eq>;

// ---- a value whose copy throws on chosen threads ----------------------------

struct copy_refused {};

struct picky {
  static inline thread_local bool refuse = false;
  int v = 0;
  explicit picky(int x) : v(x) {}
  picky(const picky& o) : v(o.v) {
    if (refuse) throw copy_refused{};
  }
  picky(picky&& o) noexcept : v(o.v) {}
  picky& operator=(const picky&) = default;
  picky& operator=(picky&&) noexcept = default;
};

// ---- non-std exception types ------------------------------------------------

struct origin_failure {
  int code;
};

template <class T>
bool threw_type(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const T&) {
    return true;
  } catch (...) {
    return false;
  }
}

// Runs a call on a new thread that catches E by reference and records the
// caught object's address and the group's in_flight() inside the catch block.
struct catch_record {
  // Keeps the exception alive until the test thread has joined every caller,
  // so that the object is freed on the test thread: libstdc++'s exception
  // reference count is not instrumented, and TSan would otherwise report the
  // last caller's free racing with another caller's read of the object.
  std::exception_ptr keep;
  std::atomic<std::uintptr_t> address{0};
  std::atomic<std::size_t> in_flight_in_catch{999};
  std::atomic<int> code{0};
  std::atomic<bool> other{false};
  std::atomic<bool> done{false};
};

}  // namespace

TEST_CASE("a Hash that throws leaves the group unchanged", "[exception_safety][hash]") {
  key_group g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_(key{1}, [&] {
      fn_started = true;
      release.wait("release fn");
      return 10;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  const auto before = g.stats();

  CHECK_THROWS_AS(g.do_(key{1, /*hash*/ true}, [] { return -1; }), hash_failure);
  CHECK_THROWS_AS(g.do_(key{2, /*hash*/ true}, [] { return -1; }), hash_failure);
  CHECK_THROWS_AS(g.forget(key{1, /*hash*/ true}), hash_failure);
  const auto after = g.stats();
  CHECK(after.flights == before.flights);
  CHECK(after.joins == before.joins);
  CHECK(g.in_flight() == 1);

  auto tf = sftest::spawn(follower, [&] { return g.do_(key{1}, [] { return -1; }); });
  sftest::must([&] { return g.stats().joins == 1; }, "next call joins as usual");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(tf, follower, "follower");
  CHECK(*leader.value == 10);
  CHECK(*follower.value == 10);
  CHECK(g.in_flight() == 0);
  const auto s = g.stats();
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

TEST_CASE("a KeyEqual that throws while comparing leaves the group unchanged",
          "[exception_safety][key_equal]") {
  key_group g;
  // Nothing to compare against: KeyEqual is not called, the poisoned key works.
  CHECK(g.do_(key{1, false, /*eq*/ true}, [] { return 5; }) == 5);
  CHECK(g.in_flight() == 0);

  sftest::gate release;
  std::atomic<bool> fn_started{false};
  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    return g.do_(key{1}, [&] {
      fn_started = true;
      release.wait("release fn");
      return 10;
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");

  // Same hash as the entry in flight: the lookup compares, and KeyEqual throws
  // under the group's lock.
  CHECK_THROWS_AS(g.do_(key{1, false, /*eq*/ true}, [] { return -1; }), eq_failure);
  CHECK(g.in_flight() == 1);
  CHECK(g.stats().joins == 0);
  CHECK(g.stats().flights == 2);

  // The lock was released and the entry is intact: the next caller joins.
  auto tf = sftest::spawn(follower, [&] { return g.do_(key{1}, [] { return -1; }); });
  sftest::must([&] { return g.stats().joins == 1; }, "next call joins as usual");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(tf, follower, "follower");
  CHECK(*leader.value == 10);
  CHECK(*follower.value == 10);
  CHECK(g.in_flight() == 0);  // cleanup does not compare keys
  const auto s = g.stats();
  CHECK(s.rejections == 1);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

TEST_CASE("a Key whose copy throws on insertion leaves the group unchanged",
          "[exception_safety][key_copy]") {
  // Cold: this thread has no pooled flight, the key is copy-constructed into
  // a new one. Warm: the thread's pooled flight takes the key by assignment.
  const bool cold = GENERATE(true, false);
  CAPTURE(cold);
  if (cold) {
    sftest::empty_flight_pool<key_group>();
  } else {
    key_group warm;
    CHECK(warm.do_(key{4}, [] { return 4; }) == 4);  // leaves a flight in this thread's pool
  }
  key_group g{sftest::numbered()};
  std::atomic<int> fn_calls{0};
  auto fn = [&] {
    ++fn_calls;
    return 3;
  };
  sf::call_info info{sf::role::leader, 5};
  CHECK_THROWS_AS(g.do_(key{3, false, false, /*copy*/ true}, fn, {}, info), copy_failure);
  CHECK(fn_calls == 0);
  CHECK(g.in_flight() == 0);
  CHECK(info.role == sf::role::none);
  auto s = g.stats();
  CHECK(s.flights == 0);
  CHECK(s.rejections == 1);

  CHECK(g.do_(key{3}, fn, {}, info) == 3);
  CHECK(info.role == sf::role::leader);
  CHECK(info.flight == 1);  // the failed insertion did not use up a flight number
  s = g.stats();
  CHECK(s.flights == 1);
  CHECK(s.calls == s.flights + s.joins + s.rejections);
}

TEST_CASE(
    "T whose copy throws for one caller: that caller gets the exception, the others "
    "their values",
    "[exception_safety][value_copy]") {
  const bool refusing_leader = GENERATE(false, true);
  CAPTURE(refusing_leader);
  sf::group<std::string, picky> g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};

  sftest::result<int> leader, f1, f2;
  auto tl = sftest::spawn(leader, [&] {
    picky::refuse = refusing_leader;
    return g
        .do_("k",
             [&] {
               fn_started = true;
               release.wait("release fn");
               return picky{7};
             })
        .v;
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto t1 = sftest::spawn(f1, [&] {
    picky::refuse = !refusing_leader;
    return g.do_("k", [] { return picky{-1}; }).v;
  });
  auto t2 = sftest::spawn(f2, [&] { return g.do_("k", [] { return picky{-1}; }).v; });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(t1, f1, "follower 1");
  sftest::finish(t2, f2, "follower 2");

  sftest::result<int>& refused = refusing_leader ? leader : f1;
  sftest::result<int>& served = refusing_leader ? f1 : leader;
  CHECK(refused.threw<copy_refused>());
  REQUIRE(served.value);
  CHECK(*served.value == 7);
  REQUIRE(f2.value);
  CHECK(*f2.value == 7);
  CHECK(g.in_flight() == 0);
  CHECK(g.stats().failures == 0);  // fn did not fail; one caller's copy did
  CHECK(g.do_("k", [] { return picky{8}; }).v == 8);
}

TEST_CASE(
    "fn throwing a non-std type: every waiter catches the same object, after the entry "
    "is gone",
    "[exception_safety][fn_error]") {
  const bool throw_int = GENERATE(true, false);
  CAPTURE(throw_int);
  sf::group<std::string, int> g;
  std::atomic<bool> fn_started{false};
  std::atomic<bool> throw_now{false};
  catch_record rec[3];

  auto call = [&](int i) {
    return sftest::jthread([&, i] {
      try {
        (void)g.do_("k", [&]() -> int {
          fn_started = true;
          sftest::must([&] { return throw_now.load(); }, "followers joined");
          if (throw_int) throw 42;
          throw origin_failure{43};
        });
      } catch (const int& e) {
        rec[i].keep = std::current_exception();
        rec[i].in_flight_in_catch = g.in_flight();
        rec[i].address = reinterpret_cast<std::uintptr_t>(&e);
        rec[i].code = e;
      } catch (const origin_failure& e) {
        rec[i].keep = std::current_exception();
        rec[i].in_flight_in_catch = g.in_flight();
        rec[i].address = reinterpret_cast<std::uintptr_t>(&e);
        rec[i].code = e.code;
      } catch (...) {
        rec[i].other = true;
      }
      rec[i].done = true;
    });
  };
  sftest::jthread t0 = call(0);
  sftest::must([&] { return fn_started.load(); }, "fn started");
  sftest::jthread t1 = call(1);
  sftest::jthread t2 = call(2);
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");
  throw_now = true;
  for (auto& r : rec) sftest::must([&] { return r.done.load(); }, "caller caught");
  t0.join();
  t1.join();
  t2.join();

  const int expected = throw_int ? 42 : 43;
  for (auto& r : rec) {
    CHECK_FALSE(r.other.load());
    CHECK(r.code == expected);
    CHECK(r.in_flight_in_catch == 0);
    CHECK(r.address != 0);
    CHECK(r.address == rec[0].address.load());  // one object, not copies
    CHECK(r.keep == rec[0].keep);
  }
  CHECK(g.stats().failures == 1);
}

TEST_CASE("allocation failure at any point of an inline call leaves the group unchanged",
          "[exception_safety][alloc]") {
  if (!injects_allocation_failures) {
    WARN("allocation failure injection is not available under ThreadSanitizer");
    return;
  }
  const std::string k(64, 'x');  // longer than any small-string buffer: copying allocates
  int failures = 0;
  bool succeeded = false;
  for (int n = 1; n <= 64 && !succeeded; ++n) {
    CAPTURE(n);
    sf::group<std::string, int> g;
    // A cold start: the flight, its stop state and the key's storage are new.
    sftest::empty_flight_pool<sf::group<std::string, int>>();
    std::atomic<int> fn_calls{0};
    bool threw = false;
    sftest::alloc::arm(n);
    try {
      const int v = g.do_(k, [&](sf::stop_token) {
        ++fn_calls;
        return 9;
      });
      succeeded = !sftest::alloc::hit;  // the call did not reach the n-th allocation
      sftest::alloc::disarm();
      CHECK(v == 9);
    } catch (const std::bad_alloc&) {
      sftest::alloc::disarm();
      threw = true;
      ++failures;
    }
    const auto s = g.stats();
    CHECK(s.in_flight == 0);
    CHECK(s.calls == s.flights + s.joins + s.rejections);
    if (threw) {
      CHECK(fn_calls == 0);
      CHECK(s.flights == 0);
      CHECK(s.rejections == 1);
    }
    CHECK(g.do_(k, [] { return 1; }) == 1);  // still usable
    CHECK(g.close_for(sftest::bound));
  }
  CHECK(succeeded);
  CHECK(failures >= 3);  // at least the flight, its stop state, the key's storage
}

TEST_CASE("allocation failure at any point of a call with thread_executor fails cleanly",
          "[exception_safety][alloc][executor]") {
  if (!injects_allocation_failures) {
    WARN("allocation failure injection is not available under ThreadSanitizer");
    return;
  }
  const std::string k(64, 'x');
  int failures = 0;
  bool succeeded = false;
  for (int n = 1; n <= 64 && !succeeded; ++n) {
    CAPTURE(n);
    sf::options o;
    o.executor = sf::thread_executor{};
    sf::group<std::string, int> g{o};
    std::atomic<int> fn_calls{0};
    bool threw = false;
    sftest::alloc::arm(n);
    try {
      const int v = g.do_(k, [&](sf::stop_token) {
        ++fn_calls;
        return 9;
      });
      succeeded = !sftest::alloc::hit;
      sftest::alloc::disarm();
      CHECK(v == 9);
    } catch (const std::bad_alloc&) {
      sftest::alloc::disarm();
      threw = true;
      ++failures;
    }
    const auto s = g.stats();
    CHECK(s.in_flight == 0);
    CHECK(s.calls == s.flights + s.joins + s.rejections);
    if (threw) {
      CHECK(fn_calls == 0);
      // Before the flight was committed: nothing changed. After: the flight
      // failed with the allocation error.
      CHECK(((s.flights == 0 && s.rejections == 1) || (s.flights == 1 && s.failures == 1)));
    }
    CHECK(g.do_(k, [] { return 1; }) == 1);
    CHECK(g.close_for(sftest::bound));  // no user count leaked
  }
  CHECK(succeeded);
  CHECK(failures >= 4);
}
