// tests/support/coro.hpp: tools for the async tests (callback and coroutine
// waiters).
//
//  * fire_task<T>: an eager, detached coroutine. It runs on the caller's
//    thread until its first real suspension, then wherever it is resumed. At
//    its end it records how it ended (value or exception), the thread it ran
//    its last step on and how many co_awaits really suspended, destroys its
//    own frame and only then publishes `done` (release): once done() is
//    true, nothing of the coroutine exists any more and the record may be
//    read without a race.
//  * callback_log<T>: the on_done of one async_do waiter; counts its calls
//    and records the first one.
//  * completion_box<T>: hands completions from an async fn (any thread) to
//    the test.
//  * manual_executor: queues tasks; the test runs them on a thread it owns.
//  * overlap_meter, on_new_thread.
//
// Lifetimes in a test: declare logs first, then the group, then boxes and
// executors. A box destroyed with unresolved completions (a failed REQUIRE)
// then fails those flights while the logs still exist, before ~group()
// waits for pending completions.
#pragma once

#include <singleflight/singleflight.hpp>

#include <atomic>
#include <concepts>
#include <coroutine>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "jthread.hpp"
#include "support/sync.hpp"

namespace sftest {

template <class E>
bool holds(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

// ---- fire_task --------------------------------------------------------------

// How one fire_task ended. Written by the coroutine, read by the test once
// done is true.
template <class T>
struct co_record {
  std::optional<T> value;
  std::exception_ptr error;
  std::thread::id finished_on;    // the thread that ran the coroutine's last step
  int suspensions = 0;            // co_awaits whose await_suspend really suspended
  std::atomic<bool> done{false};  // set after the frame is destroyed

  template <class E>
  bool threw() const {
    return holds<E>(error);
  }
};

namespace detail {

// The awaiter `co_await a` uses for an awaitable a: a's operator co_await
// (member or free), or a itself.
template <class A>
decltype(auto) awaiter_of(A&& a) {
  if constexpr (requires { std::forward<A>(a).operator co_await(); }) {
    return std::forward<A>(a).operator co_await();
  } else if constexpr (requires { operator co_await(std::forward<A>(a)); }) {
    return operator co_await(std::forward<A>(a));
  } else {
    return std::forward<A>(a);
  }
}

// Wraps an awaiter and counts real suspensions. It writes to itself only
// while this coroutine still owns its frame: before calling the inner
// await_suspend, or after it returned "do not suspend" (false, or this very
// handle); after a real suspension another thread may already have resumed
// and destroyed the frame.
template <class Aw>
class spy {
 public:
  template <class A>
  spy(A&& a, int* suspensions) : inner_(awaiter_of(std::forward<A>(a))), count_(suspensions) {}

  bool await_ready() { return inner_.await_ready(); }

  template <class P>
  auto await_suspend(std::coroutine_handle<P> h) {
    using R = decltype(inner_.await_suspend(h));
    entered_ = true;
    if constexpr (std::is_void_v<R>) {
      inner_.await_suspend(h);
    } else if constexpr (std::same_as<R, bool>) {
      const bool suspend = inner_.await_suspend(h);
      if (!suspend) kept_ = true;
      return suspend;
    } else {
      std::coroutine_handle<> next = inner_.await_suspend(h);
      if (next == h) kept_ = true;
      return next;
    }
  }

  decltype(auto) await_resume() {
    if (entered_ && !kept_) ++*count_;
    return inner_.await_resume();
  }

 private:
  Aw inner_;
  int* count_;
  bool entered_ = false;
  bool kept_ = false;
};

}  // namespace detail

template <class T>
class fire_task {
 public:
  struct promise_type {
    std::shared_ptr<co_record<T>> rec = std::make_shared<co_record<T>>();

    fire_task get_return_object() { return fire_task(rec); }
    std::suspend_never initial_suspend() noexcept { return {}; }

    struct final_awaiter {
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        std::shared_ptr<co_record<T>> r = std::move(h.promise().rec);
        r->finished_on = std::this_thread::get_id();
        h.destroy();  // parameters and promise too: nothing of the coroutine is left
        r->done.store(true, std::memory_order_release);
      }
      void await_resume() noexcept {}
    };
    final_awaiter final_suspend() noexcept { return {}; }

    void return_value(T v) { rec->value.emplace(std::move(v)); }
    void unhandled_exception() noexcept { rec->error = std::current_exception(); }

    template <class A>
    auto await_transform(A&& a) {
      using aw = decltype(detail::awaiter_of(std::forward<A>(a)));
      return detail::spy<aw>(std::forward<A>(a), &rec->suspensions);
    }
  };

  bool done() const { return rec_->done.load(std::memory_order_acquire); }
  void wait(const char* name) const {
    must([&] { return done(); }, name);
  }
  // Read only once done().
  const co_record<T>& get() const { return *rec_; }

 private:
  explicit fire_task(std::shared_ptr<co_record<T>> r) : rec_(std::move(r)) {}
  std::shared_ptr<co_record<T>> rec_;
};

// ---- shared by the async tests ----------------------------------------------

// A thrown type that is not a std::exception.
struct not_an_exception {
  int code;
};

// The address of the exception object `e` holds (rethrown, caught by
// reference) when it is an E, else null: "the same object in every waiter".
template <class E>
const void* address_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E& x) {
    return &x;
  } catch (...) {
  }
  return nullptr;
}

// Options with only the ownership policy set.
inline singleflight::options with(singleflight::ownership owner) {
  singleflight::options o;
  o.owner = owner;
  return o;
}

// ---- callback waiters -------------------------------------------------------

// The on_done of one async_do waiter. Records the first call; counts all.
// `probe`, when set, runs inside on_done first (e.g. to re-enter the group).
template <class T>
struct callback_log {
  std::atomic<int> calls{0};
  std::optional<T> value;
  std::exception_ptr error;
  std::thread::id thread;
  std::function<void()> probe;
  std::atomic<bool> done{false};

  auto on_done() {
    return [this](singleflight::outcome<T> o) { record(std::move(o)); };
  }
  void record(singleflight::outcome<T>&& o) {
    if (calls.fetch_add(1) != 0) return;  // a second call is counted, never recorded
    if (probe) probe();
    thread = std::this_thread::get_id();
    if (o.has_value()) {
      value.emplace(std::move(o).value());
    } else {
      error = o.error();
    }
    done.store(true, std::memory_order_release);
  }
  bool is_done() const { return done.load(std::memory_order_acquire); }
  void wait(const char* name) const {
    must([&] { return is_done(); }, name);
  }
  template <class E>
  bool threw() const {
    return holds<E>(error);
  }
};

// ---- async fn plumbing ------------------------------------------------------

// Completions (and the tokens that came with them) handed from an async fn
// to the test, in arrival order.
template <class T>
class completion_box {
 public:
  void put(singleflight::stop_token st, singleflight::completion<T> c) {
    std::lock_guard<std::mutex> lk(m_);
    items_.push_back({std::move(st), std::move(c)});
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lk(m_);
    return items_.size();
  }
  // Waits (bounded) for the next completion and takes it.
  std::pair<singleflight::stop_token, singleflight::completion<T>> take(const char* name) {
    must([&] { return size() > 0; }, name);
    std::lock_guard<std::mutex> lk(m_);
    entry e = std::move(items_.front());
    items_.pop_front();
    return {std::move(e.st), std::move(e.c)};
  }
  // An async fn that parks its completion here.
  auto fn() {
    return [this](singleflight::stop_token st, singleflight::completion<T> c) {
      put(std::move(st), std::move(c));
    };
  }

 private:
  struct entry {
    singleflight::stop_token st;
    singleflight::completion<T> c;
  };
  mutable std::mutex m_;
  std::deque<entry> items_;
};

// An executor that only queues: the test takes each task and runs it where it
// wants.
class manual_executor {
 public:
  std::function<void(singleflight::task)> executor() {
    return [this](singleflight::task t) {
      std::lock_guard<std::mutex> lk(m_);
      q_.push_back(std::move(t));
    };
  }
  std::size_t queued() const {
    std::lock_guard<std::mutex> lk(m_);
    return q_.size();
  }
  singleflight::task take(const char* name) {
    must([&] { return queued() > 0; }, name);
    std::lock_guard<std::mutex> lk(m_);
    singleflight::task t = std::move(q_.front());
    q_.pop_front();
    return t;
  }

 private:
  mutable std::mutex m_;
  std::deque<singleflight::task> q_;
};

// Runs f on a new thread, waits (bounded, by name) for it to return, joins
// it, and returns that thread's id.
template <class F>
std::thread::id on_new_thread(F f, const char* name) {
  std::atomic<bool> done{false};
  sftest::jthread t([&] {
    f();
    done.store(true, std::memory_order_release);
  });
  const std::thread::id id = t.get_id();
  must([&] { return done.load(std::memory_order_acquire); }, name);
  t.join();
  return id;
}

// Counts fns (or async flights) running at once; remembers the most ever
// seen together.
struct overlap_meter {
  std::atomic<int> running{0};
  std::atomic<int> peak{0};
  std::atomic<int> calls{0};
  void enter() {
    calls.fetch_add(1);
    const int now = running.fetch_add(1) + 1;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void leave() { running.fetch_sub(1); }
};

}  // namespace sftest
