// tests/support/batch.hpp: tools for the batch_loader tests.
//
//  * bulk_record<Key>: what a bulk function saw, call by call: the keys, the
//    thread it ran on, whether its token had fired when it returned. Filled
//    by the bulk function (any thread), read by the test's thread.
//  * identity_bulk(record, hold): a synchronous bulk function answering each
//    key with itself; with `hold`, each call waits (bounded) for that gate
//    before it answers, so the test can act while the batch is running.
//  * forever: a window no test waits for; batches close by max_batch or
//    flush() only.
#pragma once

#include <singleflight/batch_loader.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "sync.hpp"

namespace sftest {

inline constexpr std::chrono::nanoseconds forever = std::chrono::hours(1);

template <class Key>
class bulk_record {
 public:
  struct call {
    std::vector<Key> keys;
    std::thread::id thread;
    std::chrono::steady_clock::time_point at;
    bool stopped = false;  // the call's token had fired when it returned
    bool returned = false;
  };

  // enter(keys): a call began; returns its index.
  std::size_t enter(std::span<const Key> keys) {
    std::lock_guard<std::mutex> lk(m_);
    calls_.push_back({std::vector<Key>(keys.begin(), keys.end()), std::this_thread::get_id(),
                      std::chrono::steady_clock::now()});
    return calls_.size() - 1;
  }
  void leave(std::size_t i, const singleflight::stop_token& st) {
    std::lock_guard<std::mutex> lk(m_);
    calls_[i].stopped = st.stop_requested();
    calls_[i].returned = true;
  }
  std::size_t count() const {
    std::lock_guard<std::mutex> lk(m_);
    return calls_.size();
  }
  std::vector<std::vector<Key>> keys() const {
    std::lock_guard<std::mutex> lk(m_);
    std::vector<std::vector<Key>> out;
    for (const auto& c : calls_) out.push_back(c.keys);
    return out;
  }
  // keys(), in sorted order: the batches whatever order their calls started in (batches
  // dispatched together run at once, on different threads).
  std::vector<std::vector<Key>> sorted_keys() const {
    auto out = keys();
    std::sort(out.begin(), out.end());
    return out;
  }
  call at(std::size_t i) const {
    std::lock_guard<std::mutex> lk(m_);
    return calls_.at(i);
  }
  // Waits (bounded, by name) until n calls have begun.
  void wait(std::size_t n, const char* name) const {
    must([&] { return count() >= n; }, name);
  }

 private:
  mutable std::mutex m_;
  std::vector<call> calls_;
};

template <class Key>
auto identity_bulk(bulk_record<Key>& rec, const gate* hold = nullptr) {
  return [&rec, hold](std::span<const Key> keys, singleflight::stop_token st) {
    const std::size_t i = rec.enter(keys);
    if (hold != nullptr) hold->wait("bulk call held");
    rec.leave(i, st);
    return std::vector<Key>(keys.begin(), keys.end());
  };
}

// Options with a window no test waits for and the given max_batch.
inline singleflight::batch_options no_window(std::size_t max_batch = 0) {
  singleflight::batch_options o;
  o.window = forever;
  o.max_batch = max_batch;
  return o;
}

}  // namespace sftest
