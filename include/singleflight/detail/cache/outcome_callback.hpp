// singleflight/detail/cache/outcome_callback.hpp -- internal; do not include directly.
//
// outcome_callback<T>: a caller's async_get / co_get / get_many callback, owned and type-erased
// as one `void(outcome<T>&&) noexcept` type, so that the cache's callback path (the lookup's
// answer, the load as a flight of the cache's group, the on_done the group holds) is one
// function per cache type rather than one per callback type (cache_calls::async_ref, compiled
// once a program under SINGLEFLIGHT_EXTERN_CACHE, cache.hpp). Each callback type adds only
// three small functions (call it, move it, destroy it).
//   * storage: in place when the callable fits kInline bytes (three pointers: co_get's awaiter
//     lambda, get_many's per-key lambda, a typical user lambda), is aligned no more than a
//     pointer and moves without throwing; otherwise on the heap (the one allocation, when
//     constructed);
//   * move-only; a moved-from or default-constructed one is empty (calling it is undefined);
//     the callable is destroyed exactly once, with the last outcome_callback that holds it;
//   * operator()(o): calls the callable as an lvalue with std::move(o); a throw from it
//     terminates (noexcept), as the cache's deliver() did with the callable itself.
//
// Locking: none. One owner at a time; not thread-safe to share.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "../../outcome.hpp"
#include "../functional.hpp"

namespace singleflight::detail {

template <class T>
class outcome_callback {
 public:
  // What a callable stored in place may take.
  static constexpr std::size_t kInline = 3 * sizeof(void*);

  // Whether a callable of type F is stored in place (no allocation).
  template <class F>
  static constexpr bool stored_inline =
      sizeof(F) <= kInline &&
      alignof(F) <= alignof(void*) && std::is_nothrow_move_constructible_v<F>;

  outcome_callback() noexcept = default;

  // Takes `f` (moved or copied in). Throws what that move or copy, or the allocation of a
  // callable stored on the heap, throws.
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, outcome_callback> &&
           std::is_invocable_v<std::decay_t<F>&, outcome<T>&&>) explicit outcome_callback(F&& f)
      : ops_(&ops_of<std::decay_t<F>>) {
    using Fn = std::decay_t<F>;
    if constexpr (stored_inline<Fn>) {
      ::new (static_cast<void*>(buf_)) Fn(std::forward<F>(f));
    } else {
      Fn* p = new Fn(std::forward<F>(f));
      ::new (static_cast<void*>(buf_)) Fn*(p);
    }
  }

  outcome_callback(outcome_callback&& o) noexcept : ops_(o.ops_) {
    if (ops_ != nullptr) {
      ops_->move(buf_, o.buf_);
      o.ops_ = nullptr;
    }
  }

  outcome_callback& operator=(outcome_callback&& o) noexcept {
    if (this != &o) {
      reset();
      if (o.ops_ != nullptr) {
        o.ops_->move(buf_, o.buf_);
        ops_ = o.ops_;
        o.ops_ = nullptr;
      }
    }
    return *this;
  }

  outcome_callback(const outcome_callback&) = delete;
  outcome_callback& operator=(const outcome_callback&) = delete;

  ~outcome_callback() { reset(); }

  // Whether it holds a callable.
  explicit operator bool() const noexcept { return ops_ != nullptr; }

  // operator()(o): the callable with std::move(o). Requires a callable (undefined otherwise);
  // a throw from it terminates.
  void operator()(outcome<T>&& o) noexcept { ops_->call(buf_, std::move(o)); }

 private:
  struct ops {
    void (*call)(void* buf, outcome<T>&& o) noexcept;
    void (*move)(void* to, void* from) noexcept;  // `from` left with nothing to destroy
    void (*destroy)(void* buf) noexcept;
  };

  template <class Fn>
  static Fn& get(void* buf) noexcept {
    if constexpr (stored_inline<Fn>) {
      return *std::launder(static_cast<Fn*>(buf));
    } else {
      return **std::launder(static_cast<Fn**>(buf));
    }
  }

  template <class Fn>
  static void call(void* buf, outcome<T>&& o) noexcept {
    (void)::singleflight::detail::invoke(get<Fn>(buf), std::move(o));  // a throw terminates
  }

  template <class Fn>
  static void move(void* to, void* from) noexcept {
    if constexpr (stored_inline<Fn>) {
      Fn& f = get<Fn>(from);
      ::new (to) Fn(std::move(f));
      f.~Fn();
    } else {
      ::new (to) Fn*(std::addressof(get<Fn>(from)));  // the pointer moves; `from`'s is trivial
    }
  }

  template <class Fn>
  static void destroy(void* buf) noexcept {
    if constexpr (stored_inline<Fn>) {
      get<Fn>(buf).~Fn();
    } else {
      delete std::addressof(get<Fn>(buf));
    }
  }

  template <class Fn>
  static constexpr ops ops_of{&call<Fn>, &move<Fn>, &destroy<Fn>};

  void reset() noexcept {
    if (ops_ != nullptr) {
      ops_->destroy(buf_);
      ops_ = nullptr;
    }
  }

  alignas(void*) unsigned char buf_[kInline];
  const ops* ops_ = nullptr;
};

}  // namespace singleflight::detail
