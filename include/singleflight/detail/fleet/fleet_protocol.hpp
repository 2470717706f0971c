// singleflight/detail/fleet/fleet_protocol.hpp -- internal; do not include directly.
//
// The fleet's wire protocol: the Redis names of one logical key, the record
// stored under it, and its steps (GET, acquire, renew, store, release,
// invalidate, wait for replicas), each one round trip on a connection the
// caller holds. The decisions (when to race, wait, load, give up) are
// fleet_flight.hpp's; this file only says what goes over the wire. No state,
// no lock.
//
// Names of the logical key K under prefix P, N the length of P in decimal:
//   {N:P:K}:v        the record: a value or an error marker, with a TTL
//   {N:P:K}:l        the lease: a random token, SET NX PX lease_ttl
//   {N:P:K}:m        metadata hash: `fence` (the fencing counter) and `gen` (the
//                    generation, bumped by invalidate), with a TTL refreshed by
//                    every step that touches it
//   {N:P:K}:c        the pub/sub channel leaders publish on (on a Redis Cluster a shard
//                    channel: SPUBLISH, the *_script(true) variants): "v" (stored), "r"
//                    (lease released without a value: race again), "n" (a value
//                    was loaded but could not be stored: load for yourself),
//                    "e<text>" (the load failed). In db D other than 0,
//                    {N:P:K}:c:D: channels are the server's, not a db's, and a
//                    message of db 1's key (its failure: "e") must not reach the
//                    waiters of db 2's key of the same name
//   {N:P:K}:g:<tok>  a race its client gave up on (a tombstone, meta_ttl)
//   {N:P}:i          fleet_cache's bus: every put and invalidate publishes
//                    "<writer id><key text>" on it (the writer: 32 hex digits)
// The length makes the names injective: from a name, N says where P ends and
// K begins, so no two (prefix, key) pairs share a name whatever ':' or braces
// either holds ("users" + "eu:42" is {5:users:eu:42}, "users:eu" + "42" is
// {8:users:eu:42}). Every name of one key shares the hash tag (the names of
// one slot, as Redis Cluster requires of a script; redis_router.hpp sends
// them to the node of that slot).
//
// Record: "SF1|<kind>|<codec tag>|<fence>|<gen>|<checksum>|<payload>", kind
// 'v' (payload = the codec's bytes) or 'e' (payload = the failure's text),
// checksum = FNV-1a 64 (16 hex digits) of everything between "SF1|" and the
// checksum, plus the payload. Anything else under the name (another program's
// value, a truncated or bit-flipped record, another codec's tag, another Redis
// type) is a miss, never a value. A codec tag holds no '|' (fleet_config::of).
//
// Fences and generations: the first script that finds a key's metadata
// missing (or not a hash of integers: foreign data under the name) seeds both
// with the server's clock in microseconds, so a fence or generation handed
// out after the metadata expired or was evicted is greater than any handed
// out before (as long as the server's clock does not go back, and a key sees
// fewer than one acquisition or invalidation per microsecond): a leader
// paused for longer than the metadata lives can still not store, and
// invalidate's generations only grow.
//
// Each fence is also at least the server's clock in microseconds when it was
// handed out (the race script: fence = max(counter + 1, TIME)). Replication is
// asynchronous, so a failover may lose the race that handed out fence F; the
// promoted replica's next fence is then its clock, later than F's (as long as
// the two servers' clocks differ by less than the time between the two races,
// at least the cluster's failover time): no fence is handed out twice, and the
// lost race's leader is fenced out.
//
// Scripts check the type of every name they write before their first write
// (Lua does not roll back a script that fails half-way): a name holding
// another Redis type, or a "lease" without an expiry (no fleet sets one), is
// taken over. PUBLISH (SPUBLISH) is the one step a script may be refused (an ACL user
// without channel rights): it runs last, through pcall, and the script
// reports whether it published instead of failing after its writes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../chrono.hpp"
#include "redis_conn.hpp"
#include "sha1.hpp"

namespace singleflight::detail {

// The Redis names of one logical key.
struct fleet_names {
  std::string value;
  std::string lease;
  std::string meta;
  std::string channel;
  std::string tag;  // "{N:P:K}:", what every name starts with

  // of(prefix, key, db): the names of `key` under `prefix` in database `db` (the connection's
  // SELECT: only the channel names it, the other names are a db's own).
  static fleet_names of(std::string_view prefix, std::string_view key, int db = 0) {
    const std::string length = std::to_string(prefix.size());
    fleet_names n;
    n.tag.reserve(length.size() + prefix.size() + key.size() + 5);
    n.tag += '{';
    n.tag += length;
    n.tag += ':';
    n.tag += prefix;
    n.tag += ':';
    n.tag += key;
    n.tag += "}:";
    n.value = n.tag + 'v';
    n.lease = n.tag + 'l';
    n.meta = n.tag + 'm';
    n.channel = n.tag + 'c';
    if (db != 0) {
      n.channel += ':';
      n.channel += std::to_string(db);
    }
    return n;
  }

  // The tombstone of a race with lease token `token` that its client gave up on.
  std::string tomb(std::string_view token) const {
    std::string t = tag;
    t += "g:";
    t += token;
    return t;
  }
};

// ---------------------------------------------------------------------------------------------
// Records

inline std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

inline std::string hex16(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = digits[v & 0xFU];
    v >>= 4;
  }
  return out;
}

struct record {
  char kind = 'v';  // 'v' value, 'e' error marker
  std::string_view tag;
  std::string_view fence;
  std::string_view gen;
  std::string_view payload;
};

inline std::string make_record(char kind, std::string_view tag, std::string_view fence,
                               std::string_view gen, std::string_view payload) {
  std::string head;
  head.reserve(tag.size() + fence.size() + gen.size() + 8);
  head += kind;
  head += '|';
  head += tag;
  head += '|';
  head += fence;
  head += '|';
  head += gen;
  head += '|';
  const std::string sum = hex16(fnv1a64(payload, fnv1a64(head)));
  std::string out;
  out.reserve(4 + head.size() + sum.size() + 1 + payload.size());
  out += "SF1|";
  out += head;
  out += sum;
  out += '|';
  out += payload;
  return out;
}

// record_header(bytes, tag, r, checksum): whether `bytes` starts with a record header of this
// codec tag, "SF1|<kind>|<tag>|<fence>|<gen>|<16 characters>|"; fills r's kind, tag, fence and
// gen, r.payload with what follows the header (the payload or, of a record's first bytes, its
// start) and `checksum` with the checksum field. Checks no checksum: the payload may be cut
// short (get_value's first read).
inline bool record_header(std::string_view bytes, std::string_view tag, record& r,
                          std::string_view& checksum) {
  if (!bytes.starts_with("SF1|")) return false;
  std::string_view rest = bytes.substr(4);
  std::string_view field[5];
  for (auto& f : field) {
    const auto bar = rest.find('|');
    if (bar == std::string_view::npos) return false;
    f = rest.substr(0, bar);
    rest = rest.substr(bar + 1);
  }
  if (field[0].size() != 1 || (field[0][0] != 'v' && field[0][0] != 'e')) return false;
  if (field[1] != tag || field[4].size() != 16) return false;
  r.kind = field[0][0];
  r.tag = field[1];
  r.fence = field[2];
  r.gen = field[3];
  r.payload = rest;
  checksum = field[4];
  return true;
}

// parse_record(bytes, tag): the record, or nullopt for anything that is not a
// well-formed record with this codec tag and a matching checksum.
inline std::optional<record> parse_record(std::string_view bytes, std::string_view tag) {
  record r;
  std::string_view checksum;
  if (!record_header(bytes, tag, r, checksum)) return std::nullopt;
  const std::size_t head_len = static_cast<std::size_t>(checksum.data() - bytes.data()) - 4;
  const std::string_view head = bytes.substr(4, head_len);
  if (hex16(fnv1a64(r.payload, fnv1a64(head))) != checksum) return std::nullopt;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Scripts

struct lua_script {
  struct built_t {};  // the body is built at run time: the script owns it
  static constexpr built_t built{};

  explicit lua_script(std::string_view b) : body(b), sha(sha1_hex(b)) {}
  lua_script(built_t, std::string b) : owned(std::move(b)), body(owned), sha(sha1_hex(body)) {}
  lua_script(const lua_script&) = delete;  // `body` may point into `owned`
  lua_script& operator=(const lua_script&) = delete;

  std::string owned;  // the body, when built (a sharded variant); empty otherwise
  std::string_view body;
  std::string sha;
};

// What every script may call, prepended to each body:
//   claim(name, type)  deletes what `name` holds unless it is `type` (or nothing);
//   seed(meta)         makes `meta` a hash whose fence and gen are integers, seeding
//                      a missing or foreign one from the server's clock (microseconds);
//   note(channel, m)   PUBLISH through pcall: 1 when published, 0 when refused (ACL).
#define SINGLEFLIGHT_FLEET_LUA_PRELUDE                     \
  SINGLEFLIGHT_FLEET_LUA_COMMON                            \
  "local function note(channel, message)\n"                \
  "  local r = redis.pcall('PUBLISH', channel, message)\n" \
  "  if type(r) == 'table' and r.err then return 0 end\n"  \
  "  return 1\n"                                           \
  "end\n"
#define SINGLEFLIGHT_FLEET_LUA_COMMON                                        \
  "if redis.replicate_commands then redis.replicate_commands() end\n"        \
  "local function claim(name, kind)\n"                                       \
  "  local t = redis.call('TYPE', name)['ok']\n"                             \
  "  if t ~= 'none' and t ~= kind then redis.call('DEL', name) end\n"        \
  "end\n"                                                                    \
  "local function seed(meta)\n"                                              \
  "  claim(meta, 'hash')\n"                                                  \
  "  local m = redis.call('HMGET', meta, 'fence', 'gen')\n"                  \
  "  local int = function(v) return v and string.match(v, '^%-?%d+$') end\n" \
  "  if not (int(m[1]) and int(m[2])) then\n"                                \
  "    local t = redis.call('TIME')\n"                                       \
  "    local now = t[1] .. string.format('%06d', tonumber(t[2]))\n"          \
  "    if not int(m[1]) then redis.call('HSET', meta, 'fence', now) end\n"   \
  "    if not int(m[2]) then redis.call('HSET', meta, 'gen', now) end\n"     \
  "  end\n"                                                                  \
  "end\n"

// The prelude of the scripts a fleet runs on a Redis Cluster: the same, except that note()
// sends SPUBLISH (sharded pub/sub, Redis 7.0: the message reaches the subscribers of the
// key's slot's owner, not every node over the cluster bus; allowed in a script because the
// channel has the hash tag of the script's keys), and cast(channel, m) is the classic
// PUBLISH for the channels that are no key's (fleet_cache's bus).
#define SINGLEFLIGHT_FLEET_LUA_PRELUDE_SHARDED              \
  SINGLEFLIGHT_FLEET_LUA_COMMON                             \
  "local function note(channel, message)\n"                 \
  "  local r = redis.pcall('SPUBLISH', channel, message)\n" \
  "  if type(r) == 'table' and r.err then return 0 end\n"   \
  "  return 1\n"                                            \
  "end\n"                                                   \
  "local function cast(channel, message)\n"                 \
  "  local r = redis.pcall('PUBLISH', channel, message)\n"  \
  "  if type(r) == 'table' and r.err then return 0 end\n"   \
  "  return 1\n"                                            \
  "end\n"

// ACQUIRE. KEYS: value, lease, meta, tombstone. ARGV: token, lease_ttl_ms, meta_ttl_ms, read
// ("1": read the value first), limit (the longest record to read, '0': no limit),
// script_read_max. Returns {0, record} (a value is there), {1, pttl} (lost: someone holds the
// lease), {2, fence, gen} (won), {3} (this race's client gave up on it before it ran: nothing
// written), {4, length} (a value over the limit is there: not sent, nothing written), or
// {5, length} (a value longer than script_read_max is there: read it with get_value; nothing
// written).
inline const lua_script& acquire_script() {
  static const lua_script s(SINGLEFLIGHT_FLEET_LUA_PRELUDE R"lua(
if redis.call('EXISTS', KEYS[4]) == 1 then return {3} end
if ARGV[4] == '1' then
  local n = redis.pcall('STRLEN', KEYS[1])
  if type(n) == 'number' and n > 0 then
    local limit = tonumber(ARGV[5])
    if limit > 0 and n > limit then return {4, n} end
    if n > tonumber(ARGV[6]) then return {5, n} end
    return {0, redis.call('GET', KEYS[1])}
  end
end
local l = redis.call('TYPE', KEYS[2])['ok']
if l ~= 'none' and (l ~= 'string' or redis.call('PTTL', KEYS[2]) == -1) then
  redis.call('DEL', KEYS[2])
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('PTTL', KEYS[2])}
end
seed(KEYS[3])
local f = redis.call('HINCRBY', KEYS[3], 'fence', 1)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if f < now then
  f = now
  redis.call('HSET', KEYS[3], 'fence', string.format('%d', now))
end
local g = redis.call('HGET', KEYS[3], 'gen')
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {2, f, g}
)lua");
  return s;
}

// RENEW. KEYS: lease, meta. ARGV: token, lease_ttl_ms, meta_ttl_ms. 1 while the lease is ours.
inline const lua_script& renew_script() {
  static const lua_script s(R"lua(
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0
)lua");
  return s;
}

// STORE. KEYS: value, lease, meta. ARGV: token, fence, gen, record ('' = store nothing),
// ttl_ms, channel, message, meta_ttl_ms. Returns {code, published}: code 1 (stored, or
// nothing to store; `message` published), -1 (no newer fence can be ruled out: nothing
// written, nothing published: the newer leader publishes), -2 (the key was invalidated since
// this leader's acquisition: nothing stored, lease released, "r" published so that waiters
// race again); published 0 when PUBLISH was refused.
inline const lua_script& store_script() {
  static const lua_script s(SINGLEFLIGHT_FLEET_LUA_PRELUDE R"lua(
if redis.call('TYPE', KEYS[3])['ok'] ~= 'hash' then return {-1, 1} end
local m = redis.call('HMGET', KEYS[3], 'fence', 'gen')
if m[1] ~= ARGV[2] then return {-1, 1} end
if redis.pcall('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if (m[2] or '0') ~= ARGV[3] then
  return {-2, note(ARGV[6], 'r')}
end
if ARGV[4] ~= '' and tonumber(ARGV[5]) > 0 then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
end
redis.call('PEXPIRE', KEYS[3], ARGV[8])
return {1, note(ARGV[6], ARGV[7])}
)lua");
  return s;
}

// RELEASE. KEYS: lease, tombstone. ARGV: token, tombstone_ttl_ms ('0': none), channel,
// message. Writes the tombstone (when asked: a race given up on, which may still run later
// and must then not take the lease), then releases the lease if it holds `token` and
// publishes `message`. Returns 1 (released, published), 0 (released, PUBLISH refused), -1
// (the lease was not this token's: nothing released, nothing published).
inline const lua_script& release_script() {
  static const lua_script s(SINGLEFLIGHT_FLEET_LUA_PRELUDE R"lua(
if ARGV[2] ~= '0' then redis.call('SET', KEYS[2], '1', 'PX', ARGV[2]) end
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return note(ARGV[3], ARGV[4])
end
return -1
)lua");
  return s;
}

// INVALIDATE. KEYS: value, meta. ARGV: channel, meta_ttl_ms. Deletes the value, bumps the
// generation (so that no load acquired before this stores), wakes waiters. Returns {the new
// generation, published}.
inline const lua_script& invalidate_script() {
  static const lua_script s(SINGLEFLIGHT_FLEET_LUA_PRELUDE R"lua(
seed(KEYS[2])
redis.call('DEL', KEYS[1])
local g = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {g, note(ARGV[1], 'r')}
)lua");
  return s;
}

// WRITE (fleet_cache's put and invalidate). KEYS: value, meta. ARGV: channel, meta_ttl_ms,
// record ('' = delete the value), ttl_ms, bus, bus message. INVALIDATE's effects (the value
// deleted, the generation bumped: no load acquired before this stores), then the record stored
// when there is one; wakes waiters ("v": re-read, a value is there; "r": race again); then
// PUBLISHes the bus message on the bus (every process's local cache drops the key). The value
// is written before it is deleted, so that client tracking reports it even when there was none
// (a load under way elsewhere must not keep its result locally). Returns
// {the new generation, published on the key's channel, published on the bus}.
inline const lua_script& write_script() {
  static const lua_script s(SINGLEFLIGHT_FLEET_LUA_PRELUDE R"lua(
seed(KEYS[2])
redis.call('SET', KEYS[1], '', 'PX', 1)
redis.call('DEL', KEYS[1])
local g = redis.call('HINCRBY', KEYS[2], 'gen', 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local woke
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  woke = note(ARGV[1], 'v')
else
  woke = note(ARGV[1], 'r')
end
return {g, woke, note(ARGV[5], ARGV[6])}
)lua");
  return s;
}

// sharded_variant(classic, from, to): the script `classic` with the sharded prelude instead
// of the classic one, and `from` (when not empty) replaced by `to` in its body.
inline std::string sharded_variant(const lua_script& classic, std::string_view from = {},
                                   std::string_view to = {}) {
  constexpr std::string_view classic_prelude = SINGLEFLIGHT_FLEET_LUA_PRELUDE;
  std::string body(classic.body.substr(classic_prelude.size()));
  if (!from.empty()) body.replace(body.find(from), from.size(), to);
  return SINGLEFLIGHT_FLEET_LUA_PRELUDE_SHARDED + body;
}

// The scripts that notify a key's waiters, as a fleet runs them on a Redis Cluster (a script
// of each kind per fleet, whatever the server: a single server is sent only the classic ones).
inline const lua_script& store_script(bool sharded) {
  if (!sharded) return store_script();
  static const lua_script s(lua_script::built, sharded_variant(store_script()));
  return s;
}
inline const lua_script& release_script(bool sharded) {
  if (!sharded) return release_script();
  static const lua_script s(lua_script::built, sharded_variant(release_script()));
  return s;
}
inline const lua_script& invalidate_script(bool sharded) {
  if (!sharded) return invalidate_script();
  static const lua_script s(lua_script::built, sharded_variant(invalidate_script()));
  return s;
}
// fleet_cache's bus is no key's channel: its message stays a classic PUBLISH (cast).
inline const lua_script& write_script(bool sharded) {
  if (!sharded) return write_script();
  static const lua_script s(
      lua_script::built,
      sharded_variant(write_script(), "note(ARGV[5], ARGV[6])", "cast(ARGV[5], ARGV[6])"));
  return s;
}

#undef SINGLEFLIGHT_FLEET_LUA_PRELUDE
#undef SINGLEFLIGHT_FLEET_LUA_PRELUDE_SHARDED
#undef SINGLEFLIGHT_FLEET_LUA_COMMON

// Runs a script by its SHA; on NOSCRIPT (a fresh or flushed server) sends the body once,
// which also caches it. keys and args are appended in order.
inline redis_reply run_script(redis_conn& c, const lua_script& s,
                              std::initializer_list<std::string_view> keys,
                              std::initializer_list<std::string_view> args) {
  std::vector<std::string_view> argv;
  argv.reserve(3 + keys.size() + args.size());
  const std::string nkeys = std::to_string(keys.size());
  argv.emplace_back("EVALSHA");
  argv.emplace_back(s.sha);
  argv.emplace_back(nkeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  redis_reply r = c.command(argv);
  if (is_error(r.get()) && text_of(r.get()).starts_with("NOSCRIPT")) {
    argv[0] = "EVAL";
    argv[1] = s.body;
    r = c.command(argv);
  }
  if (is_error(r.get())) {
    const std::string_view why = text_of(r.get());
    // NOPERM: the fleet's ACL user lacks EVAL/EVALSHA or a key or channel right (a key
    // pattern written for other names): a configuration error (redis_failure::refused).
    throw redis_failure("script: " + std::string(why), why.starts_with("NOPERM")
                                                           ? redis_failure::cause::refused
                                                           : redis_failure::cause::failed);
  }
  return r;
}

inline std::string ms_text(std::chrono::milliseconds d) { return std::to_string(d.count()); }

// ---------------------------------------------------------------------------------------------
// Steps

// script_read_max: the longest record the race script returns itself (ACQUIRE); a longer one
// is read with get_value, more round trips. A script copies what it returns into Lua and out
// again, ~3 ms per MiB on redis-server 7.0, while it serves nobody else and the round trip sees
// no byte move; GETRANGE copies it once. At 64 KiB the extra round trip costs less than the
// record's own transfer. It is also what get_value's first read asks for: a hit on a record up
// to this long is one round trip, a longer one two.
inline constexpr std::size_t script_read_max = 64 * 1024;

// record_limit(max_value_bytes, tag): the longest record of a value of at most max_value_bytes
// codec bytes under codec tag `tag`: its header, "SF1|k|<tag>|<fence>|<gen>|<checksum>|" (a
// fence and a generation of at most 20 characters each), plus the payload. 0 (no limit) when
// max_value_bytes is 0.
inline std::size_t record_limit(std::size_t max_value_bytes, std::string_view tag) noexcept {
  if (max_value_bytes == 0) return 0;
  const std::size_t header = 4 + 2 + tag.size() + 1 + 20 + 1 + 20 + 1 + 16 + 1;
  return max_value_bytes > SIZE_MAX - header ? SIZE_MAX : max_value_bytes + header;
}

struct get_result {
  enum kind_t { miss, found, foreign, oversized } kind = miss;
  std::string bytes;     // found: the record (a torn one fails parse_record: see get_value)
  long long length = 0;  // oversized: the record's length, at least (it was not read whole)
};

// get_value(c, n, tag, limit): reads the record with GETRANGE, never GET, so that what the
// server copies for one get is bounded: at most script_read_max + `limit` bytes (0: no limit),
// whatever is under the name. redis-server builds a whole reply before it sends its first byte
// (a GET of a 64 MiB string answers after 30-60 ms, past the default redis_timeout, before its
// length could be seen).
//  - GETRANGE value 0 script_read_max-1, one round trip: a shorter reply is the whole record
//    (a hit of an ordinary record is this one command). "" is a miss: GETRANGE answers "" for
//    a missing name, not nil, and an empty string is no record either.
//  - A reply of exactly script_read_max bytes may be the start of a longer value. If it does
//    not start with a record header of this codec (record_header) it is another program's:
//    not read further; its length (STRLEN, a second round trip) tells `oversized` (over
//    `limit`) from `foreign`. Else the rest is read with GETRANGE value script_read_max
//    `limit` (a second round trip): a reply of its full length means a record over `limit`,
//    `oversized`, and is not read (redis_conn::command_capped: the connection is then broken,
//    drop it). The two parts are concatenated: a record overwritten between the two reads
//    comes out torn, and its checksum fails (parse_record), as a corrupt record's does.
// A value of another Redis type (WRONGTYPE) is `foreign`. A record read whole that is longer
// than `limit` (a limit under script_read_max) is `oversized`.
inline get_result get_value(redis_conn& c, const fleet_names& n, std::string_view tag,
                            std::size_t limit) {
  static const std::string first_end = std::to_string(script_read_max - 1);
  static const std::string rest_start = std::to_string(script_read_max);
  get_result out;
  // A reply of GETRANGE: false for WRONGTYPE (foreign), throws for any other error.
  const auto string_reply = [&](const redis_reply& r) {
    if (is_error(r.get())) {
      if (text_of(r.get()).starts_with("WRONGTYPE")) return false;
      throw redis_failure("GETRANGE: " + std::string(text_of(r.get())));
    }
    if (r->type != REDIS_REPLY_STRING) throw redis_failure("GETRANGE: unexpected reply");
    return true;
  };
  const redis_reply head = c.command({"GETRANGE", n.value, "0", first_end});
  if (!string_reply(head)) {
    out.kind = get_result::foreign;
    return out;
  }
  if (head->len == 0) return out;  // a missing name, or an empty string: no record either
  if (limit > 0 && head->len > limit) {
    out.kind = get_result::oversized;
    out.length = static_cast<long long>(head->len);
    return out;
  }
  out.bytes.assign(head->str, head->len);
  if (head->len < script_read_max) {
    out.kind = get_result::found;
    return out;
  }

  record r;
  std::string_view checksum;
  if (!record_header(out.bytes, tag, r, checksum)) {
    out.bytes.clear();
    const redis_reply len = c.command({"STRLEN", n.value});
    if (is_error(len.get()) && !text_of(len.get()).starts_with("WRONGTYPE")) {
      throw redis_failure("STRLEN: " + std::string(text_of(len.get())));
    }
    if (!is_error(len.get()) && len->type != REDIS_REPLY_INTEGER) {
      throw redis_failure("STRLEN: unexpected reply");
    }
    const long long length = is_error(len.get()) ? 0 : len->integer;
    if (limit > 0 && length > static_cast<long long>(limit)) {
      out.kind = get_result::oversized;
      out.length = length;
    } else {
      out.kind = get_result::foreign;
    }
    return out;
  }

  // The rest: bytes script_read_max..limit (inclusive), at most limit - script_read_max + 1;
  // a reply that long is a record over the limit, and is not read.
  const std::size_t cap = limit > 0 ? limit - script_read_max : 0;
  const std::string rest_end = limit > 0 ? std::to_string(limit) : std::string("-1");
  long long over = 0;
  const redis_reply rest =
      cap > 0 ? c.command_capped(cap, {"GETRANGE", n.value, rest_start, rest_end}, over)
              : c.command({"GETRANGE", n.value, rest_start, rest_end});
  if (!rest) {
    out.bytes.clear();
    out.kind = get_result::oversized;
    out.length = static_cast<long long>(script_read_max) + over;
    return out;
  }
  if (!string_reply(rest)) {
    out.bytes.clear();
    out.kind = get_result::foreign;  // replaced by another type since the first read
    return out;
  }
  if (limit > 0 && rest->len > cap) {
    out.bytes.clear();
    out.kind = get_result::oversized;
    out.length = static_cast<long long>(script_read_max + rest->len);
    return out;
  }
  out.bytes.append(rest->str, rest->len);
  out.kind = get_result::found;
  return out;
}

struct acquire_result {
  // found: a value is there (bytes); lost: another holds the lease; won: ours; oversized: a
  // value over the limit is there (not read, nothing written); gone: a long value was there
  // and was not by the time it was read (nothing written: race again); foreign: a long value
  // is there that is not a record of this codec (not read whole, nothing written: race
  // without reading, as after a record that does not parse).
  enum kind_t { found, lost, won, oversized, gone, foreign } kind = lost;
  std::string bytes;     // found: the record
  std::string fence;     // won
  std::string gen;       // won
  long long pttl = 0;    // lost: the lease's remaining time (ms), -1/-2 when none
  long long length = 0;  // oversized: the record's length
};

// acquire(...): the race; with read_value, a value found first is the answer (a record longer
// than script_read_max is read with get_value under codec tag `tag`: the same bounded reads as
// a get, two more round trips), a value over `limit` (0: none) is not read.
inline acquire_result acquire(redis_conn& c, const fleet_names& n, std::string_view tag,
                              std::string_view token, std::chrono::milliseconds lease_ttl,
                              std::chrono::milliseconds meta_ttl, bool read_value,
                              std::size_t limit) {
  const std::string lease_ms = ms_text(lease_ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  const std::string tomb = n.tomb(token);
  const std::string limit_text = std::to_string(limit);
  const std::string inline_text = std::to_string(script_read_max);
  const redis_reply r =
      run_script(c, acquire_script(), {n.value, n.lease, n.meta, tomb},
                 {token, lease_ms, meta_ms, read_value ? "1" : "0", limit_text, inline_text});
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
      r->element[0]->type != REDIS_REPLY_INTEGER) {
    throw redis_failure("acquire: unexpected reply");
  }
  acquire_result out;
  const long long k = r->element[0]->integer;
  const redisReply* e1 = r->element[1];
  if (k == 0 && e1->type == REDIS_REPLY_STRING) {
    out.kind = acquire_result::found;
    out.bytes.assign(e1->str, e1->len);
  } else if (k == 1 && e1->type == REDIS_REPLY_INTEGER) {
    out.kind = acquire_result::lost;
    out.pttl = e1->integer;
  } else if (k == 2 && r->elements == 3 && e1->type == REDIS_REPLY_INTEGER &&
             is_string(r->element[2])) {
    out.kind = acquire_result::won;
    out.fence = std::to_string(e1->integer);
    out.gen = std::string(text_of(r->element[2]));
  } else if (k == 4 && e1->type == REDIS_REPLY_INTEGER) {
    out.kind = acquire_result::oversized;
    out.length = e1->integer;
  } else if (k == 5 && e1->type == REDIS_REPLY_INTEGER) {
    get_result g = get_value(c, n, tag, limit);
    if (g.kind == get_result::found) {
      out.kind = acquire_result::found;
      out.bytes = std::move(g.bytes);
    } else if (g.kind == get_result::oversized) {
      out.kind = acquire_result::oversized;  // replaced by a longer one since: c may be broken
      out.length = g.length;
    } else if (g.kind == get_result::foreign) {
      out.kind = acquire_result::foreign;
    } else {
      out.kind = acquire_result::gone;
    }
  } else {
    throw redis_failure("acquire: unexpected reply");
  }
  return out;
}

inline bool renew(redis_conn& c, const fleet_names& n, std::string_view token,
                  std::chrono::milliseconds lease_ttl, std::chrono::milliseconds meta_ttl) {
  const std::string lease_ms = ms_text(lease_ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  const redis_reply r =
      run_script(c, renew_script(), {n.lease, n.meta}, {token, lease_ms, meta_ms});
  if (r->type != REDIS_REPLY_INTEGER) throw redis_failure("renew: unexpected reply");
  return r->integer == 1;
}

// renew_all(c, leases, lease_ttl, meta_ttl): renew() for every (names, token) in `leases`, in
// one pipelined round trip (EVALSHA each): for each lease, whether it was still ours. One round
// trip for any number of leases, so a process with many long loads renews them all within one
// RTT, not one RTT each. The leases answered NOSCRIPT (a fresh or flushed server: then every
// lease of the batch) go again, all in one more pipelined round trip, with the body (EVAL).
// Run again one by one, they cost a round trip each: a batch of 64 at 20 ms RTT took 1.3 s,
// and with lease_ttl = 600 ms most of them expired before their turn, as did every lease
// that fell due meanwhile (the renewer's thread was busy with the batch).
inline std::vector<bool> renew_all(
    redis_conn& c, const std::vector<std::pair<const fleet_names*, std::string_view>>& leases,
    std::chrono::milliseconds lease_ttl, std::chrono::milliseconds meta_ttl) {
  const std::string lease_ms = ms_text(lease_ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  const lua_script& s = renew_script();
  std::vector<std::vector<std::string_view>> commands;
  commands.reserve(leases.size());
  for (const auto& [n, token] : leases) {
    commands.push_back({"EVALSHA", s.sha, "2", n->lease, n->meta, token, lease_ms, meta_ms});
  }
  std::vector<redis_reply> replies = c.pipeline(commands);
  std::vector<std::size_t> again;  // the indexes answered NOSCRIPT
  std::vector<std::vector<std::string_view>> with_body;
  for (std::size_t i = 0; i < leases.size(); ++i) {
    const redisReply* r = replies[i].get();
    if (!is_error(r) || !text_of(r).starts_with("NOSCRIPT")) continue;
    again.push_back(i);
    with_body.push_back(std::move(commands[i]));
    with_body.back()[0] = "EVAL";
    with_body.back()[1] = s.body;
  }
  if (!again.empty()) {
    std::vector<redis_reply> second = c.pipeline(with_body);
    for (std::size_t k = 0; k < again.size(); ++k) replies[again[k]] = std::move(second[k]);
  }
  std::vector<bool> ours(leases.size(), false);
  for (std::size_t i = 0; i < leases.size(); ++i) {
    const redisReply* r = replies[i].get();
    if (is_error(r)) throw redis_failure("renew: " + std::string(text_of(r)));
    if (r->type != REDIS_REPLY_INTEGER) throw redis_failure("renew: unexpected reply");
    ours[i] = r->integer == 1;
  }
  return ours;
}

// A {code, published} reply (store, invalidate): the code; `published` set from the flag.
inline long long coded_reply(const redis_reply& r, const char* step, bool& published) {
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
      r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
    throw redis_failure(std::string(step) + ": unexpected reply");
  }
  published = r->element[1]->integer == 1;
  return r->element[0]->integer;
}

enum class store_result { stored, fenced_out, invalidated };

// store(...): the store script; `published` says whether its PUBLISH went out.
inline store_result store(redis_conn& c, const fleet_names& n, std::string_view token,
                          std::string_view fence, std::string_view gen, std::string_view rec,
                          std::chrono::milliseconds ttl, std::string_view message,
                          std::chrono::milliseconds meta_ttl, bool& published,
                          bool sharded = false) {
  const std::string ttl_ms = ms_text(ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  const redis_reply r = run_script(c, store_script(sharded), {n.value, n.lease, n.meta},
                                   {token, fence, gen, rec, ttl_ms, n.channel, message, meta_ms});
  const long long code = coded_reply(r, "store", published);
  if (code == -1) return store_result::fenced_out;
  if (code == -2) return store_result::invalidated;
  return store_result::stored;
}

// store_on_tracker(...): the store script's writes as a transaction of plain commands, for the
// tracker connection (tracker_line.hpp: under BCAST NOLOOP, the server does not report to this
// process the writes sent on it; a write inside a script would be). Two round trips:
//   WATCH meta lease, HMGET meta fence gen, GET lease;
//   MULTI, [DEL lease when it held `token`], SET value rec PX ttl, PEXPIRE meta meta_ttl,
//   PUBLISH channel message, EXEC.
// Only the script's common case is decided here: the fence and generation as given (the meta a
// hash holding them), a record to store for ttl > 0. Anything else (a fence or generation that
// moved, a foreign type, an EXEC the WATCH aborted: a renewal's PEXPIRE, another writer; an
// error reply) returns nullopt: run the script, which decides as always (it finds what the
// transaction left: nothing, or, when the SET alone failed as it ran, the lease released). On the
// connection no WATCH is left behind. Throws redis_failure (I/O; the connection is then broken:
// whether EXEC ran is unknown, and a second, scripted, run of the store changes nothing but the
// value's TTL and a repeated message). Single server only (no cluster redirects).
inline std::optional<store_result> store_on_tracker(
    redis_conn& c, const fleet_names& n, std::string_view token, std::string_view fence,
    std::string_view gen, std::string_view rec, std::chrono::milliseconds ttl,
    std::string_view message, std::chrono::milliseconds meta_ttl, bool& published) {
  if (rec.empty() || ttl.count() <= 0) return std::nullopt;
  const std::vector<redis_reply> seen =
      c.pipeline({{"WATCH", n.meta, n.lease}, {"HMGET", n.meta, "fence", "gen"}, {"GET", n.lease}});
  const redisReply* m = seen[1].get();
  const bool current =
      !is_error(seen[0].get()) && m->type == REDIS_REPLY_ARRAY && m->elements == 2 &&
      is_string(m->element[0]) && text_of(m->element[0]) == fence &&
      (m->element[1]->type == REDIS_REPLY_NIL ? std::string_view("0") : text_of(m->element[1])) ==
          gen;
  if (!current || is_error(seen[2].get())) {
    (void)c.command({"UNWATCH"});
    return std::nullopt;
  }
  const bool ours = is_string(seen[2].get()) && text_of(seen[2].get()) == token;
  const std::string ttl_ms = ms_text(ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  std::vector<std::vector<std::string_view>> tx;
  tx.reserve(6);
  tx.push_back({"MULTI"});
  if (ours) tx.push_back({"DEL", n.lease});
  tx.push_back({"SET", n.value, rec, "PX", ttl_ms});
  tx.push_back({"PEXPIRE", n.meta, meta_ms});
  tx.push_back({"PUBLISH", n.channel, message});
  tx.push_back({"EXEC"});
  const std::vector<redis_reply> done = c.pipeline(tx);  // EXEC discards the WATCH either way
  const redisReply* exec = done.back().get();
  if (exec->type != REDIS_REPLY_ARRAY || exec->elements != tx.size() - 2) {
    return std::nullopt;  // nil: the WATCH aborted it; EXECABORT: a command refused (ACL, OOM)
  }
  // A SET the server refused as it ran (the lease may be gone): the script runs and says so.
  if (is_error(exec->element[ours ? 1 : 0])) return std::nullopt;
  published = !is_error(exec->element[exec->elements - 1]);
  return store_result::stored;
}

enum class release_result { released, not_ours };

// release(...): the release script, with a tombstone for `tomb_ttl` when it is > 0 (a race
// given up on); `published` says whether `message` went out.
inline release_result release(redis_conn& c, const fleet_names& n, std::string_view token,
                              std::chrono::milliseconds tomb_ttl, std::string_view message,
                              bool& published, bool sharded = false) {
  const std::string tomb = n.tomb(token);
  const std::string tomb_ms = ms_text(std::max(tomb_ttl, std::chrono::milliseconds(0)));
  const redis_reply r =
      run_script(c, release_script(sharded), {n.lease, tomb}, {token, tomb_ms, n.channel, message});
  if (r->type != REDIS_REPLY_INTEGER) throw redis_failure("release: unexpected reply");
  published = r->integer == 1;
  return r->integer == -1 ? release_result::not_ours : release_result::released;
}

// invalidate(...): the new generation; `published` says whether the waiters were told.
inline std::uint64_t invalidate(redis_conn& c, const fleet_names& n,
                                std::chrono::milliseconds meta_ttl, bool& published,
                                bool sharded = false) {
  const std::string meta_ms = ms_text(meta_ttl);
  const redis_reply r =
      run_script(c, invalidate_script(sharded), {n.value, n.meta}, {n.channel, meta_ms});
  const long long gen = coded_reply(r, "invalidate", published);
  if (gen < 0) throw redis_failure("invalidate: unexpected reply");
  return static_cast<std::uint64_t>(gen);
}

// write(...): the write script (`rec` empty: delete); the new generation. `published`: the
// key's waiters were told; `broadcast`: the bus message went out.
inline std::uint64_t write(redis_conn& c, const fleet_names& n, std::string_view rec,
                           std::chrono::milliseconds ttl, std::chrono::milliseconds meta_ttl,
                           std::string_view bus, std::string_view message, bool& published,
                           bool& broadcast, bool sharded = false) {
  const std::string ttl_ms = ms_text(ttl);
  const std::string meta_ms = ms_text(meta_ttl);
  const redis_reply r = run_script(c, write_script(sharded), {n.value, n.meta},
                                   {n.channel, meta_ms, rec, ttl_ms, bus, message});
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
      r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
      r->element[2]->type != REDIS_REPLY_INTEGER || r->element[0]->integer < 0) {
    throw redis_failure("write: unexpected reply");
  }
  published = r->element[1]->integer == 1;
  broadcast = r->element[2]->integer == 1;
  return static_cast<std::uint64_t>(r->element[0]->integer);
}

// The bus of the fleet_caches under prefix P (N its length): "{N:P}:i", the channel their
// put and invalidate publish the key's text on. Never a key's name: those continue the hash
// tag with ':' after P where this one closes it.
inline std::string bus_channel(std::string_view prefix) {
  std::string b = "{" + std::to_string(prefix.size()) + ':';
  b += prefix;
  b += "}:i";
  return b;
}

// The expire channel of the fleet_caches under prefix P: "{N:P}:x", the channel their expire
// publishes "<writer id><key text>" on (every process, in both coherence modes, listens).
inline std::string expire_channel(std::string_view prefix) {
  std::string b = "{" + std::to_string(prefix.size()) + ':';
  b += prefix;
  b += "}:x";
  return b;
}

// What every name of prefix P's keys starts with, "{N:P:": the prefix fleet_cache's client
// tracking asks the server to report (BCAST PREFIX). Its leases, metadata and tombstones are
// reported too; tracked_key_text tells the values apart.
inline std::string tracking_prefix(std::string_view prefix) {
  std::string t = "{" + std::to_string(prefix.size()) + ':';
  t += prefix;
  t += ':';
  return t;
}

// The key text whose value is named `name` ("{N:P:K}:v", fleet_names::value), given
// tracking_prefix(P); false for every other name (a lease "...}:l", metadata "...}:m", a
// tombstone "...}:g:<token>", another prefix): only a value name ends in "}:v".
inline bool tracked_key_text(std::string_view tracked, std::string_view name,
                             std::string_view& text) noexcept {
  constexpr std::string_view value_suffix = "}:v";
  if (name.size() < tracked.size() + value_suffix.size() || !name.starts_with(tracked) ||
      !name.ends_with(value_suffix)) {
    return false;
  }
  text = name.substr(tracked.size(), name.size() - tracked.size() - value_suffix.size());
  return true;
}

// How late after its timeout a server may answer WAIT: it checks blocked clients' timeouts on
// its timer, `hz` times a second (default 10), so up to 100 ms late, more on a loaded server
// (redis-server 7.0 on loopback answers `WAIT 1 100` after 157-164 ms).
inline constexpr std::chrono::milliseconds wait_reply_margin{250};

// wait_replicas(c, replicas, bound, timeout): WAIT replicas bound; how many replicas
// acknowledged every write made on `c` so far. The server blocks up to `bound` and answers on
// its timer, so this one round trip is bounded by bound + wait_reply_margin + timeout instead
// of the connection's own timeout. Throws redis_failure when no answer comes within that.
inline long long wait_replicas(redis_conn& c, std::uint32_t replicas,
                               std::chrono::milliseconds bound, std::chrono::milliseconds timeout) {
  const std::string n = std::to_string(replicas);
  const std::string ms = ms_text(bound);
  const redis_reply r = c.command_within(bound + wait_reply_margin + timeout, {"WAIT", n, ms});
  if (r->type != REDIS_REPLY_INTEGER) {
    throw redis_failure("WAIT: " +
                        std::string(is_error(r.get()) ? text_of(r.get()) : "unexpected reply"));
  }
  return r->integer;
}

}  // namespace singleflight::detail
