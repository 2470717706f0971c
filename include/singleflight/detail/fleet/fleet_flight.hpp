// singleflight/detail/fleet/fleet_flight.hpp -- internal; do not include directly.
//
// detail::fleet_flight: one process's flight for one key through the fleet's
// protocol, the decisions that put fleet_protocol.hpp's steps together: a hit,
// the race for the lease, a follower's waits, a leader's load and store, a
// local load when Redis fails or max_wait passes. It does not depend on the
// fleet's Key and T: what does (decoding a payload, calling the loader,
// encoding its value) is behind detail::fleet_value, which fleet.hpp
// implements for each flight. So this code is compiled once per program, not
// once per fleet<Key, T> and loader type.
//
// Locking: none of its own. A flight runs on one thread (the one the local
// group runs fn on: the first caller, the executor, or a worker) and uses the
// engine's parts, each with its own lock; it holds none of them, and no
// pooled connection, while it calls fleet_value (user code: the loader, the
// codec). A flight that runs on its first caller's thread (fleet::get without
// an executor) is told that caller's token (leave_on): when it fires while the
// flight waits for another process, run() returns with left() set, holding
// nothing (no lease, no connection, no watch), and the caller's fleet runs the
// rest of the flight on a worker (wait_until: within the same max_wait).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "../../errors.hpp"
#include "../../fleet_options.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "../unwind.hpp"
#include "fleet_engine.hpp"
#include "fleet_protocol.hpp"
#include "read_mark.hpp"
#include "tracker_line.hpp"

namespace singleflight::detail {

// fleet_value: what a flight needs of the value type. fleet.hpp implements it
// for one flight, holding the loader and the flight's result (a T); the flight
// only moves bytes.
class fleet_value {
 public:
  fleet_value(const fleet_value&) = delete;
  fleet_value& operator=(const fleet_value&) = delete;

  // decode(payload): the codec's value of a record's payload becomes the
  // flight's result. Throws what the codec throws (the flight takes any throw
  // for a miss).
  virtual void decode(std::string_view payload) = 0;
  // load(st): calls the loader; its value becomes the flight's result. Throws
  // what the loader throws.
  virtual void load(const stop_token& st) = 0;
  // encode(): the codec's bytes of the result load() produced. Throws what
  // the codec throws.
  virtual std::string encode() = 0;

 protected:
  fleet_value() = default;
  ~fleet_value() = default;
};

class fleet_flight {
  using clock = std::chrono::steady_clock;

 public:
  // A flight of `text` (the key codec's text) through engine `e`, for a codec
  // whose tag is `tag`; `st` is the local flight's token. Throws std::bad_alloc.
  fleet_flight(fleet_engine& e, std::string_view tag, const std::string& text, fleet_value& v,
               const stop_token& st)
      : e_(e),
        tag_(tag),
        text_(text),
        names_(fleet_names::of(e.cfg.key_prefix, text, e.cfg.db)),
        limit_(record_limit(e.cfg.max_value_bytes, tag)),
        v_(v),
        st_(st),
        node_(&e.router.route(names_.value)) {}
  fleet_flight(const fleet_flight&) = delete;
  fleet_flight& operator=(const fleet_flight&) = delete;
  ~fleet_flight() = default;

  // leave_on(caller): `caller` (which must outlive run()) is the token of the
  // caller whose thread runs this flight: when it fires while the flight waits
  // for another process's lease, run() returns at once with left() true and
  // no result. Not while the loader runs (user code on this thread), nor while
  // a cluster master fails over (await_failover: bounded by failover_wait).
  void leave_on(const stop_token& caller) noexcept { caller_ = &caller; }

  // wait_until(t): a flight that another one left (left()) waits for other
  // processes until `t`, its give_up(), instead of max_wait from its own start.
  void wait_until(clock::time_point t) noexcept { until_ = t; }

  // left(): run() returned because leave_on's caller left; give_up(): when the
  // flight's wait for other processes ends (pass it on to wait_until).
  bool left() const noexcept { return left_; }
  clock::time_point give_up() const noexcept { return give_up_; }

  // run(): the protocol. On return the value's result is set (from Redis, or
  // from the loader here). Throws what the loader throws (in this process),
  // remote_load_error (another process's load failed, or its error marker is
  // stored), cancelled_error (the flight's token stopped while it waited),
  // closed_error (the fleet closed while it waited). Never a Redis error:
  // Redis failing means a local load. Returns without a result when left().
  void run() {
    auto& n = e_.counters;
    if (!node_->breaker.allow()) {
      // On a cluster its master may have failed over: read the map again (rate-limited).
      redis_node* now = &e_.router.reroute(*node_, names_.value);
      if (now != node_ && now->breaker.allow()) {
        node_ = now;
      } else {
        down_ = true;  // the master does not answer: its replica may be taking over
        node_->failed();
        if (!await_failover()) return load_locally();
      }
    }

    // 1. Read the record (get_value): a hit on a record of up to 64 KiB costs this one round
    // trip, a longer one two.
    get_result first;
    std::uint64_t reports = reports_now();
    while (!round_trip([&](redis_conn& c) { first = get_value(c, names_, tag_, limit_); })) {
      if (!await_failover()) return load_locally();
      reports = reports_now();
    }
    bool read_value = true;  // may the race script return the value it finds?
    if (first.kind == get_result::found) {
      node_->answered();
      if (take(first.bytes)) {
        fleet_counters::bump(n.hits);
        mark_read(reports);
        return;
      }
      read_value = false;
    } else if (first.kind == get_result::foreign) {
      fleet_counters::bump(n.decode_failures);
      read_value = false;
    } else if (first.kind == get_result::oversized) {
      // Not read: a miss, which the leader's store replaces. When the rest of
      // the reply is in flight on the connection, it is broken: drop it (the
      // server stops).
      if ((*conn_)->broken()) conn_.reset();
      fleet_counters::bump(n.oversized_skipped);
      read_value = false;
    }

    // 2. Miss: race for the lease; lose, wait, race again. Its notifications (the leader's
    // PUBLISH or SPUBLISH, the followers' watches) need to know whether this is a cluster.
    e_.router.probe();
    const clock::time_point give_up = until_ ? *until_ : clock::now() + e_.cfg.max_wait;
    give_up_ = give_up;
    // The waits below wake on the flight's token, and on leave_on's caller's when there is one
    // (`waker`, made only for a flight that waits: a hit needs none).
    std::optional<either_stop> either;
    const auto waker = [&]() -> const stop_token& {
      if (caller_ == nullptr) return st_;
      if (!either) either.emplace(st_, *caller_);
      return either->token;
    };
    fleet_subscriber::watch w;
    bool woken = false;  // a message woke this follower since its last race
    std::string message;
    std::chrono::milliseconds moved_pause{0};  // after a `moved` event (see there)
    for (;;) {
      if (st_.stop_requested()) throw cancelled_error();
      if (leaving()) return;
      std::string token = e_.new_token();
      acquire_result a;
      reports = reports_now();
      if (!round_trip([&](redis_conn& c) {
            a = acquire(c, names_, tag_, token, e_.cfg.lease_ttl, e_.cfg.meta_ttl, read_value,
                        limit_);
          })) {
        // The race may still run on the server (a reply lost, a server that
        // stalled): it must then take no lease that nobody holds.
        if (sent_) e_.give_up(names_, token);
        if (!await_failover()) return load_locally();
        w = fleet_subscriber::watch();  // a watch, if any, was on the master that failed
        woken = false;
        read_value = true;
        continue;
      }
      node_->answered();
      if (a.kind == acquire_result::found) {
        if (take(a.bytes)) {
          fleet_counters::bump(woken ? n.follower_woken : n.late_hit);
          mark_read(reports);
          return;
        }
        read_value = false;
        continue;  // not ours to read: race without reading
      }
      if (a.kind == acquire_result::oversized) {
        if ((*conn_)->broken()) conn_.reset();
        fleet_counters::bump(n.oversized_skipped);
        read_value = false;
        continue;  // not to be read: race without reading
      }
      if (a.kind == acquire_result::foreign) {
        fleet_counters::bump(n.decode_failures);
        read_value = false;
        continue;  // not a record: race without reading
      }
      if (a.kind == acquire_result::gone) continue;  // a long value went: race again
      if (a.kind == acquire_result::won) {
        conn_.reset();  // no connection is held while the loader runs
        return lead(token, a.fence, a.gen);
      }

      // Lost: another process holds the lease.
      conn_.reset();  // nor while this flight waits
      e_.at(fleet_point::lost_race, text_);
      if (!w) {
        // On a cluster, the shard channel on the node the router says owns the slot (the
        // race just ran there, or was redirected and taught the router so).
        w = e_.subscriber_for(e_.router.route(names_.channel)).subscribe(names_.channel);
        const auto until = std::min(clock::now() + e_.cfg.wait_slice, give_up);
        if (w.wait_confirmed(until, waker())) {
          // Whatever the leader published before this point was not seen: a
          // stored value, or a released lease ("r": an abandoned or refused
          // load). Race again now (the race re-reads the value first); from
          // here on no message is missed.
          e_.at(fleet_point::subscribed, text_);
          moved_pause = std::chrono::milliseconds(0);
          read_value = true;
          woken = false;
          continue;
        }
      }
      if (st_.stop_requested()) throw cancelled_error();
      if (leaving()) return;
      if (clock::now() >= give_up) return load_locally(&n.local_max_wait);

      e_.at(fleet_point::waiting, text_);
      const auto until = std::min(clock::now() + e_.cfg.wait_slice, give_up);
      switch (w.wait_event(until, waker(), message)) {
        case fleet_subscriber::event::message:
          if (!message.empty() && message.front() == 'e') {
            // The leader's load failed: fail fast rather than load again.
            fleet_counters::bump(n.remote_failures);
            throw remote_load_error("singleflight::fleet: the load failed in another process: " +
                                    message.substr(1));
          }
          // The leader has a value it could not store (over max_value_bytes, a
          // store Redis refused, an encode that threw): racing again would make
          // the followers load one after another; each loads now, at once.
          if (message == "n") return load_locally(&n.local_unshared);
          woken = message == "v";
          break;
        case fleet_subscriber::event::moved:
          // Sharded: the key's slot migrated, or the watch went to a node that no longer
          // owns it. Race again (the race follows the slot) and watch on its owner; a
          // watch refused again and again (a migration under way) waits 1, 2, 4, 8, 8... ms
          // between races.
          w = fleet_subscriber::watch();
          woken = false;
          if (moved_pause.count() > 0) std::this_thread::sleep_for(moved_pause);
          moved_pause = std::clamp(moved_pause * 2, std::chrono::milliseconds(1),
                                   std::chrono::milliseconds(8));
          break;
        case fleet_subscriber::event::stopped:
          if (st_.stop_requested()) throw cancelled_error();
          left_ = true;  // leave_on's caller left (only its stop, or st_'s, wakes the wait)
          return;
        case fleet_subscriber::event::closed:
          throw closed_error();
        case fleet_subscriber::event::resubscribed:
        case fleet_subscriber::event::timeout:
          woken = false;
          break;
      }
      if (clock::now() >= give_up) return load_locally(&n.local_max_wait);
      read_value = true;
    }
  }

 private:
  // either_stop: a token that stops when either of two does (the waits take one token).
  // Its callbacks run inside the other tokens' request_stop(): they only request stop.
  struct either_stop {
    struct relay {
      stop_source* to;
      void operator()() const noexcept { (void)to->request_stop(); }
    };
    either_stop(const stop_token& a, const stop_token& b)
        : token(source.get_token()), on_a(a, relay{&source}), on_b(b, relay{&source}) {}
    stop_source source;
    stop_token token;
    stop_callback<relay> on_a;
    stop_callback<relay> on_b;
  };

  // leaving(): leave_on's caller left; then left() is set (run() returns at once).
  bool leaving() noexcept {
    if (caller_ == nullptr || !caller_->stop_requested()) return false;
    left_ = true;
    return true;
  }

  // One round trip on the flight's connection (taken from its node's pool on
  // first use), routed (redis_router::run: MOVED, ASK); false, with the
  // connection dropped, when Redis failed: a failure for the node's breaker
  // (sent_ then says whether the command may have been sent: a connection was
  // had), or when the cluster did not run it (TRYAGAIN, CLUSTERDOWN, a slot
  // that moved twice: no failure, nothing sent). Successes are reported by run(), once the call's
  // Redis part has worked (a hit, or a race that got an answer): a GET that works while writes
  // stall (CLIENT PAUSE WRITE, a read-only replica) must not keep the breaker closed for calls that
  // then time out.
  template <class Step>
  bool round_trip(Step&& step) {
    sent_ = false;
    down_ = false;
    not_run_ = false;
    try {
      if (!conn_) conn_.emplace(node_->pool.acquire());
      sent_ = true;  // from here the command may reach the server, whatever happens next
      // Once more on a fresh connection if a pooled one was closed under it
      // (pooled::run): a repeated GET or lease attempt costs at most a wait
      // for our own lease, never a wrong value.
      auto once = [&](redis_conn& c) {
        step(c);
        return true;
      };
      return e_.router.run(node_, conn_, once);
    } catch (const redis_failure& f) {
      conn_.reset();
      if (f.redirected()) {
        sent_ = false;  // a redirect: the command did not run
        not_run_ = true;
        return false;
      }
      fleet_counters::bump(e_.counters.redis_errors);
      // A refusal of the settings answers at once and is no outage: it does
      // not open the breaker (each call loads locally until it is fixed).
      if (!f.refused()) {
        (void)node_->breaker.failure();
        node_->failed();
        e_.router.node_failed(*node_);  // a cluster master may have died: read the map again
        down_ = true;
      }
      return false;
    }
  }

  // await_failover(): after a round trip to node_ failed (down_: refused, reset, timed out; not
  // a redirect, not a refusal of the settings) or with its breaker open: on a cluster whose
  // slot map names a replica for that master, waits for a new owner of the slot (the replica
  // promoted), reading the map again every refresh_every (redis_router::reroute), and returns
  // true with node_ set to it; also true when the same master may be asked again (its breaker
  // lets a call through: it may be back). False (load locally, as before) on a single server,
  // for a master without a replica (neither a map read since its outage began nor CLUSTER
  // NODES lists one: redis_router::replica_listed, asked once per outage; false when no other
  // node answers), and once the outage has lasted failover_wait (redis_node::down_since:
  // one bound for all the outage's flights, not one per flight). Throws cancelled_error when the
  // flight's token stops (every caller left or timed out), closed_error when the fleet closes.
  // Sleeps between map reads; holds no lock and no connection.
  bool await_failover() {
    auto& n = e_.counters;
    if (!down_ || !e_.router.cluster()) {
      if (not_run_) fleet_counters::bump(n.local_not_run);
      return false;
    }
    redis_node* const down = node_;
    conn_.reset();
    const clock::rep since = down->down_since.load(std::memory_order_relaxed);
    if (since == 0) {  // it answered another flight meanwhile (rare): ask again
      node_ = &e_.router.route(names_.value);
      return true;
    }
    const clock::time_point began{clock::duration(since)};
    const clock::time_point until = began + e_.cfg.failover_wait;
    // Between map reads: short enough that a promotion is seen about when a map read may show
    // it (refresh_every, shared by every flight of the fleet), long enough not to spin.
    constexpr auto poll = redis_router::refresh_every / 4;
    bool waited = false;
    for (;;) {
      if (st_.stop_requested()) throw cancelled_error();
      if (down->pool.closed()) throw closed_error();
      redis_node* const owner = &e_.router.reroute(*down, names_.value);
      if (owner != down) {
        down->down_since.store(0, std::memory_order_relaxed);
        node_ = owner;
        return true;
      }
      // A replica named by a map read since the outage began, or else by CLUSTER NODES (asked
      // once per outage): without one, nobody will take over.
      if (!(e_.router.map_read_at() >= since && down->replicated.load(std::memory_order_relaxed)) &&
          !e_.router.replica_listed(*down)) {
        fleet_counters::bump(n.failover_no_replica);
        return false;
      }
      const auto now = clock::now();
      if (now >= until) {
        fleet_counters::bump(n.failover_expired);
        return false;
      }
      if (!waited) {
        waited = true;
        fleet_counters::bump(n.failover_waits);
      }
      std::this_thread::sleep_for(std::min<clock::duration>(poll, until - now));
      // The master itself may be back (a restart faster than the cluster's node timeout): asked
      // again when its breaker allows (at once while it is closed, once per cooldown open).
      if (&e_.router.route(names_.value) == down && down->breaker.allow()) return true;
    }
  }

  // reports_now(): the tracking reports posted so far (read_mark.hpp), loaded before a read
  // whose reply may carry the value; 0 when nobody counts them.
  std::uint64_t reports_now() const noexcept {
    return e_.reports != nullptr ? e_.reports->reports() : 0;
  }

  // mark_read(reports): the result came from a read sent after `reports` reports were posted:
  // recorded in this thread's read_mark for fleet_cache (nothing when nobody counts them).
  void mark_read(std::uint64_t reports) noexcept {
    if (e_.reports == nullptr) return;
    read_mark& m = this_thread_read_mark();
    try {
      m.text = text_;
    } catch (...) {  // bad_alloc: no mark; the reports drop the value, as without one
      m.set = false;
      return;
    }
    m.engine = &e_;
    m.reports = reports;
    m.set = true;
  }

  // The lease is ours: load, then store (fenced) and publish.
  void lead(const std::string& token, const std::string& fence, const std::string& gen) {
    fleet_counters::bump(e_.counters.leader);
    fleet_counters::bump(e_.counters.origin_calls);
    e_.at(fleet_point::leading, text_);
    lease_renewer::handle renewal = e_.renewer.add(names_, token);
    try {
      v_.load(st_);
    } catch (...) {
      renewal.release();
      const std::exception_ptr p = std::current_exception();
      if (!p) throw;  // not a C++ exception (a forced unwind): no cleanup, the lease expires
      fail(token, fence, gen, p, st_.stop_requested());
      throw;
    }
    renewal.release();
    e_.at(fleet_point::loaded, text_);
    std::string rec;
    bool oversized = false;
    try {
      const std::string payload = v_.encode();
      oversized = e_.cfg.max_value_bytes > 0 && payload.size() > e_.cfg.max_value_bytes;
      if (!oversized) rec = make_record('v', tag_, fence, gen, payload);
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      // Cannot share it: release the lease; the followers load for themselves.
      publish(token, fence, gen, "", e_.cfg.value_ttl, "n");
      return;
    }
    if (oversized) {
      fleet_counters::bump(e_.counters.oversized_values);
      publish(token, fence, gen, "", e_.cfg.value_ttl, "n");
      return;
    }
    publish(token, fence, gen, rec, e_.cfg.value_ttl, "v");
  }

  // The store script: store `rec` (if not empty) for `ttl` when the fence is
  // the newest and the generation unchanged, release the lease, publish
  // `message`; with cfg.replicas, WAIT for them after a stored record. When
  // the store fails (Redis refused the record, a connection lost), the lease
  // is released on another connection and the followers told: "n" (load for
  // yourselves) instead of "v", the same message otherwise. Failures are
  // counted, never thrown.
  void publish(const std::string& token, const std::string& fence, const std::string& gen,
               const std::string& rec, std::chrono::milliseconds ttl,
               const std::string& message) noexcept {
    bool stored = false;
    std::optional<pooled> c;
    redis_node* node = &e_.router.route(names_.value);
    try {
      bool published = true;
      // A second run of the fenced store changes nothing (pooled::run); a
      // redirected one did not run (redis_router::run).
      auto step = [&](redis_conn& rc) {
        return store(rc, names_, token, fence, gen, rec, ttl, message, e_.cfg.meta_ttl, published,
                     e_.router.cluster());
      };
      // Under client tracking, on the tracker when it is free: the store is then not reported
      // to this process, whose local copy of the value stays (tracker_line.hpp).
      const std::optional<store_result> tracked =
          store_tracked(token, fence, gen, rec, ttl, message, published);
      const store_result sr = tracked ? *tracked : e_.router.run(node, c, step);
      switch (sr) {
        case store_result::stored:
          stored = !rec.empty();
          break;
        case store_result::fenced_out:
          fleet_counters::bump(e_.counters.fence_rejections);
          break;
        case store_result::invalidated:
          fleet_counters::bump(e_.counters.invalidated_stores);
          break;
      }
      if (!published) fleet_counters::bump(e_.counters.publish_failures);
      node->answered();
      if (stored && e_.cfg.replicas > 0) {
        // A shortfall, or no answer to WAIT, is the replicas' and is counted
        // as theirs: the primary stored the value, Redis did not fail.
        bool short_of_replicas = true;
        try {
          short_of_replicas =
              wait_replicas(**c, e_.cfg.replicas, e_.cfg.replica_timeout, e_.cfg.redis_timeout) <
              static_cast<long long>(e_.cfg.replicas);
        } catch (const redis_failure&) {
          c->mark_broken();
        }
        if (short_of_replicas) fleet_counters::bump(e_.counters.replica_timeouts);
      }
    } catch (const redis_failure& f) {
      // Whatever the server made of it (a refused record closes the
      // connection), this connection is not given back.
      if (c) c->mark_broken();  // none held when run()'s reconnect threw
      c.reset();
      // A redirect (TRYAGAIN, CLUSTERDOWN, a slot that moved twice) ran
      // nothing: no failure of the node; the lease is released as below.
      if (!f.redirected()) fleet_counters::bump(e_.counters.redis_errors);
      if (!stored) {
        if (!f.redirected()) {
          (void)node->breaker.failure();
          e_.router.node_failed(*node);
        }
        release_after_failed_store(
            token, message == "v" ? std::string_view("n") : std::string_view(message));
      }
    } catch (const std::bad_alloc&) {
      fleet_counters::bump(e_.counters.redis_errors);  // the lease expires
    }
    e_.at(fleet_point::stored, text_);  // a test hook; it must not throw
  }

  // store_tracked(...): the store as a transaction on the subscriber's tracker
  // (store_on_tracker), when this process tracks, the tracker is free, and no replica is
  // waited for (WAIT counts the writes of the connection it is sent on); nullopt: run the
  // script. A failure on the tracker marks it broken (the subscriber reopens it) and is not
  // the node's: the script runs next, on the pool, and decides.
  std::optional<store_result> store_tracked(const std::string& token, const std::string& fence,
                                            const std::string& gen, const std::string& rec,
                                            std::chrono::milliseconds ttl,
                                            const std::string& message, bool& published) noexcept {
    if (e_.router.cluster() || e_.cfg.replicas > 0) return std::nullopt;
    const tracker_line::held t = e_.subscriber.tracker().try_take();
    if (!t) return std::nullopt;
    try {
      return store_on_tracker(*t, names_, token, fence, gen, rec, ttl, message, e_.cfg.meta_ttl,
                              published);
    } catch (const std::exception&) {  // redis_failure, bad_alloc
      t->mark_broken();
    }
    return std::nullopt;
  }

  // The store script failed: release the lease (if it is still ours) on a
  // new connection (not one from the pool: the server may have closed those
  // too) and publish `message`, so that the followers do not wait for the
  // lease to expire. When that fails too (a server that stalls), the
  // renewer's thread retries it until it works or the lease has expired
  // (lease_renewer::release_later), off this caller's path.
  void release_after_failed_store(const std::string& token, std::string_view message) noexcept {
    try {
      const std::unique_ptr<redis_conn> c = e_.router.route(names_.value).pool.open();
      bool published = true;
      if (release(*c, names_, token, std::chrono::milliseconds(0), message, published,
                  e_.router.cluster()) == release_result::released &&
          !published) {
        fleet_counters::bump(e_.counters.publish_failures);
      }
    } catch (const redis_failure&) {
      fleet_counters::bump(e_.counters.redis_errors);
      e_.renewer.release_later(names_, token, std::chrono::milliseconds(0), message);
    } catch (const std::bad_alloc&) {
      fleet_counters::bump(e_.counters.redis_errors);
      e_.renewer.release_later(names_, token, std::chrono::milliseconds(0), message);
    }
  }

  // A leader's load failed: publish the error (and store its marker for
  // error_ttl) so that the followers fail fast, or, when the flight was
  // abandoned here (its callers left, deadline, close), only release the
  // lease so that they race again. Never throws.
  void fail(const std::string& token, const std::string& fence, const std::string& gen,
            const std::exception_ptr& p, bool abandoned) noexcept {
    if (abandoned) {
      publish(token, fence, gen, std::string(), e_.cfg.value_ttl, "r");
      return;
    }
    std::string rec;
    std::string message;
    try {
      const std::string why = what_of(p);
      if (e_.cfg.error_ttl.count() > 0) rec = make_record('e', tag_, fence, gen, why);
      message = "e" + why;
    } catch (const std::bad_alloc&) {
      rec.clear();
      message = "r";
    }
    publish(token, fence, gen, rec, e_.cfg.error_ttl, message);
  }

  // load_locally(why): the loader, here, without the lease; `why` (if any) is the reason's
  // counter, besides local_fallback (await_failover() counts its own).
  void load_locally(std::atomic<std::uint64_t>* why = nullptr) {
    if (why != nullptr) fleet_counters::bump(*why);
    fleet_counters::bump(e_.counters.local_fallback);
    fleet_counters::bump(e_.counters.origin_calls);
    v_.load(st_);
  }

  // take(bytes): true when `bytes` is a record of this codec whose value
  // became the result; false (counted) when it is not a record of this codec.
  // An error marker throws remote_load_error.
  bool take(std::string_view bytes) {
    const std::optional<record> r = parse_record(bytes, tag_);
    if (!r) {
      fleet_counters::bump(e_.counters.decode_failures);
      return false;
    }
    if (r->kind == 'e') {
      fleet_counters::bump(e_.counters.remote_failures);
      throw remote_load_error("singleflight::fleet: the load failed in another process: " +
                              std::string(r->payload));
    }
    try {
      v_.decode(r->payload);
      return true;
    } catch (...) {
      SINGLEFLIGHT_RETHROW_FOREIGN();
      fleet_counters::bump(e_.counters.decode_failures);
      return false;
    }
  }

  static std::string what_of(const std::exception_ptr& p) {
    std::string text = "an exception not derived from std::exception";
    try {
      std::rethrow_exception(p);
    } catch (const std::exception& x) {
      text = x.what();
    } catch (...) {  // NOLINT(bugprone-empty-catch): p is a C++ exception (checked by the caller)
    }
    constexpr std::size_t limit = 256;  // error markers stay small
    if (text.size() > limit) text.resize(limit);
    return text;
  }

  fleet_engine& e_;
  const std::string_view tag_;
  const std::string& text_;
  const fleet_names names_;
  const std::size_t limit_;  // the longest record read (record_limit); 0: no limit
  fleet_value& v_;
  const stop_token& st_;
  redis_node* node_;            // the node of the key's slot (moved by a MOVED reply)
  std::optional<pooled> conn_;  // the flight's command connection, between round trips
  bool sent_ = false;           // the last failed round trip had a connection to send on
  bool down_ = false;           // ... and node_ did not answer it (a failure of the node)
  bool not_run_ = false;        // ... or the cluster did not run it (a redirect not followed)
  const stop_token* caller_ = nullptr;      // leave_on's; null: nobody leaves mid-flight
  std::optional<clock::time_point> until_;  // wait_until's; else max_wait from the miss
  clock::time_point give_up_{};             // when the wait for other processes ends
  bool left_ = false;                       // run() returned because caller_ fired
};

}  // namespace singleflight::detail
