// Built against an installed singleflight with find_package(... COMPONENTS fleet) by
// tests/package/fleet.sh. Redis is deliberately unreachable (port 1): get() must still answer,
// from a local load, without an error.
#include <singleflight/fleet.hpp>

#include <cstdio>
#include <string>

int main() {
  singleflight::fleet_options o;
  o.redis_uri = "tcp://127.0.0.1:1";
  singleflight::fleet<std::string, std::string> f(o);
  const std::string v = f.get("tenant-7|user-42", [] { return std::string("profile"); });
  const auto s = f.stats();
  std::printf("fleet consumer: value=%s local_fallback=%llu\n", v.c_str(),
              static_cast<unsigned long long>(s.local_fallback));
  return v == "profile" && s.local_fallback == 1 ? 0 : 1;
}
