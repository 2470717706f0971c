// singleflight/tracer.hpp
//
// `singleflight::flight_tracer`: a hook for users who trace flights (a span
// per flight, a log line, a histogram of their durations) without any
// metrics library. Set one in `options::tracer`; the group then reports each
// flight twice: when it starts (on_start) and when it settles (on_settle,
// with how it ended, how long it took, how many callers joined it and
// whether its fn was called).
//
//   struct spans final : singleflight::flight_tracer {
//     void* on_start(const singleflight::flight_event& e) noexcept override {
//       return start_span("singleflight.flight", *e.key<std::string>());  // yours
//     }
//     void on_settle(const singleflight::flight_settled& e, void* span) noexcept override {
//       end_span(span, e.status, e.duration);  // yours
//     }
//   };
//   singleflight::options o;
//   o.tracer = std::make_shared<spans>();
//
// No lock; the types here are plain values. See flight_tracer for where and
// when the group calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#if defined(__cpp_rtti) || defined(__GXX_RTTI) || defined(_CPPRTTI)
#include <typeinfo>
#endif

#include "detail/chrono.hpp"
#include "outcome.hpp"

namespace singleflight {

namespace detail {
struct trace_slot;
}  // namespace detail

// flight_event
//
// What on_start receives: which flight, for which key, since when. Valid
// only during the call (copy what you keep); the key in particular is the
// flight's own and may be reused once the flight is over.
struct flight_event {
  // The flight's number in its group, as call_info::flight reports it to
  // the callers that shared it (unique within the group).
  std::uint64_t flight = 0;
  // The shard of the group's table that holds the flight (options::shards).
  std::size_t shard = 0;
  // When the flight started (the leader took the entry), on the steady clock.
  std::chrono::steady_clock::time_point started{};

  // key<K>(): the flight's key, when K is the group's Key type exactly
  // (group<std::string, T>: e.key<std::string>()); null for any other K, so
  // one tracer can serve groups of several key types. Valid during the call.
  template <class K>
  const K* key() const noexcept {
    return key_type_ != nullptr && same_type(key_type_, key_type_of<K>())
               ? static_cast<const K*>(key_)
               : nullptr;
  }

 private:
  friend struct detail::trace_slot;

#if defined(__cpp_rtti) || defined(__GXX_RTTI) || defined(_CPPRTTI)
  // typeid compares equal across shared objects (a static's address may not).
  using key_type_id = const std::type_info*;
  template <class K>
  static key_type_id key_type_of() noexcept {
    return &typeid(K);
  }
  static bool same_type(key_type_id a, key_type_id b) noexcept { return *a == *b; }
#else
  // Without RTTI: one static per key type (per shared object under hidden
  // visibility: key<K>() is null across such a boundary).
  using key_type_id = const void*;
  template <class K>
  static key_type_id key_type_of() noexcept {
    static const char id = 0;
    return &id;
  }
  static bool same_type(key_type_id a, key_type_id b) noexcept { return a == b; }
#endif

  const void* key_ = nullptr;
  key_type_id key_type_ = nullptr;
};

// flight_settled
//
// What on_settle receives: the flight_event of its start, and how it ended.
struct flight_settled : flight_event {
  // How the flight ended, as outcome<T>::status() names it for its waiters:
  //   value      fn returned a value;
  //   failed     fn threw (`error` holds it), its task was dropped, its
  //              completion was destroyed unresolved (broken_promise_error),
  //              or fn ended its thread (abandoned_error);
  //   cancelled  the ownership policy stopped it (the last waiter left under
  //              ownership::waiters, the leader left under ownership::leader);
  //   timeout    options.timeout passed;
  //   closed     close() (or ~group) settled it.
  // Never `overloaded`: a call that max_in_flight rejects starts no flight
  // and is not reported (stats().overloaded counts it).
  singleflight::status status = singleflight::status::value;
  // The exception the flight ended with when status is failed (the same
  // object its waiters receive); null otherwise.
  std::exception_ptr error;
  // When it settled, and settled - started (never negative: steady clock).
  std::chrono::steady_clock::time_point settled{};
  std::chrono::nanoseconds duration{0};
  // Callers that joined the flight after its leader (whether or not they
  // stayed until it settled).
  std::size_t joins = 0;
  // Whether its fn was called. False when the flight settled before its task
  // ran (the task then skips fn): that fn is never called.
  bool fn_started = false;
};

// flight_tracer
//
// Derive from it and override what you need (both default to doing
// nothing); hand it to a group in options::tracer. One tracer may serve any
// number of groups at once.
//
// Each flight is reported exactly once by on_start and then exactly once by
// on_settle, in that order, never concurrently with each other for the same
// flight (different flights are reported concurrently: make the tracer
// thread-safe). A group without a tracer pays one branch at start and at
// settle; with one, a clock read at each and, for a leader that ran fn
// inline, one allocation per flight (the report holds the flight, so it is
// not recycled).
//
// Where they run (user code, like fn and callbacks):
//  * never under a lock of the group; they may re-enter it (do_, async_do,
//    forget, in_flight, stats, close()); they must not destroy it, and
//    on_start must not wait for the flight it reports (a blocking do_ for
//    its key: that fn is called or handed off only after on_start returns;
//    a leader running fn inline gets std::logic_error, as fn itself would);
//  * on_start: on the thread that starts the flight, after the group has
//    taken the entry and before fn is called (or handed to the executor);
//  * on_settle: on the thread that settles the flight, once the lock is
//    released, after the flight's token was stopped (if it was) and its
//    blocked waiters were woken, before its async waiters' callbacks run
//    (so for a blocking do_ that ran fn inline, before do_ returns). Never
//    on the group's timer thread: a flight settled by its deadline, and one
//    settled inside an inline leader's stop callback, is reported on the
//    group's delivery thread (as their async waiters' callbacks are), except
//    while close() is stopping that thread, when the settling thread reports
//    it. If the settle happened before on_start was reported (close() or a
//    deadline on another thread in between), on_settle follows on_start on
//    the starting thread instead.
//  * close() does not wait for reports still in progress on other threads;
//    a flight holds its tracer (shared_ptr) until reported, so the tracer
//    outlives the group if need be.
//
// Exceptions: both are noexcept; an exception escaping them calls
// std::terminate. Catch inside if your exporter can throw.
class flight_tracer {
 public:
  flight_tracer() = default;
  flight_tracer(const flight_tracer&) = default;
  flight_tracer& operator=(const flight_tracer&) = default;
  virtual ~flight_tracer() = default;

  // on_start(e): flight e.flight started. Returns a context of yours (a span,
  // a record), handed back to on_settle for the same flight; null by default.
  virtual void* on_start(const flight_event& e) noexcept {
    static_cast<void>(e);
    return nullptr;
  }

  // on_settle(e, context): the flight settled; `context` is what on_start
  // returned for it.
  virtual void on_settle(const flight_settled& e, void* context) noexcept {
    static_cast<void>(e);
    static_cast<void>(context);
  }
};

}  // namespace singleflight
