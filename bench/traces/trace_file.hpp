// bench/traces/trace_file.hpp: reads the access traces of ../shared/traces (see its README for
// formats and licences) into memory, one key per access, decompressing at run time with the
// system's xz / gzip (the traces are not part of this repository).
//
//   big-endian 32-bit ints, xz:   web07, web12, orm-busy, w106
//   text, one key a line, gzip:   multi2, sprite, gli (lines "*" and empty are skipped)
//
// And the synthetic traces every hit-ratio table adds to them: round_robin, scan_case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace sftrace {

struct trace_spec {
  const char* name;         // file stem
  bool binary;              // big-endian u32 in .xz; else decimal text in .gz
  std::size_t capacity[3];  // the cache sizes every hit-ratio table measures it at
};

inline constexpr trace_spec all_traces[] = {
    {"web07", true, {1000, 3000, 10000}},    {"web12", true, {1000, 3000, 8000}},
    {"orm-busy", true, {1000, 5000, 20000}}, {"w106", true, {5000, 25000, 100000}},
    {"multi2", false, {500, 1000, 2000}},    {"sprite", false, {100, 500, 1000}},
    {"gli", false, {250, 1000, 2000}},
};

// The traces' directory: `arg` if given, else $SINGLEFLIGHT_TRACES, else ../shared/traces next
// to the repository (the layout of the machine this was written on), else the working
// directory's ../shared/traces.
inline std::filesystem::path traces_dir(const char* arg) {
  namespace fs = std::filesystem;
  if (arg != nullptr && *arg != '\0') return arg;
  if (const char* e = std::getenv("SINGLEFLIGHT_TRACES"); e != nullptr && *e != '\0') return e;
#ifdef SFTRACE_SOURCE_DIR
  for (const char* up : {"/../shared/traces", "/../../shared/traces"}) {
    const fs::path p = fs::path(SFTRACE_SOURCE_DIR + std::string(up));
    if (fs::exists(p / "README.md")) return fs::weakly_canonical(p);
  }
#endif
  return fs::path("../shared/traces");
}

// read_trace(dir, spec): every access of the trace, in order.
inline std::vector<std::uint32_t> read_trace(const std::filesystem::path& dir,
                                             const trace_spec& spec) {
  const std::filesystem::path file =
      dir / (std::string(spec.name) + (spec.binary ? ".trace.xz" : ".trace.gz"));
  if (!std::filesystem::exists(file)) {
    throw std::runtime_error("no trace " + file.string() +
                             " (give the traces' directory as the first argument or in "
                             "SINGLEFLIGHT_TRACES)");
  }
  const std::string cmd =
      std::string(spec.binary ? "xz -dc '" : "gzip -dc '") + file.string() + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("cannot run " + cmd);
  std::vector<std::uint32_t> out;
  if (spec.binary) {
    unsigned char b[4];
    while (std::fread(b, 1, 4, p) == 4) {
      out.push_back((std::uint32_t{b[0]} << 24U) | (std::uint32_t{b[1]} << 16U) |
                    (std::uint32_t{b[2]} << 8U) | std::uint32_t{b[3]});
    }
  } else {
    char line[128];
    while (std::fgets(line, sizeof line, p) != nullptr) {
      if (line[0] == '*' || line[0] == '\n' || line[0] == '\0') continue;
      out.push_back(static_cast<std::uint32_t>(std::strtoull(line, nullptr, 10)));
    }
  }
  if (::pclose(p) != 0 || out.empty()) throw std::runtime_error("failed: " + cmd);
  return out;
}

// round_robin(hot, rounds): keys 0 .. hot-1 read in turn, `rounds` times (a loop a cache of
// capacity hot, or a little less, must hold).
inline std::vector<std::uint32_t> round_robin(std::size_t hot, int rounds) {
  std::vector<std::uint32_t> t;
  t.reserve(hot * static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t k = 0; k < hot; ++k) t.push_back(static_cast<std::uint32_t>(k));
  }
  return t;
}

// The scan case (R06): 40 hot keys read in turn, interleaved with a scan of 4,000
// keys each read twice in a row; the hot keys' miss ratio after the first round.
inline std::vector<std::uint32_t> scan_case() {
  std::vector<std::uint32_t> t;
  std::uint32_t next_scan = 1000;
  for (int round = 0; round < 100; ++round) {
    for (std::uint32_t h = 0; h < 40; ++h) t.push_back(h);
    for (int i = 0; i < 40; ++i) {
      t.push_back(next_scan);
      t.push_back(next_scan);
      ++next_scan;
    }
  }
  return t;
}

}  // namespace sftrace
