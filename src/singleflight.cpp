// src/singleflight.cpp: singleflight::compiled's one translation unit (compiled mode,
// singleflight/src.hpp). Built with SINGLEFLIGHT_SEPARATE_COMPILATION, which the target also
// defines for everything that links it.
#include <singleflight/src.hpp>
