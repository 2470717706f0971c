// singleflight/detail/completion_relay.hpp -- internal; do not include directly.
//
// start_relayed<X>(start, on_done): hands user code a completion<X> that belongs to no
// group. Whatever becomes of it reaches `on_done(outcome<X>)` exactly once:
//   * set_value(v) / set_exception(e): that value or exception, on the resolving thread;
//   * destroyed unresolved: broken_promise_error, on the destroying thread;
//   * `start` throws before the completion was resolved: that exception (it says more than
//     the broken promise its unwind may cause), on this thread.
// It is how a layer calls an asynchronous loader inside a flight of its own group (the cache:
// a load's completion<loaded> is resolved by on_done, after publishing): no second group per
// key just to make a completion.
//
// A forced unwind through `start` (the loader ended this thread) passes; on_done then runs
// when the completion is resolved or destroyed (in the unwind, usually: broken_promise_error),
// or, if it never is, is destroyed unrun with the relay.
//
// Locking: none. `state_` orders the three parties that may finish the relay (the resolving
// thread, the destroying thread, the starter): see deliver_once.
#pragma once

#include <atomic>
#include <exception>
#include <optional>
#include <utility>

#include "../completion.hpp"
#include "../errors.hpp"
#include "../outcome.hpp"
#include "functional.hpp"
#include "group/flight.hpp"
#include "unwind.hpp"

namespace singleflight::detail {

// The node a relayed completion resolves: a flight_value<X> (what completion<X> writes its
// value into) that no group's table holds. Reference counted as any flight: one reference
// for the completion, one for the starter while `start` runs.
template <class X, class F>
class completion_relay final : public flight_value<X> {
 public:
  explicit completion_relay(F&& f) : flight_value<X>(&destroy), on_done_(std::move(f)) {}

  // Calls start(completion<X>), then settles what `start` left to the starter.
  template <class Start>
  static void run(Start& start, F&& on_done) {
    auto* r = new completion_relay(std::move(on_done));  // one reference: the completion's
    r->retain();                                         // the starter's
    on_unwind unwind([r] { r->release(); });             // the starter's, on a forced unwind
    std::exception_ptr thrown;
    try {
      ::singleflight::detail::invoke(
          start, completion_access::make<X>(static_cast<void*>(r), &resolve, r));
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      thrown = std::current_exception();
    }
    unwind.disarm();
    if (thrown) {
      r->deliver_once(outcome<X>(std::move(thrown)));
    } else if ((r->state_.fetch_and(~starting, std::memory_order_acq_rel) & broken) != 0) {
      r->deliver_once(outcome<X>(std::make_exception_ptr(broken_promise_error())));
    }
    r->release();
  }

 private:
  // state_ bits. Memory ordering: acq_rel on every change, so that whichever thread delivers
  // sees what the others wrote before their change (the value is written by the resolving
  // thread itself, before it calls resolve).
  static constexpr unsigned starting = 1;   // `start` has not returned
  static constexpr unsigned broken = 2;     // destroyed unresolved while starting
  static constexpr unsigned delivered = 4;  // on_done has run (or is running)

  static void resolve(void*, flight_value<X>* fv, resolution how, std::exception_ptr e) noexcept {
    auto* r = static_cast<completion_relay*>(fv);
    if (how == resolution::broken) {
      unsigned s = r->state_.load(std::memory_order_acquire);
      while ((s & starting) != 0) {  // the starter decides: `start` may yet throw
        if (r->state_.compare_exchange_weak(s, s | broken, std::memory_order_acq_rel)) return;
      }
      r->deliver_once(outcome<X>(std::make_exception_ptr(broken_promise_error())));
    } else if (how == resolution::value) {
      r->deliver_value();
    } else {
      r->deliver_once(outcome<X>(std::move(e)));
    }
  }

  void deliver_value() noexcept {
    std::optional<outcome<X>> o;
    try {
      o.emplace(std::in_place, std::move(*this->value));
    } catch (...) {  // X's move threw: the load fails with that
      o.emplace(std::current_exception());
    }
    deliver_once(std::move(*o));
  }

  void deliver_once(outcome<X>&& o) noexcept {
    if ((state_.fetch_or(delivered, std::memory_order_acq_rel) & delivered) != 0) return;
    on_done_(std::move(o));
  }

  ~completion_relay() = default;
  static void destroy(flight_base* b) noexcept { delete static_cast<completion_relay*>(b); }

  std::atomic<unsigned> state_{starting};
  F on_done_;
};

// start_relayed<X>(start, on_done): see the top of this file. `on_done` must be noexcept
// invocable with outcome<X>&&; `start` is called once with the completion<X>.
template <class X, class Start, class F>
void start_relayed(Start& start, F on_done) {
  static_assert(std::is_nothrow_invocable_v<F&, outcome<X>&&>,
                "detail::start_relayed: on_done must be noexcept");
  completion_relay<X, F>::run(start, std::move(on_done));
}

}  // namespace singleflight::detail
