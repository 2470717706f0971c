// singleflight/singleflight.hpp
//
// Umbrella header: every public header of the core (the group, the cache and
// their vocabulary types, codecs and metrics descriptors included).
//
//   #include <singleflight/singleflight.hpp>
//
// singleflight coalesces concurrent identical calls within one process: the
// callers that ask for the same key at the same time share one execution of
// the work and each receive its outcome. See group.hpp for the contract, and
// cache.hpp for the read-through cache built on it, batch_loader.hpp for
// batching different keys into one bulk call.
//
// Not included: the headers that need another library, each with a CMake
// target of its own: asio.hpp (Asio; singleflight::asio), prometheus.hpp
// (prometheus-cpp; singleflight::prometheus), fleet.hpp and fleet_*.hpp
// (hiredis; singleflight::fleet). ctest headers.umbrella
// (tests/check_umbrella.sh) keeps this list true.
#pragma once

#include "batch_completion.hpp"  // IWYU pragma: export
#include "batch_loader.hpp"      // IWYU pragma: export
#include "batch_options.hpp"     // IWYU pragma: export
#include "cache.hpp"             // IWYU pragma: export
#include "cache_options.hpp"     // IWYU pragma: export
#include "coarse_clock.hpp"      // IWYU pragma: export
#include "codec.hpp"             // IWYU pragma: export
#include "completion.hpp"        // IWYU pragma: export
#include "errors.hpp"            // IWYU pragma: export
#include "executor.hpp"          // IWYU pragma: export
#include "group.hpp"             // IWYU pragma: export
#include "hash.hpp"              // IWYU pragma: export
#include "metrics.hpp"           // IWYU pragma: export
#include "options.hpp"           // IWYU pragma: export
#include "outcome.hpp"           // IWYU pragma: export
#include "stats.hpp"             // IWYU pragma: export
#include "stop_token.hpp"        // IWYU pragma: export
#include "task.hpp"              // IWYU pragma: export
#include "thread_executor.hpp"   // IWYU pragma: export
#include "thread_pool.hpp"       // IWYU pragma: export
#include "tracer.hpp"            // IWYU pragma: export
#include "version.hpp"           // IWYU pragma: export
#include "wait_bound.hpp"        // IWYU pragma: export
