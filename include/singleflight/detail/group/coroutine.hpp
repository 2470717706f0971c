// singleflight/detail/group/coroutine.hpp -- internal; do not include directly.
//
// What `co_await g.co_do(key, fn)` runs: a coroutine waiter that lives in
// the awaiting coroutine's frame (no allocation per join), and the awaitable
// that co_do returns. Core is the group's async layer (async_calls).
//
// Who resumes the coroutine is decided by the node's resume_gate
// (../resume_gate.hpp): the thread delivering the outcome, if await_suspend
// has finished; otherwise await_suspend itself, by not suspending. Nothing
// here takes a lock; the node is attached and detached through Core.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "../../stats.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "../resume_gate.hpp"

namespace singleflight::detail {

template <class>
inline constexpr bool dependent_false = false;

template <class Core, class P, class F>
struct coroutine_node final : Core::async_node {
  using node = typename Core::async_node;

  coroutine_node(Core* grp, const P& k, std::remove_reference_t<F>& f_in, stop_token tok) noexcept
      : node(grp, std::move(tok)), key(&k), fn(&f_in) {
    this->complete = &complete_fn;
    this->again = &again_fn;
  }
  const P* key;
  std::remove_reference_t<F>* fn;
  resume_gate gate;

  static void complete_fn(node* b) noexcept {
    auto* n = static_cast<coroutine_node*>(b);
    n->gate.complete();
  }
  static void again_fn(node* b) noexcept {
    auto* n = static_cast<coroutine_node*>(b);
    n->g->go_again(n, *n->key, std::forward<F>(*n->fn));
  }
};

// What co_await runs. Not movable: the waiter inside is linked by address.
template <class Core, class P, class F>
class co_awaiter {
 public:
  using value_type = typename Core::value_type;

  co_awaiter(Core* g, const P& key, std::remove_reference_t<F>& fn, stop_token caller,
             call_info* info, const std::optional<std::chrono::steady_clock::time_point>& bound)
      : node_(g, key, fn, std::move(caller)), info_(info) {
    node_.caller_until = bound;
  }
  co_awaiter(const co_awaiter&) = delete;
  co_awaiter& operator=(const co_awaiter&) = delete;
  ~co_awaiter() = default;

  bool await_ready() const noexcept { return false; }

  // Attaches the waiter; returns false (do not suspend) when the outcome is
  // already there. Throws, with nothing attached, what Hash, KeyEqual, Key's
  // copy or allocation throw.
  bool await_suspend(std::coroutine_handle<> h) {
    node_.gate.arm(h);
    node_.mixed = Core::mix(node_.g->hash_key(*node_.key));
    node_.g->start(&node_, *node_.key, std::forward<F>(*node_.fn),
                   typename Core::template no_keep<P>{});
    // The last touch of this awaiter by this thread when it suspends.
    return node_.gate.suspend();
  }

  value_type await_resume() {
    if (info_ != nullptr) *info_ = node_.info;
    if (!node_.error && node_.result == Core::kind::value)
      return *static_cast<typename Core::flight_t*>(node_.f.get())->value;  // our copy
    std::rethrow_exception(Core::failure_of(node_));
  }

 private:
  using node_t = coroutine_node<Core, P, F>;
  node_t node_;
  call_info* info_;
};

// What co_do returns: refers to the key and fn until co_awaited. Key is
// converted to Core::key_type first unless it can probe the table directly.
template <class Core, class K, class F, bool Direct>
class co_operation {
 public:
  using key_type = typename Core::key_type;

  co_operation(Core* g, const K& key, std::remove_reference_t<F>& fn, stop_token caller,
               call_info* info, std::optional<std::chrono::steady_clock::time_point> bound) noexcept
      : g_(g), key_(&key), fn_(&fn), caller_(std::move(caller)), info_(info), bound_(bound) {}
  co_operation(const co_operation&) = delete;
  co_operation& operator=(const co_operation&) = delete;
  ~co_operation() = default;

  auto operator co_await() && {
    if constexpr (Direct) {
      return co_awaiter<Core, K, F>(g_, *key_, *fn_, std::move(caller_), info_, bound_);
    } else {
      return converting_awaiter(g_, *key_, *fn_, std::move(caller_), info_, bound_);
    }
  }
  template <class Self = co_operation>
  void operator co_await() & {
    static_assert(dependent_false<Self>,
                  "singleflight::group::co_do: co_await the result in the same expression "
                  "(co_await g.co_do(key, fn)); it refers to key and fn");
  }

 private:
  // A key that is not probed directly is converted to Key first.
  class converting_awaiter {
   public:
    converting_awaiter(Core* g, const K& key, std::remove_reference_t<F>& fn, stop_token caller,
                       call_info* info,
                       const std::optional<std::chrono::steady_clock::time_point>& bound)
        : key_(key), inner_(g, key_, fn, std::move(caller), info, bound) {}
    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) { return inner_.await_suspend(h); }
    auto await_resume() { return inner_.await_resume(); }

   private:
    const key_type key_;
    co_awaiter<Core, key_type, F> inner_;
  };

  Core* g_;
  const K* key_;
  std::remove_reference_t<F>* fn_;
  stop_token caller_;
  call_info* info_;
  std::optional<std::chrono::steady_clock::time_point> bound_;
};

}  // namespace singleflight::detail
