// singleflight/metrics.hpp
//
// `singleflight::metrics`: how a stats snapshot becomes named metrics, as a
// table of descriptors, independent of any monitoring library. The
// Prometheus exporter (singleflight/prometheus.hpp) reads a group's counters
// through `metrics::group_metrics`; a layer with counters of its own (a
// cache, a fleet lease) declares a table for its own stats type the same way
// and registers it with the same exporter:
//
//   struct cache_stats { std::uint64_t hits = 0, misses = 0, entries = 0; };
//   inline constexpr std::array cache_metrics{
//       singleflight::metrics::counter<&cache_stats::hits>("singleflight_cache_hits_total",
//                                                          "Lookups served from the cache"),
//       singleflight::metrics::counter<&cache_stats::misses>("singleflight_cache_misses_total",
//                                                            "Lookups that missed"),
//       singleflight::metrics::gauge<&cache_stats::entries>("singleflight_cache_entries",
//                                                           "Entries held now"),
//   };
//
// Names follow Prometheus' conventions: a `singleflight_` prefix, `_total`
// for counters, base units. Descriptors hold views of their name and help:
// give them string literals (static storage), as above. Nothing here locks or
// allocates; no dependency beyond the standard library.
#pragma once

#include <array>
#include <string_view>

#include "stats.hpp"

namespace singleflight::metrics {

// What a metric is: a counter only goes up (reset only with its process); a
// gauge is a level now.
enum class kind {
  counter,
  gauge,
};

// descriptor<Stats>
//
// One metric read from a `Stats` snapshot: its name, help text, kind and the
// function that reads its value. `read` must not throw and should be a plain
// field read; it runs when the exporter collects (a scrape), not per call.
template <class Stats>
struct descriptor {
  std::string_view name;
  std::string_view help;
  metrics::kind kind = metrics::kind::counter;
  double (*read)(const Stats&) noexcept = nullptr;
};

namespace detail {

template <class M>
struct member_of;
template <class C, class V>
struct member_of<V C::*> {
  using owner = C;
};

template <auto Field>
double read_field(const typename member_of<decltype(Field)>::owner& s) noexcept {
  return static_cast<double>(s.*Field);
}

}  // namespace detail

// counter<&Stats::field>(name, help), gauge<&Stats::field>(name, help): a
// descriptor that reads one arithmetic field of Stats.
template <auto Field>
constexpr descriptor<typename detail::member_of<decltype(Field)>::owner> counter(
    std::string_view name, std::string_view help) noexcept {
  return {name, help, kind::counter, &detail::read_field<Field>};
}
template <auto Field>
constexpr descriptor<typename detail::member_of<decltype(Field)>::owner> gauge(
    std::string_view name, std::string_view help) noexcept {
  return {name, help, kind::gauge, &detail::read_field<Field>};
}

// group_metrics: a group's `stats()` (stats.hpp), one metric per field.
// Exported with a `group` label naming the group (see prometheus.hpp).
inline constexpr std::array group_metrics{
    counter<&stats::calls>("singleflight_calls_total",
                           "Calls to do_, do_fresh, async_do and co_do"),
    counter<&stats::flights>("singleflight_flights_total",
                             "Flights started (entries created for a new fn)"),
    counter<&stats::fn_starts>("singleflight_fn_starts_total",
                               "Fns actually called (origin calls): flights minus those stopped "
                               "while their task was queued"),
    counter<&stats::joins>("singleflight_joins_total",
                           "Calls that joined a flight already in progress (coalesced)"),
    counter<&stats::rejections>("singleflight_rejections_total",
                                "Calls that neither started nor joined a flight (closed, "
                                "overloaded, stopped before attaching, timed out waiting, "
                                "self-deadlock)"),
    counter<&stats::failures>("singleflight_failures_total",
                              "Flights whose fn threw (or whose task was dropped)"),
    counter<&stats::cancellations>("singleflight_cancellations_total",
                                   "Calls that ended in cancelled_error"),
    counter<&stats::timeouts>("singleflight_timeouts_total", "Flights settled by their deadline"),
    counter<&stats::wait_timeouts>("singleflight_wait_timeouts_total",
                                   "Calls that ended at their own wait bound (timeout_error)"),
    counter<&stats::overloaded>("singleflight_overloaded_total",
                                "Calls rejected by max_in_flight (also in rejections)"),
    gauge<&stats::in_flight>("singleflight_in_flight",
                             "Map entries now: flights whose fn has not returned"),
};

}  // namespace singleflight::metrics
