// singleflight/detail/chrono.hpp -- internal; do not include directly.
//
// What the library uses of <chrono>: the clocks, durations, time points and duration literals.
// In C++20, libstdc++'s <chrono> adds the calendar, time zones and their stream I/O, and with
// them <sstream> (so <istream>, <ostream>, <ios> and the locales) to every translation unit
// that includes it; the part the library uses lives in <bits/chrono.h> (libstdc++ 11 and
// later), which <chrono>, <mutex>, <thread> and <condition_variable> include. With libstdc++
// this header includes that one only, so that including a library header parses none of the
// rest (docs/performance.md "Compile time"); elsewhere, <chrono>. A program that uses the
// calendar or prints a duration includes <chrono> itself, as it should anyway. Defining
// SINGLEFLIGHT_STANDARD_HEADERS (for every translation unit) makes it include <chrono>, for a
// standard library whose internal headers are laid out differently.
#pragma once

#include <version>  // __GLIBCXX__

#if !defined(SINGLEFLIGHT_STANDARD_HEADERS) && defined(__GLIBCXX__) && __has_include(<bits/chrono.h>)
#include <bits/chrono.h>
#else
#include <chrono>
#endif
