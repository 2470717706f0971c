// bench/compile_time/naive_cache.cpp: cache.cpp's program written naively, a mutex and an
// unordered_map of values with their expiry (the baseline of bench/compile_time.sh).
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace {

template <class Key, class T>
class naive_cache {
 public:
  using clock = std::chrono::steady_clock;
  explicit naive_cache(clock::duration ttl) : ttl_(ttl) {}

  template <class F>
  T get(const Key& key, F&& load) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (auto it = entries_.find(key); it != entries_.end() && it->second.second > clock::now())
        return it->second.first;
    }
    T v = load();
    std::lock_guard<std::mutex> lk(mu_);
    entries_.insert_or_assign(key, std::pair<T, clock::time_point>(v, clock::now() + ttl_));
    return v;
  }

 private:
  clock::duration ttl_;
  std::mutex mu_;
  std::unordered_map<Key, std::pair<T, clock::time_point>> entries_;
};

}  // namespace

int main(int argc, char**) {
  using namespace std::chrono_literals;
  naive_cache<std::string, int> c(30s);
  return c.get(std::string("tenant-7|user-42"), [&] { return argc; });
}
