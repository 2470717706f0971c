#!/usr/bin/env bash
# package.fleet: the optional singleflight::fleet target as a user meets it, offline.
#   1. install the project (library only) and build tests/package/fleet_consumer with
#      find_package(singleflight CONFIG REQUIRED COMPONENTS fleet): the installed package config
#      recreates singleflight::fleet from hiredis (its CMake package or pkg-config); run it;
#   2. configure the consumer where hiredis cannot be found (pkg-config and hiredis' package
#      disabled): the core package loads, singleflight::fleet does not exist, COMPONENTS fleet
#      is not satisfied;
#   3. configure the project with SINGLEFLIGHT_FLEET=ON where hiredis cannot be found: it must
#      fail, naming hiredis.
# Usage: tests/package/fleet.sh [--cxx <compiler>] [--generator <generator>]
#                               [--make-program <path>] [--keep]
set -euo pipefail

here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
src="$(cd "$here/../.." && pwd)"

cxx="${CXX:-c++}"
generator=""
make_program=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cxx) cxx="$2"; shift 2 ;;
    --generator) generator="$2"; shift 2 ;;
    --make-program) make_program="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "fleet.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$generator" ] && command -v ninja >/dev/null 2>&1; then generator=Ninja; fi

work="$(mktemp -d "${TMPDIR:-/tmp}/singleflight-fleet-package.XXXXXX")"
cleanup() {
  if [ "$keep" -eq 1 ]; then echo "fleet.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
unset CMAKE_PREFIX_PATH CMAKE_GENERATOR CMAKE_BUILD_TYPE CMAKE_TOOLCHAIN_FILE CXXFLAGS LDFLAGS \
  CMAKE_INSTALL_PREFIX singleflight_DIR singleflight_ROOT SINGLEFLIGHT_ROOT || true

common=(
  -DCMAKE_CXX_COMPILER="$cxx"
  -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON
  -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
  -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON
)
[ -z "$generator" ] || common+=(-G "$generator")
[ -z "$make_program" ] || common+=(-DCMAKE_MAKE_PROGRAM="$make_program")
lib_only=(-DSINGLEFLIGHT_BUILD_TESTS=OFF -DSINGLEFLIGHT_BUILD_EXAMPLES=OFF
  -DSINGLEFLIGHT_BUILD_BENCHMARKS=OFF)
no_hiredis=(-DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=ON)

log() { printf '[package.fleet] %s\n' "$*"; }
fail() {
  printf '[package.fleet] FAIL: %s\n' "$*" >&2
  exit 1
}
run() {
  local logfile="$1"
  shift
  if ! "$@" >"$logfile" 2>&1; then
    cat "$logfile" >&2
    fail "$* (log above)"
  fi
}

prefix="$work/prefix"
log "install (library only) into $prefix"
run "$work/lib-configure.log" cmake -S "$src" -B "$work/lib-build" "${common[@]}" "${lib_only[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix"
run "$work/lib-build.log" cmake --build "$work/lib-build"
run "$work/lib-install.log" cmake --install "$work/lib-build"
[ -f "$prefix/include/singleflight/fleet.hpp" ] || fail "fleet.hpp was not installed"

log "1. find_package(singleflight COMPONENTS fleet) with hiredis"
run "$work/c1-configure.log" cmake -S "$here/fleet_consumer" -B "$work/c1" "${common[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix"
grep -q "fleet consumer: singleflight::fleet imported from $prefix/share/singleflight" \
  "$work/c1-configure.log" || fail "singleflight::fleet did not come from the install"
run "$work/c1-build.log" cmake --build "$work/c1"
out="$("$work/c1/fleet_consumer")" || fail "the fleet consumer failed: $out"
log "  $out"

log "2. the same package where hiredis cannot be found"
run "$work/c2-configure.log" cmake -S "$here/fleet_consumer" -B "$work/c2" "${common[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DSF_EXPECT_FLEET=OFF "${no_hiredis[@]}"
log "  $(grep -o 'fleet consumer: .*' "$work/c2-configure.log")"

log "3. SINGLEFLIGHT_FLEET=ON where hiredis cannot be found fails loudly"
if cmake -S "$src" -B "$work/on" "${common[@]}" "${lib_only[@]}" -DSINGLEFLIGHT_FLEET=ON \
  "${no_hiredis[@]}" >"$work/on.log" 2>&1; then
  cat "$work/on.log" >&2
  fail "SINGLEFLIGHT_FLEET=ON configured without hiredis"
fi
grep -q "SINGLEFLIGHT_FLEET=ON, but hiredis was found neither" "$work/on.log" ||
  { cat "$work/on.log" >&2; fail "the failure does not say what is missing"; }
log "  failed as it should"
log "all passed"
