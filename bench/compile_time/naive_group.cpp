// bench/compile_time/naive_group.cpp: group.cpp's program written naively, a mutex and an
// unordered_map of shared calls (the baseline of bench/compile_time.sh).
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace {

template <class Key, class T>
class naive_group {
 public:
  template <class F>
  T do_(const Key& key, F&& fn) {
    std::unique_lock<std::mutex> lk(mu_);
    if (auto it = calls_.find(key); it != calls_.end()) {
      std::shared_ptr<call> c = it->second;
      c->cv.wait(lk, [&] { return c->done; });
      if (c->error) std::rethrow_exception(c->error);
      return *c->value;
    }
    auto c = std::make_shared<call>();
    calls_.emplace(key, c);
    lk.unlock();
    try {
      c->value.emplace(fn());
    } catch (...) {
      c->error = std::current_exception();
    }
    lk.lock();
    calls_.erase(key);
    c->done = true;
    c->cv.notify_all();
    if (c->error) std::rethrow_exception(c->error);
    return *c->value;
  }

 private:
  struct call {
    std::condition_variable cv;
    bool done = false;
    std::optional<T> value;
    std::exception_ptr error;
  };
  std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<call>> calls_;
};

}  // namespace

int main(int argc, char**) {
  naive_group<std::string, int> g;
  return g.do_(std::string("tenant-7|user-42"), [&] { return argc; });
}
