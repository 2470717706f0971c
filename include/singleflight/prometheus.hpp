// singleflight/prometheus.hpp
//
// `singleflight::metrics::prometheus_collector`: exports groups' counters
// (and any other stats source with a descriptor table, see metrics.hpp) to
// Prometheus through prometheus-cpp, reading `stats()` at scrape time only.
//
//   #include <prometheus/exposer.h>
//   #include <singleflight/prometheus.hpp>
//
//   prometheus::Exposer exposer("127.0.0.1:9464");
//   auto metrics = std::make_shared<singleflight::metrics::prometheus_collector>();
//   exposer.RegisterCollectable(metrics);
//
//   singleflight::group<std::string, profile> profiles;
//   auto registered = metrics->add(profiles, "profiles");  // destroyed before `profiles`
//
// A scrape of /metrics then shows, per registered group:
//
//   # TYPE singleflight_calls_total counter
//   singleflight_calls_total{group="profiles"} 1042
//   ...
//   # TYPE singleflight_in_flight gauge
//   singleflight_in_flight{group="profiles"} 3
//
// with the names of metrics::group_metrics: singleflight_calls_total,
// singleflight_flights_total, singleflight_fn_starts_total,
// singleflight_joins_total, singleflight_rejections_total,
// singleflight_failures_total, singleflight_cancellations_total,
// singleflight_timeouts_total, singleflight_overloaded_total (counters) and
// singleflight_in_flight (gauge). Series of one name from several sources
// (several groups, say) form one metric family.
//
// Cost: nothing per call. Each scrape takes each source's snapshot once
// (for a group, `stats()`: its lock, briefly) and allocates the answer.
//
// This is the only singleflight header that needs prometheus-cpp (Debian's
// prometheus-cpp-dev, headers <prometheus/...>, library prometheus-cpp::core);
// CMake target singleflight::prometheus, defined only when prometheus-cpp is
// found.
//
// Thread safety: every member of prometheus_collector may be called
// concurrently (Collect() is called from the exposer's threads). A
// registration may be destroyed on any thread, concurrently with a scrape.
//
// Lifetime: a source (a group) must outlive its registration; the
// registration's destructor removes the source and, if a scrape is reading it
// at that moment on another thread, waits for that read to finish, so that
// the source may be destroyed as soon as it returns. A registration may
// outlive its collector. Destroying a registration from inside that source's
// own snapshot function (on the scraping thread) deadlocks.
//
// Exceptions: add() throws std::invalid_argument for an invalid metric or
// label name, a label set that would repeat a series already registered
// under one of the table's names, or a name registered with another kind;
// and std::bad_alloc. Collect() lets exceptions of a snapshot function and
// allocation failures propagate (prometheus-cpp's exposer then answers the
// scrape with an error).
#pragma once

#include <prometheus/check_names.h>
#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "metrics.hpp"
#include "stats.hpp"

namespace singleflight::metrics {

namespace detail {

// One exported metric of a source, with its own copies of name and help.
struct exported_metric {
  std::string name;
  std::string help;
  ::prometheus::MetricType type;
};

// A registered stats source: its labels, its metrics and how to read them.
// `m_` serialises reads with removal: a scrape reads the source only while
// it is `alive`, and removal clears `alive` under it (waiting for a read in
// progress). Nothing else is guarded by it.
class metric_source {
 public:
  metric_source(std::vector<::prometheus::ClientMetric::Label> labels,
                std::vector<exported_metric> metrics)
      : labels_(std::move(labels)), metrics_(std::move(metrics)) {}
  metric_source(const metric_source&) = delete;
  metric_source& operator=(const metric_source&) = delete;
  virtual ~metric_source() = default;

  const std::vector<::prometheus::ClientMetric::Label>& labels() const noexcept { return labels_; }
  const std::vector<exported_metric>& metrics() const noexcept { return metrics_; }

  // Appends one value per metric (in metrics() order) to `values`, unless the
  // source was removed. Runs the snapshot function under m_.
  bool read(std::vector<double>& values) {
    const std::lock_guard<std::mutex> lk(m_);
    if (!alive_) return false;
    read_values(values);
    return true;
  }

  // Stops all further reads; returns once no read is in progress.
  void kill() noexcept {
    const std::lock_guard<std::mutex> lk(m_);
    alive_ = false;
  }

 private:
  virtual void read_values(std::vector<double>& values) = 0;

  std::vector<::prometheus::ClientMetric::Label> labels_;
  std::vector<exported_metric> metrics_;
  std::mutex m_;
  bool alive_ = true;  // guarded by m_
};

template <class Stats, class Snapshot>
class typed_source final : public metric_source {
 public:
  typed_source(std::vector<::prometheus::ClientMetric::Label> labels,
               std::vector<exported_metric> metrics,
               std::vector<double (*)(const Stats&) noexcept> readers, Snapshot snapshot)
      : metric_source(std::move(labels), std::move(metrics)),
        readers_(std::move(readers)),
        snapshot_(std::move(snapshot)) {}

 private:
  void read_values(std::vector<double>& values) override {
    const Stats s = snapshot_();
    for (auto* r : readers_) values.push_back(r(s));
  }

  std::vector<double (*)(const Stats&) noexcept> readers_;
  Snapshot snapshot_;
};

// The collector's list of sources, shared with the registrations so that a
// registration may outlive the collector. `m` guards `sources`.
struct source_list {
  std::mutex m;
  std::vector<std::shared_ptr<metric_source>> sources;
};

inline ::prometheus::MetricType to_prometheus(kind k) noexcept {
  return k == kind::gauge ? ::prometheus::MetricType::Gauge : ::prometheus::MetricType::Counter;
}

}  // namespace detail

// registration
//
// Keeps one source registered with a prometheus_collector; the destructor
// (or reset()) removes it, waiting for a scrape that is reading it on another
// thread. Movable, not copyable. A default-constructed or moved-from
// registration holds nothing.
class registration {
 public:
  registration() noexcept = default;
  registration(std::weak_ptr<detail::source_list> list,
               std::shared_ptr<detail::metric_source> source) noexcept
      : list_(std::move(list)), source_(std::move(source)) {}
  registration(registration&& o) noexcept = default;
  registration& operator=(registration&& o) noexcept {
    if (this != &o) {
      reset();
      list_ = std::move(o.list_);
      source_ = std::move(o.source_);
    }
    return *this;
  }
  registration(const registration&) = delete;
  registration& operator=(const registration&) = delete;
  ~registration() { reset(); }

  // reset(): removes the source now; after it returns the collector never
  // reads it again. Thread-safe with respect to scrapes; noexcept.
  void reset() noexcept {
    if (!source_) return;
    if (auto list = list_.lock()) {
      const std::lock_guard<std::mutex> lk(list->m);
      auto& v = list->sources;
      v.erase(std::remove(v.begin(), v.end(), source_), v.end());
    }
    source_->kill();  // a scrape that copied the list before the erase skips it from now on
    source_.reset();
    list_.reset();
  }

  explicit operator bool() const noexcept { return source_ != nullptr; }

 private:
  std::weak_ptr<detail::source_list> list_;
  std::shared_ptr<detail::metric_source> source_;
};

// prometheus_collector
//
// A prometheus::Collectable: register it with a prometheus::Exposer (or
// anything that collects Collectables), then add() sources to it. Hold it in
// a std::shared_ptr (the exposer keeps a weak_ptr).
class prometheus_collector final : public ::prometheus::Collectable {
 public:
  prometheus_collector() : list_(std::make_shared<detail::source_list>()) {}
  prometheus_collector(const prometheus_collector&) = delete;
  prometheus_collector& operator=(const prometheus_collector&) = delete;
  ~prometheus_collector() override = default;

  // add(group, name, labels = {})
  //
  // Exports `g.stats()` under metrics::group_metrics with the label
  // group="<name>" (plus `labels`, e.g. {{"service", "api"}}). Works for
  // anything whose stats() returns singleflight::stats. `g` must outlive the
  // returned registration. Throws std::invalid_argument (see the top of this
  // file) or std::bad_alloc, registering nothing.
  template <class Group>
  requires requires(const Group& g) {
    { g.stats() } -> std::convertible_to<stats>;
  }
  [[nodiscard]] registration add(const Group& g, const std::string& name,
                                 ::prometheus::Labels labels = {}) {
    if (labels.count("group") != 0) {
      throw std::invalid_argument(
          "singleflight::metrics::prometheus_collector::add: the \"group\" label is the name "
          "argument; do not pass it in labels");
    }
    labels.emplace("group", name);
    return add_source(std::move(labels), group_metrics, [&g]() -> stats { return g.stats(); });
  }

  // add_source(labels, table, snapshot)
  //
  // The generic form, for layers with their own stats type: exports every
  // descriptor of `table` with `labels`, reading `snapshot()` (a callable
  // returning Stats) once per scrape. `snapshot` and whatever it refers to
  // must stay valid until the registration is destroyed; it runs on the
  // scraping thread, under a lock of this source only (the registration's
  // destructor waits for it), and must not add or remove sources of this
  // collector. Throws std::invalid_argument or std::bad_alloc, registering
  // nothing.
  template <class Stats, std::size_t N, class Snapshot>
  requires std::invocable<Snapshot&> && std::convertible_to<std::invoke_result_t<Snapshot&>, Stats>
  [[nodiscard]] registration add_source(::prometheus::Labels labels,
                                        std::span<const descriptor<Stats>, N> table,
                                        Snapshot snapshot) {
    std::vector<::prometheus::ClientMetric::Label> label_list;
    for (const auto& [k, v] : labels) {
      if (!::prometheus::CheckLabelName(k) || k.rfind("__", 0) == 0) {
        throw std::invalid_argument("singleflight::metrics: invalid label name \"" + k + "\"");
      }
      label_list.push_back({k, v});
    }
    std::vector<detail::exported_metric> metrics;
    std::vector<double (*)(const Stats&) noexcept> readers;
    for (const descriptor<Stats>& d : table) {
      std::string metric_name(d.name);
      if (!::prometheus::CheckMetricName(metric_name) || d.read == nullptr) {
        throw std::invalid_argument("singleflight::metrics: invalid metric \"" + metric_name +
                                    "\" (name or read function)");
      }
      metrics.push_back(
          {std::move(metric_name), std::string(d.help), detail::to_prometheus(d.kind)});
      readers.push_back(d.read);
    }
    auto source = std::make_shared<detail::typed_source<Stats, Snapshot>>(
        std::move(label_list), std::move(metrics), std::move(readers), std::move(snapshot));

    const std::lock_guard<std::mutex> lk(list_->m);
    for (const auto& other : list_->sources) check_compatible(*other, *source);
    list_->sources.push_back(source);
    return registration(list_, std::move(source));
  }

  // add_source(labels, std::array table, snapshot): the same with a table
  // declared as a std::array (as metrics::group_metrics is).
  template <class Stats, std::size_t N, class Snapshot>
  requires std::invocable<Snapshot&> && std::convertible_to<std::invoke_result_t<Snapshot&>, Stats>
  [[nodiscard]] registration add_source(::prometheus::Labels labels,
                                        const std::array<descriptor<Stats>, N>& table,
                                        Snapshot snapshot) {
    return add_source(std::move(labels), std::span<const descriptor<Stats>, N>(table),
                      std::move(snapshot));
  }

  // Collect(): one MetricFamily per metric name, in the order names were
  // first registered; within a family, one sample per source, in
  // registration order. Called by the exposer on each scrape. Thread-safe.
  std::vector<::prometheus::MetricFamily> Collect() const override {
    std::vector<std::shared_ptr<detail::metric_source>> sources;
    {
      const std::lock_guard<std::mutex> lk(list_->m);
      sources = list_->sources;
    }
    std::vector<::prometheus::MetricFamily> families;
    std::vector<double> values;
    for (const auto& src : sources) {
      values.clear();
      if (!src->read(values)) continue;  // removed meanwhile
      const auto& metrics = src->metrics();
      for (std::size_t i = 0; i < metrics.size(); ++i) {
        const detail::exported_metric& m = metrics[i];
        auto fam =
            std::find_if(families.begin(), families.end(),
                         [&](const ::prometheus::MetricFamily& f) { return f.name == m.name; });
        if (fam == families.end()) {
          families.push_back({m.name, m.help, m.type, {}});
          fam = std::prev(families.end());
        }
        ::prometheus::ClientMetric sample;
        sample.label = src->labels();
        if (m.type == ::prometheus::MetricType::Gauge) {
          sample.gauge.value = values[i];
        } else {
          sample.counter.value = values[i];
        }
        fam->metric.push_back(std::move(sample));
      }
    }
    return families;
  }

 private:
  // Two sources may share a metric name only with the same kind and
  // different label sets (one family, distinct series).
  static void check_compatible(const detail::metric_source& a, const detail::metric_source& b) {
    for (const auto& ma : a.metrics()) {
      for (const auto& mb : b.metrics()) {
        if (ma.name != mb.name) continue;
        if (ma.type != mb.type) {
          throw std::invalid_argument("singleflight::metrics: \"" + ma.name +
                                      "\" is already registered as another kind of metric");
        }
        if (a.labels() == b.labels()) {
          throw std::invalid_argument(
              "singleflight::metrics: a source with the same labels "
              "already exports \"" +
              ma.name + "\" (give each group its own name)");
        }
      }
    }
  }

  std::shared_ptr<detail::source_list> list_;
};

}  // namespace singleflight::metrics
