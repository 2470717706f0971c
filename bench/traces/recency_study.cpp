// bench/traces/recency_study.cpp: which recency order can a hit keep when it may write only its
// own entry (and read, never write, a value of the shard), and how close does it come to LRU,
// alone and under W-TinyLFU? Over every cell of policy_cells.cpp (the seven traces at their three
// capacities, round-robin 1.00x and 1.05x), one shard, hit ratios in % (docs/performance.md,
// "Recency a hit can keep without a shared list"). Not built by CMake:
//   g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/traces/recency_study.cpp -o /tmp/rs
//   /tmp/rs          # every cell, two tables (15 to 20 s, most of it the 5M-access traces)
//   /tmp/rs sprite   # the cells whose name contains "sprite"
// The traces' directory as for bench_traces ($SINGLEFLIGHT_TRACES, else ../shared/traces).
//
// The epoch: the shard's count of accesses (the hits the read gate counts plus the inserts, as
// the policy computes its clock today) over capacity / E, recomputed on a miss only, so that
// hits read it (one load of a shard-wide value) and never write it; hits between two misses
// read the same epoch. A hit stores it in its entry's stamp (16 bits, or 6: see below) when it
// differs; ages are wrapping differences, epoch - stamp mod 2^bits. E = 64 unless a column says.
//
// The first table: orders over the whole capacity, no admission.
//   CLOCK     one reference bit: a hit sets it; at the tail a set bit is cleared and the entry
//             goes back to the head, else it is evicted.
//   GCLOCK    the 2-bit counter the cache's entries already have: a hit adds one (at most 3);
//             at the tail a non-zero counter is decremented and the entry goes to the head.
//   sample K  Redis's approximated LRU without its pool: a miss with the shard full samples K
//             resident entries at random (with replacement) and evicts the one whose stamp is
//             oldest.
//   aged B    CLOCK's queue kept in B age buckets: a hit sets the reference bit and stores the
//             stamp; at the tail a referenced entry is re-queued by its stamp, into the bucket
//             of its epoch if that is one of the B newest, else into the oldest of them, behind
//             those already there (a ring of B lists a queue; B = 1 is CLOCK). "all": a bucket
//             for every epoch (exact stamp order, no ring could hold it). "6-bit": the stamp in
//             the six bits the 2-bit counter leaves of its byte.
//   hits writing  the hits that store to their entry, in % of the hits (aged all): the 2-bit
//             counter's stores alone (the cache's hit today: it stores while the counter is
//             under 3, the policy resets it when it reaches the entry), and the counter's or
//             the stamp's at E = 16 and 64.
// The second table: W-TinyLFU with the reference model's rules (reference.hpp,
// w_tinylfu_sized_hits: the window sized by ghosts 0.25 / 0.25 with the age rule at 1x, as the
// cache sizes it; its sketch counts every access; a loser back is not read once, as the cache
// makes it), over:
//   WT-LRU    exact LRU lists (the reference model itself);
//   WT-CLOCK  its three queues in CLOCK order, as the cache keeps them (aged with B = 1);
//   WT-aged   its three queues in aged-bucket order: a referenced entry at a queue's tail is
//             re-queued (or promoted from probation into protected) by its stamp, an unread one
//             moved to the head of the queue it goes to, as the exact model moves its LRU entry;
//   no age    the window's ghost rule without the age rule (a lost key grows the window
//             whenever it returns).
// And "cache": the cache's own policy (detail::wtinylfu) driven alone as policy_cells drives it.
//
// Checks (asserted, with or without NDEBUG): on a trace checked by hand and on sprite@100 and
// @1000, sampling with K >= capacity and the aged order with a bucket per epoch, both with an
// epoch per access and stamps that never wrap, give exactly LRU's hits; aged with B = 1 gives
// exactly CLOCK's.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "traces/policy_shard.hpp"
#include "traces/reference.hpp"
#include "traces/trace_file.hpp"

namespace {

#define STUDY_CHECK(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// A trace with its keys renumbered 0 .. keys - 1 (so that every policy indexes arrays), and the
// original keys (for the sketch, which hashes them as the reference model does).
struct dense_trace {
  std::vector<std::uint32_t> ids;
  std::vector<std::uint32_t> original;  // by id
};

dense_trace densify(const std::vector<std::uint32_t>& t) {
  dense_trace d;
  d.ids.reserve(t.size());
  std::unordered_map<std::uint32_t, std::uint32_t> id;
  id.reserve(t.size() / 4);
  for (const std::uint32_t k : t) {
    auto [it, fresh] = id.try_emplace(k, static_cast<std::uint32_t>(d.original.size()));
    if (fresh) d.original.push_back(k);
    d.ids.push_back(it->second);
  }
  return d;
}

constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();

// The shard's epoch: advanced every `period` accesses, recomputed on a miss only (or on every
// access when `per_access`, for the checks). `bits`: the stamp's width in the entry.
struct epoch_clock {
  std::uint64_t period = 1;
  bool per_access = false;
  unsigned bits = 16;
  std::uint64_t accesses = 0;
  std::uint64_t epoch = 0;

  static epoch_clock per_capacity(std::size_t capacity, std::size_t e, unsigned bits = 16) {
    return {std::max<std::uint64_t>(1, capacity / e), false, bits, 0, 0};
  }
  static epoch_clock exact() { return {1, true, 64, 0, 0}; }
  void access(bool miss) {
    ++accesses;
    if (miss || per_access) epoch = accesses / period;
  }
  std::uint64_t mask() const {
    return bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  }
  std::uint64_t stamp() const { return epoch & mask(); }
  std::uint64_t age(std::uint64_t stamp) const { return (epoch - stamp) & mask(); }
};

// Hits and, for the aged order, the hits that write the entry's line: `counter_stores` those
// whose 2-bit counter store alone would (the cache's hit today: it stores while the counter is
// under 3, and the policy resets it when it reaches the entry), `writes` those that store the
// counter or the stamp.
struct result {
  std::uint64_t hits = 0;
  std::uint64_t counter_stores = 0;
  std::uint64_t writes = 0;
};

// CLOCK (max 1) or GCLOCK (max 3) over a ring of `capacity` slots.
result clock_hits(const dense_trace& d, std::size_t capacity, int max) {
  std::vector<std::uint32_t> slot_of(d.original.size(), none);
  std::vector<std::uint32_t> key(capacity, none);
  std::vector<std::uint8_t> count(capacity, 0);
  std::size_t hand = 0;
  std::size_t used = 0;
  result r;
  for (const std::uint32_t k : d.ids) {
    if (const std::uint32_t s = slot_of[k]; s != none) {
      ++r.hits;
      if (count[s] < max) ++count[s];
      continue;
    }
    std::size_t s = used;
    if (used < capacity) {
      ++used;
    } else {
      while (count[hand] > 0) {
        --count[hand];
        hand = (hand + 1) % capacity;
      }
      s = hand;
      slot_of[key[s]] = none;
      hand = (hand + 1) % capacity;
    }
    key[s] = k;
    count[s] = 0;
    slot_of[k] = static_cast<std::uint32_t>(s);
  }
  return r;
}

// Sampled eviction by the oldest stamp of K resident entries (all of them when K >= capacity).
result sampled_hits(const dense_trace& d, std::size_t capacity, std::size_t samples,
                    epoch_clock clock) {
  std::vector<std::uint32_t> slot_of(d.original.size(), none);
  std::vector<std::uint32_t> key;
  std::vector<std::uint64_t> stamp;
  key.reserve(capacity);
  stamp.reserve(capacity);
  std::uint64_t random = 0x9e3779b97f4a7c15ULL;
  result r;
  for (const std::uint32_t k : d.ids) {
    const std::uint32_t s = slot_of[k];
    clock.access(s == none);
    if (s != none) {
      ++r.hits;
      stamp[s] = clock.stamp();
      continue;
    }
    if (key.size() < capacity) {
      slot_of[k] = static_cast<std::uint32_t>(key.size());
      key.push_back(k);
      stamp.push_back(clock.stamp());
      continue;
    }
    std::size_t victim = 0;
    std::uint64_t oldest = 0;
    const auto consider = [&](std::size_t i, bool first) {
      const std::uint64_t a = clock.age(stamp[i]);
      if (first || a > oldest) {
        oldest = a;
        victim = i;
      }
    };
    if (samples >= capacity) {
      for (std::size_t i = 0; i < capacity; ++i) consider(i, i == 0);
    } else {
      for (std::size_t j = 0; j < samples; ++j) {
        random = random * 6364136223846793005ULL + 1442695040888963407ULL;
        consider(static_cast<std::size_t>((random >> 33U) % capacity), j == 0);
      }
    }
    slot_of[key[victim]] = none;
    key[victim] = k;
    stamp[victim] = clock.stamp();
    slot_of[k] = static_cast<std::uint32_t>(victim);
  }
  return r;
}

// A queue in age buckets: entries leave at the tail only (the oldest bucket's oldest entry).
struct bucket_queue {
  std::map<std::uint64_t, std::deque<std::uint32_t>> at;  // bucket's epoch -> entries, oldest first
  std::size_t n = 0;
  void push(std::uint64_t bucket, std::uint32_t k) {
    at[bucket].push_back(k);
    ++n;
  }
  std::uint32_t tail() const { return at.begin()->second.front(); }
  void pop() {
    auto b = at.begin();
    b->second.pop_front();
    if (b->second.empty()) at.erase(b);
    --n;
  }
};

// The bucket a referenced entry re-enters by its stamp: its epoch if one of the `buckets` newest,
// else the oldest of those.
std::uint64_t bucket_of(const epoch_clock& clock, std::uint64_t stamp, std::uint64_t buckets) {
  const std::uint64_t back = std::min(clock.age(stamp), buckets - 1);
  return clock.epoch >= back ? clock.epoch - back : 0;
}

constexpr std::uint64_t every_epoch = std::numeric_limits<std::uint64_t>::max();

// CLOCK in `buckets` age buckets (see the file's comment).
result aged_hits(const dense_trace& d, std::size_t capacity, std::uint64_t buckets,
                 epoch_clock clock) {
  std::vector<std::uint8_t> in(d.original.size(), 0);
  std::vector<std::uint8_t> ref(d.original.size(), 0);
  std::vector<std::uint8_t> counter(d.original.size(), 0);
  std::vector<std::uint64_t> stamp(d.original.size(), 0);
  bucket_queue q;
  result r;
  for (const std::uint32_t k : d.ids) {
    clock.access(in[k] == 0);
    if (in[k] != 0) {
      ++r.hits;
      ref[k] = 1;
      bool wrote = false;
      if (counter[k] < 3) {
        ++counter[k];
        ++r.counter_stores;
        wrote = true;
      }
      if (stamp[k] != clock.stamp()) {
        stamp[k] = clock.stamp();
        wrote = true;
      }
      r.writes += wrote ? 1 : 0;
      continue;
    }
    while (q.n >= capacity) {
      const std::uint32_t t = q.tail();
      q.pop();
      counter[t] = 0;
      if (ref[t] == 0) {
        in[t] = 0;
        break;
      }
      ref[t] = 0;
      q.push(bucket_of(clock, stamp[t], buckets), t);
    }
    in[k] = 1;
    ref[k] = 0;
    counter[k] = 0;
    stamp[k] = clock.stamp();
    q.push(clock.epoch, k);
  }
  return r;
}

// An exact FIFO of the last `cap` keys added, with a count per key (reference.hpp's ghost).
struct ghost {
  explicit ghost(std::size_t keys_kept, std::size_t keys) : cap(keys_kept), in(keys, 0) {}
  void add(std::uint32_t k) {
    if (ring.size() < cap) {
      ring.push_back(k);
    } else {
      --in[ring[next]];
      ring[next] = k;
      next = (next + 1) % cap;
    }
    ++in[k];
  }
  bool has(std::uint32_t k) const { return in[k] != 0; }
  std::size_t cap;
  std::vector<std::uint32_t> ring;
  std::size_t next = 0;
  std::vector<int> in;
};

// W-TinyLFU with w_tinylfu_sized_hits's rules (ghosts 0.25 / 0.25, age 1x), its three queues in
// aged-bucket order (buckets = 1: CLOCK order, as the cache keeps them).
result wtinylfu_aged_hits(const dense_trace& d, std::size_t capacity, std::uint64_t buckets,
                          epoch_clock clock, double age = 1.0) {
  enum : std::uint8_t { out = 0, window_q, probation_q, protected_q };
  const std::size_t keys = d.original.size();
  std::vector<std::uint8_t> region(keys, out);
  std::vector<std::uint8_t> ref(keys, 0);
  std::vector<std::uint64_t> stamp(keys, 0);
  std::vector<std::uint64_t> lost_at(keys, 0);
  const auto sized = [&](double x) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(x * static_cast<double>(capacity)));
  };
  ghost lost(sized(0.25), keys);
  ghost evicted(sized(0.25), keys);
  sftrace::count_min4 sketch(capacity);
  bucket_queue q[4];
  const double cap = static_cast<double>(capacity);
  const double wmin = 1;
  const double wmax = std::max(1.0, cap * 0.99);
  double wcap = std::clamp(0.01 * cap, wmin, wmax);
  const auto main_cap = [&] { return capacity - static_cast<std::size_t>(wcap); };
  const auto main_n = [&] { return q[probation_q].n + q[protected_q].n; };
  std::uint64_t now = 0;
  std::uint64_t random = 0x9e3779b97f4a7c15ULL;
  result r;
  // A referenced entry re-queued by its stamp; an unread one moved to a queue's head.
  const auto requeue = [&](std::uint32_t k, std::uint8_t to) {
    ref[k] = 0;
    region[k] = to;
    q[to].push(bucket_of(clock, stamp[k], buckets), k);
  };
  const auto to_head = [&](std::uint32_t k, std::uint8_t to) {
    region[k] = to;
    q[to].push(clock.epoch, k);
  };
  const auto demote = [&] {
    while (q[protected_q].n > main_cap() * 8 / 10) {
      const std::uint32_t t = q[protected_q].tail();
      q[protected_q].pop();
      if (ref[t] != 0) {
        requeue(t, protected_q);
      } else {
        to_head(t, probation_q);
      }
    }
  };
  // main's victim, left at its queue's tail: probation's unread tail (a read one is promoted).
  const auto victim = [&]() -> std::uint8_t {
    for (;;) {
      const std::uint8_t from = q[probation_q].n != 0 ? probation_q : protected_q;
      const std::uint32_t t = q[from].tail();
      if (ref[t] == 0) return from;
      q[from].pop();
      requeue(t, protected_q);
      if (from == probation_q) demote();
    }
  };
  for (const std::uint32_t k : d.ids) {
    ++now;
    sketch.increment(d.original[k]);
    clock.access(region[k] == out);
    if (region[k] != out) {
      ++r.hits;
      ref[k] = 1;
      stamp[k] = clock.stamp();
    } else {
      if (lost.has(k)) {
        if (age <= 0 || static_cast<double>(now - lost_at[k]) < age * cap) {
          wcap = std::min(wmax, wcap + 1);
        }
      } else if (evicted.has(k)) {
        wcap = std::max(wmin, wcap - 1);
      }
      ref[k] = 0;
      stamp[k] = clock.stamp();
      to_head(k, window_q);
    }
    while (q[window_q].n > static_cast<std::size_t>(wcap)) {
      const std::uint32_t c = q[window_q].tail();
      q[window_q].pop();
      if (ref[c] != 0) {  // read in the window: a second pass
        requeue(c, window_q);
        continue;
      }
      if (main_n() < main_cap()) {
        to_head(c, probation_q);
        continue;
      }
      const std::uint8_t from = victim();
      const std::uint32_t v = q[from].tail();
      const int cf = sketch.estimate(d.original[c]);
      const int vf = sketch.estimate(d.original[v]);
      random = random * 6364136223846793005ULL + 1442695040888963407ULL;
      if (cf > vf || (cf >= 6 && ((random >> 33U) & 127U) == 0)) {
        q[from].pop();
        region[v] = out;
        evicted.add(v);
        to_head(c, probation_q);
      } else {
        region[c] = out;
        lost.add(c);
        lost_at[c] = now;
      }
    }
    while (q[window_q].n + main_n() > capacity) {  // main over its share after the window grew
      const std::uint8_t from = victim();
      const std::uint32_t v = q[from].tail();
      q[from].pop();
      region[v] = out;
      evicted.add(v);
    }
    demote();
  }
  return r;
}

double pct(std::uint64_t hits, std::size_t n) {
  return 100.0 * static_cast<double>(hits) / static_cast<double>(n);
}

// The checks of the file's comment, on one trace at one capacity.
void check_exact(const dense_trace& d, const std::vector<std::uint32_t>& raw,
                 std::size_t capacity) {
  const std::uint64_t lru = sftrace::lru_hits(raw, capacity);
  STUDY_CHECK(sampled_hits(d, capacity, capacity, epoch_clock::exact()).hits == lru);
  STUDY_CHECK(aged_hits(d, capacity, every_epoch, epoch_clock::exact()).hits == lru);
  STUDY_CHECK(aged_hits(d, capacity, 1, epoch_clock::per_capacity(capacity, 64)).hits ==
              clock_hits(d, capacity, 1).hits);
}

void self_check() {
  // Capacity 3, by hand. LRU (most recent first): 1 2 3 miss (3 2 1); 1 hit (1 3 2); 4 evicts
  // 2 (4 1 3); 2 evicts 3 (2 4 1); 1 hit (1 2 4); 3 evicts 4 (3 1 2); 2 hit (2 3 1); 4 evicts 1
  // (4 2 3); 3 hit (3 4 2); 5 evicts 2 (5 3 4); 3, 4 hit (4 3 5); 2 evicts 5 (2 4 3); 5 misses:
  // 6 hits. CLOCK (slots, * referenced, ^ the hand): 1 2 3 fill (^1 2 3); 1 hit (^1* 2 3); 4:
  // clears 1, evicts 2 (1 4 ^3); 2 evicts 3 (^1 4 2); 1 hit; 3: clears 1, evicts 4 (1 3 ^2); 2
  // hit; 4: clears 2, evicts 1 (4 ^3 2); 3 hit; 5: clears 3, evicts 2 (^4 3 5); 3, 4 hit; 2:
  // clears 4 and 3, evicts 5 (^4 3 2); 5 misses: 6 hits.
  const std::vector<std::uint32_t> raw = {1, 2, 3, 1, 4, 2, 1, 3, 2, 4, 3, 5, 3, 4, 2, 5};
  STUDY_CHECK(sftrace::lru_hits(raw, 3) == 6);
  const dense_trace d = densify(raw);
  STUDY_CHECK(clock_hits(d, 3, 1).hits == 6);
  check_exact(d, raw, 3);
}

// A table's header: the cell's column, then `columns`.
std::string header(const std::vector<const char*>& columns) {
  std::string h = "| cell |";
  std::string rule = "|---|";
  for (const char* c : columns) {
    h += std::string(" ") + c + " |";
    rule += "---:|";
  }
  return h + "\n" + rule + "\n";
}

// One cell's row of each table.
void cell(const std::string& name, const std::vector<std::uint32_t>& raw, std::size_t c,
          std::string& orders, std::string& wtinylfu) {
  const dense_trace d = densify(raw);
  const std::size_t n = raw.size();
  const auto by = [c](std::size_t e, unsigned bits = 16) {
    return epoch_clock::per_capacity(c, e, bits);
  };
  const auto hits = [n](std::uint64_t h) { return pct(h, n); };
  const auto per_hit = [](std::uint64_t x, const result& a) {
    return a.hits == 0 ? 0.0 : 100.0 * static_cast<double>(x) / static_cast<double>(a.hits);
  };
  const double lru = hits(sftrace::lru_hits(raw, c));
  const result aged16 = aged_hits(d, c, every_epoch, by(16));
  const result aged64 = aged_hits(d, c, every_epoch, by(64));
  const std::vector<double> o = {
      lru,
      hits(sftrace::optimal_hits(raw, sftrace::next_use(raw), c)),
      hits(clock_hits(d, c, 1).hits),
      hits(clock_hits(d, c, 3).hits),
      hits(sampled_hits(d, c, 5, by(64)).hits),
      hits(sampled_hits(d, c, 16, by(64)).hits),
      hits(sampled_hits(d, c, 64, by(64)).hits),
      hits(sampled_hits(d, c, 16, by(16)).hits),
      hits(sampled_hits(d, c, 16, by(256)).hits),
      hits(aged_hits(d, c, 4, by(4)).hits),
      hits(aged_hits(d, c, 16, by(16)).hits),
      hits(aged_hits(d, c, 16, by(16, 6)).hits),
      hits(aged_hits(d, c, 16, by(64)).hits),
      hits(aged16.hits),
      hits(aged64.hits),
      hits(aged_hits(d, c, every_epoch, by(256)).hits),
      per_hit(aged64.counter_stores, aged64),
      per_hit(aged16.writes, aged16),
      per_hit(aged64.writes, aged64),
  };
  sftrace::window_rule ghosts{sftrace::window_rule::ghosts, 0.01, 0.25, 0.25, 1.0};
  sftrace::window_rule ghosts_no_age = ghosts;
  ghosts_no_age.age = 0;
  sftrace::policy_shard<> shard(c);
  std::uint64_t cache_hits = 0;
  for (const std::uint32_t k : raw) cache_hits += shard.access(k) != nullptr ? 1 : 0;
  const std::vector<double> w = {
      lru,
      hits(cache_hits),
      hits(sftrace::w_tinylfu_sized_hits(raw, c, ghosts)),
      hits(wtinylfu_aged_hits(d, c, 1, by(64)).hits),
      hits(wtinylfu_aged_hits(d, c, every_epoch, by(64)).hits),
      hits(wtinylfu_aged_hits(d, c, 16, by(16, 6)).hits),
      hits(sftrace::w_tinylfu_sized_hits(raw, c, ghosts_no_age)),
      hits(wtinylfu_aged_hits(d, c, every_epoch, by(64), 0).hits),
  };
  char buf[64];
  const auto line = [&](std::string& out, const std::vector<double>& v, std::size_t whole_from) {
    out += "| " + name + "@" + std::to_string(c) + " |";
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::snprintf(buf, sizeof buf, i >= whole_from ? " %.0f |" : " %.2f |", v[i]);
      out += buf;
    }
    out += "\n";
  };
  line(orders, o, 16);
  line(wtinylfu, w, w.size());
}

}  // namespace

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : nullptr;
  const auto wanted = [only](const std::string& name) {
    return only == nullptr || name.find(only) != std::string::npos;
  };
  self_check();
  const auto dir = sftrace::traces_dir(nullptr);
  std::string orders =
      header({"LRU", "OPT", "CLOCK", "GCLOCK", "sample 5", "sample 16", "sample 64",
              "sample 16, E 16", "sample 16, E 256", "aged 4, E 4", "aged 16, E 16",
              "aged 16, E 16, 6-bit", "aged 16", "aged all, E 16", "aged all", "aged all, E 256",
              "hits writing: counter %", "counter or stamp, E 16 %", "counter or stamp, E 64 %"});
  std::string wtinylfu =
      header({"LRU", "cache", "WT-LRU", "WT-CLOCK", "WT-aged all", "WT-aged 16, E 16, 6-bit",
              "WT-LRU, no age", "WT-aged all, no age"});
  for (const auto& spec : sftrace::all_traces) {
    if (!wanted(spec.name)) continue;
    const std::vector<std::uint32_t> raw = sftrace::read_trace(dir, spec);
    if (std::string(spec.name) == "sprite") {
      const dense_trace d = densify(raw);
      check_exact(d, raw, 100);
      check_exact(d, raw, 1000);
    }
    for (const std::size_t c : spec.capacity) cell(spec.name, raw, c, orders, wtinylfu);
  }
  for (const std::size_t hot : {std::size_t{1024}, std::size_t{1075}}) {
    const std::string name = "round-robin-" + std::to_string(hot);
    if (!wanted(name)) continue;
    cell(name, sftrace::round_robin(hot, 100), 1024, orders, wtinylfu);
  }
  std::printf("%s\n%s", orders.c_str(), wtinylfu.c_str());
  return 0;
}
