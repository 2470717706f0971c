// bench/bench_traces.cpp: singleflight::cache's eviction on real traces. Not a timing benchmark
// (the figures are hit ratios): a plain program, built with the other benchmarks, run by
// bench/traces.sh (docs/cache.md, "Eviction, measured", holds one run's table).
//
//   bench_traces [--traces DIR] [--shards N] [--only NAME] [--no-r06] [--windows]
//   bench_traces --self-test
//
// For each trace of ../shared/traces (formats and licences in its README; read from DIR,
// $SINGLEFLIGHT_TRACES, or ../shared/traces next to the repository, decompressed at run time) at
// three capacities, and for a round-robin hot set of 1.00x and 1.05x max_entries, the hit ratio
// (hits / accesses, in %) of
//   cache     singleflight::cache<uint32_t, uint32_t> itself, max_entries = the capacity, every
//             access a get() whose loader returns the key (ttl 24 h on a clock that never moves),
//             with its real sharding (this machine's default, or N shards with --shards)
//   1 shard   the same cache with one shard: the unsharded policy
//   LRU       plain LRU
//   W-TinyLFU the TinyLFU paper's static W-TinyLFU (reference.hpp: a 1 % window, exact LRU lists)
//   climber   W-TinyLFU with its window sized by Caffeine's hill climber (reference.hpp,
//             w_tinylfu_sized_hits with window_rule::climb): the policy Caffeine ships
//   ARC       ARC (reference.hpp, arc_replay), exact lists
//   LIRS      LIRS (reference.hpp, lirs_replay), 1 % HIR share
//   OPT       Belady's MIN, the limit
// then the mean gap of the cache to OPT, and the cells where the cache trails LRU or the
// unsharded policy; then the cells where the cache, and LIRS, miss the goal "at least the best
// of S3-FIFO (the four settings of the r06 table) and ARC, minus 0.5 points" (with --no-r06,
// against ARC alone), those where LIRS trails LRU, and those where the cache trails the better
// of the two W-TinyLFU models by more than 5 points, and by more than 1. Then (unless --no-r06) the
// S3-FIFO choices the library made, measured with the reference model of reference.hpp: promotion
// after 1 or 2 hits in small, ghost of 1.0x or 0.9x the capacity, on the same cells; two more
// policies of the literature, SIEVE and 2Q (reference.hpp), on the same cells, with the cells
// where they trail LRU and the S3-FIFO/ARC bar; and a scan case (with ARC, LIRS, SIEVE and 2Q).
// --self-test replays small hand-made traces whose hits are known through the ARC, LIRS, SIEVE
// and 2Q models (and random ones, against OPT and the capacity) and exits non-zero on a
// mismatch.
// --windows prints instead how W-TinyLFU's window size decides its hit ratio on the same cells:
// fixed windows, Caffeine's hill climber and a ghost-feedback rule (reference.hpp,
// w_tinylfu_sized_hits), each with the window's final share of the capacity.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define SINGLEFLIGHT_TEST_HOOKS  // detail::cache_shards_for_tests
// include/singleflight/detail/group/flight.hpp trips -Wshadow (see bench_group.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include "singleflight/cache.hpp"
#pragma GCC diagnostic pop

#include "traces/reference.hpp"
#include "traces/trace_file.hpp"

namespace sf = singleflight;

namespace {

// A clock that never moves: nothing expires, so every miss is the policy's.
struct still_clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<still_clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(std::chrono::hours(1)); }
};

using trace_cache =
    sf::cache<std::uint32_t, std::uint32_t, sf::default_hash, std::equal_to<>, still_clock>;

// The cache's hits over a trace, with `shards` shards (0: the default).
double cache_ratio(const std::vector<std::uint32_t>& t, std::size_t capacity, std::size_t shards,
                   std::size_t* shards_used = nullptr) {
  sf::detail::cache_shards_for_tests.store(shards, std::memory_order_relaxed);
  sf::cache_options o;
  o.ttl = std::chrono::hours(24);
  o.jitter = 0;
  o.max_entries = capacity;
  trace_cache c(o);
  sf::detail::cache_shards_for_tests.store(0, std::memory_order_relaxed);
  std::size_t worst = 0;
  for (const std::uint32_t k : t) {
    (void)c.get(k, [k] { return k; });
    worst = std::max(worst, c.size());
  }
  if (worst > capacity) {
    std::fprintf(stderr, "size() %zu exceeded max_entries %zu\n", worst, capacity);
    std::exit(1);
  }
  if (shards_used != nullptr) {
    *shards_used = sf::detail::cache_shards_last_made.load(std::memory_order_relaxed);
  }
  return 100.0 * static_cast<double>(c.stats().hits) / static_cast<double>(t.size());
}

double pct(std::uint64_t hits, const std::vector<std::uint32_t>& t) {
  return 100.0 * static_cast<double>(hits) / static_cast<double>(t.size());
}

struct cell {
  std::string trace;
  std::size_t capacity;
  const std::vector<std::uint32_t>* keys;
};

}  // namespace

// --windows: W-TinyLFU's hit ratio by the rule that sizes its window (reference model,
// unsharded), next to LRU and the S3-FIFO model; "w" is the window's final share.
template <class Cells>
int window_study(const Cells& cells) {
  using rule = sftrace::window_rule;
  struct column {
    const char* name;
    rule r;
  };
  const column cols[] = {
      {"fixed 1 %", {rule::fixed, 0.01}},
      {"fixed 20 %", {rule::fixed, 0.20}},
      {"fixed 60 %", {rule::fixed, 0.60}},
      {"hill climber", {rule::climb, 0.01}},
      {"ghosts 0.25 / 0.25", {rule::ghosts, 0.01, 0.25, 0.25}},
      {"ghosts 0.10 / 0.25", {rule::ghosts, 0.01, 0.10, 0.25}},
      {"ghosts 0.02 / 0.25", {rule::ghosts, 0.01, 0.02, 0.25}},
      {"ghosts 0.25 / 0.25, age < 1x", {rule::ghosts, 0.01, 0.25, 0.25, 1.0}},
  };
  std::printf(
      "W-TinyLFU by window rule (reference model, unsharded): hit ratio %% (final window "
      "share)\n\n| trace | capacity | LRU | S3-FIFO |");
  for (const column& c : cols) std::printf(" %s |", c.name);
  std::printf("\n|---|---:|---:|---:|");
  for (std::size_t i = 0; i < std::size(cols); ++i) std::printf("---:|");
  std::printf("\n");
  for (const auto& c : cells) {
    const auto& t = *c.keys;
    std::printf("| %s | %zu | %.2f | %.2f |", c.trace.c_str(), c.capacity,
                pct(sftrace::lru_hits(t, c.capacity), t),
                pct(sftrace::s3fifo_hits(t, c.capacity, 2, 0.9), t));
    for (const column& col : cols) {
      double w = 0;
      const double r = pct(sftrace::w_tinylfu_sized_hits(t, c.capacity, col.r, &w), t);
      std::printf(" %.2f (%.0f) |", r, 100 * w);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

// --self-test: the ARC, LIRS, SIEVE and 2Q models on traces whose answers are known by hand.
int self_test() {
  int failed = 0;
  const auto check = [&failed](const char* what, double got, double want) {
    const bool ok = got == want;
    std::printf("%s %-60s got %g, want %g\n", ok ? "ok  " : "FAIL", what, got, want);
    if (!ok) ++failed;
  };
  const auto count = [](const std::vector<bool>& h) {
    return static_cast<double>(std::count(h.begin(), h.end(), true));
  };
  const auto keys = [](const char* s) {
    std::vector<std::uint32_t> t;
    for (; *s != '\0'; ++s) {
      if (*s != ' ') t.push_back(static_cast<std::uint32_t>(*s));
    }
    return t;
  };
  // A set smaller than the cache, read 50 times: every access but the first of each key hits.
  std::vector<std::uint32_t> small;
  for (int r = 0; r < 50; ++r) {
    for (std::uint32_t k = 0; k < 8; ++k) small.push_back(k);
  }
  check("small set, ARC c=10", count(sftrace::arc_replay(small, 10)), 50 * 8 - 8);
  check("small set, LIRS c=10", count(sftrace::lirs_replay(small, 10)), 50 * 8 - 8);
  check("small set, LRU c=10", static_cast<double>(sftrace::lru_hits(small, 10)), 50 * 8 - 8);
  check("small set, SIEVE c=10", count(sftrace::sieve_replay(small, 10)), 50 * 8 - 8);
  check("small set, 2Q c=10", count(sftrace::two_q_replay(small, 10)), 50 * 8 - 8);
  // SIEVE, traced by hand with c = 3 (the queue head first, * a set bit): a b c (c b a); a hits
  // (c b a*); d: the hand starts at the tail, clears a, evicts b and stops at c (d c a); b: the
  // hand evicts c and stops at d (b d a); e: the hand evicts d and stops at b (e b a); a hits,
  // kept at the tail although read before b, d and e. 2 hits; LRU evicts a at e: 1 hit.
  {
    const auto t = keys("a b c a d b e a");
    const auto h = sftrace::sieve_replay(t, 3);
    check("SIEVE hand trace c=3: hits", count(h), 2);
    check("SIEVE hand trace c=3: the last a hits", h[7] ? 1 : 0, 1);
    check("SIEVE hand trace c=3: LRU hits", static_cast<double>(sftrace::lru_hits(t, 3)), 1);
  }
  // SIEVE, c = 2, the hand wrapping: a b, then both hit (b* a*); c: the hand clears a and b,
  // wraps to the tail, evicts a and leaves the hand at b (c b); b hits (c b*); a: the hand
  // clears b, evicts c, the head, and starts from the tail again (a b). 3 hits.
  {
    const auto h = sftrace::sieve_replay(keys("a b a b c b a c"), 2);
    check("SIEVE hand trace c=2, the hand wraps: hits", count(h), 3);
    check("SIEVE hand trace c=2, the hand wraps: c was evicted", h[7] ? 1 : 0, 0);
  }
  // 2Q, traced by hand with c = 4 (Kin = 1, Kout = 2; lists head first): a b c d fill A1in
  // (d c b a); a hits in A1in, which does not move it; e: A1in holds more than Kin, so its tail
  // a goes to A1out (a), e to A1in (e d c b); a misses, is found in A1out and enters Am (a),
  // b going to A1out; f sends c to A1out (c b), enters A1in (f e d); a hits in Am; b misses,
  // is found in A1out and enters Am (b a), d going to A1out (d c); e hits in A1in. 3 hits; LRU
  // (a e d c, then a f e d, then b a f e) hits 4.
  {
    const auto t = keys("a b c d a e a f a b e");
    const auto h = sftrace::two_q_replay(t, 4);
    check("2Q hand trace c=4: hits", count(h), 3);
    check("2Q hand trace c=4: a back from A1out misses", h[6] ? 1 : 0, 0);
    check("2Q hand trace c=4: then hits in Am", h[8] ? 1 : 0, 1);
    check("2Q hand trace c=4: LRU hits", static_cast<double>(sftrace::lru_hits(t, 4)), 4);
  }
  // ARC, traced by hand with c = 2 through Fig. 4's cases (I: a b c a a; II at the 7th and
  // 10th access, from B1; III at the 8th and 13th, from B2; IV-A at c, a; IV-B at b, d):
  // 3 hits, and at the end p = 0, T1 = {}, T2 = {b, a}, B1 = {d}, B2 = {c}.
  {
    sftrace::policy_probe pr;
    const auto h = sftrace::arc_replay(keys("a b c a a b c a c b d b a"), 2, &pr);
    check("ARC hand trace c=2: hits", count(h), 3);
    check("ARC hand trace c=2: p", pr.p, 0);
    check("ARC hand trace c=2: |T1|", static_cast<double>(pr.t1), 0);
    check("ARC hand trace c=2: |T2|", static_cast<double>(pr.t2), 2);
    check("ARC hand trace c=2: |B1|", static_cast<double>(pr.b1), 1);
    check("ARC hand trace c=2: |B2|", static_cast<double>(pr.b2), 1);
  }
  // ARC, c = 3 (T lists LRU first): a, d read twice (T2 = a d); e, b, c miss, T1's LRU
  // entries going to B1 (B1 = e b, T1 = c); e from B1 raises p by 1 (|B1| >= |B2|) to 1 and
  // sends a to B2; f sends d to B2 (|T1| = 1 is not above p); b from B1, with |B2| = 2 against
  // |B1| = 1, raises p by 2 to 3 and sends e to B2: 2 hits, p = 3, T1 = c f, T2 = b, B1 = {},
  // B2 = a d e.
  {
    sftrace::policy_probe pr;
    const auto h = sftrace::arc_replay(keys("a d a d e b c e f b"), 3, &pr);
    check("ARC hand trace c=3: hits", count(h), 2);
    check("ARC hand trace c=3: p (a step of |B2| / |B1|)", pr.p, 3);
    check("ARC hand trace c=3: |T1|", static_cast<double>(pr.t1), 2);
    check("ARC hand trace c=3: |B2|", static_cast<double>(pr.b2), 3);
  }
  // Scan resistance: 5 hot keys read twice (in T2), a scan of 100 keys read once (T1 only, p
  // stays 0), then the hot keys again: ARC keeps all 5, LRU none.
  {
    std::vector<std::uint32_t> t;
    for (int r = 0; r < 2; ++r) {
      for (std::uint32_t k = 0; k < 5; ++k) t.push_back(k);
    }
    for (std::uint32_t k = 100; k < 200; ++k) t.push_back(k);
    for (std::uint32_t k = 0; k < 5; ++k) t.push_back(k);
    const auto h = sftrace::arc_replay(t, 10);
    check("hot set over a scan, ARC c=10: last 5 hits",
          static_cast<double>(std::count(h.end() - 5, h.end(), true)), 5);
    check("hot set over a scan, ARC c=10: hits", count(h), 10);
    check("hot set over a scan, LRU c=10", static_cast<double>(sftrace::lru_hits(t, 10)), 5);
  }
  // A loop of 110 keys, 20 rounds, in a cache of 100: LRU never hits; LIRS keeps its 99 LIR
  // keys (the first 99 keys of the first round) and hits them in every later round.
  {
    std::vector<std::uint32_t> t;
    for (int r = 0; r < 20; ++r) {
      for (std::uint32_t k = 0; k < 110; ++k) t.push_back(k);
    }
    check("loop 1.1x, LRU c=100", static_cast<double>(sftrace::lru_hits(t, 100)), 0);
    check("loop 1.1x, LIRS c=100", count(sftrace::lirs_replay(t, 100)), 19 * 99);
    // LIRS with a 10 % HIR share: 90 LIR keys hit in every later round.
    check("loop 1.1x, LIRS c=100, HIR 10 %", count(sftrace::lirs_replay(t, 100, 0.10)), 19 * 90);
  }
  // LIRS, traced by hand with c = 3 (L_lirs = 2, L_hirs = 1; S top first): a, b become LIR,
  // c resident HIR (S = c b a, Q = c); a hits (S = a c b); d evicts c, which stays in S as
  // non-resident, and enters as HIR (S = d a c b, Q = d); c, a miss on a key still in S,
  // evicts d (non-resident) and becomes LIR, demoting S's bottom LIR key b to Q (S = c d a,
  // Q = b); b hits in Q and, not in S, stays HIR (S = b c d a); a hits, and pruning drops d
  // (S = a b c). 3 hits.
  {
    const auto h = sftrace::lirs_replay(keys("a b c a d c b a"), 3);
    check("LIRS hand trace c=3: hits", count(h), 3);
    check("LIRS hand trace c=3: c returns a miss", h[5] ? 1 : 0, 0);
    check("LIRS hand trace c=3: b hits from Q", h[6] ? 1 : 0, 1);
  }
  // LIRS, c = 3: a, b LIR, c resident HIR; c hits while in S, so it becomes LIR and S's
  // bottom LIR key a goes to Q (S = c b); d evicts a, which S no longer holds, so it is
  // forgotten; a misses. 1 hit.
  {
    const auto h = sftrace::lirs_replay(keys("a b c c d a"), 3);
    check("LIRS hand trace c=3, a HIR hit in S: hits", count(h), 1);
    check("LIRS hand trace c=3, a HIR hit in S: a misses", h[5] ? 1 : 0, 0);
  }
  // Random traces: neither model beats OPT, holds more than the capacity, or tracks more
  // than 2x the capacity keys.
  std::uint64_t seed = 42;
  for (int n = 0; n < 20; ++n) {
    std::vector<std::uint32_t> t;
    const std::uint32_t span = 20 + 37 * static_cast<std::uint32_t>(n);
    for (int i = 0; i < 20000; ++i) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      const auto r = static_cast<std::uint32_t>(seed >> 33U);
      t.push_back(r % 4 == 0 ? r % span : r % (span / 5 + 1));  // a skewed mix
    }
    const std::size_t c = 5 + 7 * static_cast<std::size_t>(n);
    const double opt = static_cast<double>(sftrace::optimal_hits(t, sftrace::next_use(t), c));
    sftrace::policy_probe a;
    sftrace::policy_probe l;
    const double arc = count(sftrace::arc_replay(t, c, &a));
    const double lirs = count(sftrace::lirs_replay(t, c, 0.01, 1.0, &l));
    if (arc > opt || lirs > opt || a.peak_resident > c || l.peak_resident > c ||
        a.peak_tracked > 2 * c || l.peak_tracked > 2 * c) {
      std::printf(
          "FAIL random trace %d (c=%zu): OPT %g, ARC %g (%zu resident, %zu tracked), "
          "LIRS %g (%zu, %zu)\n",
          n, c, opt, arc, a.peak_resident, a.peak_tracked, lirs, l.peak_resident, l.peak_tracked);
      ++failed;
    }
    // SIEVE holds at most c keys; 2Q at most c resident and Kout = c / 2 remembered.
    sftrace::policy_probe sv;
    sftrace::policy_probe q;
    const double sieve = count(sftrace::sieve_replay(t, c, &sv));
    const double two_q = count(sftrace::two_q_replay(t, c, 0.25, 0.5, &q));
    if (sieve > opt || two_q > opt || sv.peak_resident > c || q.peak_resident > c ||
        q.peak_tracked > c + std::max<std::size_t>(1, c / 2)) {
      std::printf(
          "FAIL random trace %d (c=%zu): OPT %g, SIEVE %g (%zu resident), 2Q %g (%zu, %zu)\n", n, c,
          opt, sieve, sv.peak_resident, two_q, q.peak_resident, q.peak_tracked);
      ++failed;
    }
  }
  std::printf("random traces: %s\n%d failed\n", failed == 0 ? "ok" : "see above", failed);
  return failed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const char* dir_arg = nullptr;
  const char* only = nullptr;
  std::size_t shards = 0;
  bool r06 = true;
  bool windows = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--traces" && i + 1 < argc) {
      dir_arg = argv[++i];
    } else if (a == "--shards" && i + 1 < argc) {
      shards = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--no-r06") {
      r06 = false;
    } else if (a == "--windows") {
      windows = true;
    } else if (a == "--self-test") {
      return self_test();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--traces DIR] [--shards N] [--only NAME] [--no-r06] [--windows] | "
                   "--self-test\n",
                   argv[0]);
      return 2;
    }
  }
  const auto dir = sftrace::traces_dir(dir_arg);
  std::vector<std::vector<std::uint32_t>> traces;
  traces.reserve(std::size(sftrace::all_traces) + 2);
  std::vector<cell> cells;
  for (const auto& spec : sftrace::all_traces) {
    if (only != nullptr && std::strcmp(only, spec.name) != 0) continue;
    traces.push_back(sftrace::read_trace(dir, spec));
    for (const std::size_t c : spec.capacity) cells.push_back({spec.name, c, &traces.back()});
  }
  if (only == nullptr || std::strcmp(only, "round-robin") == 0) {
    traces.push_back(sftrace::round_robin(1024, 100));
    cells.push_back({"round-robin 1.00x", 1024, &traces.back()});
    traces.push_back(sftrace::round_robin(1075, 100));
    cells.push_back({"round-robin 1.05x", 1024, &traces.back()});
  }

  if (windows) return window_study(cells);
  std::printf("shards: %s\n\n", shards == 0 ? "the default for this machine" : "--shards");
  std::printf(
      "| trace | capacity | shards | cache | 1 shard | LRU | W-TinyLFU | climber | ARC | LIRS | "
      "OPT | "
      "cache - OPT |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  double gap_sum = 0;
  int below_lru = 0;
  double worst_shard_loss = 0;
  std::string worst_shard_cell;
  // Per cell: the cache, LRU, the better W-TinyLFU model, ARC, LIRS and (with r06) the four
  // S3-FIFO settings, SIEVE and 2Q.
  struct row {
    double mine, lru, wtinylfu, arc, lirs;
    double s3[4];
    double sieve, two_q;
  };
  std::vector<row> rows;
  for (const cell& c : cells) {
    const auto& t = *c.keys;
    std::size_t used = 0;
    row r{};
    r.mine = cache_ratio(t, c.capacity, shards, &used);
    const double one = cache_ratio(t, c.capacity, 1);
    r.lru = pct(sftrace::lru_hits(t, c.capacity), t);
    const double wt = pct(sftrace::w_tinylfu_hits(t, c.capacity), t);
    const double climber =
        pct(sftrace::w_tinylfu_sized_hits(t, c.capacity, {sftrace::window_rule::climb, 0.01}), t);
    r.wtinylfu = std::max(wt, climber);
    r.arc = pct(sftrace::arc_hits(t, c.capacity), t);
    r.lirs = pct(sftrace::lirs_hits(t, c.capacity), t);
    const double opt = pct(sftrace::optimal_hits(t, sftrace::next_use(t), c.capacity), t);
    gap_sum += opt - r.mine;
    if (r.mine < r.lru) ++below_lru;
    if (one - r.mine > worst_shard_loss) {
      worst_shard_loss = one - r.mine;
      worst_shard_cell = c.trace + " @ " + std::to_string(c.capacity);
    }
    std::printf(
        "| %s | %zu | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
        c.trace.c_str(), c.capacity, used, r.mine, one, r.lru, wt, climber, r.arc, r.lirs, opt,
        r.mine - opt);
    std::fflush(stdout);
    if (r06) {
      const int promote[4] = {1, 1, 2, 2};
      const double ghost[4] = {1.0, 0.9, 1.0, 0.9};
      for (int i = 0; i < 4; ++i) {
        r.s3[i] = pct(sftrace::s3fifo_hits(t, c.capacity, promote[i], ghost[i]), t);
      }
      r.sieve = pct(sftrace::sieve_hits(t, c.capacity), t);
      r.two_q = pct(sftrace::two_q_hits(t, c.capacity), t);
    }
    rows.push_back(r);
  }
  std::printf(
      "\nmean gap of the cache to OPT: %.2f points over %zu cells; cells below LRU: %d; "
      "largest loss to the unsharded policy: %.2f points (%s)\n",
      gap_sum / static_cast<double>(cells.size()), cells.size(), below_lru, worst_shard_loss,
      worst_shard_cell.empty() ? "none" : worst_shard_cell.c_str());
  // The goal against S3-FIFO and ARC: at least max(best S3-FIFO, ARC) - 0.5 in every cell;
  // and LRU's, for LIRS.
  const auto goal = [&](const row& r) {
    double best = r.arc;
    if (r06) best = std::max({best, r.s3[0], r.s3[1], r.s3[2], r.s3[3]});
    return best;
  };
  // below(who, what, v, reference, slack, margin): the cells where v is under reference - slack,
  // each with its figure, the reference and its margin to the bar; with `margin`, also the
  // smallest margin of all cells.
  const auto below = [&](const char* who, const char* what, double row::*v,
                         const std::function<double(const row&)>& reference, double slack,
                         bool margin) {
    int n = 0;
    std::string named;
    double smallest = 1e9;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      const row& r = rows[i];
      const double bar = reference(r) - slack;
      smallest = std::min(smallest, r.*v - bar);
      if (r.*v >= bar) continue;
      ++n;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s%s@%zu %.2f vs %.2f (%+.3f)", named.empty() ? "" : ", ",
                    cells[i].trace.c_str(), cells[i].capacity, r.*v, reference(r), r.*v - bar);
      named += buf;
    }
    std::printf("%s %s: %d%s%s", who, what, n, n == 0 ? "" : ": ", named.c_str());
    if (margin) std::printf(" (the smallest margin: %+.3f)", smallest);
    std::printf("\n");
  };
  const auto lru = [](const row& r) { return r.lru; };
  const char* const against_goal = r06 ? "below max(best S3-FIFO of the r06 table, ARC) - 0.5"
                                       : "below ARC - 0.5 (--no-r06: S3-FIFO not measured)";
  std::printf(
      "\ncells, each with its figure, the reference the bar is taken from, and the margin to the "
      "bar:\n");
  below("cache", against_goal, &row::mine, goal, 0.5, false);
  below("LIRS", against_goal, &row::lirs, goal, 0.5, false);
  below("LIRS", "below LRU", &row::lirs, lru, 0, false);
  below("ARC", "below LRU", &row::arc, lru, 0, false);
  // The goal against W-TinyLFU: within 5 points of the better model in every cell (the long
  // goal: within 1). Caffeine publishes its hit ratios as charts only; the two models stand in.
  const auto wtinylfu = [](const row& r) { return r.wtinylfu; };
  below("cache", "below max(W-TinyLFU, climber) - 5", &row::mine, wtinylfu, 5, true);
  below("cache", "below max(W-TinyLFU, climber) - 1", &row::mine, wtinylfu, 1, true);

  if (!r06) return 0;
  std::printf(
      "\nS3-FIFO choices (reference model, unsharded): hit ratio %% by promotion "
      "threshold and ghost size\n\n");
  std::printf(
      "| trace | capacity | 1 hit, ghost 1.0x | 1 hit, 0.9x | 2 hits, 1.0x | 2 hits, 0.9x |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  double sums[4] = {};
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const double* v = rows[i].s3;
    for (int j = 0; j < 4; ++j) sums[j] += v[j];
    std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f |\n", cells[i].trace.c_str(),
                cells[i].capacity, v[0], v[1], v[2], v[3]);
  }
  const auto n = static_cast<double>(cells.size());
  std::printf("| mean | | %.2f | %.2f | %.2f | %.2f |\n", sums[0] / n, sums[1] / n, sums[2] / n,
              sums[3] / n);
  std::printf(
      "\nTwo more policies of the literature (reference models, unsharded): hit ratio %%\n\n"
      "| trace | capacity | LRU | SIEVE | 2Q | cache |\n|---|---:|---:|---:|---:|---:|\n");
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const row& r = rows[i];
    std::printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f |\n", cells[i].trace.c_str(),
                cells[i].capacity, r.lru, r.sieve, r.two_q, r.mine);
  }
  std::printf("\n");
  below("SIEVE", "below LRU", &row::sieve, lru, 0, false);
  below("2Q", "below LRU", &row::two_q, lru, 0, false);
  below("SIEVE", against_goal, &row::sieve, goal, 0.5, false);
  below("2Q", against_goal, &row::two_q, goal, 0.5, false);
  // The scan case: the hot keys' misses after their first round, 64 entries in one shard.
  const std::vector<std::uint32_t> scan = sftrace::scan_case();
  const auto hot_miss = [&](const std::function<bool(std::size_t)>& hit_at) {
    std::uint64_t hot = 0;
    std::uint64_t missed = 0;
    for (std::size_t i = 120; i < scan.size(); ++i) {
      if (scan[i] >= 40) continue;
      ++hot;
      if (!hit_at(i)) ++missed;
    }
    return 100.0 * static_cast<double>(missed) / static_cast<double>(hot);
  };
  std::printf(
      "\nscan case (64 entries, one shard; 40 hot keys in turn, then 40 scanned keys "
      "each read twice, 100 rounds): hot-key miss ratio after round one, %%\n\n");
  std::printf(
      "| reference, 1 hit | reference, 2 hits | ARC | LIRS | SIEVE | 2Q | cache "
      "|\n|---:|---:|---:|---:|---:|---:|---:|\n");
  const std::vector<bool> one_hit = sftrace::s3fifo_replay(scan, 64, 1, 1.0);
  const std::vector<bool> two_hits = sftrace::s3fifo_replay(scan, 64, 2, 0.9);
  const std::vector<bool> arc = sftrace::arc_replay(scan, 64);
  const std::vector<bool> lirs = sftrace::lirs_replay(scan, 64);
  const std::vector<bool> sieve = sftrace::sieve_replay(scan, 64);
  const std::vector<bool> two_q = sftrace::two_q_replay(scan, 64);
  std::vector<bool> lib(scan.size(), false);
  {
    sf::detail::cache_shards_for_tests.store(1, std::memory_order_relaxed);
    sf::cache_options o;
    o.ttl = std::chrono::hours(24);
    o.max_entries = 64;
    trace_cache c(o);
    sf::detail::cache_shards_for_tests.store(0, std::memory_order_relaxed);
    for (std::size_t i = 0; i < scan.size(); ++i) {
      bool loaded = false;
      const std::uint32_t k = scan[i];
      (void)c.get(k, [&loaded, k] {
        loaded = true;
        return k;
      });
      lib[i] = !loaded;
    }
  }
  std::printf("| %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
              hot_miss([&](std::size_t i) { return one_hit[i]; }),
              hot_miss([&](std::size_t i) { return two_hits[i]; }),
              hot_miss([&](std::size_t i) { return arc[i]; }),
              hot_miss([&](std::size_t i) { return lirs[i]; }),
              hot_miss([&](std::size_t i) { return sieve[i]; }),
              hot_miss([&](std::size_t i) { return two_q[i]; }),
              hot_miss([&](std::size_t i) { return lib[i]; }));
  return 0;
}
