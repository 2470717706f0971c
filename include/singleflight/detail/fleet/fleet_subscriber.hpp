// singleflight/detail/fleet/fleet_subscriber.hpp -- internal; do not include directly.
//
// detail::fleet_subscriber: one pub/sub connection of the fleet (its one, on a
// single server; on a cluster, one more per master: "Sharded" below) and the thread
// that owns it: one long-running job (run(), started by start() on the fleet's
// service threads, a worker_threads: detail/worker_threads.hpp). A follower that lost the lease
// race takes a `watch` on its key's channel; the thread SUBSCRIBEs, reports the server's
// confirmation, and wakes the watch on every message. The thread does I/O and sets flags: it runs
// no user code, so no callback can hold back the notifications of other keys.
//
// Pub/sub is at-most-once: a message published before the subscription was
// confirmed, or while the connection was down, is lost. So a follower re-reads
// the value after the confirmation (wait_confirmed), and after every
// re-confirmation that follows a reconnect (a `resubscribed` event); and it
// never waits longer than its wait_slice on a message in any case.
//
// Connection: opened lazily, when the first channel is watched; on any I/O
// error (including CLIENT KILL TYPE pubsub, or a server restart) it is
// dropped and reopened while channels are watched: at once when the lost
// connection had answered, else with a backoff (50 ms doubling to 2 s, reset
// by the first reply on a connection), so a server that accepts connections
// only to drop or reject them (maxclients) is not hammered.
//
// Listeners: a channel may also have one `listener` (subscribe(channel,
// listener)), told of every message and of every (re-)confirmation, on the
// thread, under `mu_`, in the order the server sent them. A listener is
// library code (fleet_cache's invalidation inbox): it only records what it
// is told under a leaf lock of its own, never calls back into the subscriber
// and runs no user code. It is never called once its watch is destroyed.
//
// Shutdown: stop() ends the job (a poke wakes it out of poll()) and waits for
// nothing; every waiter returns `closed`. The fleet's close() then waits for the
// job through the worker_threads that runs it (from outside: joined; from a
// library thread: not waited for, the destructor joins).
//
// Client tracking (track(prefix), fleet_cache's default coherence): each
// connection, before it subscribes, asks its CLIENT ID, then opens a second
// connection, the tracker, that sends `CLIENT TRACKING on REDIRECT <id> BCAST
// NOLOOP PREFIX <prefix>`: the server then reports every change of a key under
// the prefix, by anyone but the tracker itself, as a message on
// `__redis__:invalidate` to this connection (RESP2: the payload is an array of
// key names, handed to the channel's listener one by one; a FLUSHALL is a nil
// payload: on_flushed). The tracker is lent to flights that store a value
// (tracker(), tracker_line.hpp: their store is then not reported to this
// process); otherwise it sits idle, polled: when it closes (CLIENT KILL, a
// restart) or a flight failed on it, tracking has stopped, so the subscriber's
// connection is dropped too and both are reopened; the re-confirmation of the
// subscription, sent after the new tracker is in place, tells the listener
// that messages may have been lost.
//
// Tracking refused: a server that answers CLIENT ID or CLIENT TRACKING with an
// error that is not transient (an ACL that denies `client`, a renamed or
// unknown command, a server without REDIRECT) will not track this process. The
// subscriber then stops asking, for good (tracking_refused()), tells every
// listener (on_tracking_refused, before any confirmation on that connection),
// and subscribes the fallback channels (subscribe_fallback: fleet_cache's bus)
// from that connection on. Transient errors (LOADING, BUSY, MASTERDOWN,
// TRYAGAIN, a REDIRECT target gone because the connection was killed in
// between) are a failed connect: retried with the backoff.
//
// Tracking on a Redis Cluster is refused by the subscriber itself: a tracker
// hears only the writes of its own node (CLIENT TRACKING reports the keys of the
// node it is sent to, and REDIRECT must name a client of that node), so a tracker
// on the seed would report the keys of the seed's slots and silently miss every
// other master's. Before it asks CLIENT ID, each tracked connection asks `INFO
// cluster`; `cluster_enabled:1` is a refusal as above, for good
// (tracking_refused_on_cluster()), so the fallback channels carry what can be
// heard (the fleet's own writes, classic PUBLISH, which a cluster sends to every
// node). An error reply (an ACL that denies INFO) is taken for a single server, as
// redis_router::probe does.
//
// Sharded (a Redis Cluster: one subscriber per node, fleet_engine::subscriber_for): the
// channels are shard channels (SSUBSCRIBE / SUNSUBSCRIBE, one command per channel, messages
// `smessage`; Redis 7.0), each named with its key's hash tag and heard only on the node that
// owns the slot, where the key's scripts SPUBLISH (fleet_protocol.hpp). No fallback channel,
// no client tracking, no listener. When the slot migrates the node pushes `sunsubscribe`;
// when it was not the slot's owner it answers the SSUBSCRIBE with MOVED. Either way the
// subscription is dropped for good (not asked for again until a new watch of it) and its
// waiters told (event::moved): they race again (the race follows the slot to its new owner)
// and watch there.
//
// Locking: `mu_` guards `channels_`, `closing_`, `dirty_` and every
// channel_state. The thread holds it only to read the wanted subscriptions
// and to apply what it read; connecting, writing, polling and reading happen
// without it. Waiters wait on their channel's condition variable under `mu_`;
// the thread notifies under `mu_` after setting the counters the waiters test
// (no lost wake-up). A waiter's stop token wakes it through a stop_callback
// that notifies under `mu_` too (the waiter tests stop_requested() in its
// predicate, under `mu_`); the callback is registered before the waiter takes
// `mu_` (it runs in its constructor when the token is already stopped) and
// destroyed after it released `mu_` (~stop_callback waits for a run on another
// thread, which takes `mu_`). Nothing here calls out while holding `mu_`.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../../errors.hpp"
#include "../../stop_token.hpp"
#include "../chrono.hpp"
#include "../worker_threads.hpp"
#include "fleet_hooks.hpp"
#include "redis_conn.hpp"
#include "redis_pool.hpp"
#include "tracker_line.hpp"

namespace singleflight::detail {

class fleet_subscriber {
 public:
  // listener: told of every message on its channel (the payload) and of every
  // confirmation of the channel's subscription (the first, and each after a
  // reconnect: messages sent while the connection was down are lost). Called
  // on the subscriber's thread under its lock: must not block, throw, or call
  // the subscriber.
  struct listener {
    virtual void on_message(std::string_view payload) noexcept = 0;
    virtual void on_confirmed() noexcept = 0;
    // The confirmations of one (re)subscription are all in: called once no
    // listened channel of the connection awaits its confirmation any more,
    // after the on_confirmed calls it follows, for each listened channel
    // confirmed on the connection. A listener of several channels (one
    // fleet_cache's) acts on their confirmations once, here.
    virtual void on_settled() noexcept {}
    // A message with a nil payload: client tracking's report of a FLUSHALL
    // (or FLUSHDB): every key changed.
    virtual void on_flushed() noexcept = 0;
    // The server refused client tracking (see above): from now on this
    // subscriber's connections are not tracked, and its fallback channels are
    // subscribed. Called once, before the confirmations that follow it.
    virtual void on_tracking_refused() noexcept {}

   protected:
    ~listener() = default;
  };

 private:
  struct channel_state {
    std::size_t refs = 0;    // watches alive
    bool on_server = false;  // SUBSCRIBE sent on the current connection, no UNSUBSCRIBE since
    bool confirmed = false;  // the server confirmed it on the current connection
    // (UN)SUBSCRIBEs sent on the current connection whose reply has not come
    // back. Replies come in order, so only the reply to the last request sent
    // (pending back to 0) tells the channel's state: a late reply to an
    // earlier SUBSCRIBE, followed by an UNSUBSCRIBE the server has already
    // applied, must not confirm a new watch (its message would be lost). A
    // state with replies pending is kept, so they cannot land on a new one.
    std::size_t pending = 0;
    std::uint64_t confirmations = 0;
    std::uint64_t messages = 0;
    // Sharded: the server dropped the subscription (a `sunsubscribe` it pushed: the slot
    // migrated; or it refused the SSUBSCRIBE: not the slot's owner). `gone` keeps the thread
    // from sending it again until a new watch asks for it; `moves` counts the drops.
    bool gone = false;
    std::uint64_t moves = 0;
    std::string last;       // the latest message
    bool fallback = false;  // subscribed only once tracking is refused (subscribe_fallback)
    std::condition_variable cv;
    listener* heard = nullptr;  // the listening watch's listener, while it lives
  };

 public:
  // What ended a wait. `moved` (sharded only): the server dropped the subscription, its
  // slot migrated or it was never the slot's owner: race again, and watch on the new owner.
  enum class event { message, resubscribed, moved, timeout, stopped, closed };

  // watch: interest in one channel, from construction to destruction. Used by
  // one thread (the follower's). Destroying it unsubscribes once no other
  // watch of the same channel is left.
  class watch {
   public:
    watch() noexcept = default;
    watch(watch&& o) noexcept
        : owner_(std::exchange(o.owner_, nullptr)),
          ch_(std::exchange(o.ch_, nullptr)),
          name_(std::move(o.name_)),
          seen_confirmations_(o.seen_confirmations_),
          seen_messages_(o.seen_messages_),
          seen_moves_(o.seen_moves_) {}
    watch& operator=(watch&& o) noexcept {
      if (this != &o) {
        release();
        owner_ = std::exchange(o.owner_, nullptr);
        ch_ = std::exchange(o.ch_, nullptr);
        name_ = std::move(o.name_);
        seen_confirmations_ = o.seen_confirmations_;
        seen_messages_ = o.seen_messages_;
        seen_moves_ = o.seen_moves_;
      }
      return *this;
    }
    watch(const watch&) = delete;
    watch& operator=(const watch&) = delete;
    ~watch() { release(); }

    explicit operator bool() const noexcept { return owner_ != nullptr; }

    // wait_confirmed(until, st): true once the server has confirmed the
    // subscription; false at `until`, on `st`'s stop, when the subscriber
    // closes, or when the server dropped it (sharded: reported by the next
    // wait_event, as `moved`). Other events before the confirmation are not
    // reported later.
    template <class Clock, class Duration>
    bool wait_confirmed(std::chrono::time_point<Clock, Duration> until, const stop_token& st) {
      const stop_callback<wake_on_stop> wake(st, wake_on_stop{owner_, ch_});  // before lk
      std::unique_lock<std::mutex> lk(owner_->mu_);
      (void)ch_->cv.wait_until(lk, until, [&] {
        return ch_->confirmed || ch_->moves != seen_moves_ || owner_->closing_ ||
               st.stop_requested();
      });
      seen_confirmations_ = ch_->confirmations;
      seen_messages_ = ch_->messages;
      return ch_->confirmed;
    }

    // wait_event(until, st, message): the first of: a message (copied into
    // `message`), a re-confirmation after a reconnect, the server dropping the
    // subscription (sharded), `until`, `st`'s stop, the subscriber closing. Messages and
    // re-confirmations that arrived since the previous wait are reported at once (nothing between
    // two waits is lost; several are reported as one, the latest message winning).
    template <class Clock, class Duration>
    event wait_event(std::chrono::time_point<Clock, Duration> until, const stop_token& st,
                     std::string& message) {
      const stop_callback<wake_on_stop> wake(st, wake_on_stop{owner_, ch_});  // before lk
      std::unique_lock<std::mutex> lk(owner_->mu_);
      const auto news = [&] {
        return ch_->messages != seen_messages_ || ch_->confirmations != seen_confirmations_ ||
               ch_->moves != seen_moves_ || owner_->closing_ || st.stop_requested();
      };
      (void)ch_->cv.wait_until(lk, until, news);
      if (ch_->messages != seen_messages_) {
        seen_messages_ = ch_->messages;
        seen_confirmations_ = ch_->confirmations;
        message = ch_->last;
        return event::message;
      }
      if (ch_->moves != seen_moves_) {
        seen_moves_ = ch_->moves;
        seen_confirmations_ = ch_->confirmations;
        return event::moved;
      }
      if (ch_->confirmations != seen_confirmations_) {
        seen_confirmations_ = ch_->confirmations;
        return event::resubscribed;
      }
      if (owner_->closing_) return event::closed;
      if (st.stop_requested()) return event::stopped;
      return event::timeout;
    }

   private:
    friend class fleet_subscriber;

    // Wakes a waiter whose stop token fired: notifies under mu_, so that a
    // waiter that tested stop_requested() before the stop is already waiting.
    struct wake_on_stop {
      fleet_subscriber* owner;
      channel_state* ch;
      void operator()() const noexcept {
        const std::lock_guard<std::mutex> lk(owner->mu_);
        ch->cv.notify_all();
      }
    };

    watch(fleet_subscriber* owner, channel_state* ch, std::string name) noexcept
        : owner_(owner), ch_(ch), name_(std::move(name)) {}

    void release() noexcept {
      if (owner_ == nullptr) return;
      std::exchange(owner_, nullptr)->unwatch(name_, std::exchange(ch_, nullptr));
    }

    fleet_subscriber* owner_ = nullptr;
    channel_state* ch_ = nullptr;
    std::string name_;
    std::uint64_t seen_confirmations_ = 0;
    std::uint64_t seen_messages_ = 0;
    std::uint64_t seen_moves_ = 0;
  };

  // The pool only opens the connection (same endpoint, timeout and AUTH as
  // the command connections); `errors` counts failed connects and I/O errors;
  // `hook` (tests) is called at fleet_point::resubscribing. `sharded`: shard
  // channels (SSUBSCRIBE, see "Sharded" above) on the pool's node, which must
  // own their slots.
  fleet_subscriber(const redis_pool& pool, std::atomic<std::uint64_t>& errors,
                   const fleet_hook& hook, bool sharded = false)
      : pool_(pool), errors_(errors), hook_(hook), sharded_(sharded) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    for (const int fd : fds) {
      (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      (void)::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
    }
    wake_read_ = fds[0];
    wake_write_ = fds[1];
  }

  fleet_subscriber(const fleet_subscriber&) = delete;
  fleet_subscriber& operator=(const fleet_subscriber&) = delete;

  // The job must have ended (stop(), and the worker_threads that ran it joined).
  ~fleet_subscriber() {
    ::close(wake_read_);
    ::close(wake_write_);
  }

  // subscribe(channel): a watch on `channel` (the SUBSCRIBE is sent by the
  // thread). Thread-safe. Throws std::bad_alloc.
  watch subscribe(const std::string& channel) { return subscribe(channel, nullptr); }

  // subscribe(channel, l): a watch on `channel` whose messages and
  // confirmations are also handed to `l` (see listener) until the watch is
  // destroyed. One listener per channel (a second one replaces the first).
  // Thread-safe. Throws std::bad_alloc.
  watch subscribe(const std::string& channel, listener* l) { return add(channel, l, false); }

  // subscribe_fallback(channel, l): subscribe(channel, l), except that the
  // channel is subscribed on the server only once client tracking has been
  // refused (before that, the watch waits and hears nothing). A channel
  // already watched keeps its kind. Thread-safe. Throws std::bad_alloc.
  watch subscribe_fallback(const std::string& channel, listener* l) {
    return add(channel, l, true);
  }

  // tracking_refused(): the server refused client tracking (see above).
  // Thread-safe.
  bool tracking_refused() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return refused_;
  }

  // tracking_refused_on_cluster(): tracking was refused because the server is a
  // node of a Redis Cluster (see above); set before tracking_refused() and before
  // the listeners are told. Thread-safe.
  bool tracking_refused_on_cluster() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return refused_on_cluster_;
  }

  // tracker(): the tracker connection's owner (tracker_line.hpp): a flight may store a value
  // through it. Thread-safe.
  tracker_line& tracker() noexcept { return line_; }

  // track(prefix): every connection from now on is tracked (see client
  // tracking above) for the keys that start with `prefix`. Called before the
  // first subscribe (std::logic_error otherwise: the connection would have
  // to be reopened). Thread-safe.
  void track(std::string prefix) {
    const std::lock_guard<std::mutex> lk(mu_);
    if (!channels_.empty()) {
      throw std::logic_error("singleflight: fleet_subscriber::track after subscribe");
    }
    tracked_ = std::move(prefix);
  }

  // start(threads): runs the thread's loop as one job on `threads` until stop(). Throws
  // std::system_error (no thread could be started) or closed_error (`threads` closed).
  void start(worker_threads& threads) {
    std::unique_ptr<worker_threads::job> j = worker_threads::make_job([this] { run(); });
    if (!threads.post(j)) throw closed_error();
  }

  // stop(): ends the job, waiting for nothing; every waiter returns `closed`.
  // Idempotent, thread-safe.
  void stop() noexcept {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      closing_ = true;
      cv_.notify_all();
      for (auto& [name, ch] : channels_) ch->cv.notify_all();
    }
    poke();
  }

  // How many channels the current connection has confirmed (tests).
  std::size_t confirmed_channels() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return static_cast<std::size_t>(std::count_if(
        channels_.begin(), channels_.end(), [](const auto& c) { return c.second->confirmed; }));
  }

 private:
  // add(channel, l, fallback): subscribe / subscribe_fallback, in one section
  // under mu_: the thread erases a state it finds unwatched (refs 0, nothing
  // on the server), so a fallback state created in one section and watched in
  // another could be erased in between and recreated as an ordinary channel,
  // subscribed on the server while tracking works.
  watch add(const std::string& channel, listener* l, bool fallback) {
    channel_state* ch = nullptr;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      auto& slot = channels_[channel];
      if (!slot) {
        slot = std::make_unique<channel_state>();
        slot->fallback = fallback;
      }
      ch = slot.get();
      ch->refs += 1;
      ch->gone = false;  // a new watch asks the server again
      if (l != nullptr) ch->heard = l;
      dirty_ = true;
      cv_.notify_all();
    }
    poke();
    return watch(this, ch, channel);
  }

  void unwatch(const std::string& name, channel_state* ch) noexcept {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      ch->refs -= 1;
      if (ch->refs == 0) ch->heard = nullptr;  // never called again once its watch is gone
      if (ch->refs == 0 && !ch->on_server && ch->pending == 0) {
        // Never subscribed on the server (or unsubscribed, and answered): forget it.
        channels_.erase(name);
      } else {
        dirty_ = true;
      }
    }
    poke();
  }

  // Wakes the thread out of poll(). The pipe is non-blocking: when it is
  // full, the thread has wake-ups pending anyway.
  void poke() const noexcept {
    const char b = 1;
    (void)!::write(wake_write_, &b, 1);
  }

  void drain_pokes() const noexcept {
    char buf[64];
    while (::read(wake_read_, buf, sizeof buf) > 0) {
    }
  }

  // The reconnect backoff: 50 ms, doubling to 2 s.
  static std::chrono::milliseconds grow(std::chrono::milliseconds b) noexcept {
    return b.count() == 0 ? std::chrono::milliseconds(50)
                          : std::min(b * 2, std::chrono::milliseconds(2000));
  }

  // The thread.
  void run() {
    using clock = std::chrono::steady_clock;
    std::unique_ptr<redis_conn> conn;
    std::chrono::milliseconds backoff{0};
    clock::time_point next_attempt{};
    std::vector<std::string> subs;
    std::vector<std::string> unsubs;
    std::vector<redis_reply> replies;
    std::deque<std::string> asked;  // sharded: the channels of the requests not answered yet
    bool lost_once = false;         // a connection was lost: the next one is a reconnection
    bool answered = false;          // a reply came on the current connection

    std::unique_lock<std::mutex> lk(mu_);
    while (!closing_) {
      if (!conn) {
        const bool wanted = std::any_of(channels_.begin(), channels_.end(),
                                        [this](const auto& c) { return live(*c.second); });
        if (!wanted) {
          cv_.wait(lk, [&] { return closing_ || dirty_; });
          dirty_ = false;
          continue;
        }
        if (clock::now() < next_attempt) {
          cv_.wait_until(lk, next_attempt, [&] { return closing_; });
          continue;
        }
        const std::string tracked = tracked_;
        asked.clear();
        lk.unlock();
        std::unique_ptr<redis_conn> fresh;
        bool refused = false;
        bool on_cluster = false;
        try {
          fresh = pool_.open();
          if (!tracked.empty()) line_.install(open_tracker(*fresh, tracked));
        } catch (const tracking_refusal& e) {
          refused = true;  // `fresh` is sound: it subscribes untracked
          on_cluster = e.on_cluster;
          line_.reset();
        } catch (const redis_failure&) {
          errors_.fetch_add(1, std::memory_order_relaxed);
          fresh.reset();
          line_.reset();
        }
        lk.lock();
        if (!fresh) {
          backoff = grow(backoff);
          next_attempt = clock::now() + backoff;
          continue;
        }
        if (refused && !refused_) {
          refused_on_cluster_ = on_cluster;
          refused_ = true;
          tracked_.clear();
          for (auto& [name, ch] : channels_) {
            if (ch->heard != nullptr) ch->heard->on_tracking_refused();
          }
        }
        if (lost_once) {
          lk.unlock();
          if (hook_) hook_(fleet_point::resubscribing, std::string_view());
          lk.lock();
        }
        conn = std::move(fresh);
        answered = false;
        for (auto& [name, ch] : channels_) {
          ch->on_server = false;
          ch->confirmed = false;
          ch->pending = 0;
        }
      }

      // What to (un)subscribe on this connection.
      subs.clear();
      unsubs.clear();
      for (auto it = channels_.begin(); it != channels_.end();) {
        channel_state& ch = *it->second;
        if (live(ch) && !ch.on_server) {
          subs.push_back(it->first);
          ch.on_server = true;
          ch.pending += 1;
        } else if (!live(ch) && ch.on_server) {
          unsubs.push_back(it->first);
          ch.on_server = false;
          ch.confirmed = false;
          ch.pending += 1;
        }
        if (ch.refs == 0 && !ch.on_server && ch.pending == 0) {
          it = channels_.erase(it);
        } else {
          ++it;
        }
      }
      dirty_ = false;
      lk.unlock();

      bool ok = sharded_ ? send_each(*conn, "SSUBSCRIBE", subs, asked) &&
                               send_each(*conn, "SUNSUBSCRIBE", unsubs, asked)
                         : send(*conn, "SUBSCRIBE", subs) && send(*conn, "UNSUBSCRIBE", unsubs);
      ok = ok && flush(*conn);
      replies.clear();
      if (ok) ok = wait_and_read(*conn, replies);

      lk.lock();
      for (const redis_reply& r : replies) {
        if (sharded_) {
          apply_sharded(*r, asked);
        } else {
          apply(*r);
        }
      }
      settle();
      if (!replies.empty()) {
        answered = true;  // the server talks pub/sub on this connection
        backoff = std::chrono::milliseconds(0);
      }
      if (!ok) {
        lost_once = true;
        errors_.fetch_add(1, std::memory_order_relaxed);
        lk.unlock();
        conn.reset();
        line_.reset();
        lk.lock();
        for (auto& [name, ch] : channels_) {
          ch->on_server = false;
          ch->confirmed = false;
          ch->pending = 0;
        }
        // A connection that worked is replaced at once; one that died before
        // any reply (killed as it opened, refused by an ACL, a server that
        // closes every connection) is retried with the backoff, never in a
        // tight loop.
        if (!answered) backoff = grow(backoff);
        next_attempt = clock::now() + backoff;
      }
    }
    lk.unlock();
    conn.reset();
    line_.reset();
  }

  // A channel to have on the server: watched, and not a fallback one while
  // tracking works. mu_ held.
  bool live(const channel_state& ch) const noexcept {
    return ch.refs > 0 && !ch.gone && (!ch.fallback || refused_);
  }

  // The server will not track this connection (see "Tracking refused").
  struct tracking_refusal : redis_failure {
    explicit tracking_refusal(const std::string& what, bool cluster = false)
        : redis_failure(what), on_cluster(cluster) {}
    bool on_cluster;  // the server is a node of a Redis Cluster
  };

  // An error reply to CLIENT ID / CLIENT TRACKING that a retry may not get:
  // the server busy or loading, or the REDIRECT target (our own connection)
  // killed between the two commands. Any other error is a refusal.
  static bool transient(std::string_view error) noexcept {
    for (const std::string_view p : {"LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"}) {
      if (error.starts_with(p)) return true;
    }
    return error.find("does not exist") != std::string_view::npos;
  }

  static void check(const redisReply* r, std::string_view what) {
    if (!is_error(r)) return;
    const std::string_view e = text_of(r);
    std::string m = std::string(what) + ": " + std::string(e);
    if (transient(e)) throw redis_failure(m);
    throw tracking_refusal(m);
  }

  // The tracker of `sub` (see client tracking above): its CLIENT ID, then a
  // connection that redirects the tracking of `prefix` to it. Throws
  // tracking_refusal (a node of a Redis Cluster; an error reply that is not
  // transient: an ACL, a renamed command, a server without REDIRECT),
  // redis_failure (I/O, a transient error).
  std::unique_ptr<redis_conn> open_tracker(redis_conn& sub, const std::string& prefix) const {
    const redis_reply info = sub.command({"INFO", "cluster"});
    if (!is_error(info.get()) && is_string(info.get()) &&
        text_of(info.get()).find("cluster_enabled:1") != std::string_view::npos) {
      throw tracking_refusal("CLIENT TRACKING: a Redis Cluster node tracks only its own keys",
                             true);
    }
    const redis_reply id = sub.command({"CLIENT", "ID"});
    check(id.get(), "CLIENT ID");
    if (id->type != REDIS_REPLY_INTEGER) throw redis_failure("CLIENT ID: unexpected reply");
    std::unique_ptr<redis_conn> t = pool_.open();
    const std::string id_text = std::to_string(id->integer);
    const redis_reply on = t->command(
        {"CLIENT", "TRACKING", "on", "REDIRECT", id_text, "BCAST", "NOLOOP", "PREFIX", prefix});
    check(on.get(), "CLIENT TRACKING");
    return t;
  }

  // Appends `verb names...` to c's output buffer (nothing when `names` is
  // empty); false when that failed (out of memory: the connection is dropped).
  static bool send(redis_conn& c, std::string_view verb, const std::vector<std::string>& names) {
    if (names.empty()) return true;
    std::vector<std::string_view> args;
    try {
      args.reserve(names.size() + 1);
      args.push_back(verb);
      for (const std::string& n : names) args.push_back(n);
      c.append(args);
    } catch (const std::bad_alloc&) {
      c.mark_broken();
      return false;
    }
    return true;
  }

  // Sharded: one command per channel (the channels of one SSUBSCRIBE must share a slot),
  // each noted in `asked`, the order its answer comes back in.
  static bool send_each(redis_conn& c, std::string_view verb, const std::vector<std::string>& names,
                        std::deque<std::string>& asked) {
    for (const std::string& n : names) {
      try {
        const std::string_view args[2] = {verb, n};
        c.append(args);
        asked.push_back(n);
      } catch (const std::bad_alloc&) {
        c.mark_broken();
        return false;
      }
    }
    return true;
  }

  // Sends what send() appended, bounded by the connection's timeout (a server
  // that stopped reading, e.g. SIGSTOPped, costs one timeout and a reconnect).
  static bool flush(redis_conn& c) {
    try {
      c.flush(redis_conn::clock::now() + c.timeout());
      return true;
    } catch (const redis_failure&) {
      return false;
    }
  }

  // Waits for the connection or a poke; reads whatever replies arrived.
  // The tracker (when there is one, and no flight holds it) is polled too: anything from it but
  // more bytes (its close, an error) is the connection lost.
  bool wait_and_read(redis_conn& c, std::vector<redis_reply>& out) {
    // Replies already parsed (they came with an earlier read) first.
    if (!c.take_parsed(out)) return false;
    if (!out.empty()) return true;
    // The tracker, unless a flight holds it (tracker_line.hpp: it pokes once it gives it back).
    bool lost = false;
    const int tracker_fd = line_.poll_fd(lost);
    if (lost) return false;  // a flight failed on it
    pollfd fds[3] = {{c.raw()->fd, POLLIN, 0}, {wake_read_, POLLIN, 0}, {tracker_fd, POLLIN, 0}};
    const int n = ::poll(fds, 3, -1);
    if (n < 0) return errno == EINTR;
    if ((fds[1].revents & POLLIN) != 0) drain_pokes();
    if ((fds[2].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      if (!line_.after_poll()) return false;  // it is sent nothing in BCAST mode: it closed
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      if (redisBufferRead(c.raw()) != REDIS_OK) return false;
      return c.take_parsed(out);
    }
    return true;
  }

  // Applies one pub/sub reply: ["subscribe", ch, n], ["message", ch, text],
  // ["unsubscribe", ch, n]. Called with mu_ held.
  void apply(const redisReply& r) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 3 || !is_string(r.element[0]) ||
        !is_string(r.element[1])) {
      return;
    }
    const std::string_view kind = text_of(r.element[0]);
    const auto it = channels_.find(std::string(text_of(r.element[1])));
    if (it == channels_.end()) return;
    channel_state& ch = *it->second;
    if (kind == "subscribe" || kind == "unsubscribe") {
      if (ch.pending > 0) ch.pending -= 1;
      // Only the reply to the last request sent says where the server is.
      if (kind == "unsubscribe" || ch.pending != 0 || !ch.on_server || ch.confirmed) return;
      ch.confirmed = true;
      ch.confirmations += 1;
      if (ch.heard != nullptr) {
        ch.heard->on_confirmed();
        unsettled_ = true;
      }
      ch.cv.notify_all();
    } else if (kind == "message") {
      const redisReply* m = r.element[2];
      if (is_string(m)) {
        ch.last.assign(text_of(m));
        if (ch.heard != nullptr) ch.heard->on_message(text_of(m));
      } else if (m->type == REDIS_REPLY_ARRAY) {  // client tracking: key names
        for (std::size_t i = 0; i < m->elements; ++i) {
          if (ch.heard != nullptr && is_string(m->element[i])) {
            ch.heard->on_message(text_of(m->element[i]));
          }
        }
      } else if (m->type == REDIS_REPLY_NIL) {  // client tracking: FLUSHALL
        if (ch.heard != nullptr) ch.heard->on_flushed();
      } else {
        return;
      }
      ch.messages += 1;
      ch.cv.notify_all();
    }
    // A forgotten channel (no watch, nothing pending) is erased by the thread's next pass.
  }

  // settle(): once no listened channel of the connection awaits its
  // confirmation (a SUBSCRIBE sent, its reply not in yet), tells the
  // listeners of the confirmed ones (listener::on_settled). mu_ held.
  void settle() noexcept {
    if (!unsettled_) return;
    for (const auto& [name, ch] : channels_) {
      if (ch->heard != nullptr && live(*ch) && ch->on_server && !ch->confirmed) return;
    }
    unsettled_ = false;
    for (const auto& [name, ch] : channels_) {
      if (ch->heard != nullptr && ch->confirmed) ch->heard->on_settled();
    }
  }

  // Applies one sharded pub/sub reply: ["ssubscribe", ch, n], ["smessage", ch, text],
  // ["sunsubscribe", ch, n] (the answer to ours, the first in `asked`; or pushed by the
  // server: the slot migrated), or an error (MOVED: the answer to the first in `asked`, an
  // SSUBSCRIBE or SUNSUBSCRIBE this node no longer serves). A subscription dropped by the
  // server is `gone` (not asked for again on this connection) and its waiters told (`moves`).
  // When a pushed `sunsubscribe` is taken for the answer to ours, the next error is laid at
  // the wrong channel: its waiter races once more than needed, nothing worse. mu_ held.
  void apply_sharded(const redisReply& r, std::deque<std::string>& asked) {
    const auto drop = [](channel_state& ch) {
      ch.on_server = false;
      ch.confirmed = false;
      ch.gone = true;
      ch.moves += 1;
      ch.cv.notify_all();
    };
    if (is_error(&r)) {
      if (asked.empty()) return;
      const std::string name = std::move(asked.front());
      asked.pop_front();
      const auto it = channels_.find(name);
      if (it == channels_.end()) return;
      channel_state& ch = *it->second;
      if (ch.pending > 0) ch.pending -= 1;
      if (ch.pending == 0 && ch.on_server) drop(ch);
      return;
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements < 3 || !is_string(r.element[0]) ||
        !is_string(r.element[1])) {
      return;
    }
    const std::string_view kind = text_of(r.element[0]);
    const std::string_view name = text_of(r.element[1]);
    const auto it = channels_.find(std::string(name));
    if (kind == "ssubscribe" || kind == "sunsubscribe") {
      const bool answer = !asked.empty() && asked.front() == name;
      if (answer) asked.pop_front();
      if (it == channels_.end()) return;
      channel_state& ch = *it->second;
      if (!answer) {  // pushed: the slot is no longer this node's
        if (kind == "sunsubscribe" && ch.on_server) drop(ch);
        return;
      }
      if (ch.pending > 0) ch.pending -= 1;
      if (kind == "sunsubscribe" || ch.pending != 0 || !ch.on_server || ch.confirmed) return;
      ch.confirmed = true;
      ch.confirmations += 1;
      ch.cv.notify_all();
    } else if (kind == "smessage" && it != channels_.end() && is_string(r.element[2])) {
      channel_state& ch = *it->second;
      ch.last.assign(text_of(r.element[2]));
      ch.messages += 1;
      ch.cv.notify_all();
    }
  }

  const redis_pool& pool_;
  std::atomic<std::uint64_t>& errors_;
  const fleet_hook& hook_;
  const bool sharded_;  // shard channels (SSUBSCRIBE) on one node of a cluster
  int wake_read_ = -1;
  int wake_write_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // the thread's wait while it has no connection
  std::unordered_map<std::string, std::unique_ptr<channel_state>> channels_;  // guarded by mu_
  bool closing_ = false;                                                      // guarded by mu_
  bool dirty_ = false;                                                        // guarded by mu_
  std::string tracked_;   // guarded by mu_: the prefix each connection tracks ("" none)
  bool refused_ = false;  // guarded by mu_: the server refused tracking (tracked_ then "")
  bool refused_on_cluster_ = false;  // guarded by mu_: refused as a Redis Cluster node
  bool unsettled_ = false;           // guarded by mu_: a listener was confirmed, not yet settled
  // The tracker (its own lock): installed and dropped by the thread, lent to flights' stores.
  tracker_line line_{[this] { poke(); }};
};

}  // namespace singleflight::detail
