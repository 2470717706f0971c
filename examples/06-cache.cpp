// 06-cache: the seed's profile service behind singleflight::cache.
//
// Profiles are keyed tenant|user|locale (everything that changes the answer)
// and cost a 200 ms origin call. 8 request threads read 20 profiles for 4 s:
//   * at start 64 requests arrive at once: one origin call per profile;
//   * ttl 1 s with jitter 0.1: the profiles do not all expire together;
//   * stale_while_revalidate 0.5 s: after ttl a reader gets the old profile at
//     once and one background refresh runs;
//   * from 1.8 s to 3.3 s the origin is down: stale_if_error (1 min) answers
//     with the last profile instead of the error, and error_ttl (0.5 s) keeps
//     the failing origin from being asked more than about twice a second per
//     profile (a profile with no old value would have its failure cached and
//     thrown to every caller for 0.5 s);
//   * the origin is the cache-wide loader, given at construction: the cache
//     keeps it for the loads and refreshes that outlive a request.
// Prints origin calls, hits and stale serves, and exits non-zero if a request
// got an error, a profile's origin call ever overlapped another of the same
// profile (the start burst not coalesced), a profile was never loaded, or no
// stale serve happened.
#include <singleflight/cache.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

int run() {
  const auto start = steady::now();
  const auto since_start = [start] { return steady::now() - start; };
  std::atomic<int> origin_calls{0};
  std::atomic<int> origin_failures{0};
  // Per profile, under `seen_mu`: origin calls running now, and whether one has returned a
  // profile yet. `overlaps`: a call that started while another of its profile ran;
  // `first_loads`: calls that returned a profile never returned before.
  std::mutex seen_mu;
  std::map<std::string, std::pair<int, bool>> seen;
  int overlaps = 0;
  int first_loads = 0;

  // Declared after what its loader uses: destroyed first, it joins its loads and refreshes.
  singleflight::cache<std::string, std::string> profiles(
      {
          .ttl = 1s,
          .jitter = 0.1,
          .stale_while_revalidate = 500ms,
          .stale_if_error = 1min,
          .error_ttl = 500ms,  // a failing profile is asked at most twice a second; one with
                               // no old value: its failure is thrown to every caller for 0.5 s
      },
      // The cache-wide loader: the cache keeps it and runs it for misses and background
      // refreshes, after the request that caused them has returned; it is given the key.
      [&origin_calls, &origin_failures, &seen_mu, &seen, &overlaps, &first_loads, since_start](
          const std::string& key, singleflight::stop_token) {
        origin_calls.fetch_add(1);
        {
          const std::lock_guard<std::mutex> lk(seen_mu);
          if (++seen[key].first > 1) ++overlaps;
        }
        std::this_thread::sleep_for(200ms);  // the slow origin
        const auto t = since_start();
        const bool down = t > 1800ms && t < 3300ms;
        {
          const std::lock_guard<std::mutex> lk(seen_mu);
          auto& [running, loaded] = seen[key];
          --running;
          if (!down && !loaded) {
            loaded = true;
            ++first_loads;
          }
        }
        if (down) {
          origin_failures.fetch_add(1);
          throw std::runtime_error("profile service unavailable");
        }
        return "profile of " + key;
      });

  std::vector<std::string> keys;
  keys.reserve(20);
  for (int i = 0; i < 20; ++i) {
    keys.push_back("tenant-" + std::to_string(i % 3) + "|user-" + std::to_string(100 + i) + "|" +
                   (i % 2 != 0 ? "en-GB" : "de-DE"));
  }

  std::atomic<int> requests{0};
  std::atomic<int> errors{0};
  std::atomic<int> waited{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::minstd_rand rng(static_cast<unsigned>(t) + 1);
      for (int n = 0; since_start() < 4s; ++n) {
        // The first 8 requests per thread are the start burst (all 20 keys, 64 requests).
        const std::string& key = keys[n < 8 ? (t * 8 + n) % keys.size() : rng() % keys.size()];
        try {
          const auto e = profiles.get_entry(key);
          if (*e.value != "profile of " + key) errors.fetch_add(1);
          if (e.taken_as != singleflight::role::none) waited.fetch_add(1);
        } catch (const std::exception& ex) {
          std::printf("request error: %s\n", ex.what());
          errors.fetch_add(1);
        }
        requests.fetch_add(1);
        if (n >= 8) std::this_thread::sleep_for(10ms);  // the next request on this handler
      }
    });
  }
  for (auto& t : threads) t.join();
  profiles.close();

  const singleflight::cache_stats s = profiles.stats();
  std::printf("requests:              %d\n", requests.load());
  std::printf(
      "origin calls:          %d (%d first loads of %zu profiles; %d overlapping; %d failed)\n",
      origin_calls.load(), first_loads, keys.size(), overlaps, origin_failures.load());
  std::printf("hits:                  %llu\n", static_cast<unsigned long long>(s.hits));
  std::printf("stale serves:          %llu (%llu while the origin was down)\n",
              static_cast<unsigned long long>(s.stale_hits),
              static_cast<unsigned long long>(s.stale_on_error));
  std::printf("waited on the origin:  %d requests\n", waited.load());
  std::printf("background refreshes:  %llu\n",
              static_cast<unsigned long long>(s.background_refreshes));
  std::printf("errors seen by users:  %d\n", errors.load());

  const bool ok = errors == 0 && overlaps == 0 && first_loads == static_cast<int>(keys.size()) &&
                  s.stale_hits > 0 && s.stale_on_error > 0 && s.background_refreshes > 0;
  if (!ok) std::printf("FAILED: a claim above does not hold\n");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
}
