// bench/traces/reference.hpp: the reference points of bench_traces' table, each replaying a
// trace (a vector of keys) at a capacity and returning its hits:
//   lru_hits      plain LRU (a list and a hash map)
//   w_tinylfu_hits  W-TinyLFU, static 1% window (below)
//   optimal_hits  Belady's MIN: on a miss with the cache full, evict the entry whose next use is
//                 farthest in the future (or never), the new key included; no online policy can do
//                 better.
//   s3fifo_hits   S3-FIFO in the settings the library chose between (below)
//   arc_hits      ARC, exact lists (below)
//   lirs_hits     LIRS, 1 % HIR share (below)
//   sieve_hits    SIEVE (below)
//   two_q_hits    2Q, full version, Kin 25 % and Kout 50 % (below)
// Single-threaded; no part of the library.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <list>
#include <queue>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sftrace {

inline std::uint64_t lru_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  std::list<std::uint32_t> order;  // front = most recent
  std::unordered_map<std::uint32_t, std::list<std::uint32_t>::iterator> where;
  where.reserve(capacity * 2);
  std::uint64_t hits = 0;
  for (const std::uint32_t k : t) {
    if (auto it = where.find(k); it != where.end()) {
      order.splice(order.begin(), order, it->second);
      ++hits;
      continue;
    }
    if (order.size() == capacity) {
      where.erase(order.back());
      order.pop_back();
    }
    order.push_front(k);
    where[k] = order.begin();
  }
  return hits;
}

// next_use(t): for each access i, the index of the next access to the same key (or "never").
inline std::vector<std::uint32_t> next_use(const std::vector<std::uint32_t>& t) {
  constexpr std::uint32_t never = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> next(t.size(), never);
  std::unordered_map<std::uint32_t, std::uint32_t> seen;
  for (std::size_t i = t.size(); i-- > 0;) {
    auto [it, fresh] = seen.try_emplace(t[i], static_cast<std::uint32_t>(i));
    if (!fresh) {
      next[i] = it->second;
      it->second = static_cast<std::uint32_t>(i);
    }
  }
  return next;
}

inline std::uint64_t optimal_hits(const std::vector<std::uint32_t>& t,
                                  const std::vector<std::uint32_t>& next, std::size_t capacity) {
  // key -> its next use while cached; a max-heap of (next use, key) with stale pairs skipped.
  std::unordered_map<std::uint32_t, std::uint32_t> cached;
  cached.reserve(capacity * 2);
  std::priority_queue<std::pair<std::uint32_t, std::uint32_t>> heap;
  std::uint64_t hits = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t k = t[i];
    if (auto it = cached.find(k); it != cached.end()) {
      ++hits;
      it->second = next[i];
      heap.emplace(next[i], k);
      continue;
    }
    // The new key competes too: when its own next use is the farthest, it is the one dropped.
    cached.emplace(k, next[i]);
    heap.emplace(next[i], k);
    while (cached.size() > capacity) {
      const auto [when, victim] = heap.top();
      heap.pop();
      auto v = cached.find(victim);
      if (v != cached.end() && v->second == when) cached.erase(v);
    }
  }
  return hits;
}

}  // namespace sftrace

namespace sftrace {

// count_min4: TinyLFU's frequency sketch (Einziger, Friedman, Manes, "TinyLFU: A Highly
// Efficient Cache Admission Policy", ACM ToS 2017): four rows of 4-bit counters (kept in bytes
// here: this is a model, not a space-efficient one), at least `capacity` wide; every counter is
// halved after 10 x capacity increments (the paper's reset).
class count_min4 {
 public:
  explicit count_min4(std::size_t capacity) : sample_(10 * std::max<std::size_t>(1, capacity)) {
    std::size_t w = 16;
    while (w < capacity) w <<= 1U;
    mask_ = w - 1;
    rows_.assign(4 * w, 0);
  }
  int estimate(std::uint64_t k) const {
    int m = 15;
    for (int i = 0; i < 4; ++i) m = std::min<int>(m, rows_[slot(k, i)]);
    return m;
  }
  void increment(std::uint64_t k) {
    const int e = estimate(k);
    bool added = false;
    for (int i = 0; i < 4; ++i) {
      std::uint8_t& c = rows_[slot(k, i)];
      if (c == e && c < 15) {  // conservative update
        ++c;
        added = true;
      }
    }
    if (added && ++adds_ >= sample_) {
      for (std::uint8_t& c : rows_) c = static_cast<std::uint8_t>(c >> 1U);
      adds_ /= 2;
    }
  }

 private:
  std::size_t slot(std::uint64_t k, int row) const {
    std::uint64_t x = k + 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(row + 1);
    x = (x ^ (x >> 30U)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27U)) * 0x94d049bb133111ebULL;
    x ^= x >> 31U;
    return static_cast<std::size_t>(row) * (mask_ + 1) + (x & mask_);
  }
  std::vector<std::uint8_t> rows_;
  std::size_t mask_ = 0;
  std::uint64_t adds_ = 0;
  std::uint64_t sample_;
};

// w_tinylfu_hits: W-TinyLFU as the TinyLFU paper describes it, with its static configuration:
// a 1% LRU window in front of a segmented LRU main region (20% probation, 80% protected); when
// the window overflows, its LRU entry enters main only if the sketch says it is more frequent
// than main's probation victim. Caffeine adapts the window's size at run time (hill climbing);
// this static model does not, so it trails Caffeine on recency-biased traces.
inline std::uint64_t w_tinylfu_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  using list = std::list<std::uint32_t>;
  const std::size_t window_cap = std::max<std::size_t>(1, capacity / 100);
  const std::size_t main_cap = capacity > window_cap ? capacity - window_cap : 1;
  const std::size_t protected_cap = main_cap * 8 / 10;
  count_min4 sketch(capacity);
  list window, probation, prot;  // front = most recent
  struct where {
    int region;  // 0 window, 1 probation, 2 protected
    list::iterator it;
  };
  std::unordered_map<std::uint32_t, where> at;
  at.reserve(capacity * 2);
  std::uint64_t hits = 0;
  for (const std::uint32_t k : t) {
    sketch.increment(k);
    if (auto f = at.find(k); f != at.end()) {
      ++hits;
      where& w = f->second;
      if (w.region == 0) {
        window.splice(window.begin(), window, w.it);
      } else if (w.region == 2) {
        prot.splice(prot.begin(), prot, w.it);
      } else {
        prot.splice(prot.begin(), probation, w.it);
        w.region = 2;
        if (prot.size() > protected_cap) {  // demote protected's LRU to probation
          probation.splice(probation.begin(), prot, std::prev(prot.end()));
          at[probation.front()].region = 1;
        }
      }
      continue;
    }
    window.push_front(k);
    at[k] = where{0, window.begin()};
    if (window.size() <= window_cap) continue;
    const std::uint32_t cand = window.back();
    if (probation.size() + prot.size() < main_cap) {
      probation.splice(probation.begin(), window, std::prev(window.end()));
      at[cand].region = 1;
      continue;
    }
    list& victims = probation.empty() ? prot : probation;
    const std::uint32_t victim = victims.back();
    if (sketch.estimate(cand) > sketch.estimate(victim)) {
      victims.pop_back();
      at.erase(victim);
      probation.splice(probation.begin(), window, std::prev(window.end()));
      at[cand].region = 1;
    } else {
      window.pop_back();
      at.erase(cand);
    }
  }
  return hits;
}

}  // namespace sftrace

namespace sftrace {

// s3fifo_hits: S3-FIFO (Yang et al., SOSP 2023, Algorithm 1) unsharded, with the two knobs of
// the choice the library makes (docs/cache.md, "Eviction, measured"): an entry leaves the small
// queue for main after `promote_at` hits there (the paper: 2, i.e. freq > 1), and the ghost
// queue remembers the last `ghost_ratio` x capacity keys that left small unread (the paper:
// 0.9). Small is 10% of the capacity; main is a CLOCK with 2-bit frequencies. An exact FIFO of
// keys for the ghost (the library keeps fingerprints).
// s3fifo_replay returns, for each access, whether it hit; with `where`, also where each hit
// found its key (s3fifo_where: small, main after a promotion, main after a ghost hit; none on a
// miss), for policy_timeline.
enum class s3fifo_where : std::uint8_t { none, small, promoted, from_ghost };
inline std::vector<bool> s3fifo_replay(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                       int promote_at, double ghost_ratio,
                                       std::vector<s3fifo_where>* where = nullptr) {
  struct entry {
    int freq = 0;
    bool in_main = false;
    bool from_ghost = false;
  };
  std::unordered_map<std::uint32_t, entry> at;
  std::list<std::uint32_t> small, main;  // front = newest
  std::list<std::uint32_t> ghost;
  std::unordered_map<std::uint32_t, int> in_ghost;  // key -> copies in `ghost`
  const auto ghost_cap = static_cast<std::size_t>(static_cast<double>(capacity) * ghost_ratio);
  const std::size_t small_cap = std::max<std::size_t>(1, capacity / 10);
  const auto ghost_add = [&](std::uint32_t k) {
    if (ghost_cap == 0) return;
    ghost.push_front(k);
    ++in_ghost[k];
    if (ghost.size() > ghost_cap) {
      const std::uint32_t old = ghost.back();
      ghost.pop_back();
      if (--in_ghost[old] == 0) in_ghost.erase(old);
    }
  };
  const auto evict = [&] {
    for (;;) {
      if (!small.empty() && (small.size() >= small_cap || main.empty())) {
        const std::uint32_t k = small.back();
        small.pop_back();
        entry& e = at[k];
        if (e.freq >= promote_at) {
          e.freq = 0;
          e.in_main = true;
          main.push_front(k);
          continue;
        }
        ghost_add(k);
        at.erase(k);
        return;
      }
      const std::uint32_t k = main.back();
      main.pop_back();
      entry& e = at[k];
      if (e.freq > 0) {
        --e.freq;
        main.push_front(k);
        continue;
      }
      at.erase(k);
      return;
    }
  };
  std::vector<bool> hit(t.size(), false);
  if (where != nullptr) where->assign(t.size(), s3fifo_where::none);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t k = t[i];
    if (auto f = at.find(k); f != at.end()) {
      hit[i] = true;
      if (where != nullptr) {
        (*where)[i] = !f->second.in_main     ? s3fifo_where::small
                      : f->second.from_ghost ? s3fifo_where::from_ghost
                                             : s3fifo_where::promoted;
      }
      f->second.freq = std::min(f->second.freq + 1, 3);
      continue;
    }
    if (at.size() >= capacity) evict();
    entry& e = at[k];
    if (in_ghost.count(k) != 0) {
      e.in_main = true;
      e.from_ghost = true;
      main.push_front(k);
    } else {
      small.push_front(k);
    }
  }
  return hit;
}

inline std::uint64_t s3fifo_hits(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                 int promote_at, double ghost_ratio) {
  const std::vector<bool> h = s3fifo_replay(t, capacity, promote_at, ghost_ratio);
  return static_cast<std::uint64_t>(std::count(h.begin(), h.end(), true));
}

}  // namespace sftrace

namespace sftrace {

// w_tinylfu_sized_hits: W-TinyLFU (as w_tinylfu_hits: an LRU window, a 20 / 80 % probation /
// protected main, TinyLFU admission against probation's victim, Caffeine's rule that a
// candidate seen at least 6 times wins 1 time in 128 against a more frequent victim) whose
// window is sized by a rule, for bench_traces --windows (docs/performance.md, "Eviction,
// measured"):
//   fixed   the window stays at `window` x the capacity;
//   climb   Caffeine's hill climber: starts at `window`; every 10 x capacity accesses it
//           compares the sample's hit ratio with the last one's and moves the window by a step
//           (6.25 % of the capacity, in the direction that helped, reversed when the ratio fell;
//           the step decays by 0.98, and restarts at 6.25 % after a change of 5 points or more);
//   ghosts  a feedback rule in ARC's manner: the keys the window's candidates lost with (the
//           last `ghost_window` x capacity of them) and the keys main evicted (the last
//           `ghost_main` x capacity) are remembered; a miss on a key the window lost grows the
//           window by one entry, a miss on one main evicted shrinks it by one; with `age`
//           > 0, a key the window lost grows it only if it returns fewer than age x capacity
//           accesses after it was lost (a loop longer than the cache returns later).
// *final_window: the window's share of the capacity at the end.
struct window_rule {
  enum kind_t { fixed, climb, ghosts } kind = fixed;
  double window = 0.01;
  double ghost_window = 0.25;
  double ghost_main = 0.25;
  double age = 0;
};

inline std::uint64_t w_tinylfu_sized_hits(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                          window_rule rule, double* final_window = nullptr) {
  using list = std::list<std::uint32_t>;
  struct where {
    int region;  // 0 window, 1 probation, 2 protected
    list::iterator it;
  };
  // An exact FIFO of the last `cap` keys added, with a count per key.
  struct ghost {
    std::size_t cap;
    std::vector<std::uint32_t> ring;
    std::size_t next = 0;
    std::unordered_map<std::uint32_t, int> in;
    void add(std::uint32_t k) {
      if (ring.size() < cap) {
        ring.push_back(k);
      } else {
        const std::uint32_t old = ring[next];
        if (--in[old] == 0) in.erase(old);
        ring[next] = k;
        next = (next + 1) % cap;
      }
      ++in[k];
    }
    bool has(std::uint32_t k) const { return in.count(k) != 0; }
  };
  const auto sized = [&](double r) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(r * static_cast<double>(capacity)));
  };
  ghost lost{sized(rule.ghost_window), {}, 0, {}};
  ghost evicted{sized(rule.ghost_main), {}, 0, {}};
  count_min4 sketch(capacity);
  list window, probation, prot;  // front = most recent
  std::unordered_map<std::uint32_t, where> at;
  at.reserve(capacity * 2);
  const double cap = static_cast<double>(capacity);
  const double wmin = 1;
  const double wmax = std::max(1.0, cap * 0.99);
  double wcap = std::clamp(rule.window * cap, wmin, wmax);
  const auto main_cap = [&] { return capacity - static_cast<std::size_t>(wcap); };
  std::unordered_map<std::uint32_t, std::uint64_t> lost_at;  // access number of the loss
  std::uint64_t now = 0;
  std::uint64_t hits = 0;
  std::uint64_t sample_hits = 0;
  std::uint64_t sample_misses = 0;
  const std::uint64_t sample = std::max<std::uint64_t>(1, 10 * capacity);
  double previous = 0;
  double step = -0.0625 * cap;
  std::uint64_t random = 0x9e3779b97f4a7c15ULL;
  const auto demote = [&] {
    while (prot.size() > main_cap() * 8 / 10) {
      probation.splice(probation.begin(), prot, std::prev(prot.end()));
      at[probation.front()].region = 1;
    }
  };
  for (const std::uint32_t k : t) {
    ++now;
    sketch.increment(k);
    if (auto f = at.find(k); f != at.end()) {
      ++hits;
      ++sample_hits;
      where& w = f->second;
      if (w.region == 0) {
        window.splice(window.begin(), window, w.it);
      } else if (w.region == 2) {
        prot.splice(prot.begin(), prot, w.it);
      } else {
        prot.splice(prot.begin(), probation, w.it);
        w.region = 2;
        demote();
      }
    } else {
      ++sample_misses;
      if (rule.kind == window_rule::ghosts) {
        if (lost.has(k)) {
          if (rule.age <= 0 || static_cast<double>(now - lost_at[k]) < rule.age * cap) {
            wcap = std::min(wmax, wcap + 1);
          }
        } else if (evicted.has(k)) {
          wcap = std::max(wmin, wcap - 1);
        }
      }
      window.push_front(k);
      at[k] = where{0, window.begin()};
    }
    if (rule.kind == window_rule::climb && sample_hits + sample_misses >= sample) {
      const double ratio =
          static_cast<double>(sample_hits) / static_cast<double>(sample_hits + sample_misses);
      const double change = ratio - previous;
      const double amount = change >= 0 ? step : -step;
      step = std::abs(change) >= 0.05 ? 0.0625 * cap * (amount >= 0 ? 1 : -1) : 0.98 * amount;
      previous = ratio;
      sample_hits = sample_misses = 0;
      wcap = std::clamp(wcap + amount, wmin, wmax);
    }
    while (window.size() > static_cast<std::size_t>(wcap)) {
      const std::uint32_t cand = window.back();
      if (probation.size() + prot.size() < main_cap()) {
        probation.splice(probation.begin(), window, std::prev(window.end()));
        at[cand].region = 1;
        continue;
      }
      list& victims = probation.empty() ? prot : probation;
      const std::uint32_t victim = victims.back();
      const int cf = sketch.estimate(cand);
      const int vf = sketch.estimate(victim);
      random = random * 6364136223846793005ULL + 1442695040888963407ULL;
      if (cf > vf || (cf >= 6 && ((random >> 33U) & 127U) == 0)) {
        victims.pop_back();
        at.erase(victim);
        evicted.add(victim);
        probation.splice(probation.begin(), window, std::prev(window.end()));
        at[cand].region = 1;
      } else {
        window.pop_back();
        at.erase(cand);
        lost.add(cand);
        if (rule.age > 0) lost_at[cand] = now;
      }
    }
    while (at.size() > capacity) {  // main over its share after the window grew
      list& victims = probation.empty() ? prot : probation;
      const std::uint32_t victim = victims.back();
      victims.pop_back();
      at.erase(victim);
      evicted.add(victim);
    }
    demote();
  }
  if (final_window != nullptr) *final_window = wcap / cap;
  return hits;
}

}  // namespace sftrace

namespace sftrace {

// What arc_replay and lirs_replay leave behind, for bench_traces --self-test: the most entries
// resident at once, and the policy's state at the end.
struct policy_probe {
  std::size_t peak_resident = 0;
  std::size_t peak_tracked = 0;  // resident + remembered (ARC's ghosts, LIRS's non-resident)
  double p = 0;                  // ARC: the target size of T1
  std::size_t t1 = 0, t2 = 0, b1 = 0, b2 = 0;
};

// arc_replay: ARC (Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache",
// FAST 2003, Fig. 4), exact and unsharded. T1 holds the keys read once since they entered, T2
// those read again, each in LRU order; B1 and B2 remember the keys T1 and T2 evicted
// (|T1| + |B1| <= c, |T1| + |T2| + |B1| + |B2| <= 2c). p, the target size of T1, is a real
// number as in the paper: a miss on a key of B1 raises it by max(1, |B2| / |B1|), one of B2
// lowers it by max(1, |B1| / |B2|); REPLACE evicts T1's LRU entry into B1 when |T1| > p (or
// |T1| == p and the key came from B2), else T2's LRU entry into B2. No knobs: ARC sizes itself.
// Returns, for each access, whether it hit.
inline std::vector<bool> arc_replay(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                    policy_probe* probe = nullptr) {
  using list = std::list<std::uint32_t>;  // front = MRU
  enum which : std::uint8_t { t1, t2, b1, b2 };
  struct where {
    which in;
    list::iterator it;
  };
  list l[4];
  std::unordered_map<std::uint32_t, where> at;
  at.reserve(capacity * 4);
  const double c = static_cast<double>(capacity);
  double p = 0;
  const auto move_to = [&](where& w, which to) {  // to the MRU end of `to`
    l[to].splice(l[to].begin(), l[w.in], w.it);
    w.in = to;
  };
  const auto replace = [&](bool in_b2) {
    const double n1 = static_cast<double>(l[t1].size());
    if (!l[t1].empty() && (n1 > p || (in_b2 && n1 == p))) {
      move_to(at[l[t1].back()], b1);
    } else {
      move_to(at[l[t2].back()], b2);
    }
  };
  const auto drop_lru = [&](which from) {
    at.erase(l[from].back());
    l[from].pop_back();
  };
  std::vector<bool> hit(t.size(), false);
  std::size_t peak = 0;
  std::size_t tracked = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t x = t[i];
    if (auto f = at.find(x); f != at.end()) {
      where& w = f->second;
      const auto n1 = static_cast<double>(l[b1].size());
      const auto n2 = static_cast<double>(l[b2].size());
      if (w.in == t1 || w.in == t2) {  // Case I
        hit[i] = true;
        move_to(w, t2);
        continue;
      }
      if (w.in == b1) {  // Case II
        p = std::min(p + (n1 >= n2 ? 1.0 : n2 / n1), c);
        replace(false);
      } else {  // Case III
        p = std::max(p - (n2 >= n1 ? 1.0 : n1 / n2), 0.0);
        replace(true);
      }
      move_to(w, t2);
    } else {  // Case IV
      const std::size_t l1 = l[t1].size() + l[b1].size();
      const std::size_t all = l1 + l[t2].size() + l[b2].size();
      if (l1 == capacity) {
        if (l[t1].size() < capacity) {
          drop_lru(b1);
          replace(false);
        } else {
          drop_lru(t1);
        }
      } else if (all >= capacity) {
        if (all == 2 * capacity) drop_lru(b2);
        replace(false);
      }
      l[t1].push_front(x);
      at[x] = where{t1, l[t1].begin()};
    }
    peak = std::max(peak, l[t1].size() + l[t2].size());
    tracked = std::max(tracked, at.size());
  }
  if (probe != nullptr) {
    *probe = policy_probe{peak, tracked, p, l[t1].size(), l[t2].size(), l[b1].size(), l[b2].size()};
  }
  return hit;
}

inline std::uint64_t arc_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  const std::vector<bool> h = arc_replay(t, capacity);
  return static_cast<std::uint64_t>(std::count(h.begin(), h.end(), true));
}

// lirs_replay: LIRS (Jiang and Zhang, "LIRS: An Efficient Low Inter-reference Recency Set
// Replacement Policy to Improve Buffer Cache Performance", SIGMETRICS 2002), exact and
// unsharded. The resident keys are LIR (a low inter-reference recency: read twice within the
// recency of the other LIR keys) or resident HIR; L_hirs = 1 % of the capacity (at least 1)
// is the HIR share, the rest LIR. The stack S holds, in recency order, the LIR keys, and the
// HIR keys (resident or not) read since S's bottom LIR key was; pruning keeps a LIR key at its
// bottom. The queue Q holds the resident HIR keys, FIFO; a miss with the cache full evicts
// Q's front (it stays in S as non-resident if it is there). A hit on a HIR key in S, or a
// miss on a non-resident one, makes it LIR and demotes S's bottom LIR key to Q's end; a HIR
// key not in S re-enters S and Q's end and stays HIR. Until the LIR keys fill their share,
// every new key becomes LIR.
// Knobs: `hir_share` (0.01) and `nonresident` (1.0): at most nonresident x capacity
// non-resident keys are kept in S (the paper leaves S unbounded); beyond it the oldest one is
// dropped, so that at most 2x the capacity keys are tracked in all.
// Returns, for each access, whether it hit.
inline std::vector<bool> lirs_replay(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                     double hir_share = 0.01, double nonresident = 1.0,
                                     policy_probe* probe = nullptr) {
  using list = std::list<std::uint32_t>;
  enum state : std::uint8_t { lir, hir, gone };  // gone: non-resident HIR (in S)
  struct entry {
    state s = hir;
    bool in_s = false;
    bool in_q = false;
    list::iterator s_it;      // S: front = top (most recent)
    list::iterator q_it;      // Q: front = next to evict
    std::uint64_t stamp = 0;  // the access that put it at its place in S
  };
  const std::size_t cap = std::max<std::size_t>(2, capacity);
  const std::size_t l_hirs = std::clamp<std::size_t>(
      static_cast<std::size_t>(hir_share * static_cast<double>(cap)), 1, cap - 1);
  const std::size_t l_lirs = cap - l_hirs;
  const auto nr_cap = static_cast<std::size_t>(nonresident * static_cast<double>(cap));
  list s, q;
  std::unordered_map<std::uint32_t, entry> at;
  at.reserve(cap * 4);
  std::set<std::pair<std::uint64_t, std::uint32_t>> nonres;  // by their place in S
  std::size_t lirs = 0;
  std::size_t resident = 0;
  const auto to_top = [&](std::uint32_t k, entry& e, std::uint64_t now) {
    if (e.in_s) {
      s.splice(s.begin(), s, e.s_it);
    } else {
      s.push_front(k);
      e.s_it = s.begin();
      e.in_s = true;
    }
    e.stamp = now;
  };
  const auto to_q_end = [&](std::uint32_t k, entry& e) {
    if (e.in_q) {
      q.splice(q.end(), q, e.q_it);
    } else {
      q.push_back(k);
      e.q_it = std::prev(q.end());
      e.in_q = true;
    }
  };
  const auto prune = [&] {  // S's bottom must be a LIR key
    while (!s.empty()) {
      const std::uint32_t k = s.back();
      entry& e = at[k];
      if (e.s == lir) return;
      s.pop_back();
      e.in_s = false;
      if (e.s == gone) {
        nonres.erase({e.stamp, k});
        at.erase(k);
      }
    }
  };
  const auto demote_bottom = [&] {  // S's bottom LIR key becomes resident HIR, at Q's end
    const std::uint32_t k = s.back();
    entry& e = at[k];
    s.pop_back();
    e.in_s = false;
    e.s = hir;
    to_q_end(k, e);
    prune();
  };
  std::vector<bool> hit(t.size(), false);
  std::size_t peak = 0;
  std::size_t tracked = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t x = t[i];
    const std::uint64_t now = i + 1;
    auto f = at.find(x);
    if (f != at.end() && f->second.s == lir) {
      hit[i] = true;
      to_top(x, f->second, now);
      prune();
      continue;
    }
    if (f != at.end() && f->second.s == hir) {
      hit[i] = true;
      entry& e = f->second;
      if (e.in_s) {
        e.s = lir;
        q.erase(e.q_it);
        e.in_q = false;
        to_top(x, e, now);
        demote_bottom();
      } else {
        to_top(x, e, now);
        to_q_end(x, e);
      }
      continue;
    }
    // A miss: a new key, or a non-resident one still in S.
    if (lirs < l_lirs) {
      entry& e = f != at.end() ? f->second : at[x];
      if (e.s == gone) nonres.erase({e.stamp, x});
      e.s = lir;
      ++lirs;
      ++resident;
      to_top(x, e, now);
    } else {
      if (resident >= cap) {
        const std::uint32_t v = q.front();
        q.pop_front();
        entry& ve = at[v];
        ve.in_q = false;
        if (ve.in_s) {
          ve.s = gone;
          nonres.insert({ve.stamp, v});
        } else {
          at.erase(v);
        }
        --resident;
      }
      entry& e = at[x];  // references survive a rehash
      ++resident;
      if (e.s == gone) {
        nonres.erase({e.stamp, x});
        e.s = lir;
        to_top(x, e, now);
        demote_bottom();
      } else {
        e.s = hir;
        to_top(x, e, now);
        to_q_end(x, e);
      }
      while (nonres.size() > nr_cap) {  // forget the oldest non-resident key
        const std::uint32_t k = nonres.begin()->second;
        nonres.erase(nonres.begin());
        s.erase(at[k].s_it);
        at.erase(k);
      }
    }
    peak = std::max(peak, resident);
    tracked = std::max(tracked, at.size());
  }
  if (probe != nullptr) {
    probe->peak_resident = peak;
    probe->peak_tracked = tracked;
  }
  return hit;
}

inline std::uint64_t lirs_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  const std::vector<bool> h = lirs_replay(t, capacity);
  return static_cast<std::uint64_t>(std::count(h.begin(), h.end(), true));
}

// sieve_replay: SIEVE (Zhang, Yang, Yue, Vigfusson, Rashmi, "SIEVE is Simpler than LRU: an
// Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024), exact and unsharded. One
// FIFO queue with a visited bit a key: a hit sets the bit and moves nothing; a new key enters at
// the head; a miss with the cache full moves a hand from where it stopped (from the tail at
// first) towards the head, clearing the bits it passes, evicts the first key whose bit is clear
// and leaves the hand on the key after it towards the head (wrapping to the tail). Retained keys
// keep their place, so that a new key is looked at, and evicted if unread, before the old ones the
// hand has passed. The hits, access by access; `probe` gets the peak resident count.
inline std::vector<bool> sieve_replay(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                      policy_probe* probe = nullptr) {
  struct node {
    std::uint32_t key;
    bool visited;
  };
  using list = std::list<node>;  // front = head (newest), back = tail (oldest)
  list q;
  std::unordered_map<std::uint32_t, list::iterator> at;
  at.reserve(capacity * 2);
  auto hand = q.end();  // end(): from the tail
  std::vector<bool> hit(t.size(), false);
  std::size_t peak = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t k = t[i];
    if (const auto f = at.find(k); f != at.end()) {
      f->second->visited = true;
      hit[i] = true;
      continue;
    }
    if (capacity == 0) continue;
    if (at.size() >= capacity) {
      auto h = hand == q.end() ? std::prev(q.end()) : hand;
      while (h->visited) {
        h->visited = false;
        h = h == q.begin() ? std::prev(q.end()) : std::prev(h);
      }
      hand = h == q.begin() ? q.end() : std::prev(h);
      at.erase(h->key);
      q.erase(h);
    }
    q.push_front({k, false});
    at[k] = q.begin();
    peak = std::max(peak, at.size());
  }
  if (probe != nullptr) probe->peak_resident = probe->peak_tracked = peak;
  return hit;
}

inline std::uint64_t sieve_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  const std::vector<bool> h = sieve_replay(t, capacity);
  return static_cast<std::uint64_t>(std::count(h.begin(), h.end(), true));
}

// two_q_replay: 2Q, the full version (Johnson and Shasha, "2Q: A Low Overhead High Performance
// Buffer Management Replacement Algorithm", VLDB 1994, Fig. 2), exact and unsharded. A1in, a
// FIFO of the keys read once (Kin = `in_share` of the capacity, at least 1); A1out, a FIFO
// remembering the keys A1in let go (Kout = `out_share` of the capacity keys, not resident); Am,
// an LRU of the keys read again after A1in let them go. A hit in Am moves the key to Am's head, a
// hit in A1in moves nothing; a miss on a key of A1out puts it in Am, any other miss in A1in.
// Room is made (the paper's reclaimfor) from A1in's tail, into A1out, while A1in holds more than
// Kin or Am is empty, else from Am's tail (forgotten). The hits, access by access; `probe` gets
// the peak resident count and the peak of resident plus remembered keys.
inline std::vector<bool> two_q_replay(const std::vector<std::uint32_t>& t, std::size_t capacity,
                                      double in_share = 0.25, double out_share = 0.5,
                                      policy_probe* probe = nullptr) {
  using list = std::list<std::uint32_t>;  // front = head (newest)
  enum which : std::uint8_t { am, a1in, a1out };
  struct where {
    which in;
    list::iterator it;
  };
  list l[3];
  std::unordered_map<std::uint32_t, where> at;
  at.reserve(capacity * 2);
  const auto share = [capacity](double s) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(capacity) * s));
  };
  const std::size_t kin = share(in_share);
  const std::size_t kout = share(out_share);
  const auto push = [&](which w, std::uint32_t k) {
    l[w].push_front(k);
    at[k] = {w, l[w].begin()};
  };
  const auto reclaim = [&] {
    if (l[am].size() + l[a1in].size() < capacity) return;
    if (l[a1in].size() > kin || l[am].empty()) {
      const std::uint32_t y = l[a1in].back();
      l[a1in].pop_back();
      push(a1out, y);
      if (l[a1out].size() > kout) {
        at.erase(l[a1out].back());
        l[a1out].pop_back();
      }
    } else {
      at.erase(l[am].back());
      l[am].pop_back();
    }
  };
  std::vector<bool> hit(t.size(), false);
  std::size_t peak = 0;
  std::size_t tracked = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t k = t[i];
    const auto f = at.find(k);
    if (f != at.end() && f->second.in == am) {
      l[am].splice(l[am].begin(), l[am], f->second.it);
      hit[i] = true;
    } else if (f != at.end() && f->second.in == a1in) {
      hit[i] = true;
    } else if (capacity != 0) {
      const bool remembered = f != at.end();
      if (remembered) {
        l[a1out].erase(f->second.it);
        at.erase(f);
      }
      reclaim();
      push(remembered ? am : a1in, k);
    }
    peak = std::max(peak, l[am].size() + l[a1in].size());
    tracked = std::max(tracked, at.size());
  }
  if (probe != nullptr) {
    probe->peak_resident = peak;
    probe->peak_tracked = tracked;
  }
  return hit;
}

inline std::uint64_t two_q_hits(const std::vector<std::uint32_t>& t, std::size_t capacity) {
  const std::vector<bool> h = two_q_replay(t, capacity);
  return static_cast<std::uint64_t>(std::count(h.begin(), h.end(), true));
}

}  // namespace sftrace
