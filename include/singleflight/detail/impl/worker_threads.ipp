// singleflight/detail/impl/worker_threads.ipp -- internal; do not include directly.
//
// worker_threads' definitions (detail/worker_threads.hpp, which describes the protocol): included
// by that header in header-only mode, by singleflight/src.hpp in compiled mode
// (detail/config.hpp). The job queue's and the thread list's code is all here, so that in
// compiled mode no other translation unit instantiates it.
#pragma once

#include "../worker_threads.hpp"

namespace singleflight::detail {

SINGLEFLIGHT_DECL worker_threads::job::~job() = default;

SINGLEFLIGHT_DECL worker_threads::worker_threads(std::chrono::nanoseconds idle_for,
                                                 std::size_t max_threads) noexcept
    : idle_for_(idle_for), max_threads_(max_threads) {}

SINGLEFLIGHT_DECL worker_threads::~worker_threads() {
  if (current_ == this) {
    std::fputs(
        "singleflight: an object was destroyed on one of its own threads (inside its loader, "
        "bulk function or callback); call close() there and destroy it elsewhere\n",
        stderr);
    std::abort();
  }
  std::unique_lock<std::mutex> lk(mu_);
  closing_ = true;
  cv_.notify_all();
  join_all(lk);
}

SINGLEFLIGHT_DECL bool worker_threads::post(std::unique_ptr<job>& j) {
  std::list<worker> done;
  bool posted = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    reap_locked(done);
    if (!closing_) {
      queue_.push_back(std::move(j));
      posted = true;
      if (idle_ >= queue_.size() || (max_threads_ != 0 && workers_.size() >= max_threads_)) {
        cv_.notify_one();  // an idle thread takes it, or the next thread to finish a job
      } else {
        try {
          workers_.emplace_back();
          worker& w = workers_.back();
          w.thread = std::thread([this, &w] { loop(w); });
        } catch (...) {
          workers_.pop_back();
          j = std::move(queue_.back());
          queue_.pop_back();
          posted = false;
          lk.unlock();
          join_reaped(done);
          throw;
        }
      }
    }
  }
  join_reaped(done);
  return posted;
}

SINGLEFLIGHT_DECL std::exception_ptr worker_threads::try_post(std::unique_ptr<job>& j) noexcept {
  try {
    if (post(j)) return nullptr;
    return std::make_exception_ptr(closed_error());
  } catch (...) {
    return std::current_exception();
  }
}

SINGLEFLIGHT_DECL void worker_threads::close() {
  std::unique_lock<std::mutex> lk(mu_);
  closing_ = true;
  cv_.notify_all();
  if (on_library_thread()) return;  // a library thread (any layer's): stop, reject, never wait
  join_all(lk);
}

SINGLEFLIGHT_DECL void worker_threads::stop() {
  std::lock_guard<std::mutex> lk(mu_);
  closing_ = true;
  cv_.notify_all();
}

SINGLEFLIGHT_DECL bool worker_threads::closed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return closing_;
}

SINGLEFLIGHT_DECL bool worker_threads::on_own_thread() const noexcept { return current_ == this; }

SINGLEFLIGHT_DECL std::size_t worker_threads::threads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return workers_.size() + joining_;
}

SINGLEFLIGHT_DECL void worker_threads::loop(worker& self) {
  current_ = this;
  library_thread::mark();
  struct ended_mark {
    worker_threads* o;
    worker* w;
    ~ended_mark() {
      const std::lock_guard<std::mutex> lk(o->mu_);
      w->finished = true;
    }
  } ended{this, &self};
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    while (!queue_.empty()) {
      std::unique_ptr<job> j = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      j->run();
      j.reset();  // whatever the job owned goes before the lock is retaken
      lk.lock();
    }
    if (closing_) break;
    ++idle_;
    const bool woke = cv_.wait_for(lk, idle_for_, [&] { return closing_ || !queue_.empty(); });
    --idle_;
    if (!woke) break;
  }
  lk.unlock();  // `ended` marks this thread finished
}

SINGLEFLIGHT_DECL void worker_threads::join_all(std::unique_lock<std::mutex>& lk) {
  for (;;) {
    if (!workers_.empty()) {
      std::list<worker> mine;
      mine.swap(workers_);
      const std::size_t n = mine.size();
      joining_ += n;
      lk.unlock();
      for (worker& w : mine) w.thread.join();
      mine.clear();
      lk.lock();
      joining_ -= n;
      joined_cv_.notify_all();
      continue;
    }
    if (joining_ == 0) return;
    joined_cv_.wait(lk, [&] { return joining_ == 0 || !workers_.empty(); });
  }
}

SINGLEFLIGHT_DECL void worker_threads::reap_locked(std::list<worker>& out) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->finished) {
      out.splice(out.end(), workers_, it);
      ++joining_;
    }
    it = next;
  }
}

SINGLEFLIGHT_DECL void worker_threads::join_reaped(std::list<worker>& done) {
  if (done.empty()) return;
  for (worker& w : done) w.thread.join();  // finished: returns at once
  std::lock_guard<std::mutex> lk(mu_);
  joining_ -= done.size();
  joined_cv_.notify_all();
}

}  // namespace singleflight::detail
