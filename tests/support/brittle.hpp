// tests/support/brittle.hpp: a value whose move throws, for the tests of the deliveries that
// move T (user code) into a caller's place: a get_many / load_many slot, a co_get's result, a
// cache load fed by a batch loader.
//
// brittle's moves are fine until it is copied; a copy of a "bad" one throws move_threw on its
// next move. The library's copy for a caller is the last copy of a delivery, so for a "bad"
// value the move that throws is the one that takes the caller's outcome onward.
#pragma once

#include <exception>

namespace sftest {

struct move_threw : std::exception {};

struct brittle {
  explicit brittle(bool b) : bad(b) {}
  brittle(const brittle& o) : bad(o.bad), copied(true) {}
  brittle(brittle&& o) : bad(o.bad), copied(o.copied) {  // NOLINT: may throw, on purpose
    if (bad && copied) throw move_threw();
  }
  brittle& operator=(const brittle&) = default;
  brittle& operator=(brittle&&) = default;
  ~brittle() = default;
  bool bad;
  bool copied = false;
};

}  // namespace sftest
