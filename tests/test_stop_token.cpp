// singleflight/stop_token.hpp and its bundled implementation (detail/stop_state.hpp).
//
// Every semantic test runs against the bundled types (singleflight::detail::stop_token & co.,
// compiled whatever the standard library has) and, where the standard library has them, against
// std::stop_token & co. as the reference: both must behave alike. Under libc++ 14 (preset
// libcxx) only the bundled ones exist, and singleflight::stop_token is them.
//
// This file was written before the rest of the suite built with libc++ 14 and uses no
// support/sync.hpp: the few helpers below are the same ideas (bounded waits that abort with a
// name, a gate) on std::thread. It also tests sftest::jthread (tests/support/jthread.hpp), the
// suite's std::jthread: std::jthread itself where the library has it, else the support class.
#include <singleflight/detail/stop_state.hpp>  // the bundled types, whatever the library has
#include <singleflight/stop_token.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"

namespace {

using namespace std::chrono_literals;

// ---- bounded waits on std::thread ------------------------------------------

constexpr std::chrono::milliseconds bound = 20s;

[[noreturn]] void hang(const char* name) {
  std::fprintf(stderr, "\nHANG: bounded wait '%s' ran out after %lld ms\n", name,
               static_cast<long long>(bound.count()));
  std::fflush(stderr);
  std::abort();
}

template <class Pred>
void must(Pred pred, const char* name) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) hang(name);
    std::this_thread::yield();
  }
}

// Whether pred comes to hold within `limit` (for "does NOT happen" checks).
template <class Pred>
bool becomes(Pred pred, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

class gate {
 public:
  void open() {
    const std::lock_guard<std::mutex> lk(m_);
    open_ = true;
    cv_.notify_all();
  }
  void wait(const char* name) const {
    std::unique_lock<std::mutex> lk(m_);
    if (!cv_.wait_for(lk, bound, [&] { return open_; })) hang(name);
  }

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

// A thread joined on destruction (std::jthread without the stop token).
class joining_thread {
 public:
  template <class F>
  explicit joining_thread(F f) : t_(std::move(f)) {}
  joining_thread(joining_thread&&) noexcept = default;
  joining_thread& operator=(joining_thread&&) = delete;
  joining_thread(const joining_thread&) = delete;
  joining_thread& operator=(const joining_thread&) = delete;
  ~joining_thread() {
    if (t_.joinable()) t_.join();
  }
  void join() { t_.join(); }

 private:
  std::thread t_;
};

// ---- the implementations under test ----------------------------------------

struct bundled {
  using token = singleflight::detail::stop_token;
  using source = singleflight::detail::stop_source;
  template <class F>
  using callback = singleflight::detail::stop_callback<F>;
  static constexpr const auto& nostopstate = singleflight::detail::nostopstate;
};

#if defined(__cpp_lib_jthread)
struct standard {
  using token = std::stop_token;
  using source = std::stop_source;
  template <class F>
  using callback = std::stop_callback<F>;
  static constexpr const auto& nostopstate = std::nostopstate;
};
#define SFTEST_STOP_IMPLS bundled, standard
#else
#define SFTEST_STOP_IMPLS bundled
#endif

using fn_cb = std::function<void()>;

}  // namespace

TEST_CASE("singleflight::stop_token is std::stop_token where the standard library has it",
          "[stop_token]") {
#if defined(__cpp_lib_jthread)
  STATIC_REQUIRE(SINGLEFLIGHT_STD_STOP_TOKEN == 1);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_token, std::stop_token>);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_source, std::stop_source>);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_callback<fn_cb>, std::stop_callback<fn_cb>>);
  STATIC_REQUIRE(std::is_same_v<singleflight::nostopstate_t, std::nostopstate_t>);
#else
  STATIC_REQUIRE(SINGLEFLIGHT_STD_STOP_TOKEN == 0);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_token, singleflight::detail::stop_token>);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_source, singleflight::detail::stop_source>);
  STATIC_REQUIRE(std::is_same_v<singleflight::stop_callback<fn_cb>,
                                singleflight::detail::stop_callback<fn_cb>>);
#endif
  // Class template argument deduction works through the library's names.
  singleflight::stop_source src;
  int runs = 0;
  singleflight::stop_callback cb(src.get_token(), [&runs] { ++runs; });
  STATIC_REQUIRE(!std::is_copy_constructible_v<decltype(cb)>);
  REQUIRE(src.request_stop());
  REQUIRE(runs == 1);
}

TEST_CASE("bundled stop_callback deduces its callback type", "[stop_token]") {
  singleflight::detail::stop_source src;
  auto f = [] {};
  singleflight::detail::stop_callback cb(src.get_token(), f);
  STATIC_REQUIRE(std::is_same_v<decltype(cb), singleflight::detail::stop_callback<decltype(f)>>);
  STATIC_REQUIRE(std::is_same_v<decltype(cb)::callback_type, decltype(f)>);
  STATIC_REQUIRE(!std::is_move_constructible_v<decltype(cb)>);
}

TEMPLATE_TEST_CASE("stop_possible and stop_requested follow the state's life", "[stop_token]",
                   SFTEST_STOP_IMPLS) {
  using token = typename TestType::token;
  using source = typename TestType::source;

  const token none;
  REQUIRE_FALSE(none.stop_possible());
  REQUIRE_FALSE(none.stop_requested());

  SECTION("a source's token can be stopped until the last source is gone") {
    token t;
    {
      source s;
      REQUIRE(s.stop_possible());
      REQUIRE_FALSE(s.stop_requested());
      t = s.get_token();
      REQUIRE(t.stop_possible());
      {
        const source copy = s;  // NOLINT(performance-unnecessary-copy-initialization)
        REQUIRE(t.stop_possible());
      }
      REQUIRE(t.stop_possible());  // s still owns it
    }
    REQUIRE_FALSE(t.stop_possible());  // no source left, never stopped
    REQUIRE_FALSE(t.stop_requested());
  }
  SECTION("once stopped, a token stays stopped and possible with no source left") {
    token t;
    {
      source s;
      t = s.get_token();
      REQUIRE(s.request_stop());
      REQUIRE(s.stop_requested());
      REQUIRE(t.stop_requested());
    }
    REQUIRE(t.stop_requested());
    REQUIRE(t.stop_possible());
  }
  SECTION("a source constructed with nostopstate has no state") {
    source s(TestType::nostopstate);
    REQUIRE_FALSE(s.stop_possible());
    REQUIRE_FALSE(s.stop_requested());
    REQUIRE_FALSE(s.request_stop());
    REQUIRE_FALSE(s.get_token().stop_possible());
    REQUIRE(s.get_token() == token());
  }
}

TEMPLATE_TEST_CASE("copies share the state; moves transfer it; equality and swap", "[stop_token]",
                   SFTEST_STOP_IMPLS) {
  using token = typename TestType::token;
  using source = typename TestType::source;

  source a;
  source b;
  REQUIRE_FALSE(a == b);
  source a2 = a;
  REQUIRE(a2 == a);
  const token ta = a.get_token();
  const token ta2 = a2.get_token();
  REQUIRE(ta == ta2);
  REQUIRE_FALSE(ta == b.get_token());

  REQUIRE(a2.request_stop());  // through a copy
  REQUIRE(a.stop_requested());
  REQUIRE(ta.stop_requested());
  REQUIRE_FALSE(a.request_stop());  // the state was stopped once already
  REQUIRE_FALSE(b.stop_requested());

  source moved = std::move(b);
  REQUIRE(moved.stop_possible());
  REQUIRE_FALSE(b.stop_possible());  // NOLINT(bugprone-use-after-move): moved-from is empty
  token tm = moved.get_token();
  token tn;
  tn.swap(tm);
  REQUIRE(tn == moved.get_token());
  REQUIRE(tm == token());
  swap(a, moved);
  REQUIRE_FALSE(a.stop_requested());
  REQUIRE(moved.stop_requested());
}

TEMPLATE_TEST_CASE("request_stop returns true exactly once, also when threads race for it",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  constexpr int rounds = 200;
  constexpr int threads = 4;
  for (int round = 0; round < rounds; ++round) {
    source s;
    std::atomic<int> ready{0};
    std::atomic<int> winners{0};
    std::atomic<int> callback_runs{0};
    const typename TestType::template callback<fn_cb> cb(s.get_token(),
                                                         [&] { callback_runs.fetch_add(1); });
    {
      std::vector<joining_thread> ts;
      for (int i = 0; i < threads; ++i) {
        ts.emplace_back([&, s]() mutable {
          ready.fetch_add(1);
          while (ready.load() < threads) std::this_thread::yield();
          if (s.request_stop()) winners.fetch_add(1);
        });
      }
    }
    REQUIRE(winners == 1);
    REQUIRE(callback_runs == 1);
  }
}

TEMPLATE_TEST_CASE("callbacks run once each, on the requesting thread, before request_stop returns",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  source s;
  std::atomic<int> runs{0};
  std::thread::id ran_on[3];
  std::optional<callback> cbs[3];
  for (int i = 0; i < 3; ++i) {
    cbs[i].emplace(s.get_token(), [&, i] {
      ran_on[i] = std::this_thread::get_id();
      runs.fetch_add(1);
    });
  }
  REQUIRE(runs == 0);
  std::thread::id requester;
  bool first = false;
  int runs_when_returned = -1;
  joining_thread([&] {
    requester = std::this_thread::get_id();
    first = s.request_stop();
    runs_when_returned = runs.load();
  }).join();
  REQUIRE(first);
  REQUIRE(runs_when_returned == 3);
  for (const auto& id : ran_on) REQUIRE(id == requester);
  s.request_stop();
  REQUIRE(runs == 3);  // never again
}

TEMPLATE_TEST_CASE("a callback registered on a stopped token runs in its constructor",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using token = typename TestType::token;
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;

  SECTION("stopped: at once, on the constructing thread") {
    source s;
    s.request_stop();
    int runs = 0;
    std::thread::id ran_on;
    const callback cb(s.get_token(), [&] {
      ++runs;
      ran_on = std::this_thread::get_id();
    });
    REQUIRE(runs == 1);
    REQUIRE(ran_on == std::this_thread::get_id());
  }
  SECTION("no state, or no source left: never") {
    int runs = 0;
    {
      const callback cb(token(), [&] { ++runs; });
    }
    token orphan;
    {
      source s;
      orphan = s.get_token();
    }
    {
      const callback cb(orphan, [&] { ++runs; });
    }
    REQUIRE(runs == 0);
  }
  SECTION("from an rvalue token") {
    source s;
    int runs = 0;
    const callback cb(s.get_token(), [&] { ++runs; });
    s.request_stop();
    REQUIRE(runs == 1);
  }
}

TEMPLATE_TEST_CASE("a deregistered callback never runs", "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  source s;
  int first = 0;
  int second = 0;
  int third = 0;
  {
    std::optional<callback> a;
    a.emplace(s.get_token(), [&] { ++first; });
    const callback b(s.get_token(), [&] { ++second; });
    std::optional<callback> c;
    c.emplace(s.get_token(), [&] { ++third; });
    a.reset();  // head of the list
    c.reset();  // tail
    REQUIRE(s.request_stop());
  }
  REQUIRE(first == 0);
  REQUIRE(second == 1);
  REQUIRE(third == 0);
}

namespace {
// A callback that can only be invoked as an rvalue, as request_stop must invoke it.
struct rvalue_only {
  int* runs;
  void operator()() && { ++*runs; }
};
}  // namespace

TEMPLATE_TEST_CASE("callbacks are invoked as rvalues", "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  source s;
  int runs = 0;
  {
    const typename TestType::template callback<rvalue_only> cb(s.get_token(), rvalue_only{&runs});
    s.request_stop();
  }
  const typename TestType::template callback<rvalue_only> late(s.get_token(), rvalue_only{&runs});
  REQUIRE(runs == 2);
}

TEMPLATE_TEST_CASE("~stop_callback waits for its callback running on another thread",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  source s;
  gate release;
  std::atomic<bool> entered{false};
  std::atomic<bool> finished{false};
  std::atomic<bool> destroyed{false};
  std::atomic<bool> finished_before_destructor_returned{false};
  std::optional<callback> cb;
  cb.emplace(s.get_token(), [&] {
    entered = true;
    release.wait("callback released");
    finished = true;
  });
  joining_thread requester([&] { s.request_stop(); });
  must([&] { return entered.load(); }, "callback entered");
  joining_thread destroyer([&] {
    cb.reset();
    finished_before_destructor_returned = finished.load();
    destroyed = true;
  });
  // The destructor must block while the callback runs.
  REQUIRE_FALSE(becomes([&] { return destroyed.load(); }, 100ms));
  release.open();
  must([&] { return destroyed.load(); }, "destructor returned");
  REQUIRE(finished_before_destructor_returned);
}

TEMPLATE_TEST_CASE("~stop_callback inside its own callback does not wait for itself",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  source s;
  std::optional<callback> self;
  int other_runs = 0;
  self.emplace(s.get_token(), [&] { self.reset(); });  // destroys the running callback
  const callback other(s.get_token(), [&] { ++other_runs; });
  std::atomic<bool> returned{false};
  joining_thread requester([&] {
    s.request_stop();
    returned = true;
  });
  must([&] { return returned.load(); }, "request_stop returned (no self-deadlock)");
  requester.join();
  REQUIRE_FALSE(self.has_value());
  REQUIRE(other_runs == 1);
}

TEMPLATE_TEST_CASE("a callback may request stop again and register another callback",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  source s;
  bool again = true;
  int inner_runs = 0;
  std::optional<callback> inner;
  const callback outer(s.get_token(), [&] {
    again = s.request_stop();                             // already requested: false
    inner.emplace(s.get_token(), [&] { ++inner_runs; });  // runs in its constructor
  });
  REQUIRE(s.request_stop());
  REQUIRE_FALSE(again);
  REQUIRE(inner_runs == 1);
}

TEST_CASE("bundled: a callback may destroy the last owner of the state", "[stop_token]") {
  // The source request_stop() was called on, and every token, die inside the callback: the state
  // must outlive the loop that runs the callbacks (ASan checks the rest).
  using namespace singleflight::detail;
  auto owner = std::make_unique<stop_source>();
  stop_source* raw = owner.get();
  int later_runs = 0;
  std::optional<stop_callback<fn_cb>> first;
  std::optional<stop_callback<fn_cb>> second;
  first.emplace(owner->get_token(), [&] {
    first.reset();
    owner.reset();
  });
  second.emplace(raw->get_token(), [&] {
    ++later_runs;
    second.reset();
  });
  REQUIRE(raw->request_stop());
  REQUIRE(later_runs == 1);
  REQUIRE_FALSE(owner);
}

TEMPLATE_TEST_CASE("registration racing request_stop: every live callback runs exactly once",
                   "[stop_token]", SFTEST_STOP_IMPLS) {
  using source = typename TestType::source;
  using callback = typename TestType::template callback<fn_cb>;
  constexpr int threads = 3;
  constexpr int per_thread = 200;
  for (int round = 0; round < 20; ++round) {
    source s;
    // runs[t][i]: how often callback i of thread t ran; kept[t][i]: alive until the end.
    std::vector<std::vector<std::atomic<int>>> runs(threads);
    for (auto& r : runs) r = std::vector<std::atomic<int>>(per_thread);
    std::vector<std::vector<std::unique_ptr<callback>>> kept(threads);
    std::atomic<int> started{0};
    {
      std::vector<joining_thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          started.fetch_add(1);
          for (int i = 0; i < per_thread; ++i) {
            auto cb = std::make_unique<callback>(s.get_token(),
                                                 [&runs, t, i] { runs[t][i].fetch_add(1); });
            if (i % 3 == 0) {
              cb.reset();  // deregistered, possibly while request_stop runs the list
            } else {
              kept[t].push_back(std::move(cb));
            }
          }
        });
      }
      must([&] { return started.load() == threads; }, "registering threads started");
      REQUIRE(s.request_stop());
    }
    for (int t = 0; t < threads; ++t) {
      for (int i = 0; i < per_thread; ++i) {
        if (i % 3 == 0) {
          REQUIRE(runs[t][i] <= 1);
        } else {
          REQUIRE(runs[t][i] == 1);
        }
      }
    }
  }
}

// ---- sftest::jthread ---------------------------------------------------------

TEST_CASE("sftest::jthread passes its stop token, and stops and joins when destroyed",
          "[stop_token][jthread]") {
  // Catches a support jthread (libc++ before 20) that does not hand the callable its token,
  // hands it a token of another source, or destroys without request_stop() (the thread would
  // spin until the bound) or without join (saw_stop read before the thread wrote it).
  std::atomic<bool> saw_stop{false};
  singleflight::stop_token kept;
  {
    sftest::jthread t([&](singleflight::stop_token st) {
      must([&] { return st.stop_requested(); }, "jthread's token stopped by its destructor");
      saw_stop = true;
    });
    REQUIRE(t.joinable());
    kept = t.get_stop_token();
    CHECK(kept.stop_possible());
    CHECK_FALSE(kept.stop_requested());
    CHECK(t.get_stop_source().get_token() == kept);
  }
  CHECK(saw_stop.load());
  CHECK(kept.stop_requested());

  SECTION("a callable without a token parameter gets the arguments only") {
    int got = 0;
    {
      sftest::jthread t([&](int x) { got = x; }, 7);
    }
    CHECK(got == 7);
  }
  SECTION("move-assignment stops and joins the thread it replaces") {
    std::atomic<bool> first_saw_stop{false};
    sftest::jthread t([&](singleflight::stop_token st) {
      must([&] { return st.stop_requested(); }, "replaced jthread's token stopped");
      first_saw_stop = true;
    });
    const singleflight::stop_token first = t.get_stop_token();
    t = sftest::jthread([] {});
    CHECK(first.stop_requested());
    CHECK(first_saw_stop.load());
    CHECK(t.joinable());
    t.join();
  }
  SECTION("a default-constructed jthread has no thread and no stop state") {
    sftest::jthread t;
    CHECK_FALSE(t.joinable());
    CHECK_FALSE(t.get_stop_token().stop_possible());
    CHECK_FALSE(t.request_stop());
  }
}
