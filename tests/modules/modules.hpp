// tests/modules/modules.hpp: the interface between the test executable and two
// shared objects built with -fvisibility=hidden, each instantiating the
// group's members itself (defect H of the issue "Where user code runs").
#pragma once

#include <singleflight/singleflight.hpp>

#include <string>

#define SFTEST_MODULE_API __attribute__((visibility("default")))

namespace sfmod {

using group_t = singleflight::group<std::string, int>;
using callback = int (*)(group_t&);

// module A: g.do_(key, fn) where fn calls `inside(g)` (code of module B).
SFTEST_MODULE_API int a_do(group_t& g, const char* key, callback inside);

// module B: what fn does inside.
SFTEST_MODULE_API int b_close(group_t& g);          // g.close(); returns 1
SFTEST_MODULE_API int b_same_key(group_t& g);       // g.do_("k", ...) for fn's own key
SFTEST_MODULE_API int b_close_from_do(group_t& g);  // g.do_("other", [&]{ g.close(); ...})

}  // namespace sfmod
