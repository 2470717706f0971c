// bench/traces/policy_timeline.cpp: how the cache's eviction policy (detail::wtinylfu, one
// shard) behaves over one trace, segment by segment, next to LRU and CLOCK of the same
// capacity (docs/performance.md, "Eviction, measured", reads it for sprite@1000). Not built by
// CMake:
//   g++ -O2 -DNDEBUG -std=c++20 -I include -I bench bench/traces/policy_timeline.cpp -o /tmp/pt
//   /tmp/pt sprite 1000 10000
// Arguments: trace name, capacity, segment length in accesses; the traces' directory as for
// bench_traces ($SINGLEFLIGHT_TRACES, else ../shared/traces).
//
// The policy is driven as a shard of a cache with one shard drives it (policy_shard.hpp), with
// the cache's fingerprints: the total is bench_traces's "1 shard" column's. Per segment: the
// window's target share of the capacity and the protected queue's share of main at the segment's
// end; the segment's evictions that took the window's candidate (it lost its duel against main's
// victim: "lost") and those that took an entry of main ("victims": a candidate won its duel, or
// entered without one as the window shrank); the hit ratios of the policy, LRU and CLOCK (one
// reference bit over the whole capacity: the cache's window at 100 %) and S3-FIFO with promotion
// after one hit and a ghost of 1.0x the capacity (reference.hpp, the best S3-FIFO on the web
// traces). Then the accesses on which S3-FIFO hit and the policy missed, by what the policy last
// did with the key (the window lost it in a duel, "lost", or main evicted it, "victim"), how
// many reads it had while it was held (0, 1, 2 or more), how long before the access it was
// evicted (in accesses, against the capacity) and where S3-FIFO held it (small, main after a
// promotion, main after a ghost hit); the ten largest classes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "traces/policy_shard.hpp"
#include "traces/reference.hpp"
#include "traces/trace_file.hpp"

namespace {

struct entry : sftrace::policy_entry {
  bool in_window = false;  // before the eviction being counted
  int reads = 0;           // hits while held
};

// What the policy last did with a key: how it left, when, after how many reads.
struct fate {
  bool lost = false;
  std::size_t at = 0;
  int reads = 0;
};

// One reference policy, fed one access at a time.
struct lru {
  explicit lru(std::size_t c) : cap(c) {}
  bool access(std::uint32_t k) {
    if (auto f = at.find(k); f != at.end()) {
      order.splice(order.begin(), order, f->second);
      return true;
    }
    order.push_front(k);
    at[k] = order.begin();
    if (order.size() > cap) {
      at.erase(order.back());
      order.pop_back();
    }
    return false;
  }
  std::size_t cap;
  std::list<std::uint32_t> order;
  std::unordered_map<std::uint32_t, std::list<std::uint32_t>::iterator> at;
};

struct clock_ref {
  explicit clock_ref(std::size_t c) : cap(c) {}
  bool access(std::uint32_t k) {
    if (auto f = at.find(k); f != at.end()) {
      f->second.second = true;
      return true;
    }
    while (order.size() >= cap) {  // the tail: a second chance if referenced
      auto& e = at[order.back()];
      if (!e.second) {
        at.erase(order.back());
        order.pop_back();
        break;
      }
      e.second = false;
      order.splice(order.begin(), order, std::prev(order.end()));
    }
    order.push_front(k);
    at[k] = {order.begin(), false};
    return false;
  }
  std::size_t cap;
  std::list<std::uint32_t> order;
  std::unordered_map<std::uint32_t, std::pair<std::list<std::uint32_t>::iterator, bool>> at;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TRACE CAPACITY SEGMENT\n", argv[0]);
    return 2;
  }
  const std::string name = argv[1];
  const std::size_t capacity = std::strtoul(argv[2], nullptr, 10);
  const std::size_t segment = std::strtoul(argv[3], nullptr, 10);
  std::vector<std::uint32_t> t;
  for (const auto& spec : sftrace::all_traces) {
    if (name == spec.name) t = sftrace::read_trace(sftrace::traces_dir(nullptr), spec);
  }
  if (t.empty() || capacity == 0 || segment == 0) {
    std::fprintf(stderr, "no trace %s, or a capacity or segment of 0\n", name.c_str());
    return 2;
  }
  sftrace::policy_shard<entry> shard(capacity);
  lru l(capacity);
  clock_ref c(capacity);
  std::vector<sftrace::s3fifo_where> where;
  const std::vector<bool> s3 = sftrace::s3fifo_replay(t, capacity, 1, 1.0, &where);
  std::unordered_map<std::uint32_t, fate> fates;
  std::map<std::string, std::uint64_t> s3_only;  // class -> accesses
  std::uint64_t policy_only = 0;                 // accesses the policy hit and S3-FIFO missed
  std::uint64_t seg[4] = {0, 0, 0, 0};
  std::uint64_t lost = 0;
  std::uint64_t victims = 0;
  std::uint64_t all[4] = {0, 0, 0, 0};
  std::printf(
      "| accesses | window %% | protected %% of main | lost | victims | policy | LRU | CLOCK | "
      "S3-FIFO |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint32_t k = t[i];
    policy_only += !s3[i] && shard.holds(k) ? 1 : 0;
    if (s3[i] && !shard.holds(k)) {
      std::string cls = "never held";
      if (const auto f = fates.find(k); f != fates.end()) {
        const std::size_t age = i - f->second.at;
        cls = std::string(f->second.lost ? "lost" : "victim") + ", " +
              std::to_string(std::min(f->second.reads, 2)) +
              (f->second.reads >= 2   ? "+ reads, "
               : f->second.reads == 1 ? " read, "
                                      : " reads, ") +
              (age < capacity       ? "< 1x"
               : age < 4 * capacity ? "1-4x"
                                    : ">= 4x");
      }
      cls += where[i] == sftrace::s3fifo_where::small      ? ", S3-FIFO: small"
             : where[i] == sftrace::s3fifo_where::promoted ? ", S3-FIFO: main (promoted)"
                                                           : ", S3-FIFO: main (from ghost)";
      ++s3_only[cls];
    }
    // An eviction took the window's candidate (it lost its duel), or an entry of main.
    const auto mark_window = [&shard] {
      for (const auto& [key, e] : shard.entries()) {
        e->in_window = e->queue == singleflight::detail::wtinylfu::window_q;
      }
    };
    const auto evicted = [&](entry& v) {
      (v.in_window ? lost : victims) += 1;
      fates[v.key] = {v.in_window, i, v.reads};
    };
    if (entry* e = shard.access(k, mark_window, evicted); e != nullptr) {
      ++seg[0];
      ++e->reads;
    }
    seg[1] += l.access(k) ? 1 : 0;
    seg[2] += c.access(k) ? 1 : 0;
    seg[3] += s3[i] ? 1 : 0;
    if ((i + 1) % segment == 0 || i + 1 == t.size()) {
      std::size_t prot = 0;
      std::size_t main = 0;
      for (const auto& [key, e] : shard.entries()) {
        main += e->queue != singleflight::detail::wtinylfu::window_q ? 1 : 0;
        prot += e->queue == singleflight::detail::wtinylfu::protected_q ? 1 : 0;
      }
      const double n = static_cast<double>(i % segment + 1);
      std::printf(
          "| %zu | %.0f | %.0f | %llu | %llu | %.2f | %.2f | %.2f | %.2f |\n", i + 1,
          100.0 * static_cast<double>(shard.policy().window()) / static_cast<double>(capacity),
          main == 0 ? 0.0 : 100.0 * static_cast<double>(prot) / static_cast<double>(main),
          static_cast<unsigned long long>(lost), static_cast<unsigned long long>(victims),
          100.0 * static_cast<double>(seg[0]) / n, 100.0 * static_cast<double>(seg[1]) / n,
          100.0 * static_cast<double>(seg[2]) / n, 100.0 * static_cast<double>(seg[3]) / n);
      for (int j = 0; j < 4; ++j) {
        all[j] += seg[j];
        seg[j] = 0;
      }
      lost = victims = 0;
    }
  }
  const auto total = static_cast<double>(t.size());
  std::printf(
      "\n%s@%zu: policy %.2f, LRU %.2f, CLOCK %.2f, S3-FIFO %.2f\n", name.c_str(), capacity,
      100.0 * static_cast<double>(all[0]) / total, 100.0 * static_cast<double>(all[1]) / total,
      100.0 * static_cast<double>(all[2]) / total, 100.0 * static_cast<double>(all[3]) / total);
  std::vector<std::pair<std::uint64_t, std::string>> classes;
  std::uint64_t s3_only_all = 0;
  for (const auto& [cls, n] : s3_only) {
    classes.emplace_back(n, cls);
    s3_only_all += n;
  }
  std::sort(classes.rbegin(), classes.rend());
  std::printf(
      "\npolicy hit, S3-FIFO missed: %llu accesses; S3-FIFO hit, policy missed: %llu\n\n"
      "| the key | accesses |\n|---|---:|\n",
      static_cast<unsigned long long>(policy_only), static_cast<unsigned long long>(s3_only_all));
  for (std::size_t j = 0; j < classes.size() && j < 10; ++j) {
    std::printf("| %s | %llu |\n", classes[j].second.c_str(),
                static_cast<unsigned long long>(classes[j].first));
  }
  return 0;
}
