// Module A of the two-module test: instantiates group::do_ with hidden visibility.
#include "modules.hpp"

namespace sfmod {

int a_do(group_t& g, const char* key, callback inside) {
  return g.do_(std::string(key), [&g, inside] { return inside(g); });
}

}  // namespace sfmod
