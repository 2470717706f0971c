// tests/support/jthread.hpp: `sftest::jthread`, std::jthread for the test suite on any
// standard library.
//
// Where the standard library has std::jthread (__cpp_lib_jthread: libstdc++ 10 and later,
// libc++ 20 and later), sftest::jthread IS std::jthread (a using-declaration), and its stop
// token is std::stop_token, which is then singleflight::stop_token too. Elsewhere (libc++ 19
// and older, e.g. Debian 12's libc++ 14, where <stop_token> and std::jthread are missing) it is
// the small class below with std::jthread's interface and semantics, built on std::thread and
// singleflight::stop_source (bundled there): a callable whose first parameter accepts a
// singleflight::stop_token gets the thread's token; destruction and move-assignment request
// stop and join.
//
// Owns: one std::thread and the stop_source whose token it passed. Not thread-safe: one
// object, one owning thread (as std::jthread). No lock.
#pragma once

#include <singleflight/stop_token.hpp>

#include <functional>
#include <thread>
#include <type_traits>
#include <utility>

namespace sftest {

#if defined(__cpp_lib_jthread)

using std::jthread;

#else

class jthread {
 public:
  using id = std::thread::id;
  using native_handle_type = std::thread::native_handle_type;

  // No thread; get_stop_source().stop_possible() is false (as std::jthread's).
  jthread() noexcept : source_(singleflight::nostopstate) {}

  // Starts a thread running f(get_stop_token(), args...) when that is invocable, else
  // f(args...); f and args are decay-copied into the new thread. Throws what std::thread's
  // constructor throws.
  template <class F, class... Args>
  requires(!std::is_same_v<std::remove_cvref_t<F>, jthread>) explicit jthread(F&& f, Args&&... args)
      : source_() {
    if constexpr (std::is_invocable_v<std::decay_t<F>, singleflight::stop_token,
                                      std::decay_t<Args>...>) {
      thread_ = std::thread(std::forward<F>(f), source_.get_token(), std::forward<Args>(args)...);
    } else {
      thread_ = std::thread(std::forward<F>(f), std::forward<Args>(args)...);
    }
  }

  // Requests stop and joins, when joinable.
  ~jthread() { stop_and_join(); }

  jthread(const jthread&) = delete;
  jthread& operator=(const jthread&) = delete;
  jthread(jthread&& o) noexcept
      : source_(std::exchange(o.source_, singleflight::stop_source(singleflight::nostopstate))),
        thread_(std::move(o.thread_)) {}
  // Requests stop on and joins this object's thread (when joinable), then takes o's.
  jthread& operator=(jthread&& o) noexcept {
    if (this != &o) {
      stop_and_join();
      source_ = std::exchange(o.source_, singleflight::stop_source(singleflight::nostopstate));
      thread_ = std::move(o.thread_);
    }
    return *this;
  }

  void swap(jthread& o) noexcept {
    std::swap(source_, o.source_);
    std::swap(thread_, o.thread_);
  }
  friend void swap(jthread& a, jthread& b) noexcept { a.swap(b); }

  [[nodiscard]] bool joinable() const noexcept { return thread_.joinable(); }
  void join() { thread_.join(); }
  void detach() { thread_.detach(); }
  [[nodiscard]] id get_id() const noexcept { return thread_.get_id(); }
  [[nodiscard]] native_handle_type native_handle() { return thread_.native_handle(); }
  [[nodiscard]] static unsigned hardware_concurrency() noexcept {
    return std::thread::hardware_concurrency();
  }

  [[nodiscard]] singleflight::stop_source get_stop_source() noexcept { return source_; }
  [[nodiscard]] singleflight::stop_token get_stop_token() const noexcept {
    return source_.get_token();
  }
  bool request_stop() noexcept { return source_.request_stop(); }

 private:
  void stop_and_join() {
    if (thread_.joinable()) {
      source_.request_stop();
      thread_.join();
    }
  }

  singleflight::stop_source source_;
  std::thread thread_;
};

#endif

}  // namespace sftest
