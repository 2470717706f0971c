// singleflight/detail/cache/node_pool.hpp -- internal; do not include directly.
//
// node_pool<Node>: the memory of one shard's nodes (cache_table.hpp). Nodes
// are carved from slabs of many nodes, so that an entry pays neither
// malloc's chunk header nor its rounding: a 96-byte node costs 96 bytes,
// not a 112-byte chunk (bench/bench_memory.cpp).
//
// Locking and lifetime:
//   * take() runs under the shard's mutex, like everything else in the
//     shard: it pops the free list, else carves the current slab, else
//     collects what was given back, else allocates a new slab (allocation
//     under the mutex, as a bigger bucket array already is).
//   * give_back() runs with no lock, after the mutex is released: a node's
//     key, value and exception are destroyed outside the lock (garbage,
//     cache_table.hpp), and its memory is then pushed onto `returned_`, a
//     lock-free stack that take() empties whole. Pushes from any thread;
//     the only removal is an exchange of the whole list under the mutex, so
//     no slot is popped from under a push (no ABA).
//     Memory ordering: a push is a release and the exchange an acquire, so
//     the destruction of what a slot held happens before its reuse.
//   * A slot is given back only once no reader can reach its node: a node is
//     unlinked with the shard's readers locked out (read_gate), and a reader
//     that enters after the writer lets it in no longer finds it. The pool
//     changes nothing there: it reuses a slot no sooner than malloc would
//     reuse a freed chunk.
//   * Slabs are freed with the pool (when the cache dies), never while it
//     lives: a cache keeps the memory of its largest population of nodes and
//     reuses it (docs/performance.md measures a cache that grew to 1M entries
//     and shrank to 1K). Slabs grow geometrically from 8 nodes to
//     max_slab_nodes, so that a small cache stays small.
// Nodes larger than max_node_bytes, or aligned beyond what operator new
// gives, take plain operator new and delete (pooled == false): their slabs
// would hold much for little gain.
#pragma once

#include <atomic>
#include <cstddef>
#include <new>

#include "../algorithm.hpp"

namespace singleflight::detail {

template <class Node>
class node_pool {
 public:
  static constexpr std::size_t max_node_bytes = 256;
  static constexpr std::size_t max_slab_nodes = 256;
  static constexpr bool pooled =
      sizeof(Node) <= max_node_bytes && alignof(Node) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__;

  // A free slot: its first word links the next one.
  struct slot {
    slot* next;
  };
  static_assert(!pooled || (sizeof(Node) >= sizeof(slot) && alignof(Node) >= alignof(slot)));

  // batch: slots gathered by one thread, given back with one push.
  struct batch {
    slot* head = nullptr;
    slot* tail = nullptr;
    void add(void* p) noexcept {
      slot* s = ::new (p) slot{head};
      if (tail == nullptr) tail = s;
      head = s;
    }
  };

  node_pool() = default;
  node_pool(const node_pool&) = delete;
  node_pool& operator=(const node_pool&) = delete;
  ~node_pool() {
    while (slabs_ != nullptr) {
      slab* s = slabs_;
      slabs_ = s->next;
      ::operator delete(static_cast<void*>(s));
    }
  }

  // take(): memory for one node (uninitialised). With the shard's mutex
  // held. Throws std::bad_alloc (changing nothing) if a slab cannot be had.
  void* take() {
    if constexpr (!pooled) {
      return ::operator new (sizeof(Node), std::align_val_t{alignof(Node)});
    } else {
      if (free_ == nullptr && left_ == 0 && returned_.load(std::memory_order_relaxed) != nullptr) {
        free_ = returned_.exchange(nullptr, std::memory_order_acquire);
      }
      if (free_ != nullptr) {
        slot* s = free_;
        free_ = s->next;
        s->~slot();
        return s;
      }
      if (left_ == 0) grow();
      void* p = cursor_;
      cursor_ += sizeof(Node);
      --left_;
      return p;
    }
  }

  // give_back(b): the slots of `b` (their nodes destroyed) are free again.
  // Any thread, no lock.
  void give_back(batch& b) noexcept {
    if (b.head == nullptr) return;
    slot* h = returned_.load(std::memory_order_relaxed);
    do {
      b.tail->next = h;
    } while (!returned_.compare_exchange_weak(h, b.head, std::memory_order_release,
                                              std::memory_order_relaxed));
    b = batch{};
  }

  // give_back(p): one slot. Any thread, no lock.
  void give_back(void* p) noexcept {
    if constexpr (!pooled) {
      ::operator delete (p, std::align_val_t{alignof(Node)});
    } else {
      batch b;
      b.add(p);
      give_back(b);
    }
  }

  // slab_bytes(): the bytes of the slabs held (nodes linked or free).
  // With the shard's mutex held.
  std::size_t slab_bytes() const noexcept { return bytes_; }

 private:
  struct slab {
    slab* next;
  };
  static constexpr std::size_t header =
      (sizeof(slab) + alignof(Node) - 1) / alignof(Node) * alignof(Node);

  void grow() {
    const std::size_t n = next_nodes_;
    const std::size_t bytes = header + n * sizeof(Node);
    slab* s = ::new (::operator new(bytes)) slab{slabs_};
    slabs_ = s;
    bytes_ += bytes;
    cursor_ = reinterpret_cast<unsigned char*>(s) + header;
    left_ = n;
    next_nodes_ = std::min(2 * n, max_slab_nodes);
  }

  slot* free_ = nullptr;                  // mutex
  unsigned char* cursor_ = nullptr;       // mutex: the current slab's next unused node
  std::size_t left_ = 0;                  // mutex: unused nodes left in the current slab
  std::size_t next_nodes_ = 8;            // mutex: the next slab's node count
  std::size_t bytes_ = 0;                 // mutex
  slab* slabs_ = nullptr;                 // mutex
  std::atomic<slot*> returned_{nullptr};  // lock-free: given back, not yet collected
};

}  // namespace singleflight::detail
