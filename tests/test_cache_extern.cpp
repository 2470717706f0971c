// SINGLEFLIGHT_EXTERN_CACHE / SINGLEFLIGHT_INSTANTIATE_CACHE: a cache type whose slow path is
// compiled in one TU (support/cache_extern_types.cpp) behaves, from a TU that only declares it
// extern, as the header-only one: loaders of every synchronous shape borrowed by the slow path
// (a key probed with another type converted once), get_entry and get_fresh, a refresh that
// outlives the call (the loader copied for it), stale-if-error, an asynchronous loader (still
// compiled here), close from a loader; async_get, co_get and get_many, their callbacks
// type-erased (detail::outcome_callback: in place or on the heap, moved, destroyed once). That
// this TU compiles none of it is checked on its object file by the ctest test
// cache_extern.object (support/check_extern.sh).
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "support/cache_extern_types.hpp"
#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::extern_cache;
using sftest::manual_clock;
using sftest::must;
using namespace std::chrono_literals;

namespace {

sf::cache_options opts(std::chrono::nanoseconds ttl = 1s) {
  sf::cache_options o;
  o.ttl = ttl;
  o.jitter = 0;
  return o;
}

std::string plain_loader() { return "fp"; }

template <class L>
sftest::fire_task<std::string> co_read(extern_cache& c, std::string key, L load) {
  co_return co_await c.co_get(key, load);
}

// counted_fn<Pad, Align, NothrowMove>: a callback that counts its live objects, moves and calls
// (Pad bytes of payload, aligned to Align).
struct fn_counts {
  int live = 0;
  int made = 0;
  int moves = 0;
  int calls = 0;
  int last = 0;
};

template <std::size_t Pad, std::size_t Align = alignof(void*), bool NothrowMove = true>
struct alignas(Align) counted_fn {
  explicit counted_fn(fn_counts* c) : n(c) { ++n->live, ++n->made; }
  counted_fn(const counted_fn& o) : n(o.n) { ++n->live, ++n->made; }
  counted_fn(counted_fn&& o) noexcept(NothrowMove) : n(o.n) { ++n->live, ++n->made, ++n->moves; }
  counted_fn& operator=(const counted_fn&) = delete;
  ~counted_fn() { --n->live; }
  void operator()(sf::outcome<int>&& o) {
    ++n->calls;
    n->last = o.value();
  }
  fn_counts* n;
  std::array<unsigned char, Pad> pad{};
};

using callback = singleflight::detail::outcome_callback<int>;

}  // namespace

// ---- detail::outcome_callback -----------------------------------------------------------

TEMPLATE_TEST_CASE("outcome_callback: a callable destroyed exactly once, in place or on the heap",
                   "[cache][extern][outcome_callback]", counted_fn<8>, counted_fn<64>,
                   (counted_fn<8, 64>), (counted_fn<8, alignof(void*), false>)) {
  constexpr bool small = callback::stored_inline<TestType>;
  STATIC_REQUIRE(small ==
                 (sizeof(TestType) <= 3 * sizeof(void*) && alignof(TestType) <= alignof(void*) &&
                  std::is_nothrow_move_constructible_v<TestType>));
  fn_counts n;
  {
    callback a{TestType(&n)};
    CHECK(n.live == 1);
    const int moves_in = n.moves;  // the temporary moved in
    callback b(std::move(a));
    CHECK_FALSE(static_cast<bool>(a));
    REQUIRE(static_cast<bool>(b));
    callback d;
    d = std::move(b);
    CHECK_FALSE(static_cast<bool>(b));
    CHECK(n.live == 1);
    // In place the callable itself moves with its holder; on the heap only the pointer does.
    CHECK(n.moves - moves_in == (small ? 2 : 0));
    d(sf::outcome<int>(std::in_place, 7));
    CHECK(n.calls == 1);
    CHECK(n.last == 7);
    callback e{TestType(&n)};
    CHECK(n.live == 2);
    e = std::move(d);  // e's own callable destroyed, d's taken
    CHECK(n.live == 1);
  }
  CHECK(n.live == 0);
}

TEST_CASE("outcome_callback: the cache's own callbacks are stored in place", "[cache][extern]") {
  // get_many's per-key callback (a shared_ptr and an index) and a lambda of three pointers.
  auto many = [st = std::shared_ptr<int>(), i = std::size_t{0}](sf::outcome<int>&&) noexcept {
    (void)st, (void)i;
  };
  int* p = nullptr;
  auto three = [p, q = p, r = p](sf::outcome<int>) { (void)p, (void)q, (void)r; };
  auto big = [pad = std::array<char, 64>{}](sf::outcome<int>) { (void)pad; };
  STATIC_REQUIRE(callback::stored_inline<decltype(many)>);
  STATIC_REQUIRE(callback::stored_inline<decltype(three)>);
  STATIC_REQUIRE_FALSE(callback::stored_inline<decltype(big)>);
}

TEST_CASE("an extern cache type loads through every synchronous loader shape", "[cache][extern]") {
  manual_clock::reset();
  extern_cache c(opts());
  int calls = 0;
  CHECK(c.get("a", [&] { return ++calls, std::string("v-a"); }) == "v-a");
  CHECK(c.get(std::string("a"), [&] { return ++calls, std::string("other"); }) == "v-a");  // hit
  CHECK(calls == 1);
  CHECK(c.get(std::string_view("b"), [](const std::string& k) { return "k-" + k; }) == "k-b");
  CHECK(c.get("c", [](const std::string& k, sf::stop_token) { return "t-" + k; }) == "t-c");
  CHECK(c.get("d", &plain_loader) == "fp");
  CHECK_THROWS_AS(c.get("e", [] { return sf::load_result<std::string>::not_found(); }),
                  sf::not_found_error);
  const auto by_const = [](const std::string& k) { return "const-" + k; };
  CHECK(c.get("f", by_const) == "const-f");
  const sf::cached<std::string> e = c.get_entry("b", [] { return std::string("unused"); });
  REQUIRE(e.value);
  CHECK(*e.value == "k-b");
  CHECK(c.get_fresh("b", [] { return std::string("fresh-b"); }) == "fresh-b");
  CHECK(c.get("b", [] { return std::string("unused"); }) == "fresh-b");
  CHECK(c.stats().loads >= 6);
}

TEST_CASE("an extern cache type's refresh runs a copy of the call's loader after the call",
          "[cache][extern]") {
  manual_clock::reset();
  sf::cache_options o = opts(1s);
  o.stale_while_revalidate = 10s;
  extern_cache c(o);
  std::atomic<int> loads{0};
  CHECK(c.get("k", [&loads] { return "v" + std::to_string(++loads); }) == "v1");
  manual_clock::advance(2s);  // stale, within stale_while_revalidate
  {
    // The loader lives in this scope only: the refresh holds its own copy.
    auto scoped = [&loads, tag = std::string("r")] { return tag + std::to_string(++loads); };
    CHECK(c.get("k", scoped) == "v1");  // the old value at once; a refresh starts
  }
  must([&] { return c.peek("k") && c.peek("k")->value == "r2"; }, "the refresh published");
  CHECK(c.stats().background_refreshes == 1);
}

TEST_CASE("an extern cache type with a cache-wide loader serves stale on error",
          "[cache][extern]") {
  manual_clock::reset();
  sf::cache_options o = opts(1s);
  o.stale_if_error = 10s;
  o.loads = sf::load_owner::caller;
  std::atomic<bool> fail{false};
  extern_cache c(o, [&fail](const std::string& k) {
    if (fail.load()) throw std::runtime_error("origin down");
    return "w-" + k;
  });
  CHECK(c.get("x") == "w-x");
  fail = true;
  manual_clock::advance(2s);                              // expired, within stale_if_error
  CHECK(c.get("x") == "w-x");                             // the load failed: the old value
  CHECK_THROWS_AS(c.get("y"), std::runtime_error);        // nothing to fall back on
  CHECK_THROWS_AS(c.get_fresh("x"), std::runtime_error);  // never the cache, never stale
  fail = false;
  CHECK(c.get_fresh("x") == "w-x");
}

TEST_CASE("an extern cache type's asynchronous cache-wide loader serves get, get_entry, get_fresh",
          "[cache][extern]") {
  manual_clock::reset();
  std::atomic<int> calls{0};
  extern_cache c(opts(1s),
                 [&calls](const std::string& k, sf::stop_token, sf::completion<std::string> done) {
                   ++calls;
                   done.set_value("a-" + k);  // completed at once, on the thread that started it
                 });
  CHECK(c.get("k") == "a-k");
  CHECK(c.get("k") == "a-k");  // a hit
  CHECK(calls.load() == 1);
  CHECK(c.get_fresh("k") == "a-k");
  CHECK(calls.load() == 2);
  const sf::cached<std::string> e = c.get_entry("k");
  REQUIRE(e.value);
  CHECK(*e.value == "a-k");
  CHECK(calls.load() == 2);
}

TEST_CASE("an extern cache type still takes an asynchronous loader, and close from a loader",
          "[cache][extern]") {
  sf::cache<std::uint64_t, int> c(opts(1s));
  std::thread origin;
  const auto async_load = [&origin](const std::uint64_t& k, sf::stop_token,
                                    sf::completion<int> done) {
    origin =
        std::thread([k, d = std::move(done)]() mutable { d.set_value(static_cast<int>(k) * 2); });
  };
  CHECK(c.get(21, async_load) == 42);
  origin.join();
  CHECK(c.get(21, [] { return -1; }) == 42);  // a hit
  // close() from a loader on the cache's own thread (load_owner::cache) stops and rejects
  // without waiting for that thread: this call returns (the load's value, or closed_error),
  // and the cache is closed.
  int got = 0;
  try {
    got = c.get(5, [&c] {
      c.close();
      return 5;
    });
  } catch (const sf::closed_error&) {
    got = -1;
  }
  CHECK((got == 5 || got == -1));
  CHECK_THROWS_AS(c.get(6, [] { return 6; }), sf::closed_error);
}

// ---- the callback path ------------------------------------------------------------------

TEST_CASE("an extern cache type's async_get: a hit on this thread, a miss through the load",
          "[cache][extern][async]") {
  manual_clock::reset();
  extern_cache c(opts());
  CHECK(c.get("a", [] { return std::string("v-a"); }) == "v-a");
  sftest::callback_log<std::string> hit;
  c.async_get(
      std::string_view("a"), [] { return std::string("unused"); }, hit.on_done());
  REQUIRE(hit.is_done());  // answered before async_get returned
  CHECK(hit.thread == std::this_thread::get_id());
  CHECK(hit.value == "v-a");

  sftest::gate loading;
  sftest::callback_log<std::string> miss;
  c.async_get(
      "m",
      [&loading](const std::string& k) {
        loading.wait("the test opens the load");
        return "v-" + k;
      },
      miss.on_done());
  CHECK_FALSE(miss.is_done());  // the load runs on the cache's thread, held by the gate
  loading.open();
  miss.wait("the miss delivered");
  CHECK(miss.value == "v-m");
  CHECK(miss.calls == 1);

  sftest::callback_log<std::string> nf;
  c.async_get(
      "nf", [] { return sf::load_result<std::string>::not_found(); }, nf.on_done());
  nf.wait("the not-found delivered");
  CHECK(nf.threw<sf::not_found_error>());
}

TEST_CASE("an extern cache type's async_get: a callback too large to store in place",
          "[cache][extern][async]") {
  manual_clock::reset();
  extern_cache c(opts());
  std::atomic<int> calls{0};
  std::atomic<int> got{0};
  auto big = [&calls, &got, pad = std::array<char, 64>{'x'}](sf::outcome<std::string> o) {
    got.store(o.has_value() && o.value() == std::string("v-b") + pad[0] ? 1 : -1);
    calls.fetch_add(1);
  };
  STATIC_REQUIRE_FALSE(
      singleflight::detail::outcome_callback<std::string>::stored_inline<decltype(big)>);
  c.async_get(
      "b", [] { return std::string("v-bx"); }, big);  // a miss: through the load
  must([&] { return calls.load() == 1; }, "the large callback called");
  CHECK(got.load() == 1);
  c.async_get(
      "b", [] { return std::string("unused"); }, big);  // a hit: here
  CHECK(calls.load() == 2);
  CHECK(got.load() == 1);
}

TEST_CASE("an extern cache type's async_get: a callback owning a move-only resource",
          "[cache][extern][async]") {
  manual_clock::reset();
  extern_cache c(opts());
  struct resource {
    std::atomic<int>* freed;
    ~resource() { freed->fetch_add(1); }
  };
  std::atomic<int> freed{0};
  std::atomic<int> seen{0};
  {
    auto owner = [&seen,
                  r = std::unique_ptr<resource>(new resource{&freed})](sf::outcome<std::string> o) {
      seen.store(r != nullptr && o.has_value() && o.value() == "v-r" ? 1 : -1);
    };
    c.async_get(
        "r", [] { return std::string("v-r"); }, std::move(owner));
  }
  must([&] { return seen.load() != 0; }, "the owning callback called");
  CHECK(seen.load() == 1);
  must([&] { return freed.load() == 1; }, "the resource freed with the callback");
  CHECK(freed.load() == 1);  // once
}

TEST_CASE("an extern cache type's co_get: a hit without suspending, a miss resumed by the load",
          "[cache][extern][async]") {
  manual_clock::reset();
  extern_cache c(opts());
  CHECK(c.get("a", [] { return std::string("v-a"); }) == "v-a");
  const auto unused = [] { return std::string("unused"); };
  sftest::fire_task<std::string> hit = co_read(c, "a", unused);
  REQUIRE(hit.done());
  CHECK(hit.get().value == "v-a");
  CHECK(hit.get().suspensions == 0);

  sftest::gate loading;
  const auto held = [&loading](const std::string& k) {
    loading.wait("the test opens the load");
    return "co-" + k;
  };
  sftest::fire_task<std::string> miss = co_read(c, "m", held);
  CHECK_FALSE(miss.done());
  loading.open();
  miss.wait("the co_get resumed");
  CHECK(miss.get().value == "co-m");

  const auto nf = [] { return sf::load_result<std::string>::not_found(); };
  sftest::fire_task<std::string> none = co_read(c, "nf", nf);
  none.wait("the not-found co_get resumed");
  CHECK(none.get().threw<sf::not_found_error>());
}

TEST_CASE("an extern cache type's get_many: a key twice, a not-found key, a hit",
          "[cache][extern][many]") {
  manual_clock::reset();
  extern_cache c(opts());
  CHECK(c.get("h", [] { return std::string("v-h"); }) == "v-h");
  std::atomic<int> loads_a{0};
  std::atomic<int> loads{0};
  const auto load = [&](const std::string& k) {
    loads.fetch_add(1);
    if (k == "a") loads_a.fetch_add(1);
    if (k == "nf") return sf::load_result<std::string>::not_found();
    return sf::load_result<std::string>::value("v-" + k);
  };
  const std::vector<std::string> keys{"a", "nf", "a", "h", "b"};
  std::vector<sf::outcome<std::string>> out = c.get_many(keys, load);
  REQUIRE(out.size() == keys.size());
  REQUIRE(out[0].has_value());
  CHECK(out[0].value() == "v-a");
  REQUIRE_FALSE(out[1].has_value());
  CHECK(sftest::holds<sf::not_found_error>(out[1].error()));
  REQUIRE(out[2].has_value());
  CHECK(out[2].value() == "v-a");
  REQUIRE(out[3].has_value());
  CHECK(out[3].value() == "v-h");
  REQUIRE(out[4].has_value());
  CHECK(out[4].value() == "v-b");
  CHECK(loads_a.load() == 1);  // the key twice: one load (joined, or the second a hit)
  CHECK(loads.load() == 3);    // a, nf, b; h answered from the cache
}

TEST_CASE("an extern cache type's cache-wide loader serves async_get and get_many",
          "[cache][extern][async]") {
  manual_clock::reset();
  extern_cache c(opts(), [](const std::string& k) { return "w-" + k; });
  sftest::callback_log<std::string> log;
  c.async_get("x", log.on_done());
  log.wait("the cache-wide load delivered");
  CHECK(log.value == "w-x");
  const std::vector<std::string> keys{"x", "y"};
  std::vector<sf::outcome<std::string>> out = c.get_many(keys);
  REQUIRE(out.size() == 2);
  CHECK(out[0].value() == "w-x");
  CHECK(out[1].value() == "w-y");
}
