// options.tracer: each flight reported once when it starts and once when it
// settles (status, duration, joins, whether fn ran), in that order, outside
// every lock, never on the group's timer thread, re-entrantly.
//
// The recorder below keeps one record per flight number (unique within a
// group) and flags every breach of the contract it can see from inside the
// calls: a second start or settle, a settle before its start, a context that
// did not come back, a key of the wrong type. Each test then checks the
// flags and the fields for its own status.
#define SINGLEFLIGHT_TEST_HOOKS  // the timer thread's id, and close()'s progress

#include <singleflight/singleflight.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
using namespace std::chrono_literals;
using group_t = sf::group<std::string, int>;
using steady = std::chrono::steady_clock;

// The contract, at compile time: both calls are noexcept (an exception
// escaping a tracer terminates), and options.tracer is a shared_ptr.
static_assert(
    noexcept(std::declval<sf::flight_tracer&>().on_start(std::declval<const sf::flight_event&>())));
static_assert(noexcept(std::declval<sf::flight_tracer&>().on_settle(
    std::declval<const sf::flight_settled&>(), nullptr)));
static_assert(std::is_same_v<decltype(sf::options{}.tracer), std::shared_ptr<sf::flight_tracer>>);

struct record {
  std::string key;
  std::size_t shard = 0;
  steady::time_point started{};
  std::thread::id start_thread{};
  int starts = 0;
  int settles = 0;
  sf::status status = sf::status::value;
  std::exception_ptr error;
  steady::time_point settled{};
  std::chrono::nanoseconds duration{0};
  std::size_t joins = 0;
  bool fn_started = false;
  std::thread::id settle_thread{};
};

class recorder final : public sf::flight_tracer {
 public:
  // Optional re-entry hooks, set before the group is used.
  std::function<void(const sf::flight_event&)> at_start;
  std::function<void(const sf::flight_settled&)> at_settle;

  void* on_start(const sf::flight_event& e) noexcept override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      record& r = flights_[e.flight];
      if (r.starts++ != 0 || r.settles != 0) breaches_.fetch_add(1);
      const std::string* k = e.key<std::string>();
      if (k == nullptr || e.key<int>() != nullptr) breaches_.fetch_add(1);
      r.key = k != nullptr ? *k : std::string("<no key>");
      r.shard = e.shard;
      r.started = e.started;
      r.start_thread = std::this_thread::get_id();
    }
    starts_.fetch_add(1, std::memory_order_release);
    if (at_start) at_start(e);
    return new std::uint64_t(e.flight);  // comes back to on_settle, which frees it
  }

  void on_settle(const sf::flight_settled& e, void* context) noexcept override {
    auto* ctx = static_cast<std::uint64_t*>(context);
    {
      std::lock_guard<std::mutex> lk(mu_);
      record& r = flights_[e.flight];
      if (r.starts != 1 || r.settles++ != 0) breaches_.fetch_add(1);
      if (ctx == nullptr || *ctx != e.flight) breaches_.fetch_add(1);
      if (e.started != r.started || e.key<std::string>() == nullptr ||
          *e.key<std::string>() != r.key)
        breaches_.fetch_add(1);
      r.status = e.status;
      r.error = e.error;
      r.settled = e.settled;
      r.duration = e.duration;
      r.joins = e.joins;
      r.fn_started = e.fn_started;
      r.settle_thread = std::this_thread::get_id();
    }
    delete ctx;
    if (at_settle) at_settle(e);
    settles_.fetch_add(1, std::memory_order_release);
  }

  int starts() const { return starts_.load(std::memory_order_acquire); }
  int settles() const { return settles_.load(std::memory_order_acquire); }
  int breaches() const { return breaches_.load(); }
  void wait_settles(int n, const char* name) const {
    sftest::must([&] { return settles() >= n; }, name);
  }
  // A copy of flight n's record (taken once the reports are in).
  record at(std::uint64_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    return flights_.at(n);
  }
  std::map<std::uint64_t, record> all() {
    std::lock_guard<std::mutex> lk(mu_);
    return flights_;
  }

 private:
  std::mutex mu_;
  std::map<std::uint64_t, record> flights_;
  std::atomic<int> starts_{0};
  std::atomic<int> settles_{0};
  std::atomic<int> breaches_{0};
};

sf::options traced(const std::shared_ptr<recorder>& r, sf::options o = {}) {
  o.tracer = r;
  return o;
}

// The group's timer thread, as the timer_due test hook sees it.
std::atomic<std::thread::id> g_timer_thread{};
void note_timer(sf::detail::hook_point p, const void*) {
  if (p == sf::detail::hook_point::timer_due)
    g_timer_thread.store(std::this_thread::get_id(), std::memory_order_release);
}

// close()'s progress: it has settled, stopped and notified every shard.
sftest::gate* g_close_marked = nullptr;
void note_close(sf::detail::hook_point p, const void*) {
  if (p == sf::detail::hook_point::close_marked && g_close_marked != nullptr)
    g_close_marked->open();
}

}  // namespace

TEST_CASE("a value flight is reported started then settled, within the call, with its key",
          "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  sf::call_info info;
  const auto t0 = steady::now();
  const int v = g.do_(
      "k", [] { return 7; }, {}, info);
  const auto t1 = steady::now();
  REQUIRE(v == 7);
  // An inline leader's flight is reported before do_ returns.
  REQUIRE(rec->starts() == 1);
  REQUIRE(rec->settles() == 1);
  CHECK(rec->breaches() == 0);
  const record r = rec->at(info.flight);
  CHECK(r.key == "k");
  CHECK(r.status == sf::status::value);
  CHECK(r.error == nullptr);
  CHECK(r.fn_started);
  CHECK(r.joins == 0);
  CHECK(r.started >= t0);
  CHECK(r.settled <= t1);
  CHECK(r.duration == r.settled - r.started);
  CHECK(r.duration >= 0ns);
  CHECK(r.duration <= t1 - t0);
  CHECK(r.start_thread == std::this_thread::get_id());
  CHECK(r.settle_thread == std::this_thread::get_id());
}

TEST_CASE("a failed flight is reported failed with the exception its waiters received",
          "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  std::exception_ptr caught;
  try {
    (void)g.do_("k", []() -> int { throw std::runtime_error("origin down"); });
  } catch (...) {
    caught = std::current_exception();
  }
  REQUIRE(caught != nullptr);
  REQUIRE(rec->settles() == 1);
  CHECK(rec->breaches() == 0);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::failed);
  CHECK(r.error == caught);  // the very object, not a copy
  CHECK(r.fn_started);
}

TEST_CASE("joins counts the callers that joined the flight", "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  sftest::gate release;
  std::atomic<bool> in_fn{false};
  auto fn = [&] {
    in_fn = true;
    release.wait("leader released");
    return 1;
  };
  sftest::result<int> a, b, c;
  auto ta = sftest::spawn(a, [&] { return g.do_("k", fn); });
  sftest::must([&] { return in_fn.load(); }, "leader in fn");
  auto tb = sftest::spawn(b, [&] { return g.do_("k", fn); });
  auto tc = sftest::spawn(c, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().joins == 2; }, "two followers joined");
  release.open();
  sftest::finish(ta, a, "leader");
  sftest::finish(tb, b, "follower b");
  sftest::finish(tc, c, "follower c");
  rec->wait_settles(1, "settle reported");
  CHECK(rec->starts() == 1);
  CHECK(rec->breaches() == 0);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::value);
  CHECK(r.joins == 2);
}

TEST_CASE("the last waiter leaving under ownership::waiters is reported cancelled, with fn started",
          "[tracer][executor]") {
  auto rec = std::make_shared<recorder>();
  sf::options o;
  o.executor = sf::thread_executor{};
  group_t g{sftest::numbered(traced(rec, o))};
  std::atomic<bool> in_fn{false};
  sf::stop_source caller;
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    return g.do_(
        "k",
        [&](sf::stop_token st) {
          in_fn = true;
          sftest::must([&] { return st.stop_requested(); }, "flight stopped");
          return 1;
        },
        caller.get_token());
  });
  sftest::must([&] { return in_fn.load(); }, "fn running");
  caller.request_stop();
  sftest::finish(ta, a, "caller left");
  CHECK(a.threw<sf::cancelled_error>());
  rec->wait_settles(1, "cancel reported");
  CHECK(rec->breaches() == 0);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::cancelled);
  CHECK(r.fn_started);
  CHECK(r.error == nullptr);
}

TEST_CASE("a flight settled before its task ran is reported with fn_started false",
          "[tracer][executor]") {
  auto rec = std::make_shared<recorder>();
  sftest::manual_executor ex;
  sf::options o;
  o.executor = ex.executor();
  group_t g{sftest::numbered(traced(rec, o))};
  std::atomic<int> fn_calls{0};
  sf::stop_source caller;
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    return g.do_(
        "k",
        [&] {
          ++fn_calls;
          return 1;
        },
        caller.get_token());
  });
  sftest::must([&] { return ex.queued() == 1; }, "task queued");
  REQUIRE(rec->starts() == 1);  // reported before the hand-off
  caller.request_stop();
  sftest::finish(ta, a, "caller left");
  rec->wait_settles(1, "cancel reported");
  ex.take("the task")();  // the task now skips fn
  CHECK(fn_calls == 0);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::cancelled);
  CHECK_FALSE(r.fn_started);
  CHECK(rec->breaches() == 0);
  CHECK(g.stats().fn_starts == 0);
}

TEST_CASE("a deadline is reported timeout, off the timer thread", "[tracer][deadline]") {
  auto rec = std::make_shared<recorder>();
  sf::options o;
  o.timeout = 50ms;
  group_t g{sftest::numbered(traced(rec, o))};
  g_timer_thread.store(std::thread::id{});
  sf::detail::test_hook.store(&note_timer, std::memory_order_release);
  const auto t0 = steady::now();
  std::exception_ptr caught;
  try {
    (void)g.do_("k", [](sf::stop_token st) {
      sftest::must([&] { return st.stop_requested(); }, "deadline stops fn");
      return 1;
    });
  } catch (...) {
    caught = std::current_exception();
  }
  const auto t1 = steady::now();
  rec->wait_settles(1, "timeout reported");
  sf::detail::test_hook.store(nullptr, std::memory_order_release);
  CHECK(sftest::holds<sf::timeout_error>(caught));
  CHECK(rec->breaches() == 0);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::timeout);
  CHECK(r.fn_started);
  CHECK(r.duration >= o.timeout);
  CHECK(r.duration <= t1 - t0);
  const std::thread::id timer = g_timer_thread.load(std::memory_order_acquire);
  REQUIRE(timer != std::thread::id{});
  CHECK(r.settle_thread != timer);
  CHECK(r.settle_thread != std::this_thread::get_id());  // the delivery thread
}

TEST_CASE(
    "an inline leader's stop is reported cancelled on the delivery thread, not in its stop "
    "callback",
    "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  std::atomic<bool> in_fn{false};
  sf::stop_source caller;
  std::thread::id leader_thread{};
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    leader_thread = std::this_thread::get_id();
    return g.do_(
        "k",
        [&](sf::stop_token st) {
          in_fn = true;
          sftest::must([&] { return st.stop_requested(); }, "flight stopped");
          return 1;
        },
        caller.get_token());
  });
  sftest::must([&] { return in_fn.load(); }, "fn running");
  caller.request_stop();  // the leader's stop callback runs here, and settles
  sftest::finish(ta, a, "leader returned");
  CHECK(a.threw<sf::cancelled_error>());
  rec->wait_settles(1, "cancel reported");
  const record r = rec->at(1);
  CHECK(r.status == sf::status::cancelled);
  CHECK(r.settle_thread != std::this_thread::get_id());
  CHECK(r.settle_thread != leader_thread);
  CHECK(rec->breaches() == 0);
}

TEST_CASE("close() is reported closed, on the closing thread, before close() returns",
          "[tracer][close][executor]") {
  auto rec = std::make_shared<recorder>();
  sf::options o;
  o.executor = sf::thread_executor{};
  group_t g{sftest::numbered(traced(rec, o))};
  std::atomic<bool> in_fn{false};
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    return g.do_("k", [&](sf::stop_token st) {
      in_fn = true;
      sftest::must([&] { return st.stop_requested(); }, "close stops fn");
      return 1;
    });
  });
  sftest::must([&] { return in_fn.load(); }, "fn running");
  g.close();
  REQUIRE(rec->settles() == 1);
  sftest::finish(ta, a, "caller");
  CHECK(a.threw<sf::closed_error>());
  const record r = rec->at(1);
  CHECK(r.status == sf::status::closed);
  CHECK(r.settle_thread == std::this_thread::get_id());
  CHECK(rec->breaches() == 0);
}

TEST_CASE("a max_in_flight rejection is no flight and reports nothing", "[tracer][bounds]") {
  auto rec = std::make_shared<recorder>();
  sf::options o;
  o.max_in_flight = 1;
  group_t g{sftest::numbered(traced(rec, o))};
  sftest::gate release;
  std::atomic<bool> in_fn{false};
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    return g.do_("a", [&] {
      in_fn = true;
      release.wait("leader released");
      return 1;
    });
  });
  sftest::must([&] { return in_fn.load(); }, "a running");
  CHECK_THROWS_AS(g.do_("b", [] { return 2; }), sf::overloaded_error);
  CHECK(rec->starts() == 1);
  CHECK(rec->settles() == 0);
  release.open();
  sftest::finish(ta, a, "a");
  rec->wait_settles(1, "a reported");
  CHECK(rec->starts() == 1);
  CHECK(g.stats().overloaded == 1);
  CHECK(rec->all().size() == 1);
  CHECK(rec->breaches() == 0);
}

TEST_CASE(
    "a settle that happens before on_start returns is reported after it, on the starting "
    "thread",
    "[tracer][close]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  sftest::gate in_start, release_start, marked;
  rec->at_start = [&](const sf::flight_event&) {
    in_start.open();
    release_start.wait("on_start released");
  };
  std::thread::id leader_thread{};
  sftest::result<int> a;
  auto ta = sftest::spawn(a, [&] {
    leader_thread = std::this_thread::get_id();
    return g.do_("k", [] { return 1; });
  });
  in_start.wait("leader inside on_start");
  g_close_marked = &marked;
  sf::detail::test_hook.store(&note_close, std::memory_order_release);
  sftest::thread closer([&] { g.close(); });
  marked.wait("close() settled the flight");
  CHECK(rec->settles() == 0);  // held back until on_start returns
  release_start.open();
  sftest::finish(ta, a, "leader");
  closer.join("close() drained");
  sf::detail::test_hook.store(nullptr, std::memory_order_release);
  g_close_marked = nullptr;
  CHECK(a.threw<sf::closed_error>());
  REQUIRE(rec->settles() == 1);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::closed);
  CHECK(r.settle_thread == leader_thread);
  CHECK(r.fn_started);  // an inline leader runs fn even when closed meanwhile
  CHECK(rec->breaches() == 0);
}

TEST_CASE("the tracer may re-enter the group: do_, forget, in_flight, stats", "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  std::atomic<std::size_t> in_flight_at_start{99};
  std::atomic<int> nested{0};
  std::atomic<bool> forgot{true};
  rec->at_start = [&](const sf::flight_event& e) {
    if (*e.key<std::string>() == "k") in_flight_at_start = g.in_flight();
  };
  rec->at_settle = [&](const sf::flight_settled& e) {
    if (*e.key<std::string>() != "k") return;
    nested = g.do_("nested", [] { return 5; });
    forgot = g.forget("k");  // its entry is already gone
    (void)g.stats();
  };
  CHECK(g.do_("k", [] { return 1; }) == 1);
  CHECK(in_flight_at_start == 1);
  CHECK(nested == 5);
  CHECK_FALSE(forgot);
  CHECK(rec->starts() == 2);
  CHECK(rec->settles() == 2);
  CHECK(rec->breaches() == 0);
  CHECK(g.in_flight() == 0);
}

TEST_CASE("close() from on_start does not wait for the flight being started", "[tracer][close]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  rec->at_start = [&](const sf::flight_event&) { g.close(); };
  std::atomic<bool> fn_saw_stop{false};
  CHECK_THROWS_AS(g.do_("k",
                        [&](sf::stop_token st) {
                          fn_saw_stop = st.stop_requested();
                          return 1;
                        }),
                  sf::closed_error);
  CHECK(fn_saw_stop);
  REQUIRE(rec->settles() == 1);
  CHECK(rec->at(1).status == sf::status::closed);
  CHECK(rec->breaches() == 0);
}

TEST_CASE("close() from on_settle drains the group", "[tracer][close]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  rec->at_settle = [&](const sf::flight_settled&) { g.close(); };
  CHECK(g.do_("k", [] { return 1; }) == 1);
  CHECK_THROWS_AS(g.do_("k", [] { return 1; }), sf::closed_error);
  CHECK(rec->settles() == 1);
  CHECK(rec->breaches() == 0);
}

TEST_CASE("async_do and a completion-based fn are reported like blocking calls",
          "[tracer][async]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  sftest::completion_box<int> box;
  sftest::callback_log<int> a, b;
  g.async_do("k", box.fn(), a.on_done());
  g.async_do("k", box.fn(), b.on_done());
  auto first = box.take("fn started");
  CHECK(rec->starts() == 1);
  CHECK(rec->settles() == 0);
  std::atomic<int> settles_seen_by_callback{-1};
  a.probe = [&] { settles_seen_by_callback = rec->settles(); };
  first.second.set_value(3);  // settles here: reported before the callbacks run
  a.wait("a");
  b.wait("b");
  CHECK(*a.value == 3);
  REQUIRE(rec->settles() == 1);
  CHECK(settles_seen_by_callback == 1);
  const record r = rec->at(1);
  CHECK(r.status == sf::status::value);
  CHECK(r.joins == 1);
  CHECK(r.fn_started);
  CHECK(rec->breaches() == 0);
}

TEST_CASE("every flight is reported exactly once, start before settle, across shards",
          "[tracer][shards]") {
  auto rec = std::make_shared<recorder>();
  sf::options o;
  o.shards = 8;
  group_t g{traced(rec, o)};
  constexpr int kThreads = 4;
  constexpr int kCalls = 300;
  std::vector<std::string> keys;
  for (int i = 0; i < 32; ++i) keys.push_back("key-" + std::to_string(i));
  std::atomic<int> errors{0};
  {
    std::deque<sftest::thread> ts;  // not movable: built in place
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kCalls; ++i) {
          const std::string& k = keys[static_cast<std::size_t>((i * 7 + t) % 32)];
          try {
            if (g.do_(k, [i] { return i; }) < 0) ++errors;
          } catch (...) {
            ++errors;
          }
        }
      });
    }
    for (auto& t : ts) t.join("caller threads");
  }
  const sf::stats st = g.stats();
  CHECK(errors == 0);
  rec->wait_settles(static_cast<int>(st.flights), "every settle reported");
  CHECK(rec->starts() == static_cast<int>(st.flights));
  CHECK(rec->settles() == static_cast<int>(st.flights));
  CHECK(rec->breaches() == 0);
  const auto all = rec->all();
  CHECK(all.size() == st.flights);
  std::set<std::size_t> shards;
  std::size_t joins = 0;
  for (const auto& [n, r] : all) {
    CHECK(r.starts == 1);
    CHECK(r.settles == 1);
    CHECK(r.status == sf::status::value);
    CHECK(r.duration >= 0ns);
    CHECK(r.shard < 8);
    shards.insert(r.shard);
    joins += r.joins;
  }
  CHECK(shards.size() > 1);
  CHECK(joins == st.joins);
}

TEST_CASE("without a tracer nothing is reported and flights are recycled as before", "[tracer]") {
  // The default: options.tracer is null. A tracer set on one group is not
  // seen by another.
  auto rec = std::make_shared<recorder>();
  group_t traced_g{traced(rec)};
  group_t plain;
  CHECK(plain.do_("k", [] { return 1; }) == 1);
  CHECK(rec->starts() == 0);
  CHECK(traced_g.do_("k", [] { return 1; }) == 1);
  CHECK(rec->starts() == 1);
  CHECK(rec->settles() == 1);
}

namespace {

// A stand-in for a tracing library (OpenTelemetry's API has the same shape:
// a provider that starts spans, attributes, a status, an end time).
struct span {
  enum code { unset, ok, error };
  std::string name;
  std::map<std::string, std::string> attributes;
  code status = unset;
  steady::time_point start{}, end_time{};
  bool ended = false;

  void set_attribute(const std::string& k, const std::string& v) { attributes[k] = v; }
  void set_attribute(const std::string& k, std::uint64_t v) { attributes[k] = std::to_string(v); }
  void set_attribute(const std::string& k, bool v) { attributes[k] = v ? "true" : "false"; }
  void set_status(code c) { status = c; }
  void end(steady::time_point t) {
    end_time = t;
    ended = true;
  }
};

struct tracer_provider {
  std::mutex mu;
  std::deque<span> spans;  // stable addresses
  span* start_span(const std::string& name, steady::time_point t) {
    std::lock_guard<std::mutex> lk(mu);
    spans.push_back(span{name, {}, span::unset, t, {}, false});
    return &spans.back();
  }
};

// --- snippet: otel-tracer ---
// One span per flight: started in on_start, ended in on_settle.
class flight_spans final : public singleflight::flight_tracer {
 public:
  explicit flight_spans(tracer_provider& p) : provider_(p) {}

  void* on_start(const singleflight::flight_event& e) noexcept override {
    span* s = provider_.start_span("singleflight.flight", e.started);
    if (const auto* key = e.key<std::string>()) s->set_attribute("singleflight.key", *key);
    s->set_attribute("singleflight.flight", e.flight);
    return s;  // handed back to on_settle
  }

  void on_settle(const singleflight::flight_settled& e, void* context) noexcept override {
    auto* s = static_cast<span*>(context);
    s->set_attribute("singleflight.joins", static_cast<std::uint64_t>(e.joins));
    s->set_attribute("singleflight.fn_started", e.fn_started);
    s->set_status(e.status == singleflight::status::value ? span::ok : span::error);
    s->end(e.settled);  // the settle's own time, whenever this runs
  }

 private:
  tracer_provider& provider_;
};
// --- end snippet ---

}  // namespace

TEST_CASE("the README's span-per-flight tracer records one ended span per flight",
          "[tracer][docs]") {
  tracer_provider provider;
  // --- snippet: otel-tracer-use ---
  singleflight::options o;
  o.tracer = std::make_shared<flight_spans>(provider);
  singleflight::group<std::string, int> profiles(o);
  // --- end snippet ---
  CHECK(profiles.do_("tenant-7|user-42", [] { return 1; }) == 1);
  CHECK_THROWS_AS(profiles.do_("tenant-7|user-43", []() -> int { throw std::runtime_error("x"); }),
                  std::runtime_error);
  std::lock_guard<std::mutex> lk(provider.mu);
  REQUIRE(provider.spans.size() == 2);
  const span& a = provider.spans[0];
  const span& b = provider.spans[1];
  CHECK(a.attributes.at("singleflight.key") == "tenant-7|user-42");
  CHECK(a.attributes.at("singleflight.fn_started") == "true");
  CHECK(a.status == span::ok);
  CHECK(a.ended);
  CHECK(a.end_time >= a.start);
  CHECK(b.attributes.at("singleflight.key") == "tenant-7|user-43");
  CHECK(b.status == span::error);
  CHECK(b.ended);
}

TEST_CASE("do_ for the key being started, from on_start, throws logic_error for an inline leader",
          "[tracer]") {
  auto rec = std::make_shared<recorder>();
  group_t g{sftest::numbered(traced(rec))};
  std::atomic<bool> threw_logic{false};
  std::atomic<int> inner_fn_calls{0};
  rec->at_start = [&](const sf::flight_event& e) {
    if (*e.key<std::string>() != "k") return;
    try {
      (void)g.do_("k", [&] {
        ++inner_fn_calls;
        return 2;
      });
    } catch (const std::logic_error&) {
      threw_logic = true;
    }
  };
  CHECK(g.do_("k", [] { return 1; }) == 1);
  CHECK(threw_logic);
  CHECK(inner_fn_calls == 0);
  CHECK(rec->settles() == 1);
  CHECK(rec->breaches() == 0);
}
