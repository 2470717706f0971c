// singleflight/detail/fleet/read_mark.hpp -- internal; do not include directly.
//
// detail::read_mark: which client-tracking reports a value read from Redis is known to reflect.
// fleet_cache under client tracking counts the reports its subscriber thread has posted
// (invalidation_inbox::reports). A flight whose value came from a Redis read (a GET, or the
// race script that returned it) loads that count just before it sends the read: every report
// counted then was sent by the server before it ran that read (one connection's replies keep
// the server's order; the subscriber received them before the read left), so the value already
// reflects the writes they report, and their later application must not drop it. Reports
// counted after it (a write the read may not reflect) still drop it.
//
// The flight records (engine, key text, count) in a thread-local slot (this_thread_read_mark)
// when its result came from such a read, on the thread that ran the flight; fleet_cache reads
// and clears it on the same thread right after fleet::get returns. A get answered by another
// thread's flight, a leader's load, a local load leave it unset: no report is skipped for them.
//
// A leader's value came from its loader, not from a read, and it marks nothing: its store goes on
// the tracker connection (tracker_line.hpp), whose writes the server does not report to this
// process, so there is no report of it to skip. When the store ran as the script instead (the
// tracker busy or down), its report drops the value locally, as any report not skipped.
//
// report_source: what the flight asks of the count's owner (invalidation_inbox).
//
// Locking: none; the slot is the thread's own. The count is an atomic the inbox writes under its
// lock (release) and the flight loads (acquire).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace singleflight::detail {

class report_source {
 public:
  // reports(): the count of reports posted so far. Memory ordering: acquire. Thread-safe.
  virtual std::uint64_t reports() const noexcept = 0;

 protected:
  report_source() = default;
  report_source(const report_source&) = default;
  report_source& operator=(const report_source&) = default;
  ~report_source() = default;
};

struct read_mark {
  const void* engine = nullptr;  // the fleet_engine whose flight set it
  std::string text;              // the key's text
  std::uint64_t reports = 0;     // the reports posted before the read was sent
  bool set = false;
};

// this_thread_read_mark(): the calling thread's slot.
inline read_mark& this_thread_read_mark() noexcept {
  thread_local read_mark m;
  return m;
}

}  // namespace singleflight::detail
