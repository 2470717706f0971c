// tests/support/catch_main.cpp
//
// main() for the Catch2 v2 test executables, compiled once and linked into each of them, when
// the Catch2 package has no prebuilt Catch2::Catch2WithMain (v2 before 2.13) or
// SINGLEFLIGHT_CATCH2_OWN_MAIN is ON. Catch2 v3 always uses Catch2::Catch2WithMain.
#if !defined(SINGLEFLIGHT_CATCH2_V3)
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
#endif
