#!/usr/bin/env bash
# tests/support/check_extern.sh OBJECT...: the check of SINGLEFLIGHT_EXTERN_CACHE on
# test_cache_extern's objects (ctest cache_extern.object). In test_cache_extern.cpp's object
# the slow path of its extern cache types (cache_calls<...>::slow_ref, ::close, the
# constructors) and their callback path (::async_ref, async_get's and co_get's; ::many_ref,
# get_many's; ::async_shared / ::many_shared, the same with the cache-wide loader; ::slow_shared /
# ::fresh_shared, get's and get_fresh's with it) must be undefined references, resolved by
# support/cache_extern_types.cpp's object, which defines them, and no function of the group's
# call chains for the std::string type may be defined there. Fails with what it found otherwise.
set -euo pipefail
user="" inst=""
for o in "$@"; do
  case "$o" in
    *test_cache_extern.cpp.o) user=$o ;;
    *cache_extern_types.cpp.o) inst=$o ;;
  esac
done
if [ -z "$user" ] || [ -z "$inst" ]; then
  echo "check_extern.sh: test_cache_extern.cpp.o and cache_extern_types.cpp.o expected among: $*" >&2
  exit 1
fi
fail=0
for fn in '::slow_ref(' '::close()' '::cache_calls(singleflight::cache_options const&)' \
  '::async_ref(' '::async_shared(' '::many_ref(' '::many_shared(' '::slow_shared(' \
  '::fresh_shared('; do
  u=$(nm -C "$user" | grep -F "cache_calls<" | grep -F "$fn" || true)
  if ! grep -q ' U ' <<<"$u" || grep -q ' [TtWw] ' <<<"$u"; then
    echo "test_cache_extern.cpp.o: cache_calls<...>$fn should be an undefined reference only:" >&2
    echo "${u:-(absent)}" >&2
    fail=1
  fi
  d=$(nm -C "$inst" | grep -F "cache_calls<" | grep -F "$fn" | grep ' [TtWw] ' || true)
  if [ -z "$d" ]; then
    echo "cache_extern_types.cpp.o: cache_calls<...>$fn not defined" >&2
    fail=1
  fi
done
# Nothing of the group's call chains for the std::string cache type (its loaded<T, Clock> names
# sftest::manual_clock), which the test calls only with synchronous loaders and a cache-wide
# loader: every such call goes through the functions above.
leak=$(nm -C "$user" | grep ' [TtWw] ' | grep -E 'detail::(blocking|async)_calls<' |
  grep -F 'sftest::manual_clock' || true)
if [ -n "$leak" ]; then
  echo "test_cache_extern.cpp.o: the group's call chains of the extern std::string cache type are" \
    "compiled here ($(wc -l <<<"$leak") functions), e.g.:" >&2
  head -3 <<<"$leak" >&2
  fail=1
fi
[ "$fail" = 0 ] && echo "test_cache_extern.cpp.o compiles no slow path or callback path of its extern cache types"
exit "$fail"
