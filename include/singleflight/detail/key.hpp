// singleflight/detail/key.hpp -- internal; do not include directly.
//
// The map stores each key with its hash, computed once per call outside the
// lock. Lookups go through probe types, so that
//   * a caller's key is hashed exactly once (user Hash never runs under the
//     group's lock, and never runs during cleanup);
//   * cleanup finds its own node by address (node_probe), so erasing an entry
//     calls neither Hash nor KeyEqual and cannot throw, and only ever erases
//     the node this flight inserted (the identity check of golang/go#31420).
#pragma once

#include <cstddef>

namespace singleflight::detail {

template <class Key>
struct stored_key {
  Key key;
  std::size_t hash;
};

template <class P>
struct probe {
  const P& key;
  std::size_t hash;
};

struct node_probe {
  const void* node;  // address of the stored_key inside the map node
  std::size_t hash;
};

struct key_hasher {
  using is_transparent = void;
  template <class Key>
  std::size_t operator()(const stored_key<Key>& k) const noexcept {
    return k.hash;
  }
  template <class P>
  std::size_t operator()(const probe<P>& p) const noexcept {
    return p.hash;
  }
  std::size_t operator()(const node_probe& p) const noexcept { return p.hash; }
};

template <class KeyEqual>
struct key_equal {
  using is_transparent = void;
  [[no_unique_address]] KeyEqual eq;

  template <class Key>
  bool operator()(const stored_key<Key>& a, const stored_key<Key>& b) const {
    return a.hash == b.hash && eq(a.key, b.key);
  }
  template <class Key, class P>
  bool operator()(const stored_key<Key>& a, const probe<P>& b) const {
    return a.hash == b.hash && eq(a.key, b.key);
  }
  template <class Key, class P>
  bool operator()(const probe<P>& b, const stored_key<Key>& a) const {
    return a.hash == b.hash && eq(a.key, b.key);
  }
  template <class Key>
  bool operator()(const stored_key<Key>& a, const node_probe& b) const noexcept {
    return static_cast<const void*>(&a) == b.node;
  }
  template <class Key>
  bool operator()(const node_probe& b, const stored_key<Key>& a) const noexcept {
    return static_cast<const void*>(&a) == b.node;
  }
};

}  // namespace singleflight::detail
