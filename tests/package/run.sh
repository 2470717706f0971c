#!/usr/bin/env bash
# Builds and runs the consumer project (tests/package/consumer) against this checkout in each
# way a user can take singleflight, offline:
#   include          no build system: c++ -std=c++20 -I <checkout>/include main.cpp -pthread
#   find_package     install the project (tests/examples/benchmarks OFF), consume it with
#                    find_package(singleflight CONFIG REQUIRED) and CMAKE_PREFIX_PATH
#   fetchcontent     the README's FetchContent_Declare(... SOURCE_DIR ... FIND_PACKAGE_ARGS), as
#                    written, with nothing installed and SINGLEFLIGHT_PATH=<checkout>; then the
#                    same with the sources given by FETCHCONTENT_SOURCE_DIR_SINGLEFLIGHT instead
#   fetchcontent-installed
#                    the same declaration with an installed copy on CMAKE_PREFIX_PATH and a
#                    SINGLEFLIGHT_PATH that does not exist: the installed copy must win
#                    (FIND_PACKAGE_ARGS)
#   add_subdirectory add_subdirectory(third_party/singleflight), a link to the checkout
#   pkg-config       install the project, then the README's command line:
#                    c++ $(pkg-config --cflags singleflight) main.cpp $(pkg-config --libs ...)
#                    with only that prefix visible to pkg-config; again after moving the
#                    installed tree elsewhere (singleflight.pc is relocatable)
#   vcpkg            configured, installed and config-fixed up exactly as
#                    ports/singleflight/portfile.cmake does, moved into an "installed" tree the
#                    way vcpkg does, then consumed with find_package and with pkg-config
# Every configure hides Catch2 and Google Benchmark (CMAKE_DISABLE_FIND_PACKAGE_...): a
# consumer must not need them.
#
# Usage: tests/package/run.sh [--cxx <compiler>] [--generator <generator>]
#                             [--make-program <path>] [--build-type <type>] [--keep]
#                             [mode...]            (default: all modes, in the order above)
# ctest runs it as package.consumers with the parent build's compiler and generator.
set -euo pipefail

here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
src="$(cd "$here/../.." && pwd)"
consumer="$here/consumer"

cxx="${CXX:-c++}"
generator=""
make_program=""
build_type="Debug"
keep=0
modes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cxx) cxx="$2"; shift 2 ;;
    --generator) generator="$2"; shift 2 ;;
    --make-program) make_program="$2"; shift 2 ;;
    --build-type) build_type="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) modes+=("$1"); shift ;;
  esac
done
[ "${#modes[@]}" -gt 0 ] ||
  modes=(include find_package fetchcontent fetchcontent-installed add_subdirectory pkg-config vcpkg)
if [ -z "$generator" ] && command -v ninja >/dev/null 2>&1; then generator=Ninja; fi

work="$(mktemp -d "${TMPDIR:-/tmp}/singleflight-package.XXXXXX")"
cleanup() {
  if [ "$keep" -eq 1 ]; then echo "run.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Nothing from the caller's environment may point CMake or pkg-config at another copy or change
# the flags.
unset CMAKE_PREFIX_PATH CMAKE_GENERATOR CMAKE_BUILD_TYPE CMAKE_TOOLCHAIN_FILE CXXFLAGS LDFLAGS \
  CMAKE_INSTALL_PREFIX singleflight_DIR singleflight_ROOT SINGLEFLIGHT_ROOT PKG_CONFIG_PATH \
  PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR || true

common=(
  -DCMAKE_CXX_COMPILER="$cxx"
  -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
  # No user or system package registry: only the prefixes given here are searched.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
  -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON
)
[ -z "$generator" ] || common+=(-G "$generator")
[ -z "$make_program" ] || common+=(-DCMAKE_MAKE_PROGRAM="$make_program")

# Project-side options for the install modes: the library only.
lib_only=(-DSINGLEFLIGHT_BUILD_TESTS=OFF -DSINGLEFLIGHT_BUILD_EXAMPLES=OFF
  -DSINGLEFLIGHT_BUILD_BENCHMARKS=OFF)

log() { printf '[package] %s\n' "$*"; }
fail() {
  printf '[package] FAIL: %s\n' "$*" >&2
  exit 1
}
# run <log file> <command...>: runs the command, keeping its output; shows it on failure.
run() {
  local logfile="$1"
  shift
  if ! "$@" >"$logfile" 2>&1; then
    cat "$logfile" >&2
    fail "$* (log above)"
  fi
}

# The header set that must be installed: every header under include/singleflight, and the
# definitions they include in header-only mode (impl/*.ipp; detail/config.hpp).
expected_headers="$(cd "$src/include" && find singleflight \( -name '*.hpp' -o -name '*.ipp' \) | LC_ALL=C sort)"

# install_project <dir> <prefix> [cmake args...]: configure, build and install the library.
install_project() {
  local dir="$1" prefix="$2"
  shift 2
  mkdir -p "$dir"
  run "$dir/lib-configure.log" cmake -S "$src" -B "$dir/lib-build" "${common[@]}" "$@" \
    -DCMAKE_INSTALL_PREFIX="$prefix"
  # A consumer configure must never compile Catch2 or benchmark code: nothing to build here.
  run "$dir/lib-build.log" cmake --build "$dir/lib-build"
  run "$dir/lib-install.log" cmake --install "$dir/lib-build"
}

# check_install_tree <prefix>: the headers, the package files, and nothing else.
check_install_tree() {
  local prefix="$1" f
  local got
  got="$(cd "$prefix/include" && find singleflight \( -name '*.hpp' -o -name '*.ipp' \) | LC_ALL=C sort)"
  [ "$got" = "$expected_headers" ] || fail "installed headers differ from include/singleflight"
  for f in singleflight-config.cmake singleflight-config-version.cmake \
    singleflight-targets.cmake; do
    [ -f "$prefix/share/singleflight/$f" ] || fail "missing share/singleflight/$f in $prefix"
  done
  [ -f "$prefix/share/pkgconfig/singleflight.pc" ] ||
    fail "missing share/pkgconfig/singleflight.pc in $prefix"
  local others
  others="$(cd "$prefix" && find . -type f ! -path './include/singleflight/*' \
    ! -path './share/singleflight/*' ! -path './share/pkgconfig/singleflight.pc' |
    LC_ALL=C sort)"
  [ -z "$others" ] || fail "unexpected installed files in $prefix: $others"
  # Relocatable: no installed CMake or pkg-config file may name the prefix it was installed to.
  if grep -rlF "$prefix" "$prefix/share/singleflight" "$prefix/share/pkgconfig" >/dev/null; then
    fail "share/singleflight or share/pkgconfig names the absolute install prefix $prefix"
  fi
}

# The project's version, from include/singleflight/version.hpp.
project_version() {
  sed -nE 's/^#define SINGLEFLIGHT_VERSION_(MAJOR|MINOR|PATCH) +([0-9]+).*/\2/p' \
    "$src/include/singleflight/version.hpp" | paste -sd.
}

# pkg_config_consumer <dir> <pcdir>: build and run the consumer with the README's pkg-config
# command line, pkg-config seeing only <pcdir> (PKG_CONFIG_LIBDIR replaces the system paths).
pkg_config_consumer() {
  local dir="$1" pcdir="$2"
  command -v pkg-config >/dev/null 2>&1 || fail "pkg-config not found (apt-get install pkg-config)"
  mkdir -p "$dir"
  local version cflags libs
  version="$(PKG_CONFIG_LIBDIR="$pcdir" pkg-config --modversion singleflight)" ||
    fail "pkg-config: singleflight not found in $pcdir"
  [ "$version" = "$(project_version)" ] ||
    fail "pkg-config: singleflight.pc says version $version, version.hpp $(project_version)"
  cflags="$(PKG_CONFIG_LIBDIR="$pcdir" pkg-config --cflags singleflight)"
  libs="$(PKG_CONFIG_LIBDIR="$pcdir" pkg-config --libs singleflight)"
  case " $cflags " in *" -std=c++20 "*) ;; *) fail "pkg-config: no -std=c++20 in Cflags: $cflags" ;; esac
  case " $cflags " in *" -pthread "*) ;; *) fail "pkg-config: no -pthread in Cflags: $cflags" ;; esac
  case " $libs " in *" -pthread "*) ;; *) fail "pkg-config: no -pthread in Libs: $libs" ;; esac
  log "  pkg-config --cflags --libs singleflight: $cflags $libs"
  # The README's command line (with this build's compiler), plus strict warnings: the headers
  # come in with -I here, not as SYSTEM includes.
  (
    export PKG_CONFIG_LIBDIR="$pcdir"
    # shellcheck disable=SC2046  # word splitting of pkg-config's output is intended
    run "$dir/build.log" "$cxx" -Wall -Wextra -Wpedantic -Werror -DSF_CONSUME='"pkg-config"' \
      $(pkg-config --cflags singleflight) "$consumer/main.cpp" $(pkg-config --libs singleflight) \
      -o "$dir/consumer"
  )
  local out
  out="$("$dir/consumer")" || fail "pkg-config: the consumer program failed: $out"
  log "  $out"
}

# build_consumer <dir> <mode> <expect-regex> [cmake args...]: configure the consumer (a copy
# of tests/package/consumer in <dir>/src), check where singleflight came from, build and run.
build_consumer() {
  local dir="$1" mode="$2" expect="$3"
  shift 3
  mkdir -p "$dir"
  cp -R "$consumer" "$dir/src"
  if [ "$mode" = add_subdirectory ]; then
    mkdir -p "$dir/src/third_party"
    ln -s "$src" "$dir/src/third_party/singleflight"
  fi
  run "$dir/configure.log" cmake -S "$dir/src" -B "$dir/build" "${common[@]}" \
    -DCMAKE_BUILD_TYPE="$build_type" -DSF_CONSUME="$mode" "$@"
  grep -E "$expect" "$dir/configure.log" >/dev/null ||
    fail "$mode: expected /$expect/ in the configure log:
$(grep 'consumer:' "$dir/configure.log" || cat "$dir/configure.log")"
  log "  $(grep -o 'consumer: .*' "$dir/configure.log")"
  if grep -E '^(Catch2|benchmark)_DIR:PATH=/' "$dir/build/CMakeCache.txt" >/dev/null; then
    fail "$mode: the consumer's configure found Catch2 or benchmark"
  fi
  run "$dir/build.log" cmake --build "$dir/build"
  local out
  out="$("$dir/build/consumer")" || fail "$mode: the consumer program failed: $out"
  log "  $out"
  # Where prometheus-cpp is installed (CI installs Debian's prometheus-cpp-dev), every way of
  # taking singleflight must also define singleflight::prometheus.
  if [ -f /usr/include/prometheus/collectable.h ]; then
    grep -q 'consumer: singleflight::prometheus available' "$dir/configure.log" ||
      fail "$mode: prometheus-cpp is installed but singleflight::prometheus is not defined"
    out="$("$dir/build/consumer_prometheus")" ||
      fail "$mode: the consumer's Prometheus program failed: $out"
    log "  $out"
  fi
  # Where standalone Asio is installed (CI installs Debian's libasio-dev), likewise
  # singleflight::asio.
  if [ -f /usr/include/asio.hpp ]; then
    grep -q 'consumer: singleflight::asio available' "$dir/configure.log" ||
      fail "$mode: Asio is installed but singleflight::asio is not defined"
    out="$("$dir/build/consumer_asio")" || fail "$mode: the consumer's Asio program failed: $out"
    log "  $out"
  fi
  # From a source tree (add_subdirectory, FetchContent of the checkout) singleflight::compiled
  # exists too, and the same program linked against it (compiled mode) must work; an installed
  # package has no such target.
  if grep -q 'consumer: singleflight::compiled available' "$dir/configure.log"; then
    out="$("$dir/build/consumer_compiled")" ||
      fail "$mode: the consumer's compiled-mode program failed: $out"
    log "  compiled mode: $out"
  elif grep -q 'built from the source tree' "$dir/configure.log"; then
    fail "$mode: singleflight::compiled is not defined from the source tree"
  fi
}

re_quote() { printf '%s' "$1" | sed 's/[][\.*^$(){}+?|/]/\\&/g'; }

mode_include() {
  local d="$work/include"
  mkdir -p "$d"
  # The README's command line, with this build's compiler.
  run "$d/build.log" "$cxx" -std=c++20 -I "$src/include" "$consumer/main.cpp" -pthread \
    -o "$d/consumer"
  local out
  out="$("$d/consumer")" || fail "include: the consumer program failed: $out"
  log "  $out"
}

mode_find_package() {
  local d="$work/find_package" prefix="$work/find_package/prefix"
  install_project "$d" "$prefix" "${lib_only[@]}" -DCMAKE_BUILD_TYPE="$build_type"
  check_install_tree "$prefix"
  build_consumer "$d/consumer" find_package \
    "consumer: .* imported by find_package from $(re_quote "$prefix")/share/singleflight$" \
    -DCMAKE_PREFIX_PATH="$prefix"
}

mode_fetchcontent() {
  # No CMAKE_PREFIX_PATH and no registries: FIND_PACKAGE_ARGS' find_package finds nothing
  # (unless singleflight is installed in a system prefix, which this machine must not have),
  # and FetchContent takes the local sources the snippet names. Nothing else is set: the
  # snippet must work as written (it has no download method, so nothing can be downloaded).
  build_consumer "$work/fetchcontent" fetchcontent \
    "consumer: .* built from the source tree $(re_quote "$src")$" \
    -DSINGLEFLIGHT_PATH="$src"
  # FETCHCONTENT_SOURCE_DIR_SINGLEFLIGHT overrides the declared sources (and skips
  # find_package, as documented), fully disconnected.
  build_consumer "$work/fetchcontent-override" fetchcontent \
    "consumer: .* built from the source tree $(re_quote "$src")$" \
    -DSINGLEFLIGHT_PATH="$work/no-such-dir" -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_SINGLEFLIGHT="$src"
}

mode_fetchcontent_installed() {
  local d="$work/fetchcontent-installed" prefix="$work/fetchcontent-installed/prefix"
  install_project "$d" "$prefix" "${lib_only[@]}" -DCMAKE_BUILD_TYPE="$build_type"
  # No FETCHCONTENT_SOURCE_DIR_SINGLEFLIGHT here: when set, FetchContent skips find_package
  # (documented). The declared SOURCE_DIR does not exist, so the configure only succeeds if
  # FIND_PACKAGE_ARGS' find_package takes the installed copy.
  build_consumer "$d/consumer" fetchcontent \
    "consumer: .* imported by find_package from $(re_quote "$prefix")/share/singleflight$" \
    -DSINGLEFLIGHT_PATH="$work/no-such-dir" -DCMAKE_PREFIX_PATH="$prefix"
}

mode_add_subdirectory() {
  build_consumer "$work/add_subdirectory" add_subdirectory \
    "consumer: .* built from the source tree .*/src/third_party/singleflight$"
}

mode_pkg_config() {
  local d="$work/pkg-config" prefix="$work/pkg-config/prefix"
  install_project "$d" "$prefix" "${lib_only[@]}" -DCMAKE_BUILD_TYPE="$build_type"
  check_install_tree "$prefix"
  pkg_config_consumer "$d/consumer" "$prefix/share/pkgconfig"
  # Moved elsewhere, the same .pc still points at its own tree.
  mv "$prefix" "$d/moved"
  pkg_config_consumer "$d/consumer-moved" "$d/moved/share/pkgconfig"
  log "  relocated: $d/moved"
}

mode_vcpkg() {
  local d="$work/vcpkg" portdir="$src/ports/singleflight"
  # The port's own options, read from the portfile so that this cannot drift from it.
  local port_opts=()
  mapfile -t port_opts < <(sed -n '/vcpkg_cmake_configure(/,/)/p' "$portdir/portfile.cmake" |
    grep -oE -- '-D[A-Za-z0-9_]+(:[A-Z]+)?=[^ )"]+')
  [ "${#port_opts[@]}" -gt 0 ] || fail "vcpkg: no -D options found in the portfile"
  log "  portfile options: ${port_opts[*]}"
  # The port's version must be the project's (include/singleflight/version.hpp).
  local v_hpp v_json
  v_hpp="$(project_version)"
  v_json="$(sed -nE 's/^ *"version(-semver|-string)?" *: *"([^"]+)".*/\2/p' "$portdir/vcpkg.json")"
  [ "$v_hpp" = "$v_json" ] || fail "vcpkg.json version $v_json != version.hpp $v_hpp"

  # What vcpkg_cmake_configure passes for a release-only (VCPKG_BUILD_TYPE release) port on
  # Linux, besides the toolchain file: then vcpkg_cmake_install (build target install).
  local pkgs="$d/packages/singleflight_x64-linux"
  mkdir -p "$d"
  run "$d/lib-configure.log" cmake -S "$src" -B "$d/x64-linux-rel" "${common[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$pkgs" \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON "${port_opts[@]}" \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
    -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON \
    -DCMAKE_INSTALL_SYSTEM_RUNTIME_LIBS_SKIP=TRUE -DCMAKE_VERBOSE_MAKEFILE=ON \
    -DCMAKE_ERROR_ON_ABSOLUTE_INSTALL_DESTINATION=ON \
    -DCMAKE_INSTALL_LIBDIR:STRING=lib -DCMAKE_INSTALL_BINDIR:STRING=bin
  run "$d/lib-install.log" cmake --build "$d/x64-linux-rel" --target install
  # vcpkg_cmake_config_fixup(CONFIG_PATH share/singleflight): the config must already be
  # there (a release-only port has no debug/ tree to merge).
  [ -f "$pkgs/share/singleflight/singleflight-config.cmake" ] ||
    fail "vcpkg: no share/singleflight/singleflight-config.cmake for vcpkg_cmake_config_fixup"
  [ ! -d "$pkgs/debug" ] || fail "vcpkg: a release-only port must not install debug/"
  check_install_tree "$pkgs"
  # The rest of the portfile: usage and copyright (vcpkg_install_copyright).
  cp "$portdir/usage" "$pkgs/share/singleflight/usage"
  cp "$src/LICENSE" "$pkgs/share/singleflight/copyright"
  # vcpkg moves the package into installed/<triplet>: the package files must be relocatable.
  local installed="$d/installed/x64-linux"
  mkdir -p "$installed"
  cp -R "$pkgs/." "$installed/"
  rm -rf "$d/packages" "$d/x64-linux-rel"
  build_consumer "$d/consumer" find_package \
    "consumer: .* imported by find_package from $(re_quote "$installed")/share/singleflight$" \
    -DCMAKE_PREFIX_PATH="$installed"
  # vcpkg_fixup_pkgconfig: a consumer using pkg-config with the installed tree's share/pkgconfig.
  pkg_config_consumer "$d/consumer-pkg-config" "$installed/share/pkgconfig"
  # The usage file's snippet is the one the consumer just used.
  grep -qF 'find_package(singleflight CONFIG REQUIRED)' "$portdir/usage" ||
    fail "vcpkg: usage does not show find_package(singleflight CONFIG REQUIRED)"
  grep -qF 'target_link_libraries(main PRIVATE singleflight::singleflight)' "$portdir/usage" ||
    fail "vcpkg: usage does not show target_link_libraries(... singleflight::singleflight)"
}

log "source: $src"
log "compiler: $cxx; generator: ${generator:-default}; build type: $build_type; work: $work"
for mode in "${modes[@]}"; do
  start=$SECONDS
  log "$mode"
  case "$mode" in
    include) mode_include ;;
    find_package) mode_find_package ;;
    fetchcontent) mode_fetchcontent ;;
    fetchcontent-installed) mode_fetchcontent_installed ;;
    add_subdirectory) mode_add_subdirectory ;;
    pkg-config) mode_pkg_config ;;
    vcpkg) mode_vcpkg ;;
    *) fail "unknown mode $mode" ;;
  esac
  log "  ok ($((SECONDS - start))s)"
done
log "all consumers built and ran: ${modes[*]}"
