// singleflight/detail/stop_state.hpp -- internal; include <singleflight/stop_token.hpp>.
//
// A bundled implementation of C++20's stop tokens ([thread.stoptoken]) for
// standard libraries that lack <stop_token> (libc++ before 20 without
// -fexperimental-library): detail::stop_token, stop_source, stop_callback,
// nostopstate_t / nostopstate. <singleflight/stop_token.hpp> exposes them as
// singleflight::stop_token & co. only where std::stop_token is missing; where
// it exists these types are still compiled and tested (tests/test_stop_token.cpp)
// but nothing else uses them.
//
// Semantics are the standard's:
//  * request_stop() returns true for exactly one call per stop state, and
//    runs every registered callback synchronously, in the requesting thread,
//    before it returns (in registration order; the standard leaves the order
//    unspecified);
//  * a stop_callback constructed on a token whose stop was already requested
//    runs its callback at once, in the constructor, on the constructing
//    thread; on a token without a state it does nothing;
//  * ~stop_callback deregisters the callback; if the callback is running on
//    another thread, it waits until it has returned; if it is running on this
//    thread (the callback destroys its own stop_callback), it returns at once
//    without waiting (no deadlock);
//  * a callback that exits with an exception calls std::terminate;
//  * stop_token::stop_possible() is true while a stop_source owns the state or
//    once stop was requested; copies of a token or a source share the state.
//
// Ownership and locking: one heap-allocated stop_state per stop_source()
// default construction, reference counted (atomic) by every stop_token,
// stop_source and registered stop_callback that refers to it, and freed by
// the last of them. Its `m_` (a std::mutex) guards the callback list,
// `running_`, `requester_` and `waiting_`; the `requested_` flag is also
// readable without it. No callback ever runs with `m_` held.
#pragma once

#include <atomic>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

namespace singleflight::detail {

// One registered callback: a node of the state's intrusive, doubly linked
// list. Its fields belong to the state and are guarded by its mutex.
struct stop_callback_node {
  stop_callback_node* prev = nullptr;
  stop_callback_node* next = nullptr;
  void (*run)(stop_callback_node*) noexcept = nullptr;
  bool listed = false;  // in the list: registered and not yet run
};

// The shared state of one stop_source and everything derived from it.
class stop_state {
 public:
  // A new state owned by one stop_source (one reference, one source).
  // Throws std::bad_alloc.
  static stop_state* create() { return new stop_state(); }

  stop_state(const stop_state&) = delete;
  stop_state& operator=(const stop_state&) = delete;

  // Memory ordering: a new reference is always taken from an existing one,
  // so relaxed suffices; the last release is acq_rel so that every use of
  // the state by other owners happens before its deletion.
  void add_ref() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Sources are counted apart from references, for stop_possible(). Release
  // and acquire: a token that sees no source left sees everything the last
  // source did before it went away.
  void add_source() noexcept { sources_.fetch_add(1, std::memory_order_relaxed); }
  void remove_source() noexcept { sources_.fetch_sub(1, std::memory_order_release); }

  // Memory ordering: acquire, paired with the release store in
  // request_stop(): whoever sees the stop sees what the requester did
  // before requesting it.
  bool requested() const noexcept { return requested_.load(std::memory_order_acquire); }
  bool possible() const noexcept {
    return requested() || sources_.load(std::memory_order_acquire) != 0;
  }

  // Requests stop; returns whether this call did (exactly one call per state
  // returns true). Runs every registered callback on this thread, without
  // the mutex, before returning.
  bool request_stop() noexcept {
    // A callback may destroy the last source or token of this state (the one
    // request_stop was called on included): keep it alive until we are done.
    add_ref();
    std::unique_lock<std::mutex> lk(m_);
    if (requested_.load(std::memory_order_relaxed)) {
      lk.unlock();
      release();
      return false;
    }
    requester_ = std::this_thread::get_id();
    requested_.store(true, std::memory_order_release);
    while (head_ != nullptr) {
      stop_callback_node* n = head_;
      unlink(n);
      running_ = n;
      lk.unlock();
      n->run(n);  // may destroy n (its own ~stop_callback returns at once): n is not touched again
      lk.lock();
      running_ = nullptr;
      if (waiting_ != 0) done_.notify_all();
    }
    lk.unlock();
    release();
    return true;
  }

  // Registers n; returns false, registering nothing, when stop was already
  // requested (the caller then runs the callback itself).
  bool add(stop_callback_node* n) noexcept {
    const std::lock_guard<std::mutex> lk(m_);
    if (requested_.load(std::memory_order_relaxed)) return false;
    n->prev = tail_;
    n->next = nullptr;
    if (tail_ != nullptr) {
      tail_->next = n;
    } else {
      head_ = n;
    }
    tail_ = n;
    n->listed = true;
    return true;
  }

  // Deregisters n (~stop_callback). If n is running on another thread, waits
  // until it has returned; if it is running on this one (n's callback is
  // destroying n), returns at once.
  void remove(stop_callback_node* n) noexcept {
    std::unique_lock<std::mutex> lk(m_);
    if (n->listed) {
      unlink(n);
      return;
    }
    if (running_ == n && requester_ != std::this_thread::get_id()) {
      ++waiting_;
      done_.wait(lk, [&] { return running_ != n; });
      --waiting_;
    }
  }

 private:
  stop_state() = default;
  ~stop_state() = default;

  void unlink(stop_callback_node* n) noexcept {
    if (n->prev != nullptr) {
      n->prev->next = n->next;
    } else {
      head_ = n->next;
    }
    if (n->next != nullptr) {
      n->next->prev = n->prev;
    } else {
      tail_ = n->prev;
    }
    n->prev = n->next = nullptr;
    n->listed = false;
  }

  std::atomic<std::size_t> refs_{1};
  std::atomic<std::size_t> sources_{1};
  std::atomic<bool> requested_{false};
  std::mutex m_;
  std::condition_variable done_;           // running_ changed (someone is waiting_)
  stop_callback_node* head_ = nullptr;     // guarded by m_
  stop_callback_node* tail_ = nullptr;     // guarded by m_
  stop_callback_node* running_ = nullptr;  // guarded by m_: the callback now running
  std::thread::id requester_;              // guarded by m_: the thread running the callbacks
  int waiting_ = 0;                        // guarded by m_: destructors waiting on done_
};

// nostopstate_t / nostopstate: tag for a stop_source without a state.
struct nostopstate_t {
  explicit nostopstate_t() = default;
};
inline constexpr nostopstate_t nostopstate{};

template <class Callback>
class stop_callback;

// stop_token
//
// A view of a stop state: can be asked whether stop was requested. A default
// token has no state (stop_possible() is false). Copies share the state.
// Thread safety: distinct tokens (copies included) may be used concurrently.
class stop_token {
 public:
  stop_token() noexcept = default;
  stop_token(const stop_token& o) noexcept : s_(o.s_) {
    if (s_ != nullptr) s_->add_ref();
  }
  stop_token(stop_token&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stop_token& operator=(const stop_token& o) noexcept {
    stop_token(o).swap(*this);
    return *this;
  }
  stop_token& operator=(stop_token&& o) noexcept {
    stop_token(std::move(o)).swap(*this);
    return *this;
  }
  ~stop_token() {
    if (s_ != nullptr) s_->release();
  }

  // stop_requested(): whether stop was requested on the state.
  [[nodiscard]] bool stop_requested() const noexcept { return s_ != nullptr && s_->requested(); }
  // stop_possible(): whether stop was requested or can still be (a
  // stop_source owns the state).
  [[nodiscard]] bool stop_possible() const noexcept { return s_ != nullptr && s_->possible(); }

  void swap(stop_token& o) noexcept { std::swap(s_, o.s_); }
  friend void swap(stop_token& a, stop_token& b) noexcept { a.swap(b); }
  // Equal when both have no state or share one.
  [[nodiscard]] friend bool operator==(const stop_token& a, const stop_token& b) noexcept {
    return a.s_ == b.s_;
  }

 private:
  friend class stop_source;
  template <class>
  friend class stop_callback;

  explicit stop_token(stop_state* s) noexcept : s_(s) {
    if (s_ != nullptr) s_->add_ref();
  }

  stop_state* s_ = nullptr;
};

// stop_source
//
// Owns a stop state (unless constructed with nostopstate) and can request
// stop on it. Copies share the state. Thread safety: distinct sources (copies
// included) may be used concurrently; request_stop() may race with itself,
// with callback registration and with ~stop_callback.
class stop_source {
 public:
  // A new stop state. Throws std::bad_alloc.
  stop_source() : s_(stop_state::create()) {}
  explicit stop_source(nostopstate_t) noexcept {}
  stop_source(const stop_source& o) noexcept : s_(o.s_) {
    if (s_ != nullptr) {
      s_->add_ref();
      s_->add_source();
    }
  }
  stop_source(stop_source&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stop_source& operator=(const stop_source& o) noexcept {
    stop_source(o).swap(*this);
    return *this;
  }
  stop_source& operator=(stop_source&& o) noexcept {
    stop_source(std::move(o)).swap(*this);
    return *this;
  }
  ~stop_source() {
    if (s_ != nullptr) {
      s_->remove_source();
      s_->release();
    }
  }

  // get_token(): a token sharing the state (none for nostopstate).
  [[nodiscard]] stop_token get_token() const noexcept { return stop_token(s_); }
  [[nodiscard]] bool stop_possible() const noexcept { return s_ != nullptr; }
  [[nodiscard]] bool stop_requested() const noexcept { return s_ != nullptr && s_->requested(); }
  // request_stop(): true for the one call that requested stop on the state;
  // that call runs every registered callback, on this thread, before
  // returning. False without a state or when stop was already requested.
  bool request_stop() noexcept { return s_ != nullptr && s_->request_stop(); }

  void swap(stop_source& o) noexcept { std::swap(s_, o.s_); }
  friend void swap(stop_source& a, stop_source& b) noexcept { a.swap(b); }
  [[nodiscard]] friend bool operator==(const stop_source& a, const stop_source& b) noexcept {
    return a.s_ == b.s_;
  }

 private:
  stop_state* s_ = nullptr;
};

// stop_callback<Callback>
//
// Registers `callback` on a token's stop state for as long as it lives:
// request_stop() invokes it once, as an rvalue, on the requesting thread. If
// stop was already requested, the constructor invokes it at once. Neither
// copyable nor movable. The destructor deregisters it, waiting for a run in
// progress on another thread (not for one on this thread).
template <class Callback>
class stop_callback : private stop_callback_node {
  static_assert(std::invocable<Callback>,
                "singleflight::stop_callback<Callback>: Callback must be invocable with no "
                "arguments");
  static_assert(std::destructible<Callback>,
                "singleflight::stop_callback<Callback>: Callback must be destructible");

 public:
  using callback_type = Callback;

  template <class C>
  requires std::constructible_from<Callback, C>
  explicit stop_callback(const stop_token& st,
                         C&& cb) noexcept(std::is_nothrow_constructible_v<Callback, C>)
      : callback_(std::forward<C>(cb)) {
    if (st.s_ != nullptr) {
      st.s_->add_ref();
      attach(st.s_);
    }
  }
  template <class C>
  requires std::constructible_from<Callback, C>
  explicit stop_callback(stop_token&& st,
                         C&& cb) noexcept(std::is_nothrow_constructible_v<Callback, C>)
      : callback_(std::forward<C>(cb)) {
    if (st.s_ != nullptr) attach(std::exchange(st.s_, nullptr));  // the token's reference
  }

  stop_callback(const stop_callback&) = delete;
  stop_callback& operator=(const stop_callback&) = delete;
  stop_callback(stop_callback&&) = delete;
  stop_callback& operator=(stop_callback&&) = delete;

  ~stop_callback() {
    if (state_ != nullptr) {
      state_->remove(this);
      state_->release();
    }
  }

 private:
  // Takes a reference to s: registers, or runs the callback now (and drops
  // the reference) when stop was already requested.
  void attach(stop_state* s) noexcept {
    this->run = &run_fn;
    if (!s->requested() && s->add(this)) {
      state_ = s;
      return;
    }
    s->release();
    invoke();
  }

  void invoke() noexcept { std::forward<Callback>(callback_)(); }  // a throw terminates

  static void run_fn(stop_callback_node* n) noexcept { static_cast<stop_callback*>(n)->invoke(); }

  Callback callback_;
  stop_state* state_ = nullptr;  // set while registered or running; holds a reference
};

template <class Callback>
stop_callback(stop_token, Callback) -> stop_callback<Callback>;

}  // namespace singleflight::detail
