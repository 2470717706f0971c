// singleflight::cache: no Key or T destructor (nor copy) runs under a shard's mutex or with the
// shard's readers locked out (issue 32). A destructor that blocks must not stall a hit on an
// unrelated key, and one that calls the cache must not deadlock: whatever a write takes out of
// the table (a node a racing writer made twice, an evicted, invalidated, cleared or replaced
// entry) is destroyed after the lock. Interleavings are forced with gates on the key's copy and
// destructor (armed for one thread, one shot); every wait is bounded (a hang aborts with its
// name).
#include <singleflight/cache.hpp>

#include <atomic>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "support/catch.hpp"
#include "support/coro.hpp"
#include "support/dtor_hook.hpp"
#include "support/sync.hpp"

namespace sf = singleflight;
using sftest::callback_log;
using sftest::completion_box;
using sftest::gate;
using sftest::must;
using namespace std::chrono_literals;

namespace {

using sftest::hook;

hook key_copy;
hook key_dtor;
hook value_dtor;

struct dkey {
  std::string s;
  dkey(const char* v) : s(v) {}  // NOLINT: implicit, as a string key would be
  dkey(const dkey& o) : s(o.s) { key_copy.fire(); }
  dkey& operator=(const dkey&) = default;
  ~dkey() { key_dtor.fire(); }
  bool operator==(const dkey& o) const { return s == o.s; }
};

struct dhash {
  std::size_t operator()(const dkey& k) const { return std::hash<std::string>{}(k.s); }
};

struct dval {
  std::string s;
  dval(const char* v) : s(v) {}  // NOLINT
  dval(const dval&) = default;
  ~dval() { value_dtor.fire(); }
};

using dcache = sf::cache<dkey, dval, dhash, std::equal_to<>>;

using sftest::old_value_dtor;
using oval = sftest::old_value;

using ocache = sf::cache<std::string, oval>;

// One shard (a bounded table has at most one per 1,024 entries): every key shares the mutex
// and the read gate of every other.
sf::cache_options one_shard(std::size_t max_entries = 100) {
  sf::cache_options o;
  o.ttl = 1h;
  o.max_entries = max_entries;
  return o;
}

}  // namespace

TEST_CASE("a Key destructor that blocks does not stall a hit on another key",
          "[cache][destructors]") {
  dcache c(one_shard());
  c.put("other", "o");
  gate copy_held, copy_go, dtor_held, dtor_go;
  std::atomic<bool> a_done{false};
  // A's put finds no node for "k", copies the key with the mutex released (held there), and
  // finds, once back under the mutex, the node B made meanwhile: the copy it made is not needed.
  sftest::thread a([&] {
    key_copy.arm(std::this_thread::get_id(), [&] {
      copy_held.open();
      copy_go.wait("A's key copy released");
    });
    c.put("k", "a");
    a_done.store(true);
  });
  copy_held.wait("A copies the key");
  c.put("k", "b");  // B: makes and links the node
  key_dtor.arm(a.get_id(), [&] {
    dtor_held.open();
    dtor_go.wait("A's spare key's destructor released");
  });
  copy_go.open();
  dtor_held.wait("A destroys its spare key");
  // A's spare key is being destroyed (held): a hit on an unrelated key of the same shard must
  // not wait for it. Before: it was destroyed under the mutex with the readers locked out.
  std::atomic<bool> hit_done{false};
  std::atomic<int> loads{0};
  sftest::thread hit([&] {
    const dval v = c.get("other", [&](sf::stop_token) {
      loads.fetch_add(1);
      return dval("loaded");
    });
    hit_done.store(v.s == "o");
  });
  const bool unblocked = sftest::becomes([&] { return hit_done.load(); }, 5s);
  dtor_go.open();
  hit.join("the hit returns");
  a.join("A's put returns");
  CHECK(unblocked);
  CHECK(hit_done.load());
  CHECK(loads.load() == 0);
  CHECK(a_done.load());
  REQUIRE(c.peek("k"));
  CHECK(c.peek("k")->value->s == "a");  // A's put came last
}

TEST_CASE("a Key destructor that calls the cache does not deadlock", "[cache][destructors]") {
  dcache c(one_shard());
  c.put("other", "o");
  gate copy_held, copy_go;
  std::atomic<bool> peeked{false};
  sftest::thread a([&] {
    key_copy.arm(std::this_thread::get_id(), [&] {
      copy_held.open();
      copy_go.wait("A's key copy released");
    });
    c.put("k", "a");
  });
  copy_held.wait("A copies the key");
  c.put("k", "b");
  key_dtor.arm(a.get_id(), [&] {
    auto e = c.peek("other");  // before: the shard's mutex, held by this very thread
    peeked.store(e.has_value() && e->value->s == "o");
  });
  copy_go.open();
  must([&] { return a.done(); }, "A's put returns (its spare key's destructor called the cache)");
  a.join("A");
  CHECK(peeked.load());
}

TEST_CASE("Key and T destructors that call the cache, on every write that drops an entry",
          "[cache][destructors]") {
  // Each write below destroys a key or a value it took out of the table; the hook calls the
  // cache (peek of an unrelated key of the same shard), which deadlocks if it runs under the
  // mutex. The write runs on its own thread so that a deadlock is a named hang.
  dcache c(one_shard(2));
  c.put("other", "o");
  const auto peek_other = [&] { return c.peek("other").has_value(); };
  const auto on_thread = [&](const char* name, hook& h, auto write) {
    std::atomic<bool> called{false};
    sftest::thread t([&] {
      h.arm(std::this_thread::get_id(), [&] {
        (void)peek_other();
        called.store(true);
      });
      write();
    });
    t.join(name);
    h.on.store(std::thread::id{});
    return called.load();
  };
  SECTION("put replacing a value") {
    c.put("k", "1");
    CHECK(on_thread("put replacing", value_dtor, [&] { c.put("k", "2"); }));
  }
  SECTION("invalidate") {
    c.put("k", "1");
    CHECK(on_thread("invalidate (value)", value_dtor, [&] { c.invalidate("k"); }));
    const dkey k("k");  // no converted temporary: the one key destroyed is the node's
    c.put(k, "1");
    CHECK(on_thread("invalidate (key)", key_dtor, [&] { c.invalidate(k); }));
  }
  SECTION("clear") {
    c.put("k", "1");
    CHECK(on_thread("clear", value_dtor, [&] { c.clear(); }));
  }
  SECTION("eviction") {
    c.put("k", "1");  // full: the next new key evicts one of "other" and "k"
    CHECK(on_thread("eviction", value_dtor, [&] { c.put("n", "2"); }));
  }
}

TEST_CASE("a T destructor run by an asynchronous load's publication may close the cache",
          "[cache][destructors][close]") {
  // An asynchronous load publishes on the thread that resolves its completion, before its
  // flight settles; what the publication lets go of (the value it replaces, an entry its
  // admission evicts) is destroyed there, after the lock. A close() from that destructor
  // waited for the flight this very thread was about to settle: it never returned. Now it
  // stops and rejects and waits for nothing; the cache's destructor drains.
  ocache c(one_shard(2));
  c.put("a", "old");
  c.put("b", "old");
  std::string key;
  SECTION("the value the load replaces") {
    key = "a";
    c.expire("a");  // no stale window: the next get waits on a load
  }
  SECTION("an entry the load's admission evicts") { key = "n"; }
  callback_log<oval> log;
  completion_box<oval> box;
  c.async_get(key, box.fn(), log.on_done());
  auto [st, done] = box.take("the load starts");
  std::atomic<bool> closed{false};
  sftest::thread resolver([&, d = std::move(done)]() mutable {
    old_value_dtor.arm(std::this_thread::get_id(), [&] {
      c.close();
      closed.store(true);
    });
    d.set_value(oval("new"));
  });
  resolver.join("the resolver returns (close() from an old value's destructor)");
  old_value_dtor.on.store(std::thread::id{});
  CHECK(closed.load());
  log.wait("the caller is answered");
  CHECK(log.calls.load() == 1);
  CHECK_THROWS_AS(c.get("b", [] { return oval("x"); }), sf::closed_error);
}

TEST_CASE("a T destructor run by an asynchronous load's recorded failure may close the cache",
          "[cache][destructors][close]") {
  // With error_ttl, a failed load records its failure in place of a dead value: the value is
  // destroyed on the thread that fails the load's completion, before the load's flight
  // settles. A close() from that destructor must not wait for that flight.
  sf::cache_options o = one_shard();
  o.error_ttl = 1h;
  ocache c(o);
  c.put("a", "old");
  c.expire("a");  // dead: no stale window, so the failure replaces it
  callback_log<oval> log;
  completion_box<oval> box;
  c.async_get("a", box.fn(), log.on_done());
  auto [st, done] = box.take("the load starts");
  std::atomic<bool> closed{false};
  sftest::thread resolver([&, d = std::move(done)]() mutable {
    old_value_dtor.arm(std::this_thread::get_id(), [&] {
      c.close();
      closed.store(true);
    });
    d.set_exception(std::make_exception_ptr(std::runtime_error("origin down")));
  });
  resolver.join("the resolver returns (close() from a dead value's destructor)");
  old_value_dtor.on.store(std::thread::id{});
  CHECK(closed.load());
  log.wait("the caller is answered");
  CHECK(log.calls.load() == 1);
  CHECK(log.threw<std::runtime_error>());
  CHECK_THROWS_AS(c.get("b", [] { return oval("x"); }), sf::closed_error);
}

TEST_CASE("a garbage_hold keeps what this thread's writes take out of the cache until it ends",
          "[cache][destructors]") {
  // detail::cache_table::garbage_hold (fleet_cache applies the bus inside one): the entries a
  // write on the hold's thread drops are destroyed when the hold ends, not inside the write;
  // writes on other threads and to other caches are not held.
  ocache c(one_shard());
  ocache other(one_shard());
  c.put("a", "old");
  c.put("b", "old");
  other.put("x", "old");
  std::atomic<int> fired{0};
  const auto count = [&] { fired.fetch_add(1); };
  auto& table = sf::detail::cache_access::table(c);
  {
    using hold_t = std::remove_reference_t<decltype(table)>::garbage_hold;
    const hold_t held(table);
    old_value_dtor.arm(std::this_thread::get_id(), count);
    (void)c.invalidate("a");
    CHECK(fired.load() == 0);  // held
    (void)other.invalidate("x");
    CHECK(fired.load() == 1);  // another cache's: destroyed at once
    sftest::thread elsewhere([&] {
      old_value_dtor.arm(std::this_thread::get_id(), count);
      (void)c.invalidate("b");
    });
    elsewhere.join("an invalidate on another thread");
    CHECK(fired.load() == 2);  // another thread's: destroyed at once
    old_value_dtor.arm(std::this_thread::get_id(), count);
  }
  CHECK(fired.load() == 3);  // the held entry, with the hold
  old_value_dtor.on.store(std::thread::id{});
  CHECK_FALSE(c.peek("a").has_value());
}

TEST_CASE("cache_access::age reads the age peek would report without copying T",
          "[cache][destructors]") {
  // fleet_cache reads an entry's age inside its application of the bus, where no user code
  // may run: no copy of T (nor a destruction: the reference count is not touched).
  struct copies {
    std::atomic<int>* n;
    explicit copies(std::atomic<int>* c) : n(c) {}
    copies(const copies& o) : n(o.n) { n->fetch_add(1); }
  };
  std::atomic<int> copied{0};
  sf::cache<std::string, copies> c(one_shard());
  CHECK_FALSE(sf::detail::cache_access::age(c, "a").has_value());
  c.put("a", copies(&copied));
  const int before = copied.load();
  const auto age = sf::detail::cache_access::age(c, "a");
  CHECK(copied.load() == before);
  REQUIRE(age.has_value());
  const auto seen = c.peek("a");
  REQUIRE(seen.has_value());
  CHECK(*age <= seen->age);
  (void)c.expire("a");  // no stale window: peek answers nothing, nor does age
  CHECK_FALSE(c.peek("a").has_value());
  CHECK_FALSE(sf::detail::cache_access::age(c, "a").has_value());
}
