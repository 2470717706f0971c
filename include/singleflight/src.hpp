// singleflight/src.hpp
//
// The definitions of the library's non-template functions, for compiled mode: include this
// header in exactly one translation unit of a program in which every translation unit is
// compiled with SINGLEFLIGHT_SEPARATE_COMPILATION defined (detail/config.hpp). CMake's
// singleflight::compiled target is that translation unit (src/singleflight.cpp), built as a
// static library that also defines the macro for whatever links it.
#pragma once

#if !defined(SINGLEFLIGHT_SEPARATE_COMPILATION)
#error \
    "singleflight/src.hpp is for compiled mode: define SINGLEFLIGHT_SEPARATE_COMPILATION for every translation unit of the program (or link singleflight::compiled)"
#endif

#include "detail/cache/impl/cache_policy.ipp"
#include "detail/cache/impl/read_gate.ipp"
#include "detail/group/impl/deadlines.ipp"
#include "detail/group/impl/execution.ipp"
#include "detail/group/impl/leader_stop.ipp"
#include "detail/group/impl/lifecycle.ipp"
#include "detail/group/impl/notification.ipp"
#include "detail/group/impl/owned_thread.ipp"
#include "detail/group/impl/shard_set.ipp"
#include "detail/group/impl/trace_slot.ipp"
#include "detail/group/impl/wake_batch.ipp"
#include "detail/impl/library_thread.ipp"
#include "detail/impl/worker_threads.ipp"
#include "impl/errors.ipp"
