// Module B of the two-module test: instantiates close() and do_ itself.
#include "modules.hpp"

namespace sfmod {

int b_close(group_t& g) {
  g.close();
  return 1;
}

int b_same_key(group_t& g) {
  return g.do_(std::string("k"), [] { return 2; });
}

int b_close_from_do(group_t& g) {
  return g.do_(std::string("other"), [&g] {
    g.close();
    return 3;
  });
}

}  // namespace sfmod
