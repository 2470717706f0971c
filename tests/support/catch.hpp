// tests/support/catch.hpp
//
// Include this, not Catch2 directly: it picks the Catch2 v2 single header or the v3 headers.
// tests/CMakeLists.txt defines SINGLEFLIGHT_CATCH2_V3 when it finds Catch2 v3.
#pragma once

#if defined(SINGLEFLIGHT_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
