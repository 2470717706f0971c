// singleflight/stop_token.hpp
//
// `singleflight::stop_token`, `stop_source`, `stop_callback<F>`,
// `nostopstate_t` and `nostopstate`: C++20's stop tokens, under the
// library's own names, so that singleflight works with a standard library
// that lacks <stop_token>.
//
//   #include <singleflight/stop_token.hpp>
//
//   singleflight::stop_source src;
//   singleflight::stop_callback cb(src.get_token(), [] { /* runs inside request_stop() */ });
//   src.request_stop();
//
// Where the standard library has them (`__cpp_lib_jthread`: libstdc++ 10 and
// later, libc++ 20 and later, or libc++ 17-19 with -fexperimental-library,
// MSVC), these names are the std ones (using-declarations: the same types,
// so a std::stop_token is a singleflight::stop_token and nothing changes).
// Elsewhere (libc++ 19 and older by default, e.g. clang++ -stdlib=libc++ on
// Debian 12 or macOS) they are a bundled implementation with the standard's
// semantics (detail/stop_state.hpp): callbacks run synchronously in the
// thread that requests stop; a callback registered on a stopped token runs in
// its constructor; ~stop_callback waits for a run on another thread but not
// for one on its own thread; request_stop() returns true once.
//
// SINGLEFLIGHT_STD_STOP_TOKEN is 1 when the std types are used, 0 for the
// bundled ones. Which one is chosen depends only on the standard library, so
// every translation unit of a program agrees.
//
// Thread safety, exceptions and lifetime: as for the std types.
#pragma once

#include <version>

#if defined(__cpp_lib_jthread)
#define SINGLEFLIGHT_STD_STOP_TOKEN 1
#include <stop_token>
#else
#define SINGLEFLIGHT_STD_STOP_TOKEN 0
#include "detail/stop_state.hpp"
#endif

namespace singleflight {

#if SINGLEFLIGHT_STD_STOP_TOKEN
using std::nostopstate;
using std::nostopstate_t;
using std::stop_callback;
using std::stop_source;
using std::stop_token;
#else
using detail::nostopstate;
using detail::nostopstate_t;
using detail::stop_callback;
using detail::stop_source;
using detail::stop_token;
#endif

}  // namespace singleflight
