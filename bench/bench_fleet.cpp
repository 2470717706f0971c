// bench/bench_fleet.cpp: the cost of the fleet's own paths, against bare hiredis round trips
// in the same binary (the floor: what the same number of round trips costs without the
// fleet). Needs a redis-server: SINGLEFLIGHT_BENCH_REDIS=tcp://127.0.0.1:PORT (bench/fleet/run.sh
// starts one). The hit benchmarks report the server's own command count per iteration
// (INFO commandstats: no script runs on that path, so it is the number of round trips); for
// misses the server also counts the commands inside the scripts, so their round trips are
// counted by fleet_driver, through MONITOR, instead.
//
//   hit/impl:fleet          fleet.get of a stored 100-byte value (local group + GETRANGE + decode)
//   hit/impl:hiredis        one bare GET of the same name (the floor)
//   miss_leader/impl:fleet  fleet.get of a new key, origin returning at once: GETRANGE, the race
//                           script, the store script
//   miss_leader/impl:hiredis  three bare round trips (GET, GET, GET): the floor for three
#include <singleflight/fleet.hpp>

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace sf = singleflight;

std::string redis_uri() {
  const char* u = std::getenv("SINGLEFLIGHT_BENCH_REDIS");
  return u != nullptr ? u : "";
}

redisContext* raw_connect(const std::string& uri) {
  const std::string rest = uri.substr(uri.find("://") + 3);
  const auto colon = rest.rfind(':');
  return redisConnect(rest.substr(0, colon).c_str(), std::stoi(rest.substr(colon + 1)));
}

long long total_commands(redisContext* c) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
  long long total = 0;
  if (r != nullptr && r->type == REDIS_REPLY_STRING) {
    std::istringstream in(std::string(r->str, r->len));
    std::string line;
    while (std::getline(in, line)) {
      const auto at = line.find("calls=");
      if (line.rfind("cmdstat_", 0) == 0 && line.rfind("cmdstat_info:", 0) != 0 &&
          at != std::string::npos) {
        total += std::stoll(line.substr(at + 6));
      }
    }
  }
  if (r != nullptr) freeReplyObject(r);
  return total;
}

// Runs `body` under the benchmark loop and reports round trips per iteration.
template <class Body>
void with_round_trips(benchmark::State& state, redisContext* counter, Body body) {
  const long long before = total_commands(counter);
  for (auto _ : state) body();
  const long long after = total_commands(counter);
  state.counters["round_trips"] =
      benchmark::Counter(static_cast<double>(after - before), benchmark::Counter::kAvgIterations);
}

sf::fleet_options options(const std::string& prefix) {
  sf::fleet_options o;
  o.redis_uri = redis_uri();
  o.key_prefix = prefix;
  o.redis_timeout = std::chrono::milliseconds(1000);
  return o;
}

void hit_fleet(benchmark::State& state) {
  if (redis_uri().empty()) return state.SkipWithError("set SINGLEFLIGHT_BENCH_REDIS");
  sf::fleet<std::string, std::string> f(options("bench-hit"));
  (void)f.get("hot", [] { return std::string(100, 'x'); });
  redisContext* counter = raw_connect(redis_uri());
  with_round_trips(state, counter,
                   [&] { benchmark::DoNotOptimize(f.get("hot", [] { return std::string(); })); });
  redisFree(counter);
}

void hit_hiredis(benchmark::State& state) {
  if (redis_uri().empty()) return state.SkipWithError("set SINGLEFLIGHT_BENCH_REDIS");
  {
    sf::fleet<std::string, std::string> f(options("bench-hit"));
    (void)f.get("hot", [] { return std::string(100, 'x'); });
  }
  redisContext* c = raw_connect(redis_uri());
  redisContext* counter = raw_connect(redis_uri());
  const std::string name = sf::detail::fleet_names::of("bench-hit", "hot").value;
  with_round_trips(state, counter, [&] {
    auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", name.data(), name.size()));
    benchmark::DoNotOptimize(r);
    freeReplyObject(r);
  });
  redisFree(counter);
  redisFree(c);
}

void miss_fleet(benchmark::State& state) {
  if (redis_uri().empty()) return state.SkipWithError("set SINGLEFLIGHT_BENCH_REDIS");
  static int run = 0;
  sf::fleet<std::string, std::string> f(
      options(std::string("bench-miss-").append(std::to_string(++run))));
  long i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        f.get(std::string("k").append(std::to_string(++i)), [] { return std::string("v"); }));
  }
}

void miss_hiredis(benchmark::State& state) {
  if (redis_uri().empty()) return state.SkipWithError("set SINGLEFLIGHT_BENCH_REDIS");
  redisContext* c = raw_connect(redis_uri());
  for (auto _ : state) {
    for (int k = 0; k < 3; ++k) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "GET %s", "bench-floor"));
      benchmark::DoNotOptimize(r);
      freeReplyObject(r);
    }
  }
  redisFree(c);
}

BENCHMARK(hit_fleet)->Name("hit/impl:fleet")->UseRealTime();
BENCHMARK(hit_hiredis)->Name("hit/impl:hiredis")->UseRealTime();
BENCHMARK(miss_fleet)->Name("miss_leader/impl:fleet")->UseRealTime();
BENCHMARK(miss_hiredis)->Name("miss_leader/impl:hiredis")->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
