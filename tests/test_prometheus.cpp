// singleflight/prometheus.hpp and singleflight/metrics.hpp: the mapping from stats to
// Prometheus metric families (names, types, labels, values), read at scrape time; one family
// per name across sources; the registration's lifetime rules; the generic table for other
// layers; misuse rejected by add(). Built only where prometheus-cpp is found.
#include <singleflight/cache.hpp>
#include <singleflight/fleet_cache_options.hpp>
#include <singleflight/metrics.hpp>
#include <singleflight/prometheus.hpp>
#include <singleflight/singleflight.hpp>

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/manual_clock.hpp"
#include "support/sync.hpp"

namespace {

namespace sf = singleflight;
namespace sm = singleflight::metrics;
using namespace std::chrono_literals;

// A stats source with a distinct value in every field, so that a metric reading the wrong
// field shows.
struct fixed_source {
  sf::stats s;
  fixed_source() {
    s.calls = 2;
    s.flights = 3;
    s.fn_starts = 5;
    s.joins = 7;
    s.rejections = 11;
    s.failures = 13;
    s.cancellations = 17;
    s.timeouts = 19;
    s.wait_timeouts = 31;
    s.overloaded = 23;
    s.in_flight = 29;
  }
  sf::stats stats() const { return s; }
};

const prometheus::MetricFamily* family(const std::vector<prometheus::MetricFamily>& fams,
                                       const std::string& name) {
  for (const auto& f : fams) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label) {
    if (l.name == name) return l.value;
  }
  return "<none>";
}

// The value of `name`'s series whose group label is `group`; -1 when there is none.
double value(const std::vector<prometheus::MetricFamily>& fams, const std::string& name,
             const std::string& group) {
  const auto* f = family(fams, name);
  if (f == nullptr) return -1;
  for (const auto& m : f->metric) {
    if (label(m, "group") != group) continue;
    return f->type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
  }
  return -1;
}

// Every field of a group's stats against the exported value of its metric.
void require_matches(const std::vector<prometheus::MetricFamily>& fams, const std::string& group,
                     const sf::stats& s) {
  CHECK(value(fams, "singleflight_calls_total", group) == static_cast<double>(s.calls));
  CHECK(value(fams, "singleflight_flights_total", group) == static_cast<double>(s.flights));
  CHECK(value(fams, "singleflight_fn_starts_total", group) == static_cast<double>(s.fn_starts));
  CHECK(value(fams, "singleflight_joins_total", group) == static_cast<double>(s.joins));
  CHECK(value(fams, "singleflight_rejections_total", group) == static_cast<double>(s.rejections));
  CHECK(value(fams, "singleflight_failures_total", group) == static_cast<double>(s.failures));
  CHECK(value(fams, "singleflight_cancellations_total", group) ==
        static_cast<double>(s.cancellations));
  CHECK(value(fams, "singleflight_timeouts_total", group) == static_cast<double>(s.timeouts));
  CHECK(value(fams, "singleflight_wait_timeouts_total", group) ==
        static_cast<double>(s.wait_timeouts));
  CHECK(value(fams, "singleflight_overloaded_total", group) == static_cast<double>(s.overloaded));
  CHECK(value(fams, "singleflight_in_flight", group) == static_cast<double>(s.in_flight));
}

}  // namespace

TEST_CASE("every stats field is exported under its conventional name, type and group label",
          "[prometheus]") {
  const fixed_source src;
  sm::prometheus_collector c;
  const sm::registration r = c.add(src, "profiles");
  const auto fams = c.Collect();

  struct expected {
    const char* name;
    prometheus::MetricType type;
    double value;
  };
  const expected table[] = {
      {"singleflight_calls_total", prometheus::MetricType::Counter, 2},
      {"singleflight_flights_total", prometheus::MetricType::Counter, 3},
      {"singleflight_fn_starts_total", prometheus::MetricType::Counter, 5},
      {"singleflight_joins_total", prometheus::MetricType::Counter, 7},
      {"singleflight_rejections_total", prometheus::MetricType::Counter, 11},
      {"singleflight_failures_total", prometheus::MetricType::Counter, 13},
      {"singleflight_cancellations_total", prometheus::MetricType::Counter, 17},
      {"singleflight_timeouts_total", prometheus::MetricType::Counter, 19},
      {"singleflight_wait_timeouts_total", prometheus::MetricType::Counter, 31},
      {"singleflight_overloaded_total", prometheus::MetricType::Counter, 23},
      {"singleflight_in_flight", prometheus::MetricType::Gauge, 29},
  };
  REQUIRE(fams.size() == std::size(table));
  for (std::size_t i = 0; i < std::size(table); ++i) {
    INFO(table[i].name);
    REQUIRE(fams[i].name == table[i].name);  // the table's order
    REQUIRE(fams[i].type == table[i].type);
    REQUIRE_FALSE(fams[i].help.empty());
    REQUIRE(fams[i].metric.size() == 1);
    const auto& m = fams[i].metric[0];
    REQUIRE(m.label.size() == 1);
    REQUIRE(m.label[0].name == "group");
    REQUIRE(m.label[0].value == "profiles");
    REQUIRE(value(fams, table[i].name, "profiles") == table[i].value);
  }
}

TEST_CASE("the text exposition has one TYPE line per family and one sample per group",
          "[prometheus]") {
  const fixed_source a;
  fixed_source b;
  b.s.calls = 100;
  sm::prometheus_collector c;
  const auto ra = c.add(a, "a");
  const auto rb = c.add(b, "b", {{"service", "api"}});
  const std::string text = prometheus::TextSerializer().Serialize(c.Collect());
  INFO(text);
  const auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  REQUIRE(count("# TYPE singleflight_calls_total counter\n") == 1);
  REQUIRE(count("# TYPE singleflight_in_flight gauge\n") == 1);
  REQUIRE(count("# TYPE ") == sm::group_metrics.size());
  REQUIRE(count("singleflight_calls_total{group=\"a\"} 2\n") == 1);
  REQUIRE(count("singleflight_calls_total{group=\"b\",service=\"api\"} 100\n") == 1);
  REQUIRE(count("singleflight_in_flight{group=\"b\",service=\"api\"} 29\n") == 1);
}

TEST_CASE("a group's values are read from stats() at scrape time", "[prometheus]") {
  sf::group<std::string, int> g;
  sm::prometheus_collector c;
  const auto r = c.add(g, "profiles");

  // An open flight with a follower: in_flight is a level, calls and joins count.
  sftest::gate release;
  sftest::result<int> leader;
  sftest::result<int> follower;
  auto fn = [&] {
    release.wait("leader's fn released");
    return 42;
  };
  auto t1 = sftest::spawn(leader, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().fn_starts == 1; }, "leader's fn running");
  auto t2 = sftest::spawn(follower, [&] { return g.do_("k", fn); });
  sftest::must([&] { return g.stats().joins == 1; }, "follower joined");
  auto during = c.Collect();
  CHECK(value(during, "singleflight_in_flight", "profiles") == 1);
  CHECK(value(during, "singleflight_calls_total", "profiles") == 2);
  CHECK(value(during, "singleflight_joins_total", "profiles") == 1);
  release.open();
  sftest::finish(t1, leader, "leader done");
  sftest::finish(t2, follower, "follower done");
  REQUIRE(leader.value == 42);
  REQUIRE(follower.value == 42);

  // A failure and a caller that was stopped before it arrived.
  REQUIRE_THROWS_AS(g.do_("e", []() -> int { throw std::runtime_error("origin down"); }),
                    std::runtime_error);
  sf::stop_source stopped;
  stopped.request_stop();
  REQUIRE_THROWS_AS(g.do_(
                        "c", [] { return 1; }, stopped.get_token()),
                    sf::cancelled_error);

  const auto after = c.Collect();
  const sf::stats s = g.stats();
  require_matches(after, "profiles", s);
  CHECK(value(after, "singleflight_in_flight", "profiles") == 0);
  CHECK(value(after, "singleflight_calls_total", "profiles") == 4);
  CHECK(value(after, "singleflight_flights_total", "profiles") == 2);
  CHECK(value(after, "singleflight_failures_total", "profiles") == 1);
  CHECK(value(after, "singleflight_cancellations_total", "profiles") == 1);
}

TEST_CASE("deadlines, overload and executor-stopped flights reach their counters", "[prometheus]") {
  sf::options o;
  o.timeout = 20ms;
  o.max_in_flight = 1;
  sf::group<std::string, int> g(o);
  sm::prometheus_collector c;
  const auto r = c.add(g, "bounded");
  sftest::gate entered;
  sftest::result<int> slow;
  auto t = sftest::spawn(slow, [&] {
    return g.do_("slow", [&](sf::stop_token st) {
      entered.open();
      sftest::must([&] { return st.stop_requested(); }, "deadline stops fn");
      return 0;
    });
  });
  entered.wait("slow fn running");
  REQUIRE_THROWS_AS(g.do_("other", [] { return 1; }), sf::overloaded_error);  // cap of 1
  sftest::finish(t, slow, "slow caller done");
  REQUIRE(slow.threw<sf::timeout_error>());
  sftest::must([&] { return g.in_flight() == 0; }, "slow entry gone");
  const auto fams = c.Collect();
  require_matches(fams, "bounded", g.stats());
  CHECK(value(fams, "singleflight_timeouts_total", "bounded") == 1);
  CHECK(value(fams, "singleflight_overloaded_total", "bounded") == 1);
}

TEST_CASE("several groups share one family per name, one series each", "[prometheus]") {
  sf::group<std::string, int> a;
  sf::group<int, std::string> b;
  sm::prometheus_collector c;
  const auto ra = c.add(a, "a");
  const auto rb = c.add(b, "b");
  a.do_("x", [] { return 1; });
  a.do_("y", [] { return 2; });
  b.do_(1, [] { return std::string("one"); });
  const auto fams = c.Collect();
  REQUIRE(fams.size() == sm::group_metrics.size());
  for (const auto& f : fams) {
    REQUIRE(f.metric.size() == 2);
    REQUIRE(label(f.metric[0], "group") == "a");  // registration order
    REQUIRE(label(f.metric[1], "group") == "b");
  }
  REQUIRE(value(fams, "singleflight_calls_total", "a") == 2);
  REQUIRE(value(fams, "singleflight_calls_total", "b") == 1);
}

TEST_CASE("add() rejects what would make an invalid exposition", "[prometheus]") {
  const fixed_source s;
  sm::prometheus_collector c;
  const auto r = c.add(s, "profiles");
  SECTION("the same group name twice: duplicate series") {
    REQUIRE_THROWS_AS((void)c.add(s, "profiles"), std::invalid_argument);
  }
  SECTION("the group label given twice") {
    REQUIRE_THROWS_AS((void)c.add(s, "x", {{"group", "y"}}), std::invalid_argument);
  }
  SECTION("invalid or reserved label names") {
    REQUIRE_THROWS_AS((void)c.add(s, "x", {{"1st", "v"}}), std::invalid_argument);
    REQUIRE_THROWS_AS((void)c.add(s, "x", {{"__name__", "v"}}), std::invalid_argument);
  }
  SECTION("a name already registered as another kind") {
    static constexpr std::array wrong_kind{
        sm::gauge<&sf::stats::calls>("singleflight_calls_total", "calls as a gauge")};
    REQUIRE_THROWS_AS((void)c.add_source({{"group", "other"}}, wrong_kind, [&] { return s.s; }),
                      std::invalid_argument);
  }
  SECTION("an invalid metric name") {
    static constexpr std::array bad_name{sm::counter<&sf::stats::calls>("calls-total", "dash")};
    REQUIRE_THROWS_AS((void)c.add_source({}, bad_name, [&] { return s.s; }), std::invalid_argument);
  }
  // Whatever was rejected, nothing changed.
  const auto fams = c.Collect();
  REQUIRE(fams.size() == sm::group_metrics.size());
  for (const auto& f : fams) REQUIRE(f.metric.size() == 1);
}

namespace {
// Another layer's stats and table, as the comment in metrics.hpp shows.
struct cache_stats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t entries = 0;
};
constexpr std::array cache_metrics{
    sm::counter<&cache_stats::hits>("singleflight_cache_hits_total", "Lookups served"),
    sm::counter<&cache_stats::misses>("singleflight_cache_misses_total", "Lookups missed"),
    sm::gauge<&cache_stats::entries>("singleflight_cache_entries", "Entries held"),
};
}  // namespace

TEST_CASE("another layer exports its own stats type through the same collector", "[prometheus]") {
  sf::group<std::string, int> g;
  std::atomic<std::uint64_t> hits{0};
  sm::prometheus_collector c;
  const auto rg = c.add(g, "profiles");
  const auto rc = c.add_source({{"cache", "profiles"}}, cache_metrics, [&] {
    cache_stats s;
    s.hits = hits.load();
    s.misses = 4;
    s.entries = 9;
    return s;
  });
  hits = 3;
  const auto fams = c.Collect();
  REQUIRE(fams.size() == sm::group_metrics.size() + cache_metrics.size());
  const auto* h = family(fams, "singleflight_cache_hits_total");
  REQUIRE(h != nullptr);
  REQUIRE(h->type == prometheus::MetricType::Counter);
  REQUIRE(h->metric.size() == 1);
  REQUIRE(label(h->metric[0], "cache") == "profiles");
  REQUIRE(h->metric[0].counter.value == 3);
  const auto* e = family(fams, "singleflight_cache_entries");
  REQUIRE(e != nullptr);
  REQUIRE(e->type == prometheus::MetricType::Gauge);
  REQUIRE(e->metric[0].gauge.value == 9);
}

TEST_CASE(
    "a fleet_cache's own counters are exported under fleet_cache_metrics, its local cache's and "
    "fleet's under their tables, from one stats type",
    "[prometheus][fleet_cache]") {
  // A distinct value in every field, so that a metric reading the wrong field shows.
  sf::fleet_cache_stats s;
  s.broadcasts = 2;
  s.invalidations_heard = 3;
  s.expires_heard = 5;
  s.resyncs = 7;
  s.overflows = 11;
  s.tracking_refused = 1;
  s.local.hits = 13;
  s.fleet.gets = 17;
  sm::prometheus_collector c;
  const auto rfc =
      c.add_source({{"fleet_cache", "profiles"}}, sm::fleet_cache_metrics, [&] { return s; });
  const auto rc = c.add_source({{"cache", "profiles"}}, sm::cache_metrics, [&] { return s.local; });
  const auto rf = c.add_source({{"fleet", "profiles"}}, sm::fleet_metrics, [&] { return s.fleet; });
  const auto fams = c.Collect();
  REQUIRE(fams.size() ==
          sm::fleet_cache_metrics.size() + sm::cache_metrics.size() + sm::fleet_metrics.size());
  const std::pair<const char*, double> expected[] = {
      {"singleflight_fleet_cache_broadcasts_total", 2},
      {"singleflight_fleet_cache_invalidations_heard_total", 3},
      {"singleflight_fleet_cache_expires_heard_total", 5},
      {"singleflight_fleet_cache_resyncs_total", 7},
      {"singleflight_fleet_cache_overflows_total", 11},
  };
  REQUIRE(sm::fleet_cache_metrics.size() == std::size(expected) + 1);  // + the gauge below
  for (const auto& [name, v] : expected) {
    INFO(name);
    const auto* f = family(fams, name);
    REQUIRE(f != nullptr);
    CHECK(f->type == prometheus::MetricType::Counter);
    REQUIRE(f->metric.size() == 1);
    CHECK(label(f->metric[0], "fleet_cache") == "profiles");
    CHECK(f->metric[0].counter.value == v);
  }
  const auto* refused = family(fams, "singleflight_fleet_cache_tracking_refused");
  REQUIRE(refused != nullptr);
  CHECK(refused->type == prometheus::MetricType::Gauge);
  REQUIRE(refused->metric.size() == 1);
  CHECK(refused->metric[0].gauge.value == 1);
  const auto* hits = family(fams, "singleflight_cache_hits_total");
  REQUIRE(hits != nullptr);
  CHECK(label(hits->metric[0], "cache") == "profiles");
  CHECK(hits->metric[0].counter.value == 13);
  const auto* gets = family(fams, "singleflight_fleet_gets_total");
  REQUIRE(gets != nullptr);
  CHECK(label(gets->metric[0], "fleet") == "profiles");
  CHECK(gets->metric[0].counter.value == 17);
}

TEST_CASE("a cache's running loads are gauges, its soft-timeout answers a counter",
          "[prometheus][cache]") {
  using scache =
      sf::cache<std::string, std::string, sf::default_hash, std::equal_to<>, sftest::manual_clock>;
  sftest::manual_clock::reset();
  scache profiles;
  sm::prometheus_collector c;
  const auto rc =
      c.add_source({{"cache", "profiles"}}, sm::cache_metrics, [&] { return profiles.stats(); });
  sftest::gate release;
  std::atomic<int> calls{0};
  std::atomic<bool> done{false};
  sftest::jthread t([&] {
    (void)profiles.get("k", [&](sf::stop_token) {
      calls.fetch_add(1);
      release.wait("origin released");
      return std::string("v");
    });
    done.store(true);
  });
  sftest::must([&] { return calls.load() == 1; }, "the loader runs");
  sftest::manual_clock::advance(3s);
  auto fams = c.Collect();
  REQUIRE(fams.size() == sm::cache_metrics.size());
  const auto* running = family(fams, "singleflight_cache_loads_running");
  REQUIRE(running != nullptr);
  REQUIRE(running->type == prometheus::MetricType::Gauge);
  REQUIRE(running->metric[0].gauge.value == 1);
  const auto* stuck = family(fams, "singleflight_cache_loads_stuck");
  REQUIRE(stuck != nullptr);
  REQUIRE(stuck->metric[0].gauge.value == 0);
  const auto* age = family(fams, "singleflight_cache_oldest_load_age_seconds");
  REQUIRE(age != nullptr);
  REQUIRE(age->type == prometheus::MetricType::Gauge);
  REQUIRE(age->metric[0].gauge.value == 3.0);
  const auto* sot = family(fams, "singleflight_cache_stale_on_timeout_total");
  REQUIRE(sot != nullptr);
  REQUIRE(sot->type == prometheus::MetricType::Counter);
  REQUIRE(sot->metric[0].counter.value == 0);
  release.open();
  sftest::must([&] { return done.load(); }, "the get returns");
  t.join();
  sftest::must([&] { return profiles.stats().loads_running == 0; }, "the load is over");
  fams = c.Collect();
  REQUIRE(family(fams, "singleflight_cache_loads_running")->metric[0].gauge.value == 0);
  REQUIRE(family(fams, "singleflight_cache_oldest_load_age_seconds")->metric[0].gauge.value == 0);
}

TEST_CASE("a reset registration is never read again; the group may go right after",
          "[prometheus]") {
  sm::prometheus_collector c;
  auto g = std::make_unique<sf::group<std::string, int>>();
  sm::registration r = c.add(*g, "gone");
  REQUIRE(c.Collect().size() == sm::group_metrics.size());
  r.reset();
  REQUIRE_FALSE(r);
  g.reset();  // ASan: a later read would be a use after free
  REQUIRE(c.Collect().empty());
  // The name is free again.
  const fixed_source s;
  const auto again = c.add(s, "gone");
  REQUIRE(c.Collect().size() == sm::group_metrics.size());
}

TEST_CASE("a registration may outlive its collector, and moves", "[prometheus]") {
  const fixed_source s;
  sm::registration kept;
  {
    auto c = std::make_shared<sm::prometheus_collector>();
    sm::registration r = c->add(s, "a");
    kept = std::move(r);
    REQUIRE_FALSE(r);  // NOLINT(bugprone-use-after-move): moved-from holds nothing
    REQUIRE(kept);
    REQUIRE(c->Collect().size() == sm::group_metrics.size());
  }
  kept.reset();  // the collector is gone: nothing to unregister from, no crash
  REQUIRE_FALSE(kept);
}

TEST_CASE("destroying a registration waits for a scrape reading that source on another thread",
          "[prometheus]") {
  sm::prometheus_collector c;
  sftest::gate release;
  std::atomic<bool> reading{false};
  std::atomic<bool> read_done{false};
  std::optional<sm::registration> r;
  r.emplace(c.add_source({{"group", "slow"}}, sm::group_metrics, [&] {
    reading = true;
    release.wait("snapshot released");
    read_done = true;
    return sf::stats{};
  }));
  std::atomic<std::size_t> families{0};
  sftest::jthread scraper([&] { families = c.Collect().size(); });
  sftest::must([&] { return reading.load(); }, "scrape reading the source");
  std::atomic<bool> destroyed{false};
  std::atomic<bool> read_done_when_destroyed{false};
  sftest::jthread remover([&] {
    r.reset();
    read_done_when_destroyed = read_done.load();
    destroyed = true;
  });
  REQUIRE_FALSE(sftest::becomes([&] { return destroyed.load(); }, 100ms));
  release.open();
  sftest::must([&] { return destroyed.load(); }, "registration destroyed");
  scraper.join();
  REQUIRE(read_done_when_destroyed);
  REQUIRE(families == sm::group_metrics.size());  // the scrape that had started completes
  REQUIRE(c.Collect().empty());
}

TEST_CASE("scrapes race calls, registrations and removals", "[prometheus]") {
  sf::group<int, int> g;
  sm::prometheus_collector c;
  const auto r = c.add(g, "busy");
  std::atomic<bool> stop{false};
  std::atomic<int> scrapes{0};
  std::atomic<int> bad{0};
  {
    std::vector<sftest::jthread> ts;
    ts.emplace_back([&] {
      for (int i = 0; !stop; ++i) g.do_(i % 7, [i] { return i; });
    });
    for (int k = 0; k < 2; ++k) {
      ts.emplace_back([&] {
        while (!stop) {
          const auto fams = c.Collect();
          if (fams.size() != sm::group_metrics.size()) bad.fetch_add(1);
          scrapes.fetch_add(1);
        }
      });
    }
    ts.emplace_back([&] {
      const fixed_source s;
      for (int i = 0; !stop; ++i) {
        const auto tmp = c.add(s, "tmp" + std::to_string(i % 3));
      }
    });
    sftest::must([&] { return scrapes.load() >= 500; }, "500 scrapes");
    stop = true;
  }
  REQUIRE(bad == 0);
  require_matches(c.Collect(), "busy", g.stats());
}
