// detail::worker_threads, the threads every layer owns and their close protocol
// (include/singleflight/detail/worker_threads.hpp; its model: tests/model/worker_threads.pml):
// concurrent outside closes all wait, jobs of two objects that close each other (and
// themselves) all return, the default and a given cap bound the threads, a refusal is
// returned to the caller, the destructor joins. Interleavings are forced with gates; every
// wait is bounded (a hang aborts with its name).
#include <singleflight/detail/worker_threads.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>

#include "support/catch.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sf::detail::worker_threads;
using sftest::gate;
using sftest::must;
using namespace std::chrono_literals;

namespace {

// Posts a job running f; REQUIREs that it was taken.
template <class F>
void post(worker_threads& w, F f) {
  auto j = worker_threads::make_job(std::move(f));
  REQUIRE(w.post(j));
}

// Whether w refuses jobs (closed), probed with a job that does nothing.
bool refuses(worker_threads& w) {
  auto j = worker_threads::make_job([] {});
  return !w.post(j);
}

}  // namespace

TEST_CASE("two outside closers both wait for a running job", "[worker_threads][close]") {
  // Catches: the second closer returning at once because the first took the thread list.
  worker_threads w;
  gate release;
  std::atomic<bool> job_done{false};
  post(w, [&] {
    release.wait("the test releases the job");
    job_done = true;
  });
  std::atomic<bool> first_returned{false}, second_returned{false};
  sftest::thread first([&] {
    w.close();
    first_returned = true;
  });
  must([&] { return refuses(w); }, "the first closer closed");
  sftest::thread second([&] {
    w.close();
    second_returned = true;
  });
  // The job still runs: neither closer may return.
  CHECK_FALSE(sftest::becomes([&] { return second_returned.load(); }, 200ms));
  CHECK_FALSE(first_returned);
  release.open();
  first.join("the first closer returns");
  second.join("the second closer returns");
  CHECK(job_done);
  CHECK(w.threads() == 0);
}

TEST_CASE("jobs of two objects that close each other and themselves all return",
          "[worker_threads][close]") {
  // Catches: a close from a job joining the other object's thread, whose job is joining this
  // one's (each waits for the other forever).
  std::optional<worker_threads> a, b;
  a.emplace();
  b.emplace();
  std::atomic<int> started{0}, returned{0};
  auto both_started = [&] {
    ++started;
    must([&] { return started.load() == 2; }, "both jobs run");
  };
  post(*a, [&] {
    both_started();
    b->close();
    a->close();
    ++returned;
  });
  post(*b, [&] {
    both_started();
    a->close();
    b->close();
    ++returned;
  });
  must([&] { return returned.load() == 2; }, "both jobs' closes return");
  CHECK(refuses(*a));
  CHECK(refuses(*b));
  a->close();  // from outside: joins a's thread
  CHECK(a->threads() == 0);
  b.reset();  // the destructor joins b's
  a.reset();
}

TEST_CASE("jobs of one object that both close it return", "[worker_threads][close]") {
  worker_threads w;
  std::atomic<int> started{0}, returned{0};
  for (int i = 0; i < 2; ++i) {
    post(w, [&] {
      ++started;
      must([&] { return started.load() == 2; }, "both jobs run");
      w.close();
      ++returned;
    });
  }
  must([&] { return returned.load() == 2; }, "both jobs' closes return");
  w.close();
  CHECK(w.threads() == 0);
}

TEST_CASE("an outside close waits for a job that closes its own object",
          "[worker_threads][close]") {
  worker_threads w;
  gate closing, release;
  std::atomic<bool> job_done{false};
  post(w, [&] {
    w.close();  // returns at once
    closing.open();
    release.wait("the test releases the job");
    job_done = true;
  });
  closing.wait("the job closed");
  std::atomic<bool> returned{false};
  sftest::thread outside([&] {
    w.close();
    returned = true;
  });
  CHECK_FALSE(sftest::becomes([&] { return returned.load(); }, 100ms));
  release.open();
  outside.join("the outside close returns");
  CHECK(job_done);
}

TEST_CASE("threads are bounded: by default and by the cap given", "[worker_threads][cap]") {
  // Catches: one thread per blocked job without end.
  const std::size_t cap = GENERATE(std::size_t{3}, worker_threads::default_max_threads);
  std::optional<worker_threads> made;
  if (cap == worker_threads::default_max_threads) {
    made.emplace();
  } else {
    made.emplace(worker_threads::default_idle_for, cap);
  }
  worker_threads& w = *made;
  CHECK(w.max_threads() == cap);
  gate release;
  std::atomic<std::size_t> running{0}, most{0}, finished{0};
  const std::size_t jobs = cap + 5;
  for (std::size_t i = 0; i < jobs; ++i) {
    post(w, [&] {
      const std::size_t now = ++running;
      std::size_t seen = most.load();
      while (seen < now && !most.compare_exchange_weak(seen, now)) {
      }
      release.wait("the test releases the jobs");
      --running;
      ++finished;
    });
  }
  must([&] { return running.load() == cap; }, "the cap's worth of jobs run");
  CHECK(w.threads() == cap);
  release.open();
  must([&] { return finished.load() == jobs; }, "the queued jobs run too");
  CHECK(most.load() == cap);
  w.close();
  CHECK(w.threads() == 0);
}

TEST_CASE("a refused job is returned to the caller, with the reason", "[worker_threads][refusal]") {
  worker_threads w;
  w.close();
  std::atomic<int> destroyed{0};
  struct counted {
    std::atomic<int>* n;
    counted(std::atomic<int>* p) : n(p) {}
    counted(counted&& o) noexcept : n(std::exchange(o.n, nullptr)) {}
    ~counted() {
      if (n != nullptr) ++*n;
    }
  };
  auto j = worker_threads::make_job([c = counted(&destroyed)] {});
  CHECK_FALSE(w.post(j));
  REQUIRE(j != nullptr);  // still the caller's
  CHECK(destroyed == 0);
  std::exception_ptr why = w.try_post(j);
  REQUIRE(why != nullptr);
  CHECK_THROWS_AS(std::rethrow_exception(why), sf::closed_error);
  REQUIRE(j != nullptr);
  j.reset();
  CHECK(destroyed == 1);
  CHECK(w.closed());
}

TEST_CASE("the destructor waits for every job and joins every thread",
          "[worker_threads][destructor]") {
  std::optional<worker_threads> w;
  w.emplace();
  gate release;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) {
    post(*w, [&] {
      release.wait("the test releases the jobs");
      ++done;
    });
  }
  must([&] { return w->threads() == 3; }, "three threads run");
  std::atomic<bool> destroyed{false};
  sftest::thread destroyer([&] {
    w.reset();
    destroyed = true;
  });
  CHECK_FALSE(sftest::becomes([&] { return destroyed.load(); }, 100ms));
  release.open();
  destroyer.join("the destructor returns");
  CHECK(done == 3);
}
