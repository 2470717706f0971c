// singleflight/detail/fleet/voided_reads.hpp -- internal; do not include directly.
//
// detail::voided_reads<T>: fleet_cache's record, under client tracking, of the loads whose value
// the local cache refused although it reflects every report that refused it, so that the next
// load of the key takes that value instead of reading Redis once more.
//
// A report of a key that no record covers (kept_reads.hpp) drops the local entry, and the drop
// gives the key a new version, so that a load under way cannot publish what it read before the
// write reported (cache::invalidate). A load whose value-carrying read was sent after that report
// was posted (its read mark, read_mark.hpp, at or past the report's number) read the write
// already: refusing it costs one more Redis read and nothing else. It is the common case after a
// gap under stale_while_revalidate: the refresh follows another process's leader, the report of
// that leader's store comes in while the refresh waits or reads, and a get applies it first.
//
// So, while a load of a key runs, the reports that drop the key are counted (load_began,
// dropped, load_ended); a load that returns a value read after the last of them (and after no
// write of this process, no stale mark, clear or expire: fleet_cache's checks) is stashed, one
// per key. The next load of the key (the local cache starts one: it holds no entry) takes it
// back when the key's kept_reads record is still the one that load made: no report numbered
// past its read has been applied since (that erases the record), so the value is the one the
// key would hold had the load published. A stash is taken once; one not taken is replaced by
// the next, and all are cleared past `max` keys. A stash that can no longer be taken is
// discarded at once, its value with it: by a report of its key numbered past its read
// (dropped), and all of them by what voids them all (discard_all: a write of this process, a
// stale mark, a clear, an expire).
//
// Locking: `mu_`, a leaf, guards loading_ and stashed_. Values are held by shared_ptr, made and
// copied outside the lock: no T is copied, moved or destroyed under it. A discard may hand its
// values to the caller's set_aside instead of destroying them (fleet_cache's application of
// the bus destroys them once it is over).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../chrono.hpp"

namespace singleflight::detail {

template <class T>
class voided_reads {
 public:
  using clock = std::chrono::steady_clock;

  // What a stashed value was read with: its read mark, when its load returned (kept_reads'
  // record), this process's write count and fleet_cache's void count when its load began.
  struct origin {
    std::uint64_t reports = 0;
    clock::time_point at{};
    std::uint64_t writes = 0;
    std::uint64_t voids = 0;
  };

  explicit voided_reads(std::size_t max) : max_(max) {}

  // load_began(text): a load of `text` starts; returns the drops of `text` counted so far, to
  // give back to load_ended. Never throws (a load that cannot be counted is never stashed).
  // Thread-safe.
  std::uint64_t load_began(const std::string& text) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    try {
      loading& l = loading_[text];
      ++l.loads;
      return l.drops;
    } catch (...) {  // bad_alloc: not counted
      return not_counted;
    }
  }

  // set_aside: discarded values that their discarder must not destroy yet (fleet_cache applying
  // the bus: others wait for it, and T's destructor is user code); they die with this object.
  // Not thread-safe: one caller's, on its stack.
  class set_aside {
   public:
    // keep(v): v lives until this object dies; when that cannot be recorded (bad_alloc), v is
    // left to the caller, which destroys it at once.
    void keep(std::shared_ptr<const T>& v) noexcept {
      if (!v) return;
      try {
        values_.push_back(std::move(v));
      } catch (...) {  // push_back's strong guarantee: v is untouched
      }
    }

   private:
    std::vector<std::shared_ptr<const T>> values_;
  };

  // dropped(text, seq[, keep]): report `seq` of `text` dropped the local entry (and voided the
  // loads of it under way); a stash of `text` read before it is discarded. Thread-safe; the
  // discarded value is destroyed after the lock, or handed to `keep`.
  void dropped(const std::string& text, std::uint64_t seq, set_aside* keep = nullptr) noexcept {
    std::shared_ptr<const T> gone;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (const auto s = stashed_.find(text); s != stashed_.end() && seq > s->second.from.reports) {
        gone = std::move(s->second.value);
        stashed_.erase(s);
      }
      if (const auto it = loading_.find(text); it != loading_.end()) {
        ++it->second.drops;
        it->second.last = seq;
      }
    }
    if (keep != nullptr) keep->keep(gone);
  }

  // discard_all([keep]): every stash, discarded (none could be taken any more). Thread-safe;
  // the values are destroyed after the lock, or handed to `keep`.
  void discard_all(set_aside* keep = nullptr) noexcept {
    std::unordered_map<std::string, stashed> gone;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      gone.swap(stashed_);
    }
    if (keep == nullptr) return;
    for (auto& [text, s] : gone) keep->keep(s.value);
  }

  // stash_count(): how many keys hold a stash. Thread-safe.
  std::size_t stash_count() const noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    return stashed_.size();
  }

  // load_ended(text, began): the load that load_began returned `began` to is over; the number of
  // the last report that dropped `text` since it began, nullopt when none did. Thread-safe.
  std::optional<std::uint64_t> load_ended(const std::string& text, std::uint64_t began) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    const auto it = loading_.find(text);
    if (it == loading_.end()) return std::nullopt;
    std::optional<std::uint64_t> last;
    if (began != not_counted && it->second.drops != began) last = it->second.last;
    if (--it->second.loads == 0) loading_.erase(it);
    return last;
  }

  // stash(text, value, from): the value a load of `text` returned, refused by the local cache
  // though read after every report that refused it. Thread-safe.
  void stash(const std::string& text, std::shared_ptr<const T> value, const origin& from) noexcept {
    std::shared_ptr<const T> old;  // destroyed after the lock
    std::unordered_map<std::string, stashed> gone;
    {
      const std::lock_guard<std::mutex> lk(mu_);
      try {
        if (stashed_.size() >= max_ && stashed_.find(text) == stashed_.end()) {
          gone.swap(stashed_);
        }
        stashed& s = stashed_[text];
        old = std::exchange(s.value, std::move(value));
        s.from = from;
      } catch (...) {  // bad_alloc: nothing stashed
      }
    }
  }

  // take(text): the value stashed for `text` and what it was read with, removed (nullptr when
  // none); the caller decides whether it may still be used. Thread-safe.
  std::pair<std::shared_ptr<const T>, origin> take(const std::string& text) noexcept {
    const std::lock_guard<std::mutex> lk(mu_);
    if (stashed_.empty()) return {};
    const auto it = stashed_.find(text);
    if (it == stashed_.end()) return {};
    std::pair<std::shared_ptr<const T>, origin> out{std::move(it->second.value), it->second.from};
    stashed_.erase(it);  // holds no value now: nothing of T dies under the lock
    return out;
  }

 private:
  static constexpr std::uint64_t not_counted = ~std::uint64_t{0};

  struct loading {
    std::size_t loads = 0;    // loads of the key under way
    std::uint64_t drops = 0;  // reports that dropped the key while one was
    std::uint64_t last = 0;   // the number of the last of them
  };
  struct stashed {
    std::shared_ptr<const T> value;
    origin from;
  };

  const std::size_t max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, loading> loading_;  // guarded by mu_
  std::unordered_map<std::string, stashed> stashed_;  // guarded by mu_
};

}  // namespace singleflight::detail
