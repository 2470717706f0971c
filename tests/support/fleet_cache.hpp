// tests/support/fleet_cache.hpp: what the fleet_cache tests share (test_fleet_cache*.cpp).
//
//  * fleet_cache_opts(uri, prefix, coherence): a fleet_cache over message_only() fleet settings
//    (support/fleet.hpp) with a local ttl of 60 s and no jitter: within a test nothing but what
//    the case does (a message, an expire, a resync) changes a local entry;
//  * fleet_cache_engine(c): the fleet_cache's fleet engine, through fleet_cache_test_access;
//  * until_listening(c, name): bounded wait until both of c's channels are confirmed (the
//    coherence one, the bus or client tracking's, and the expire channel); each confirmation
//    marks the local cache stale (a resync), which would turn a later hit into a stale answer
//    (a miss without stale_while_revalidate). It also orders
//    the test's earlier writes (a hook) before the subscriber thread's later reads: both take
//    the subscriber's lock;
//  * heard_echo(c, mode, n, name): under client tracking, bounded wait until c has heard n
//    reports (the server's reports of the stores the test made, c's own included), so that a
//    local entry read after it is not dropped later by one of them; nothing under the bus (a
//    process does not hear itself there).
#pragma once

#include <singleflight/fleet_cache.hpp>

#include <chrono>
#include <cstdint>
#include <string>

#include "fleet.hpp"
#include "sync.hpp"

namespace sftest {

inline singleflight::fleet_cache_options fleet_cache_opts(
    const std::string& uri, const std::string& prefix,
    singleflight::fleet_coherence coherence = singleflight::fleet_coherence::tracking) {
  using namespace std::chrono_literals;
  singleflight::fleet_cache_options o;
  o.fleet = message_only(uri, prefix);
  o.local.ttl = 60s;
  o.local.jitter = 0;
  o.coherence = coherence;
  return o;
}

template <class C>
singleflight::detail::fleet_engine& fleet_cache_engine(C& c) {
  return singleflight::detail::fleet_cache_test_access::engine(c);
}

template <class C>
void until_listening(C& c, const char* name) {
  must([&] { return fleet_cache_engine(c).subscriber.confirmed_channels() == 2; }, name);
  must([&] { return c.stats().resyncs >= 2; }, name);
}

template <class C>
void heard_echo(C& c, singleflight::fleet_coherence m, std::uint64_t n, const char* name) {
  if (m == singleflight::fleet_coherence::tracking) {
    must([&] { return c.stats().invalidations_heard >= n; }, name);
  }
}

}  // namespace sftest
