// singleflight/detail/cache/cache_core.hpp -- internal; do not include directly.
//
// cache_core: the state of one singleflight::cache that outlives the cache
// object while callbacks still run (group::close() does not wait for
// callbacks already handed out): the options, the sharded entry table, and
// everything that reads or writes it — what a lookup decides (the decision
// table of docs/cache.md, "What get does"), put / invalidate / clear, and the life of a
// load (register, call the loader, publish or record the failure). The cache
// holds it by a counted_ptr (counted.hpp), as does every pending callback;
// flights refer to it by address (close() waits for them).
//
// The class is a chain of layers, each a class template deriving from the
// one below and calling only what is below it, each file opening with what
// it owns and which lock guards it:
//   cache_lookup.hpp  the options, KeyEqual and the table; what a lookup
//                     decides: lookup (get), fresh_hit (the hit path), peek;
//   cache_writes.hpp  records and entries: put / invalidate / clear,
//                     admission and eviction, unpin, size, stats;
//   cache_loads.hpp   the life of a load: register, call the loader (an
//                     async one through a relayed completion), publish or
//                     record the failure; stale-if-error, get_fresh,
//                     refreshes ending;
// with the loader vocabulary (loader_traits, loaded) in cache_loader.hpp.
// What a call of the cache does with it (lookup, refresh, a load as a
// flight of the cache's group) is cache_calls.hpp, which is not shared: the
// cache object owns it.
// Single inheritance (and counted_box beside the chain), no virtual function: the
// layers add no indirection;
// a member is called, and inlined, as it was when they were one class.
//
// Locking: see cache_table.hpp (one shard's mutex at a time, readers locked
// out only by writers of their shard) and read_gate.hpp. User code never runs
// with a shard's mutex held or inside a read section, KeyEqual excepted.
#pragma once

#include "../../cache_options.hpp"
#include "cache_loads.hpp"
#include "counted.hpp"

namespace singleflight::detail {

// The counted_box base: the cache and its pending callbacks share the core through
// counted_ptr (counted.hpp), not std::shared_ptr, whose control block each cache type
// instantiated again.
template <class Key, class T, class KeyEqual, class Clock>
class cache_core : public counted_box, public cache_loads<Key, T, KeyEqual, Clock> {
 public:
  explicit cache_core(const cache_options& opts) : cache_loads<Key, T, KeyEqual, Clock>(opts) {
    destroy = &drop;
  }

 private:
  static void drop(counted_box* b) noexcept { delete static_cast<cache_core*>(b); }
};

}  // namespace singleflight::detail
