// detail::kept_reads (detail/fleet/kept_reads.hpp): which client-tracking reports a value read
// from Redis already reflects, and stored_after, fleet_cache's check that the local entry is the
// load's value (stored after the load returned) before it skips such a report. No Redis, no
// cache: a look returns an age the way the cache measures it (its own reading of the clock, taken
// during the call); a look "preempted" reads that clock late, as a thread descheduled between
// fleet_cache's reading and the cache's does.
#include <singleflight/detail/fleet/kept_reads.hpp>

#include <chrono>
#include <optional>

#include "support/catch.hpp"

namespace {

namespace d = singleflight::detail;
using clock_t_ = d::kept_reads::clock;
using namespace std::chrono_literals;

// An entry stored at `written`; its looks return its age as the cache does (now - written, 0
// when not past), the first `late` of them reading the clock `delay` after they were called.
struct entry {
  clock_t_::time_point written;
  int late = 0;
  clock_t_::duration delay = 5ms;
  int looks = 0;
  std::optional<std::chrono::nanoseconds> operator()() {
    looks += 1;
    clock_t_::time_point now = clock_t_::now();
    if (late > 0) {
      late -= 1;
      // The clock read late: time passing, not a wait on another thread (bounded by `delay`).
      const clock_t_::time_point until = now + delay;
      while ((now = clock_t_::now()) < until) {
      }
    }
    return std::chrono::duration_cast<std::chrono::nanoseconds>(now > written ? now - written
                                                                              : 0ns);
  }
};

}  // namespace

TEST_CASE(
    "kept_reads_stored_after: an entry stored after the load returned is recognised even when "
    "the thread is preempted inside one look (one look alone, as before: the report dropped the "
    "kept value, one more Redis read)",
    "[fleet][fleet_cache][tracking][echo]") {
  const clock_t_::time_point at = clock_t_::now() - 10ms;
  entry e{at + 1ms, 1};
  CHECK(d::kept_reads::stored_after(at, e));
  CHECK(e.looks == 2);

  entry single{at + 1ms, 1};
  CHECK_FALSE(d::kept_reads::stored_after(at, single, 1));  // what one look decided
}

TEST_CASE(
    "kept_reads_stored_after: an entry stored before the load returned is never taken for the "
    "load's, preempted or not; no entry is not after",
    "[fleet][fleet_cache][tracking][echo]") {
  const clock_t_::time_point at = clock_t_::now() - 10ms;
  entry older{at - 1ms, 0};
  CHECK_FALSE(d::kept_reads::stored_after(at, older));
  entry older_late{at - 1ms, 4};
  CHECK_FALSE(d::kept_reads::stored_after(at, older_late));
  int looks = 0;
  CHECK_FALSE(d::kept_reads::stored_after(at, [&]() -> std::optional<std::chrono::nanoseconds> {
    looks += 1;
    return std::nullopt;
  }));
  CHECK(looks == 1);
}

TEST_CASE(
    "kept_reads_stored_after: looks that keep straddling the load's return are bounded and "
    "counted as not after (the report is applied)",
    "[fleet][fleet_cache][tracking][echo]") {
  const clock_t_::time_point at = clock_t_::now() - 10ms;
  entry e{at + 1ms, 100};
  CHECK_FALSE(d::kept_reads::stored_after(at, e, 3));
  CHECK(e.looks == 3);
}

TEST_CASE(
    "kept_reads: a report newer than the read, or a write of this process since the load "
    "began, drops the record",
    "[fleet][fleet_cache][tracking][echo]") {
  d::kept_reads k(8);
  const clock_t_::time_point at = clock_t_::now();
  k.record("a", 3, at, 7);
  REQUIRE(k.covers("a", 2, 7).has_value());
  CHECK(*k.covers("a", 3, 7) == at);
  CHECK_FALSE(k.covers("a", 0, 7).has_value());  // no number: never skipped
  CHECK_FALSE(k.covers("a", 4, 7).has_value());  // newer than the read
  CHECK_FALSE(k.covers("a", 3, 7).has_value());  // its record went with it
  k.record("b", 3, at, 7);
  CHECK_FALSE(k.covers("b", 3, 8).has_value());  // a put/invalidate/expire since
  CHECK_FALSE(k.covers("c", 1, 7).has_value());  // never recorded
}
