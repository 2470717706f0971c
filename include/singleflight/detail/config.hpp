// singleflight/detail/config.hpp -- internal; do not include directly.
//
// SINGLEFLIGHT_DECL: how the library's non-template functions are declared, after Asio's
// ASIO_DECL. The library is header-only by default: each detail header that has such
// functions declares them, and defines them in an impl/<name>.ipp beside it, which the header
// includes at its end; SINGLEFLIGHT_DECL is then `inline`.
//
// Compiled mode (SINGLEFLIGHT_SEPARATE_COMPILATION defined): the headers declare these
// functions only, SINGLEFLIGHT_DECL is empty, and one translation unit of the program defines
// them all by including <singleflight/src.hpp> (CMake: link singleflight::compiled, which
// does both). Every other translation unit then compiles none of that code, nor the standard
// library instantiations it needs (docs/performance.md "Compile time").
//
// Every translation unit of a program must use the same mode: the macro defined for all of
// them or for none (as with Asio). Where they disagree, a TU of each mode may bring its own
// definition of the same function (header-only: inline; compiled: from src.hpp's TU), and the
// linker keeps one without a diagnostic; nothing detects the mix. The same holds for the
// macros that change what these functions do (SINGLEFLIGHT_TEST_HOOKS, for the library's
// own tests): src.hpp's TU must see the same ones as the rest of the program.
#pragma once

#if defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#define SINGLEFLIGHT_DECL
#else
#define SINGLEFLIGHT_DECL inline
#endif
