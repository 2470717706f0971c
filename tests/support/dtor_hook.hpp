// tests/support/dtor_hook.hpp: one-shot hooks that run test code from inside a copy or a
// destructor the library runs, for the tests of user code re-entering the library from there
// (test_cache_destructors, test_fleet_cache_destructors).
//   * hook: armed for one thread; the next fire() on that thread runs its action, once.
//   * old_value: a string value whose destructor fires old_value_dtor for a value "old" only,
//     so the moved-from and temporary copies a load makes on the way never do.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>

namespace sftest {

struct hook {
  std::atomic<std::thread::id> on{};
  std::function<void()> act;  // set before `on`; run once
  void arm(std::thread::id t, std::function<void()> a) {
    act = std::move(a);
    on.store(t, std::memory_order_release);
  }
  void fire() {
    std::thread::id me = std::this_thread::get_id();
    if (on.load(std::memory_order_acquire) != me) return;
    if (!on.compare_exchange_strong(me, std::thread::id{}, std::memory_order_acq_rel)) return;
    act();
  }
};

inline hook old_value_dtor;

struct old_value {
  std::string s;
  old_value(const char* v) : s(v) {}  // NOLINT: implicit, as a string value would be
  old_value(const old_value&) = default;
  old_value(old_value&&) = default;
  old_value& operator=(const old_value&) = default;
  old_value& operator=(old_value&&) = default;
  ~old_value() {
    if (s == "old") old_value_dtor.fire();
  }
};

}  // namespace sftest
