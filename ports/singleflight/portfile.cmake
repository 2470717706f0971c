# singleflight is header-only: one release configuration, no debug tree, no binaries.
# tests/package/run.sh (ctest package.consumers) configures the project with the options below
# and installs it the same way, so a change here is tested there.
vcpkg_from_github(
    OUT_SOURCE_PATH SOURCE_PATH
    REPO owner/singleflight
    REF "v${VERSION}"
    # To be filled in at release: vcpkg prints the archive's SHA512 when this is 0.
    SHA512 0
    HEAD_REF main
)

set(VCPKG_BUILD_TYPE release)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DSINGLEFLIGHT_BUILD_TESTS=OFF
        -DSINGLEFLIGHT_BUILD_EXAMPLES=OFF
        -DSINGLEFLIGHT_BUILD_BENCHMARKS=OFF
)

vcpkg_cmake_install()

# The project installs its package files to share/singleflight already.
vcpkg_cmake_config_fixup(CONFIG_PATH share/singleflight)
# share/pkgconfig/singleflight.pc: already relocatable (prefix=${pcfiledir}/../..); vcpkg's
# fixup rewrites the prefix the same way and checks the file.
vcpkg_fixup_pkgconfig()

# Release-only build: nothing is installed under debug/, and a header-only library has no lib/.
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug" "${CURRENT_PACKAGES_DIR}/lib")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
