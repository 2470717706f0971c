// A bulk function of the wrong shape (it returns one value, not one per key) must not compile:
// batch_loader's static_assert names the shapes it accepts. (graphql/dataloader's abuse tests
// "Loader creation requires a function" and "Batch function must return a Promise of an Array"
// are type errors here.)
#include <singleflight/batch_loader.hpp>

#include <span>

int main() {
  singleflight::batch_loader<int, int> loader(
      [](std::span<const int> keys) { return static_cast<int>(keys.size()); });
  (void)loader;
}
