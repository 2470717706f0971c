// Guarantee 13: keys. group<std::string, T> is probed with std::string_view and
// const char* without building a std::string (a follower's join allocates
// nothing); std::pair and std::tuple keys work out of the box; keys that
// differ in any element (the tenant) never coalesce.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "support/alloc.hpp"  // this executable's operator new/delete
#include "support/catch.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;

// Allocation counting (support/alloc.hpp): not under ThreadSanitizer, whose runtime owns
// operator new.
constexpr bool counts_allocations = sftest::alloc::replaced;
using sftest::alloc::allocations_during;

}  // namespace

TEST_CASE(
    "string_view, const char* and char array probes join a flight started with a "
    "std::string key",
    "[keys][heterogeneous]") {
  sf::group<std::string, int> g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<int> fn_calls{0};
  const std::string owner = "tenant-a|user-42|en-GB";

  sf::call_info i0, i1, i2, i3;
  sftest::result<int> r0, r1, r2, r3;
  auto t0 = sftest::spawn(r0, [&] {
    return g.do_(
        owner,
        [&] {
          ++fn_calls;
          fn_started = true;
          release.wait("release fn");
          return 42;
        },
        {}, i0);
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto other = [&] {
    ++fn_calls;
    return -1;
  };
  auto t1 = sftest::spawn(
      r1, [&] { return g.do_(std::string_view("tenant-a|user-42|en-GB"), other, {}, i1); });
  auto t2 = sftest::spawn(r2, [&] {
    const char* p = "tenant-a|user-42|en-GB";
    return g.do_(p, other, {}, i2);
  });
  auto t3 = sftest::spawn(r3, [&] { return g.do_("tenant-a|user-42|en-GB", other, {}, i3); });
  sftest::must([&] { return g.stats().joins == 3; }, "three probes joined");
  release.open();
  sftest::finish(t0, r0, "leader");
  sftest::finish(t1, r1, "string_view");
  sftest::finish(t2, r2, "const char*");
  sftest::finish(t3, r3, "char array");
  CHECK(*r0.value == 42);
  CHECK(*r1.value == 42);
  CHECK(*r2.value == 42);
  CHECK(*r3.value == 42);
  CHECK(fn_calls == 1);
  CHECK(g.stats().flights == 1);
  CHECK(i1.role == sf::role::follower);
  CHECK(i2.role == sf::role::follower);
  CHECK(i3.role == sf::role::follower);
  CHECK(i1.flight == i0.flight);
  CHECK(i3.flight == i0.flight);

  // And the other way round: a flight started with a string_view key is
  // joined by a std::string probe.
  sftest::gate release2;
  std::atomic<bool> fn2_started{false};
  sftest::result<int> s0, s1;
  auto u0 = sftest::spawn(s0, [&] {
    return g.do_(std::string_view("tenant-b|user-7|fr"), [&] {
      fn2_started = true;
      release2.wait("release fn 2");
      return 7;
    });
  });
  sftest::must([&] { return fn2_started.load(); }, "fn 2 started");
  auto u1 = sftest::spawn(s1, [&] { return g.do_(std::string("tenant-b|user-7|fr"), other); });
  sftest::must([&] { return g.stats().joins == 4; }, "std::string probe joined");
  release2.open();
  sftest::finish(u0, s0, "string_view leader");
  sftest::finish(u1, s1, "std::string follower");
  CHECK(*s0.value == 7);
  CHECK(*s1.value == 7);
  CHECK(fn_calls == 1);
}

TEST_CASE("a follower probing with a long string_view joins without allocating",
          "[keys][heterogeneous][alloc]") {
  sf::group<std::string, int> g;
  const std::string text(200, 'k');  // far beyond any small-string buffer
  const std::string_view key(text);
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<long> leader_allocs{-1};
  std::atomic<long> follower_allocs{-1};
  sf::call_info follower_info;

  sftest::result<int> leader, follower;
  auto tl = sftest::spawn(leader, [&] {
    int v = 0;
    leader_allocs = allocations_during([&] {
      v = g.do_(key, [&] {
        fn_started = true;
        release.wait("release fn");
        return 5;
      });
    });
    return v;
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto tf = sftest::spawn(follower, [&] {
    int v = 0;
    follower_allocs = allocations_during([&] {
      v = g.do_(
          key, [] { return -1; }, {}, follower_info);
    });
    return v;
  });
  sftest::must([&] { return g.stats().joins == 1; }, "follower joined");
  release.open();
  sftest::finish(tl, leader, "leader");
  sftest::finish(tf, follower, "follower");

  CHECK(*leader.value == 5);
  CHECK(*follower.value == 5);
  CHECK(follower_info.role == sf::role::follower);
  if (counts_allocations) {
    CHECK(follower_allocs == 0);
    // The counter works: the leader stored a std::string copy of the key (and
    // allocated its flight and map node).
    CHECK(leader_allocs > 0);
  } else {
    WARN("allocation counting is not available under ThreadSanitizer");
  }
}

TEST_CASE("std::tuple and std::pair keys work out of the box", "[keys][composite]") {
  using tkey = std::tuple<std::string, int, std::string>;
  sf::group<tkey, std::string> g;
  sftest::gate release;
  std::atomic<bool> fn_started{false};
  std::atomic<int> fn_calls{0};

  sftest::result<std::string> a, b;
  auto ta = sftest::spawn(a, [&] {
    return g.do_(tkey{"tenant-a", 42, "en"}, [&] {
      ++fn_calls;
      fn_started = true;
      release.wait("release fn");
      return std::string("profile a/42/en");
    });
  });
  sftest::must([&] { return fn_started.load(); }, "fn started");
  auto tb = sftest::spawn(b, [&] {
    // A tuple of other element types converts to the key.
    return g.do_(std::make_tuple("tenant-a", 42, "en"), [&] {
      ++fn_calls;
      return std::string("wrong");
    });
  });
  sftest::must([&] { return g.stats().joins == 1; }, "equal tuple joined");
  release.open();
  sftest::finish(ta, a, "a");
  sftest::finish(tb, b, "b");
  CHECK(*a.value == "profile a/42/en");
  CHECK(*b.value == "profile a/42/en");
  CHECK(fn_calls == 1);

  sf::group<std::pair<std::string, int>, int> p;
  sftest::gate release_p;
  std::atomic<bool> p_started{false};
  sftest::result<int> pa, pb;
  auto tpa = sftest::spawn(pa, [&] {
    return p.do_(std::pair<std::string, int>{"user", 7}, [&] {
      p_started = true;
      release_p.wait("release pair fn");
      return 70;
    });
  });
  sftest::must([&] { return p_started.load(); }, "pair fn started");
  auto tpb = sftest::spawn(pb, [&] {
    return p.do_(std::pair<std::string, int>{"user", 7}, [] { return -1; });
  });
  sftest::must([&] { return p.stats().joins == 1; }, "equal pair joined");
  CHECK(p.do_(std::pair<std::string, int>{"user", 8}, [] { return 80; }) == 80);
  release_p.open();
  sftest::finish(tpa, pa, "pair a");
  sftest::finish(tpb, pb, "pair b");
  CHECK(*pa.value == 70);
  CHECK(*pb.value == 70);
  CHECK(p.stats().flights == 2);
}

TEST_CASE("keys that differ only in the tenant never coalesce", "[keys][tenant]") {
  using tkey = std::tuple<std::string, int, std::string>;
  sf::group<tkey, std::string> g;
  sf::group<std::string, std::string> s;
  sftest::gate release;
  std::atomic<int> started{0};

  auto fetch = [&](std::string tenant) {
    return [&, tenant] {
      ++started;
      release.wait("release fetches");
      return "profile of " + tenant;
    };
  };
  sftest::result<std::string> a, b, c, d;
  auto ta = sftest::spawn(a, [&] { return g.do_(tkey{"tenant-a", 42, "en"}, fetch("a")); });
  auto tb = sftest::spawn(b, [&] { return g.do_(tkey{"tenant-b", 42, "en"}, fetch("b")); });
  auto tc = sftest::spawn(c, [&] { return s.do_(std::string("tenant-a|42|en"), fetch("a")); });
  auto td = sftest::spawn(d, [&] { return s.do_(std::string("tenant-b|42|en"), fetch("b")); });
  // All four run at once: nobody joined anybody.
  sftest::must([&] { return started == 4; }, "four separate flights running");
  CHECK(g.stats().joins == 0);
  CHECK(s.stats().joins == 0);
  CHECK(g.in_flight() == 2);
  CHECK(s.in_flight() == 2);
  release.open();
  sftest::finish(ta, a, "a");
  sftest::finish(tb, b, "b");
  sftest::finish(tc, c, "c");
  sftest::finish(td, d, "d");
  CHECK(*a.value == "profile of a");
  CHECK(*b.value == "profile of b");
  CHECK(*c.value == "profile of a");
  CHECK(*d.value == "profile of b");
  CHECK(g.stats().flights == 2);
  CHECK(s.stats().flights == 2);
}
