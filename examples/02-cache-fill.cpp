// 02-cache-fill: a group in front of a cache. The cache shares completed
// values over time; the group shares unfinished work at one moment. The
// cache is checked again inside the flight, because a caller that missed the
// cache can arrive just after the previous flight filled it and left.
#include <singleflight/singleflight.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

class cache {
 public:
  std::optional<std::string> get(const std::string& k) {
    std::lock_guard<std::mutex> lk(m_);
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void put(const std::string& k, std::string v) {
    std::lock_guard<std::mutex> lk(m_);
    map_[k] = std::move(v);
  }

 private:
  std::mutex m_;
  std::unordered_map<std::string, std::string> map_;
};

int main() {
  cache c;
  singleflight::group<std::string, std::string> loads;
  std::atomic<int> origin_calls{0};

  // --- snippet: cache-aside ---
  auto load = [&](const std::string& key) {
    if (auto hit = c.get(key)) return *hit;  // fast path: no coordination
    // fn captures the key by value: it may outlive this call with an
    // executor (here it runs inline, but the habit costs nothing).
    return loads.do_(key, [&c, &origin_calls, key] {
      if (auto hit = c.get(key)) return *hit;  // filled while we were getting here?
      origin_calls.fetch_add(1);
      std::string value = "value of " + key;
      c.put(key, value);
      return value;
    });
  };
  // --- end snippet ---

  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (int i = 0; i < 32; ++i) {
    ts.emplace_back([&, i] {
      for (int round = 0; round < 100; ++round) {
        const std::string key = "tenant-1|homepage|v" + std::to_string(i % 4);
        if (load(key) == "value of " + key) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  std::printf("lookups: %d, origin calls: %d (one per distinct key)\n", ok.load(),
              origin_calls.load());
  return ok == 3200 && origin_calls == 4 ? 0 : 1;
}
