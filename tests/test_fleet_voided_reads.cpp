// detail::voided_reads (detail/fleet/voided_reads.hpp): fleet_cache's values the local cache
// refused for a report their read already reflects, set aside for the next load of the key. No
// Redis, no cache: the test plays fleet_cache (a load's begin and end, the reports it applies).
#include <singleflight/detail/fleet/voided_reads.hpp>

#include <memory>
#include <string>

#include "support/catch.hpp"

namespace {

namespace d = singleflight::detail;
using voided = d::voided_reads<std::string>;

template <class T = std::string>
typename d::voided_reads<T>::origin read_with(std::uint64_t reports) {
  typename d::voided_reads<T>::origin o;
  o.reports = reports;
  o.at = d::voided_reads<T>::clock::now();
  return o;
}

// A value that counts its destructions, to see where a discarded stash goes.
struct counted {
  int* destroyed;
  ~counted() { *destroyed += 1; }
};

}  // namespace

TEST_CASE(
    "voided_reads: a load learns the last report that dropped its key while it ran, none "
    "when no report did",
    "[fleet][fleet_cache][tracking]") {
  voided v(8);
  const std::uint64_t quiet = v.load_began("k");
  CHECK_FALSE(v.load_ended("k", quiet).has_value());

  const std::uint64_t began = v.load_began("k");
  v.dropped("other", 3);  // another key
  CHECK_FALSE(v.load_ended("k", began).has_value());

  const std::uint64_t b2 = v.load_began("k");
  v.dropped("k", 4);
  v.dropped("k", 6);
  const auto last = v.load_ended("k", b2);
  REQUIRE(last.has_value());
  CHECK(*last == 6);

  v.dropped("k", 7);  // no load under way: nothing counted for a later one
  const std::uint64_t b3 = v.load_began("k");
  CHECK_FALSE(v.load_ended("k", b3).has_value());
}

TEST_CASE("voided_reads: a stash is taken once, with what it was read with",
          "[fleet][fleet_cache][tracking]") {
  voided v(8);
  CHECK(v.take("k").first == nullptr);
  const voided::origin from = read_with(5);
  v.stash("k", std::make_shared<const std::string>("v2"), from);
  CHECK(v.stash_count() == 1);
  const auto [value, o] = v.take("k");
  REQUIRE(value != nullptr);
  CHECK(*value == "v2");
  CHECK(o.reports == 5);
  CHECK(o.at == from.at);
  CHECK(v.take("k").first == nullptr);
  CHECK(v.stash_count() == 0);
}

TEST_CASE(
    "voided_reads: a report of the key numbered past the stash's read discards it at once "
    "(its value with it); one at or below it does not",
    "[fleet][fleet_cache][tracking]") {
  voided v(8);
  v.stash("k", std::make_shared<const std::string>("v2"), read_with(5));
  v.dropped("k", 5);  // reflected by the read
  CHECK(v.stash_count() == 1);
  v.dropped("j", 9);  // another key
  CHECK(v.stash_count() == 1);
  v.dropped("k", 6);  // a write the read may not reflect
  CHECK(v.stash_count() == 0);
  CHECK(v.take("k").first == nullptr);

  int destroyed = 0;
  d::voided_reads<counted> c(8);
  c.stash("k", std::make_shared<const counted>(counted{&destroyed}), read_with<counted>(1));
  const int before = destroyed;  // the temporary the stash was copied from
  c.dropped("k", 2);
  CHECK(destroyed == before + 1);  // not kept until replaced or cleared
}

TEST_CASE("voided_reads: discard_all drops every stash; past `max` keys the stashes are cleared",
          "[fleet][fleet_cache][tracking]") {
  voided v(2);
  v.stash("a", std::make_shared<const std::string>("1"), read_with(1));
  v.stash("b", std::make_shared<const std::string>("2"), read_with(1));
  CHECK(v.stash_count() == 2);
  v.stash("b", std::make_shared<const std::string>("3"), read_with(2));  // replaced, not added
  CHECK(v.stash_count() == 2);
  v.stash("c", std::make_shared<const std::string>("4"), read_with(1));  // past max: cleared
  CHECK(v.stash_count() == 1);
  CHECK(v.take("a").first == nullptr);
  v.discard_all();
  CHECK(v.stash_count() == 0);
  CHECK(v.take("c").first == nullptr);
}

TEST_CASE(
    "voided_reads: a discard into a set_aside keeps the values until the set_aside dies (T's "
    "destructor runs after fleet_cache's application of the bus)",
    "[fleet][fleet_cache][tracking]") {
  int destroyed = 0;
  d::voided_reads<counted> c(8);
  c.stash("k", std::make_shared<const counted>(counted{&destroyed}), read_with<counted>(1));
  c.stash("j", std::make_shared<const counted>(counted{&destroyed}), read_with<counted>(1));
  c.stash("i", std::make_shared<const counted>(counted{&destroyed}), read_with<counted>(1));
  const int before = destroyed;  // the temporaries the stashes were copied from
  {
    d::voided_reads<counted>::set_aside kept;
    c.dropped("k", 2, &kept);
    CHECK(c.stash_count() == 2);
    c.discard_all(&kept);
    CHECK(c.stash_count() == 0);
    CHECK(destroyed == before);  // kept
  }
  CHECK(destroyed == before + 3);
}
