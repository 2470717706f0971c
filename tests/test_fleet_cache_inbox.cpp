// detail::invalidation_inbox (detail/fleet/invalidation_inbox.hpp): what fleet_cache's bus told a
// process and its local cache has not applied yet. No Redis: the test plays the subscriber's
// thread (on_message, on_confirmed, on_settled) and the callers (apply).
#include <singleflight/detail/fleet/invalidation_inbox.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/jthread.hpp"
#include "support/sync.hpp"

namespace {

namespace d = singleflight::detail;

const std::string self(32, 'a');
const std::string other(32, 'b');

struct applied {
  std::vector<std::string> dropped;  // in order; "stale-all" for a whole stale mark
  std::vector<std::string> expired;
  int clears = 0;
  int stale_alls = 0;
  void from(d::invalidation_inbox& in) {
    in.apply([this](const std::string& k) { dropped.push_back(k); }, [this] { clears += 1; },
             [this](const std::string& k) { expired.push_back(k); },
             [this] {
               stale_alls += 1;
               dropped.emplace_back("stale-all");
             });
  }
};

}  // namespace

TEST_CASE("inbox: other writers' keys are applied once, in order; its own are not",
          "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 16);
  applied a;
  a.from(in);
  CHECK(a.dropped.empty());
  in.on_message(other + "k1");
  in.on_message(self + "mine");
  in.on_message(other + "k2");
  in.on_message("short");  // not a bus message
  a.from(in);
  CHECK(a.dropped == std::vector<std::string>{"k1", "k2"});
  CHECK(a.clears == 0);
  a.from(in);
  CHECK(a.dropped.size() == 2);
  CHECK(in.received() == 2);
}

TEST_CASE(
    "inbox under client tracking: a value's name drops its key (written by anyone, this "
    "process too), other names of the prefix and other prefixes are ignored, a FLUSHALL clears",
    "[fleet][fleet_cache]") {
  const std::string tracked = d::tracking_prefix("p:x");
  CHECK(tracked == "{3:p:x:");
  d::invalidation_inbox in(self, 16, tracked);
  applied a;
  in.on_message(d::fleet_names::of("p:x", "k1").value);
  in.on_message(d::fleet_names::of("p:x", "k1").lease);
  in.on_message(d::fleet_names::of("p:x", "k1").meta);
  in.on_message(d::fleet_names::of("p:x", "k1").tomb("0123"));
  in.on_message(d::fleet_names::of("p:xy", "k1").value);   // another prefix
  in.on_message(d::fleet_names::of("p:x", "a}:v").value);  // the text may hold "}:v"
  in.on_message(d::fleet_names::of("p:x", "").value);
  in.on_message(self + "k2");  // a bus message is no value name
  a.from(in);
  CHECK(a.dropped == std::vector<std::string>{"k1", "a}:v", ""});
  CHECK(a.clears == 0);
  CHECK(in.received() == 3);
  in.on_message(d::fleet_names::of("p:x", "k3").value);
  in.on_flushed();
  a.from(in);
  CHECK(a.clears == 1);
  CHECK(a.dropped.size() == 3);  // the clear covers k3
  CHECK(in.resyncs() == 0);
  CHECK(in.overflows() == 0);
}

TEST_CASE(
    "inbox: a confirmation, or more keys than max_pending, is one stale mark of everything; "
    "the keys recorded are still dropped, after it",
    "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 2);
  applied a;
  in.on_message(other + "before");
  in.on_confirmed();
  in.on_settled();
  in.on_message(other + "after");
  a.from(in);
  CHECK(a.stale_alls == 1);
  CHECK(a.clears == 0);
  CHECK(a.dropped == std::vector<std::string>{"stale-all", "before", "after"});
  CHECK(in.resyncs() == 1);
  CHECK(in.overflows() == 0);
  a.dropped.clear();
  for (const char* k : {"x", "y", "z", "w"}) in.on_message(other + k);
  a.from(in);
  CHECK(a.stale_alls == 2);
  CHECK(a.clears == 0);
  CHECK(a.dropped == std::vector<std::string>{"stale-all", "x", "y"});  // z, w: the mark
  CHECK(in.overflows() == 1);                                           // once per apply
  a.dropped.clear();
  in.on_message(other + "next");
  a.from(in);
  CHECK(a.dropped == std::vector<std::string>{"next"});  // the mark was taken: no new one
  CHECK(a.stale_alls == 2);
}

TEST_CASE(
    "inbox: the confirmations of one reconnect (the coherence channel's, the expire channel's) "
    "are one stale mark, posted once they are settled; an apply between them marks nothing",
    "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 16);
  applied a;
  in.on_confirmed();
  in.on_message(other + "k");  // heard on the channel already confirmed
  a.from(in);
  CHECK(a.dropped == std::vector<std::string>{"k"});
  CHECK(a.stale_alls == 0);
  CHECK(in.resyncs() == 0);
  in.expire_listener()->on_confirmed();
  a.from(in);
  CHECK(a.stale_alls == 0);
  in.on_settled();
  in.expire_listener()->on_settled();  // the subscriber tells each listener: one mark
  a.from(in);
  CHECK(a.stale_alls == 1);
  CHECK(in.resyncs() == 2);  // each confirmation counted
  in.on_settled();           // nothing new confirmed
  a.from(in);
  CHECK(a.stale_alls == 1);
  CHECK(in.resyncs() == 2);
}

TEST_CASE(
    "inbox: stale_all(since) is given when the mark was posted, not when it is applied; two "
    "marks before one apply keep the first's time",
    "[fleet][fleet_cache]") {
  using clock = std::chrono::steady_clock;
  d::invalidation_inbox in(self, 2);
  std::vector<clock::time_point> marks;
  const auto take = [&] {
    in.apply([](const std::string&) {}, [] {}, [](const std::string&) {},
             [&](clock::time_point since) { marks.push_back(since); });
  };
  const clock::time_point t0 = clock::now();
  in.on_confirmed();
  in.on_settled();
  const clock::time_point t1 = clock::now();
  // Time passing before the first caller applies it (not an interleaving: one thread).
  const clock::time_point later = t1 + std::chrono::milliseconds(2);
  while (clock::now() < later) {
  }
  for (const char* k : {"x", "y", "z"}) in.on_message(other + k);  // an overflow: a 2nd mark
  take();
  REQUIRE(marks.size() == 1);
  CHECK(marks[0] >= t0);
  CHECK(marks[0] <= t1);

  const clock::time_point t2 = clock::now();
  for (const char* k : {"x", "y", "z"}) in.on_message(other + k);  // an overflow alone
  const clock::time_point t3 = clock::now();
  take();
  REQUIRE(marks.size() == 2);
  CHECK(marks[1] >= t2);
  CHECK(marks[1] <= t3);
}

TEST_CASE("inbox: a FLUSHALL after a confirmation is one clear, which covers the stale mark",
          "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 16, d::tracking_prefix("p:x"));
  applied a;
  in.on_confirmed();
  in.on_settled();
  in.on_message(d::fleet_names::of("p:x", "k").value);
  in.on_flushed();
  a.from(in);
  CHECK(a.clears == 1);
  CHECK(a.stale_alls == 0);
  CHECK(a.dropped.empty());
}

TEST_CASE(
    "inbox: a drop that re-enters apply on its own thread (a T destroyed by the local "
    "cache's invalidate calling the fleet_cache) returns instead of waiting for itself",
    "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 16);
  in.on_message(other + "k");
  std::atomic<bool> done{false};
  std::atomic<int> inner{0};
  sftest::jthread t([&] {
    in.apply(
        [&](const std::string&) {
          in.on_message(other + "during");  // heard while applying: the inner call wants it
          in.apply([&](const std::string&) { inner.fetch_add(1); }, [] {});
        },
        [] {});
    done.store(true);
  });
  sftest::must([&] { return done.load(); }, "the re-entrant apply returns");
  t.join();
  CHECK(inner.load() == 0);  // the inner call applied nothing; the next call applies it
  applied a;
  a.from(in);
  CHECK(a.dropped == std::vector<std::string>{"during"});
}

TEST_CASE(
    "inbox: a caller that finds another applying returns only once what was posted before it "
    "is applied",
    "[fleet][fleet_cache]") {
  d::invalidation_inbox in(self, 16);
  in.on_message(other + "k");
  sftest::gate in_drop;
  sftest::gate let_go;
  std::atomic<bool> dropped{false};
  std::atomic<bool> second_saw_it{false};
  sftest::jthread first([&] {
    in.apply(
        [&](const std::string&) {
          in_drop.open();
          let_go.wait("the test lets the first caller finish");
          dropped.store(true);
        },
        [] {});
  });
  in_drop.wait("the first caller applies");
  std::atomic<bool> second_done{false};
  sftest::jthread second([&] {
    in.apply([](const std::string&) {}, [] {});
    second_saw_it.store(dropped.load());
    second_done.store(true);
  });
  let_go.open();
  sftest::must([&] { return second_done.load(); }, "the second caller returns");
  first.join();
  second.join();
  CHECK(second_saw_it.load());
}
