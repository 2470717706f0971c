// singleflight/detail/group/impl/trace_slot.ipp -- internal; do not include directly.
//
// trace_slot's reports (detail/group/trace_slot.hpp, which describes them): report_start,
// report_settled and report_settle, the calls of options::tracer. Included by that header in
// header-only mode, by singleflight/src.hpp in compiled mode (detail/config.hpp).
#pragma once

#include <atomic>
#include <exception>

#include "../trace_slot.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL void trace_slot::report_start(const std::exception_ptr& error) noexcept {
  context = tracer->on_start(ev);
  // Memory ordering: acq_rel. The release half publishes `context` to the
  // settle reporter; the acquire half, when the settle came first, makes
  // that settler's writes (the settle fields, the flight's error) visible.
  if ((state.fetch_or(start_reported, std::memory_order_acq_rel) & settle_due) != 0)
    report_settle(error);
}

SINGLEFLIGHT_DECL void trace_slot::report_settled(const std::exception_ptr& error) noexcept {
  // Memory ordering: acq_rel, the other side of report_start's.
  if ((state.fetch_or(settle_due, std::memory_order_acq_rel) & start_reported) != 0)
    report_settle(error);
}

SINGLEFLIGHT_DECL void trace_slot::report_settle(const std::exception_ptr& error) noexcept {
  if (ev.status == status::failed) ev.error = error;
  tracer->on_settle(ev, context);
  ev.error = nullptr;  // the exception is the waiters', not the pool's
}

}  // namespace singleflight::detail
