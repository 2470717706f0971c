// The consumer's Asio program, built when singleflight::asio exists (standalone Asio found):
// two Asio operations on one key share one flight through singleflight/asio.hpp. Exits 0 only
// if both receive the value and the origin ran once.
#include <asio.hpp>
#include <singleflight/asio.hpp>
#include <singleflight/group.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main() {
  asio::io_context io;
  singleflight::group<std::string, int> group;
  int origin_calls = 0;
  int served = 0;
  singleflight::completion<int> pending;
  auto origin = [&](singleflight::stop_token, singleflight::completion<int> done) {
    ++origin_calls;
    pending = std::move(done);  // resolved below, once both operations are waiting
  };
  const auto on_done = [&](std::exception_ptr e, int v) {
    if (!e && v == 42) ++served;
  };
  singleflight::async_do(group, "answer", origin, asio::bind_executor(io, on_done));
  singleflight::async_do(group, "answer", origin, asio::bind_executor(io, on_done));
  pending.set_value(42);
  io.run();
  std::printf("singleflight::asio: %d operations served, %d origin call(s)\n", served,
              origin_calls);
  return served == 2 && origin_calls == 1 ? 0 : 1;
}
