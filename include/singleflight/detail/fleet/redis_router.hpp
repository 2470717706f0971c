// singleflight/detail/fleet/redis_router.hpp -- internal; do not include directly.
//
// detail::redis_router: which Redis node a fleet sends a key's commands to.
// Each node it knows is a detail::redis_node: its endpoint, its command
// connection pool and its circuit breaker. Also here: cluster_slot() (the
// Redis Cluster hash slot of a name) and cluster_redirect (a parsed MOVED /
// ASK / TRYAGAIN / CLUSTERDOWN reply).
//
// One node until told otherwise: the fleet starts with the node `redis_uri`
// names (the seed) and sends everything there, as it always did: route() is
// then one atomic load and a branch, and a single server is never asked
// anything more. The first MOVED reply (redis_conn throws it as
// redis_failure::redirected) shows the seed is a node of a Redis Cluster:
// the router then reads the cluster's slot map (CLUSTER SLOTS, from the seed
// or any node it knows) and from there on route() sends each name to the
// owner of its slot (CRC16 of its hash tag, 16384 slots). Every name of one
// key shares a hash tag (fleet_protocol.hpp), so a key's scripts never cross
// slots. A later MOVED moves its slot at once and reads the map again (at most
// every refresh_every).
//
// probe(): a process whose keys all live on the seed gets no MOVED, yet must know it is on a
// cluster before its first notification (SPUBLISH there, PUBLISH on a single server: every
// process of a fleet must agree). So before a fleet's first race the router asks the seed
// `INFO cluster` once (never a CLUSTER command on a single server).
//
// A list of seeds ("tcp://h1:p1,h2:p2,h3:p3"): the seed node's pool connects to the
// first of them that answers (redis_pool.hpp, Seeds), so the seed is an entry point
// whose address may change; it is then never taken for a node found in the slot map
// (node_at() makes every master a node of its own), and owns no slot once the map is
// read.
//
// A master that dies sends no MOVED: its replica takes over (after the cluster's
// node timeout) and the dead node just stops answering. So a node that fails
// (connection refused, reset, timed out: node_failed()), or whose breaker is
// open when a call wants it (reroute()), also makes the router read the map
// again, from the other nodes it knows (the same refresh_every bound): once the
// replica is master, its slots go there. Until then, when the map names a replica for that
// master (redis_node::replicated), its keys' flights wait for the promotion (fleet_flight,
// failover_wait); without one they load locally. The other masters' keys keep coalescing.
//
// run(): one routed step: the step on a pooled connection of the name's
// owner; on MOVED, once more on the new owner; on ASK, once more on the node
// named, after ASKING (the slot is being migrated: the key may already be
// there; the connection stays with the caller, ASKING before each of its
// commands, until it goes back to the pool); on TRYAGAIN (a slot being migrated whose node
// cannot run a step on names it does not all have: the names of one key split between the two
// nodes, or a cold key's race on the importing node, for as long as the migration lasts), again
// 1, 2, 4, 8, 8... ms later, until redis_timeout after the first attempt (the migration of a
// slot usually takes milliseconds: a wait instead of a local load); CLUSTERDOWN, a second
// redirect, or TRYAGAIN past that are thrown back to the caller (redis_failure::redirected: a
// local load, not a breaker failure).
//
// Locking: `mu_` guards `nodes_` (append-only: a node lives as long as the
// router, so the references route() returns stay valid) and every write of a
// slot. The slot map is read without it: `slots_` is allocated once, before
// `cluster_` is set (release), and each entry is an atomic pointer to a node
// (stores under mu_, release; loads acquire). `refresh_mu_` lets one caller at
// a time read the map (try_lock: the others route with what they have); the
// round trip runs under neither lock's critical section of mu_. `probe_mu_` makes concurrent
// probe() callers wait for the one probe (it is taken before refresh_mu_ and mu_, never under
// them).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../chrono.hpp"
#include "circuit_breaker.hpp"
#include "redis_conn.hpp"
#include "redis_pool.hpp"

namespace singleflight::detail {

// ---------------------------------------------------------------------------------------------
// Slots

inline constexpr std::size_t cluster_slots = 16384;

// CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys
// with: crc16("123456789") == 0x31C3.
inline constexpr std::array<std::uint16_t, 256> crc16_table = [] {
  std::array<std::uint16_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i << 8;
    for (int b = 0; b < 8; ++b) c = (c & 0x8000U) != 0 ? (c << 1) ^ 0x1021U : c << 1;
    t[i] = static_cast<std::uint16_t>(c & 0xFFFFU);
  }
  return t;
}();

constexpr std::uint16_t crc16(std::string_view s) noexcept {
  std::uint32_t crc = 0;
  for (const char ch : s) {
    const auto byte = static_cast<unsigned char>(ch);
    crc = ((crc << 8) ^ crc16_table[((crc >> 8) ^ byte) & 0xFFU]) & 0xFFFFU;
  }
  return static_cast<std::uint16_t>(crc);
}

// cluster_slot(name): the slot of `name`, as Redis computes it: when `name` holds a '{' and a
// later '}' with at least one byte between them, only the bytes between the first '{' and the
// first '}' after it are hashed (the hash tag); otherwise the whole name.
constexpr std::size_t cluster_slot(std::string_view name) noexcept {
  const std::size_t open = name.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = name.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      name = name.substr(open + 1, close - open - 1);
    }
  }
  return crc16(name) & (cluster_slots - 1);
}

// cluster_redirect: a node's MOVED, ASK, TRYAGAIN or CLUSTERDOWN error text, parsed.
struct cluster_redirect {
  enum kind_t { none, moved, ask, tryagain, clusterdown } kind = none;
  std::size_t slot = 0;  // moved, ask
  std::string host;      // moved, ask: may be empty (the node does not know its address)
  int port = 0;          // moved, ask

  // parse("MOVED 3999 127.0.0.1:6381"); `none` for anything else (a slot past the last, a
  // port outside 1-65535: redis_router::run then loads locally, as for CLUSTERDOWN).
  static cluster_redirect parse(std::string_view text) {
    cluster_redirect r;
    if (text.starts_with("TRYAGAIN")) {
      r.kind = tryagain;
      return r;
    }
    if (text.starts_with("CLUSTERDOWN")) {
      r.kind = clusterdown;
      return r;
    }
    kind_t k = none;
    if (text.starts_with("MOVED ")) {
      k = moved;
      text.remove_prefix(6);
    } else if (text.starts_with("ASK ")) {
      k = ask;
      text.remove_prefix(4);
    } else {
      return r;
    }
    const std::size_t space = text.find(' ');
    if (space == std::string_view::npos || space == 0) return r;
    std::size_t slot = 0;
    for (const char c : text.substr(0, space)) {
      if (c < '0' || c > '9') return r;
      slot = slot * 10 + static_cast<std::size_t>(c - '0');
      if (slot >= cluster_slots) return r;
    }
    const std::string_view where = text.substr(space + 1);
    const std::size_t colon = where.rfind(':');
    if (colon == std::string_view::npos || colon + 1 >= where.size()) return r;
    int port = 0;
    for (const char c : where.substr(colon + 1)) {
      if (c < '0' || c > '9') return r;
      port = port * 10 + (c - '0');
      if (port > 65535) return r;
    }
    if (port == 0) return r;  // no server listens there: a malformed address
    std::string_view host = where.substr(0, colon);
    if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
    r.kind = k;
    r.slot = slot;
    r.host = std::string(host);
    r.port = port;
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Nodes

// redis_node: one Redis server of the fleet (the seed, or a cluster master): its own command
// connections and its own breaker, so that a node that fails costs only its own keys.
struct redis_node {
  redis_node(std::vector<redis_endpoint> seeds, std::chrono::milliseconds timeout,
             const std::string& username, const std::string& password, std::size_t max_idle,
             std::uint32_t threshold, std::chrono::milliseconds cooldown)
      : ep(seeds.front()),
        pool(std::move(seeds), timeout, username, password, max_idle),
        breaker(threshold, cooldown) {}
  redis_node(const redis_node&) = delete;
  redis_node& operator=(const redis_node&) = delete;

  const redis_endpoint ep;  // the first seed (pool.endpoint(): the one it connects to)
  redis_pool pool;
  circuit_breaker breaker;
  // owner: the node owns slots in the router's map (the seed until the map is read); a
  // failed-over master that owns none no longer counts for healthy(). Written under the
  // router's mu_; read relaxed (a health report orders nothing).
  std::atomic<bool> owner{false};
  // replicated: the last slot map read names a replica for a slot this node owns (CLUSTER
  // SLOTS lists the replicas not marked failed): a failure of this master may be followed by
  // its replica taking over (fleet_options::failover_wait). Written under the router's mu_;
  // read relaxed (a hint: a map read later corrects it).
  std::atomic<bool> replicated{false};
  // down_since: when this node's current outage began (steady_clock ticks since its epoch; 0:
  // it answers): the first failed round trip sets it (failed()), one that works or a new owner
  // of its slots clears it. Relaxed: it orders nothing; it bounds the failover waits of one
  // outage to failover_wait in all, and tells whether a slot map was read since.
  std::atomic<std::chrono::steady_clock::rep> down_since{0};
  // replica_asked_at, replica_listed: when redis_router::replica_listed() last asked the
  // cluster about this master's replicas (ticks; 0: never), and its answer. Relaxed: a hint for
  // one outage, asked again in the next.
  std::atomic<std::chrono::steady_clock::rep> replica_asked_at{0};
  std::atomic<bool> replica_listed{false};

  // failed(): a round trip to this node failed (not a redirect, not a refused setting): the
  // start of an outage, unless one is under way.
  void failed() noexcept {
    std::chrono::steady_clock::rep none = 0;
    (void)down_since.compare_exchange_strong(
        none, std::chrono::steady_clock::now().time_since_epoch().count(),
        std::memory_order_relaxed);
  }

  // answered(): a round trip to this node worked: the breaker's success, and no outage.
  void answered() {
    breaker.success();
    if (down_since.load(std::memory_order_relaxed) != 0) {
      down_since.store(0, std::memory_order_relaxed);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// redis_router

class redis_router {
 public:
  using clock = std::chrono::steady_clock;

  // How often at most a MOVED makes the router read the whole slot map again (each MOVED
  // moves its own slot at once): a reshard moving many slots costs one CLUSTER SLOTS per
  // refresh_every, not one per key.
  static constexpr std::chrono::milliseconds refresh_every{200};

  // seeds: redis_uri's, at least one.
  redis_router(std::vector<redis_endpoint> seeds, std::chrono::milliseconds timeout,
               std::string username, std::string password, std::size_t max_idle,
               std::uint32_t threshold, std::chrono::milliseconds cooldown)
      : seed_list_(seeds.size() > 1),
        timeout_(timeout),
        username_(std::move(username)),
        password_(std::move(password)),
        max_idle_(max_idle),
        threshold_(threshold),
        cooldown_(cooldown) {
    nodes_.push_back(std::make_unique<redis_node>(std::move(seeds), timeout_, username_, password_,
                                                  max_idle_, threshold_, cooldown_));
    seed_ = nodes_.front().get();
    seed_->owner.store(true, std::memory_order_relaxed);
  }
  redis_router(const redis_router&) = delete;
  redis_router& operator=(const redis_router&) = delete;

  // seed(): the node redis_uri names, at the first of its seeds that answers (the
  // subscriber's, and every key's until a MOVED says the seed is a cluster node).
  redis_node& seed() const noexcept { return *seed_; }

  // cluster(): a MOVED, or probe(), showed the seed to be a node of a Redis Cluster.
  bool cluster() const noexcept { return cluster_.load(std::memory_order_acquire); }

  // probe(): makes sure cluster() is known before it decides how the fleet's notifications
  // travel (classic PUBLISH on a single server, SPUBLISH on a cluster: every process of a fleet
  // must agree, and a process whose keys all live on its seed never gets a MOVED). Once per
  // router, unless a MOVED came first: `INFO cluster` on the seed; `cluster_enabled:1` reads
  // the slot map (as a MOVED does). Concurrent callers wait for the one probe. A reply without
  // the field, or an error (an ACL that denies INFO), is a single server; an I/O failure leaves
  // it unknown (probed again by the next caller). Never throws. Thread-safe.
  void probe() noexcept {
    if (cluster() || probed_.load(std::memory_order_acquire)) return;
    const std::lock_guard<std::mutex> one(probe_mu_);
    if (cluster() || probed_.load(std::memory_order_relaxed)) return;
    bool enabled = false;
    try {
      pooled c = seed_->pool.acquire();
      const redis_reply r = c->command({"INFO", "cluster"});
      enabled = !is_error(r.get()) && is_string(r.get()) &&
                text_of(r.get()).find("cluster_enabled:1") != std::string_view::npos;
    } catch (...) {
      return;  // unknown: asked again
    }
    if (enabled && !refresh()) {
      try {
        const std::lock_guard<std::mutex> lk(mu_);
        become_cluster();  // every slot the seed's until a MOVED or a map says otherwise
      } catch (...) {
        return;  // out of memory: unknown
      }
    }
    probed_.store(true, std::memory_order_release);
  }

  // route(name): the node that owns `name`'s slot, as far as the router knows (the seed when
  // not a cluster, or for a slot it has not learnt). Thread-safe, lock-free.
  redis_node& route(std::string_view name) const noexcept {
    if (!cluster_.load(std::memory_order_acquire)) return *seed_;
    redis_node* n = slots_[cluster_slot(name)].load(std::memory_order_acquire);
    return n != nullptr ? *n : *seed_;
  }

  // run(node, conn, step): step(connection) on `conn` (taken from node's pool when empty),
  // redirected as the file comment says; returns what the step returns (not void). `node` and
  // `conn` are updated to where the step ran (after an ASK, `conn` sends ASKING before each
  // command until it is given back). Throws what the step throws; redis_failure with
  // redirected() when the cluster could not run it (CLUSTERDOWN, a second redirect, TRYAGAIN
  // for longer than redis_timeout): load locally, it is no failure of the node. Sleeps
  // between TRYAGAIN attempts (no lock held).
  template <class Step>
  auto run(redis_node*& node, std::optional<pooled>& conn, Step& step) {
    const auto give_up = clock::now() + timeout_;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      try {
        return run_redirected(node, conn, step);
      } catch (const redis_failure& f) {
        if (!f.redirected() ||
            cluster_redirect::parse(f.what()).kind != cluster_redirect::tryagain ||
            clock::now() + pause >= give_up) {
          throw;
        }
      }
      // TRYAGAIN: asked again on the same node and connection (still in step: the reply was
      // read), with ASKING if it had it. Once the migration ends the importing node serves
      // the step, or the migrating one answers MOVED (or ASK, every name having moved).
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(8));
    }
  }

 private:
  // run_redirected: run()'s one attempt: MOVED and ASK followed once, TRYAGAIN and the rest
  // thrown.
  template <class Step>
  auto run_redirected(redis_node*& node, std::optional<pooled>& conn, Step& step) {
    for (int attempt = 0;; ++attempt) {
      if (!conn) conn.emplace(node->pool.acquire());
      try {
        return conn->run(step);
      } catch (const redis_failure& f) {
        if (!f.redirected() || attempt > 0) throw;
        const cluster_redirect r = cluster_redirect::parse(f.what());
        if (r.kind == cluster_redirect::moved) {
          conn.reset();  // in step: given back to its pool
          node = &moved(r, *node);
          continue;
        }
        if (r.kind != cluster_redirect::ask) throw;
        // The key is being migrated: this step, and the ones after it on `conn`
        // (the same flight), go to the importing node with ASKING.
        conn.reset();
        node = &node_at(r.host.empty() ? node->pool.endpoint().host : r.host, r.port);
        conn.emplace(node->pool.acquire());
        conn->asking(true);
        return conn->run(step);
      }
    }
  }

 public:
  // moved(r, from): a MOVED reply `from` a node: r.slot is r's node's now (learnt at once),
  // and the slot map is read again (the first time: the router learns the whole cluster).
  // Returns the slot's new owner. Never throws (a failed map read leaves the slot's new
  // owner learnt, and is tried again at a MOVED or failure refresh_every later).
  redis_node& moved(const cluster_redirect& r, const redis_node& from) noexcept {
    redis_node* to = seed_;
    try {
      to = &node_at(r.host.empty() ? from.pool.endpoint().host : r.host, r.port);
      {
        const std::lock_guard<std::mutex> lk(mu_);
        become_cluster();
        slots_[r.slot].store(to, std::memory_order_release);
        to->owner.store(true, std::memory_order_relaxed);
      }
      refresh();
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: routed as before
    }
    return *to;
  }

  // node_failed(n): a round trip to `n` failed (refused, reset, timed out; not a refusal of
  // the settings, not a redirect). On a cluster, reads the slot map again from the other
  // nodes (refresh(&n)): `n` may be a master that died, whose replica takes over. Nothing on a
  // single server. Never throws. Thread-safe.
  void node_failed(const redis_node& n) noexcept {
    if (cluster()) (void)refresh(&n);
  }

  // reroute(from, name): `from` (the node `name` was routed to) has its breaker open. On a
  // cluster, reads the slot map again from the other nodes (at most every refresh_every) and
  // returns the node that now owns `name`'s slot (`from` when the map did not change); `from`
  // on a single server. Never throws. Thread-safe.
  redis_node& reroute(redis_node& from, std::string_view name) noexcept {
    if (!cluster()) return from;
    (void)refresh(&from);
    return route(name);
  }

  // refresh(avoid): reads the slot map (CLUSTER SLOTS) from the first known node that answers,
  // the seed first, `avoid` (a node that just failed) never; at most once per refresh_every,
  // by one caller at a time (the others return at once). Returns whether it read one. Never
  // throws.
  bool refresh(const redis_node* avoid = nullptr) noexcept {
    const std::unique_lock<std::mutex> one(refresh_mu_, std::try_to_lock);
    if (!one.owns_lock()) return false;
    const auto now = clock::now();
    if (refreshed_ && now - last_refresh_ < refresh_every) return false;
    std::vector<redis_node*> ask;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      for (const auto& n : nodes_) {
        if (n.get() != avoid) ask.push_back(n.get());
      }
    }
    // Whether it reads a map or not, the next read waits refresh_every: a dead node's
    // callers must not each pay a round of failed reads.
    refreshed_ = true;
    last_refresh_ = now;
    for (redis_node* n : ask) {
      try {
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        std::vector<std::pair<std::string, int>> owners;
        std::vector<bool> replicated;
        {
          pooled c = n->pool.acquire();
          const redis_reply r = c->command({"CLUSTER", "SLOTS"});
          if (!parse_slots(r.get(), n->pool.endpoint().host, ranges, owners, replicated)) {
            continue;
          }
        }
        std::vector<redis_node*> owner_nodes;
        owner_nodes.reserve(owners.size());
        for (const auto& [host, port] : owners) owner_nodes.push_back(&node_at(host, port));
        const std::lock_guard<std::mutex> lk(mu_);
        become_cluster();
        for (const auto& k : nodes_) {
          k->owner.store(false, std::memory_order_relaxed);
          k->replicated.store(false, std::memory_order_relaxed);
        }
        for (std::size_t i = 0; i < ranges.size(); ++i) {
          owner_nodes[i]->owner.store(true, std::memory_order_relaxed);
          if (replicated[i]) owner_nodes[i]->replicated.store(true, std::memory_order_relaxed);
          for (std::size_t s = ranges[i].first; s <= ranges[i].second; ++s) {
            slots_[s].store(owner_nodes[i], std::memory_order_release);
          }
        }
        refreshes_.fetch_add(1, std::memory_order_relaxed);
        map_read_at_.store(clock::now().time_since_epoch().count(), std::memory_order_release);
        return true;
      } catch (...) {  // NOLINT(bugprone-empty-catch): this node failed: ask the next
      }
    }
    return false;
  }

  // replica_listed(down): whether CLUSTER NODES lists a replica of `down` (a master, found by
  // its address) not marked failed, in the answer of any node asked: every other known node in
  // turn, then the nodes those answers name that the router did not know (learnt, node_at),
  // until one lists a replica, at most max_asked nodes. Not the first answer alone: a node's
  // view of the others can lag by a second or more, and a master that just came back as a
  // replica (restarted after its own failover) is still "master,fail" in the views of the nodes
  // it has not reached yet; its own view lists it ("myself,slave <master id>"). The slot map
  // alone cannot tell either: CLUSTER SLOTS leaves out a replica whose replication offset the
  // node asked has not heard of (a fresh cluster, a replica that just synced). Also true when a
  // node the answers name as failed or unlinked, owning no slot, does not answer itself (an
  // error, a timeout, refused): such a node may be that rejoining replica, still syncing; a
  // master that has no replica costs a wait then (at most failover_wait), not a wrong local
  // load. Once per outage of `down` (redis_node::down_since): later callers get the answer it
  // stored. False when no node answers. One round trip per node asked; never throws.
  // Thread-safe.
  bool replica_listed(redis_node& down) noexcept {
    const clock::rep since = down.down_since.load(std::memory_order_relaxed);
    if (since != 0 && down.replica_asked_at.load(std::memory_order_relaxed) >= since) {
      return down.replica_listed.load(std::memory_order_relaxed);
    }
    bool listed = false;
    try {
      std::vector<redis_node*> ask;
      {
        const std::lock_guard<std::mutex> lk(mu_);
        for (const auto& n : nodes_) {
          if (n.get() != &down) ask.push_back(n.get());
        }
      }
      std::vector<redis_node*> unsure;  // named failed or unlinked, without slots: may be one
      std::vector<redis_node*> silent;  // asked, gave no answer
      for (std::size_t i = 0; i < ask.size() && i < max_asked && !listed; ++i) {
        try {
          pooled c = ask[i]->pool.acquire();
          const redis_reply r = c->command({"CLUSTER", "NODES"});
          if (is_error(r.get()) || !is_string(r.get())) {
            silent.push_back(ask[i]);
            continue;
          }
          const std::string_view text = text_of(r.get());
          listed = lists_replica(text, down.ep.host, down.ep.port);
          each_address(text, [&](std::string_view host, int port, bool unknown_role) {
            if (host.empty() || port <= 0 || (host == down.ep.host && port == down.ep.port)) {
              return;
            }
            redis_node& n = node_at(std::string(host), port);
            if (std::find(ask.begin(), ask.end(), &n) == ask.end()) ask.push_back(&n);
            if (unknown_role) unsure.push_back(&n);
          });
        } catch (...) {  // NOLINT(bugprone-empty-catch): this node failed: ask the next
          silent.push_back(ask[i]);
        }
      }
      // A node that others see failed or unlinked, owning no slot, and that did not answer
      // itself: a master restarted after its own failover rejoins as a replica, and until the
      // others hear from it (a second or more) only its own view says whose.
      for (redis_node* n : silent) {
        listed = listed || std::find(unsure.begin(), unsure.end(), n) != unsure.end();
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: as far as known
    }
    down.replica_listed.store(listed, std::memory_order_relaxed);
    down.replica_asked_at.store(clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    return listed;
  }

  // The most nodes replica_listed() asks in one outage.
  static constexpr std::size_t max_asked = 16;

  // node_line: one line of CLUSTER NODES' text ("id ip:port@cport flags master-id ping pong
  // epoch link slots..."): the node's id, address (host empty and port 0 without a usable one:
  // no colon, a port that is not 1-5 digits up to 65535), flags ("myself,master", "slave",
  // "fail?"...), its master's id ("-" for a master), its link ("connected", "disconnected")
  // and whether it owns a slot (a first slot range).
  struct node_line {
    std::string_view id, host, flags, master, link;
    int port = 0;
    bool owns_slots = false;

    // flagged(flag): `flag` is one of the comma-separated flags.
    bool flagged(std::string_view flag) const noexcept {
      for (std::string_view rest = flags; !rest.empty();) {
        const std::size_t comma = rest.find(',');
        if (rest.substr(0, comma) == flag) return true;
        rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
      }
      return false;
    }
  };

  // each_node_line(nodes, f): f(node_line) for each line of CLUSTER NODES' text; missing fields
  // are empty.
  template <class F>
  static void each_node_line(std::string_view nodes, F&& f) {
    while (!nodes.empty()) {
      const std::size_t nl = nodes.find('\n');
      const std::string_view line = nodes.substr(0, nl);
      nodes.remove_prefix(nl == std::string_view::npos ? nodes.size() : nl + 1);
      std::string_view fields[9];  // the first 8, and the first slot range (if any)
      std::string_view rest = line;
      for (auto& field : fields) {
        const std::size_t sp = rest.find(' ');
        field = rest.substr(0, sp);
        rest.remove_prefix(sp == std::string_view::npos ? rest.size() : sp + 1);
      }
      node_line n;
      n.id = fields[0];
      n.flags = fields[2];
      n.master = fields[3];
      n.link = fields[7];
      n.owns_slots = !fields[8].empty();
      const std::string_view addr = fields[1].substr(0, fields[1].find('@'));
      const std::size_t colon = addr.rfind(':');
      const std::string_view digits =
          colon == std::string_view::npos ? std::string_view() : addr.substr(colon + 1);
      int port = 0;
      for (const char ch : digits) {
        if (ch < '0' || ch > '9') {
          port = 0;
          break;
        }
        port = port * 10 + (ch - '0');
      }
      if (!digits.empty() && digits.size() <= 5 && port <= 65535 && port > 0) {
        n.host = addr.substr(0, colon);
        n.port = port;
      }
      f(n);
    }
  }

  // each_address(nodes, f): f(host, port, unknown_role) for each node CLUSTER NODES' text lists
  // with a usable address; unknown_role: flagged "fail" or "fail?", or its link "disconnected",
  // and it owns no slot (whose replica it is may have changed unseen).
  template <class F>
  static void each_address(std::string_view nodes, F&& f) {
    each_node_line(nodes, [&](const node_line& n) {
      if (n.port == 0) return;
      const bool failed = n.flagged("fail") || n.flagged("fail?");
      f(n.host, n.port, !n.owns_slots && (failed || n.link == "disconnected"));
    });
  }

  // lists_replica(nodes, host, port): CLUSTER NODES' text lists the master at host:port and a
  // replica of it whose flags do not hold "fail".
  static bool lists_replica(std::string_view nodes, std::string_view host, int port) {
    std::string_view id;
    each_node_line(nodes, [&](const node_line& n) {
      if (n.port == port && n.host == host) id = n.id;
    });
    if (id.empty()) return false;
    bool listed = false;
    each_node_line(nodes, [&](const node_line& n) {
      if (n.master == id && !n.flagged("fail")) listed = true;
    });
    return listed;
  }

  // node_at(host, port): the node at that address, created (with its pool and breaker, no
  // connection yet) the first time; never the seed of a list of seeds (its address is
  // whichever seed answered). Thread-safe. Throws std::bad_alloc.
  redis_node& node_at(const std::string& host, int port) {
    const std::lock_guard<std::mutex> lk(mu_);
    for (const auto& n : nodes_) {
      if (seed_list_ && n.get() == seed_) continue;
      if (!n->ep.unix_socket && n->ep.port == port && n->ep.host == host) return *n;
    }
    redis_endpoint ep;
    ep.host = host;
    ep.port = port;
    ep.db = 0;  // a cluster has only db 0
    nodes_.push_back(std::make_unique<redis_node>(std::vector<redis_endpoint>{std::move(ep)},
                                                  timeout_, username_, password_, max_idle_,
                                                  threshold_, cooldown_));
    return *nodes_.back();
  }

  // healthy(): the breaker of every node that owns slots (the seed, on a single server) is
  // closed: a master that failed over, and owns none since, does not count.
  bool healthy() const {
    const std::lock_guard<std::mutex> lk(mu_);
    for (const auto& n : nodes_) {
      if (n->owner.load(std::memory_order_relaxed) && !n->breaker.closed()) return false;
    }
    return true;
  }

  // breaker_opens(): the times any node's breaker opened.
  std::uint64_t breaker_opens() const {
    const std::lock_guard<std::mutex> lk(mu_);
    std::uint64_t sum = 0;
    for (const auto& n : nodes_) sum += n->breaker.opens();
    return sum;
  }

  // nodes(): how many nodes the router knows (tests).
  std::size_t nodes() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return nodes_.size();
  }

  // refreshes(): how many times the slot map was read (tests).
  std::uint64_t refreshes() const noexcept { return refreshes_.load(std::memory_order_relaxed); }

  // map_read_at(): when the slot map was last read (steady_clock ticks since its epoch; 0:
  // never): a node's `replicated` tells about its current outage when the map was read after
  // it began (redis_node::down_since). Thread-safe.
  clock::rep map_read_at() const noexcept { return map_read_at_.load(std::memory_order_acquire); }

  // close(): closes every node's pool (later acquire() calls fail). Thread-safe, idempotent.
  void close() noexcept {
    std::vector<redis_node*> all;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      try {
        for (const auto& n : nodes_) all.push_back(n.get());
      } catch (...) {
        for (const auto& n : nodes_) n->pool.close();  // under mu_: no allocation needed
        return;
      }
    }
    for (redis_node* n : all) n->pool.close();
  }

 private:
  // become_cluster(): with mu_ held, allocates the slot map (every slot: the seed) once and
  // publishes it.
  void become_cluster() {
    if (cluster_.load(std::memory_order_relaxed)) return;
    slots_ = std::make_unique<std::atomic<redis_node*>[]>(cluster_slots);
    for (std::size_t s = 0; s < cluster_slots; ++s) {
      slots_[s].store(seed_, std::memory_order_relaxed);
    }
    cluster_.store(true, std::memory_order_release);
  }

  // parse_slots(r, host, ranges, owners, replicated): CLUSTER SLOTS' reply as (first, last) slot
  // ranges, their masters' (host, port) and whether the range lists a replica; an empty host is
  // `host` (the node asked). False for an error or an unexpected shape (a slot past the last, a
  // port outside 1-65535): the whole map is then ignored, never half taken.
  static bool parse_slots(const redisReply* r, const std::string& host,
                          std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                          std::vector<std::pair<std::string, int>>& owners,
                          std::vector<bool>& replicated) {
    if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return false;
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) return false;
      const redisReply* first = e->element[0];
      const redisReply* last = e->element[1];
      const redisReply* master = e->element[2];
      if (first->type != REDIS_REPLY_INTEGER || last->type != REDIS_REPLY_INTEGER ||
          master->type != REDIS_REPLY_ARRAY || master->elements < 2 ||
          master->element[1]->type != REDIS_REPLY_INTEGER || master->element[1]->integer < 1 ||
          master->element[1]->integer > 65535 || first->integer < 0 ||
          last->integer < first->integer ||
          last->integer >= static_cast<long long>(cluster_slots)) {
        return false;
      }
      std::string h(text_of(master->element[0]));
      if (h.empty() || h == "?") h = host;
      ranges.emplace_back(static_cast<std::size_t>(first->integer),
                          static_cast<std::size_t>(last->integer));
      owners.emplace_back(std::move(h), static_cast<int>(master->element[1]->integer));
      replicated.push_back(e->elements > 3);
    }
    return true;
  }

  const bool seed_list_;  // redis_uri named more than one seed
  const std::chrono::milliseconds timeout_;
  const std::string username_;
  const std::string password_;
  const std::size_t max_idle_;
  const std::uint32_t threshold_;
  const std::chrono::milliseconds cooldown_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<redis_node>> nodes_;  // guarded by mu_; append-only
  redis_node* seed_ = nullptr;                      // nodes_.front(), set once
  // Written once under mu_ before cluster_ is set; its entries: see the file comment.
  std::unique_ptr<std::atomic<redis_node*>[]> slots_;
  std::atomic<bool> cluster_{false};

  std::mutex probe_mu_;              // one probe() at a time
  std::atomic<bool> probed_{false};  // probe() got its answer

  std::mutex refresh_mu_;
  bool refreshed_ = false;            // guarded by refresh_mu_
  clock::time_point last_refresh_{};  // guarded by refresh_mu_
  std::atomic<std::uint64_t> refreshes_{0};
  std::atomic<clock::rep> map_read_at_{0};  // stored after the map's entries (release)
};

}  // namespace singleflight::detail
