// singleflight/version.hpp
//
// The library version, defined once. CMake reads these three macros to set
// the project version, so this file is the single source of truth.
#pragma once

#define SINGLEFLIGHT_VERSION_MAJOR 0
#define SINGLEFLIGHT_VERSION_MINOR 1
#define SINGLEFLIGHT_VERSION_PATCH 0

// SINGLEFLIGHT_VERSION: MAJOR * 10000 + MINOR * 100 + PATCH, for `#if` tests.
#define SINGLEFLIGHT_VERSION                                               \
  (SINGLEFLIGHT_VERSION_MAJOR * 10000 + SINGLEFLIGHT_VERSION_MINOR * 100 + \
   SINGLEFLIGHT_VERSION_PATCH)
