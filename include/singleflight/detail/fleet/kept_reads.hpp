// singleflight/detail/fleet/kept_reads.hpp -- internal; do not include directly.
//
// detail::kept_reads: fleet_cache's record, under client tracking, of the loads whose value came
// from a Redis read sent after some reports were posted (read_mark.hpp), so that applying those
// reports later does not drop the value (the "echo": every process hears the report of each store
// of a value, the store its own value came from included).
//
// One record per key text: the reports the read is known to reflect (`reports`), when the load
// returned (`at`, on the steady clock, before the local cache stores the value), and the count of
// this process's own writes when the load began (`writes`). A report of the key numbered
// `seq` may be skipped (covers) only when
//   * seq <= reports: the server sent it before it ran the read;
//   * no write of this process (put, invalidate, expire) began since the load began: the local
//     entry might then be that write's, not the load's;
// and fleet_cache then checks that the local entry was stored after `at` (so it is the load's
// value, or a newer one: stored_after), else drops it. A report numbered past `reports` drops
// the key and erases its record.
//
// Bounded: at most `max` records; past that the records are cleared (a value then costs one more
// Redis read, as without them). Locking: `mu_`, a leaf, guards records_.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "../chrono.hpp"

namespace singleflight::detail {

class kept_reads {
 public:
  using clock = std::chrono::steady_clock;

  explicit kept_reads(std::size_t max) : max_(max) {}

  // stored_after(at, look): whether the local entry was stored after `at`. `look()` returns
  // the entry's age (std::optional<std::chrono::nanoseconds>; nullopt: no entry), which the
  // cache measures against its own reading of `clock`, taken during the call: so the entry was
  // stored within [before - age, then - age], `before` and `then` read just around the call.
  // Decided only when that interval lies on one side of `at`; when it straddles `at` (the
  // thread was preempted during the look, or the load's store came a few nanoseconds after
  // `at`), the look is taken again, at most `looks` times, and then counted as not after (the
  // report is applied: one more Redis read, never a value older than the load kept).
  template <class Look>
  static bool stored_after(clock::time_point at, Look&& look, int looks = 4) {
    for (int i = 0; i < looks; ++i) {
      const clock::time_point before = clock::now();
      const std::optional<std::chrono::nanoseconds> age = look();
      const clock::time_point then = clock::now();
      if (!age) return false;
      if (before - *age > at) return true;
      if (then - *age <= at) return false;
    }
    return false;
  }

  // record(text, reports, at, writes): a load of `text` returned, at `at`, a value read after
  // `reports` reports were posted; `writes` was the count of this process's writes when it
  // began. Never throws (a record that cannot be made is not made). Thread-safe.
  void record(const std::string& text, std::uint64_t reports, clock::time_point at,
              std::uint64_t writes) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    try {
      if (records_.size() >= max_ && records_.find(text) == records_.end()) records_.clear();
      records_.insert_or_assign(text, entry{reports, at, writes});
    } catch (...) {  // bad_alloc: no record
    }
  }

  // covers(text, seq, writes): when report `seq` of `text` may be skipped, the time after which
  // the local entry must have been stored for it to be (see above); nullopt: drop it (and the
  // record, when the report is newer than the read or a write of this process intervened).
  // `writes`: this process's write count now. Thread-safe.
  std::optional<clock::time_point> covers(const std::string& text, std::uint64_t seq,
                                          std::uint64_t writes) noexcept {
    if (seq == 0) return std::nullopt;
    const std::lock_guard<std::mutex> lk(mu_);
    const auto it = records_.find(text);
    if (it == records_.end()) return std::nullopt;
    if (seq > it->second.reports || it->second.writes != writes) {
      records_.erase(it);
      return std::nullopt;
    }
    return it->second.at;
  }

  // holds(text, reports, at): whether the record of `text` is still the one record(text,
  // reports, at, _) made: no report past `reports` erased it and no later load replaced it.
  // Thread-safe.
  bool holds(const std::string& text, std::uint64_t reports, clock::time_point at) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    const auto it = records_.find(text);
    return it != records_.end() && it->second.reports == reports && it->second.at == at;
  }

 private:
  struct entry {
    std::uint64_t reports;
    clock::time_point at;
    std::uint64_t writes;
  };

  const std::size_t max_;
  std::mutex mu_;
  std::unordered_map<std::string, entry> records_;  // guarded by mu_
};

}  // namespace singleflight::detail
