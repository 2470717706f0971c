// singleflight/detail/get_awaitable.hpp -- internal; do not include directly.
//
// get_awaitable<Owner, K, L, T>: what a layer's co_get returns when the layer already has
// an async_get(key, loader, on_done, caller) that calls on_done(outcome<T>) exactly once
// (fleet::co_get; cache::co_get has the same shape). It refers to the key and the loader
// until co_awaited, as group::co_do's awaitable does (async_get copies what its flight
// keeps), so it is awaited in the expression that made it: co_await on a stored one does
// not compile. Its awaiter starts async_get in await_suspend and resumes the coroutine from
// on_done, or does not suspend when on_done ran first (resume_gate.hpp: who resumes).
//
// No lock; where the coroutine resumes is where async_get calls on_done.
#pragma once

#include <coroutine>
#include <optional>
#include <utility>

#include "../outcome.hpp"
#include "../stop_token.hpp"
#include "outcome_slot.hpp"
#include "resume_gate.hpp"

namespace singleflight::detail {

template <class>
inline constexpr bool dependent_false_awaitable = false;

template <class Owner, class K, class L, class T>
class get_awaitable {
 public:
  get_awaitable(Owner* owner, const K& key, L& loader, stop_token caller) noexcept
      : owner_(owner), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
  get_awaitable(const get_awaitable&) = delete;
  get_awaitable& operator=(const get_awaitable&) = delete;
  ~get_awaitable() = default;

  class awaiter {
   public:
    awaiter(Owner* owner, const K& key, L& loader, stop_token caller) noexcept
        : owner_(owner), key_(&key), loader_(&loader), caller_(std::move(caller)) {}
    awaiter(const awaiter&) = delete;
    awaiter& operator=(const awaiter&) = delete;
    ~awaiter() = default;

    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
      gate_.arm(h);
      owner_->async_get(
          *key_, *loader_,
          [this](outcome<T>&& o) noexcept {
            put_outcome(result_, std::move(o));  // T's move: a throw is this caller's outcome
            gate_.complete();
          },
          std::move(caller_));
      return gate_.suspend();
    }
    T await_resume() { return std::move(*result_).value(); }

   private:
    Owner* owner_;
    const K* key_;
    L* loader_;
    stop_token caller_;
    std::optional<outcome<T>> result_;
    resume_gate gate_;
  };

  awaiter operator co_await() && { return awaiter(owner_, *key_, *loader_, std::move(caller_)); }
  template <class Self = get_awaitable>
  void operator co_await() & {
    static_assert(dependent_false_awaitable<Self>,
                  "singleflight: co_get: co_await the result in the same expression "
                  "(co_await x.co_get(key, loader)); it refers to key and loader");
  }

 private:
  Owner* owner_;
  const K* key_;
  L* loader_;
  stop_token caller_;
};

}  // namespace singleflight::detail
