# singleflight_catch_discover_tests(<target>
#     [PREFIX <prefix>] [TIMEOUT <seconds>] [SLOW_TIMEOUT <seconds>] [LABELS <label>...]
#     [SKIP_RETURN_CODE <code>] [FIXTURES <fixture>...])
#
# Registers every TEST_CASE of a Catch2 (v2 or v3) test executable as its own ctest test,
# named <prefix><test case name>. Like Catch2's catch_discover_tests(), the executable is asked
# for its test names after each build (a POST_BUILD step), and ctest includes the result.
#
# Unlike catch_discover_tests(), properties depend on the test case's tags, from one
# discovery step that works the same with Catch2 v2 and v3:
#   every test:               TIMEOUT <TIMEOUT>, LABELS <LABELS>
#   test cases tagged [slow]: TIMEOUT <SLOW_TIMEOUT>, RUN_SERIAL, and the extra label "slow"
#   with SKIP_RETURN_CODE:    a test case that exits with <code> is reported as skipped (ctest's
#                             SKIP_RETURN_CODE; Catch2 v2 has no skip of its own: the tests that
#                             need a Redis server exit with it when none is configured)
#   with FIXTURES:            FIXTURES_REQUIRED <FIXTURES> (the fleet tests' redis-server)
# Hidden test cases ([.] or [!hide]) are not registered, as Catch2 does not list them.
#
# Requires Catch2_VERSION_MAJOR (set by find_package(Catch2)).
include_guard(GLOBAL)

set(_SINGLEFLIGHT_CATCH_ADD_TESTS_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/singleflight-catch-add-tests.cmake")

function(singleflight_catch_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PREFIX;TIMEOUT;SLOW_TIMEOUT;SKIP_RETURN_CODE"
                        "LABELS;FIXTURES")
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()
  if(NOT arg_SLOW_TIMEOUT)
    set(arg_SLOW_TIMEOUT 600)
  endif()
  if(NOT Catch2_VERSION_MAJOR)
    message(FATAL_ERROR "singleflight_catch_discover_tests: call find_package(Catch2) first")
  endif()

  set(tests_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake")
  # Labels travel as one ","-separated argument: a ";" would split the command line.
  list(JOIN arg_LABELS "," labels)
  list(JOIN arg_FIXTURES "," fixtures)

  add_custom_command(
    TARGET ${target}
    POST_BUILD
    BYPRODUCTS "${tests_file}"
    COMMAND
      "${CMAKE_COMMAND}" -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>"
      -D "TEST_WORKING_DIR=${CMAKE_CURRENT_BINARY_DIR}" -D "TEST_PREFIX=${arg_PREFIX}"
      -D "TEST_TIMEOUT=${arg_TIMEOUT}" -D "TEST_SLOW_TIMEOUT=${arg_SLOW_TIMEOUT}"
      -D "TEST_LABELS=${labels}" -D "TEST_SKIP_RETURN_CODE=${arg_SKIP_RETURN_CODE}"
      -D "TEST_FIXTURES=${fixtures}"
      -D "CATCH_VERSION_MAJOR=${Catch2_VERSION_MAJOR}"
      -D "CTEST_FILE=${tests_file}" -P "${_SINGLEFLIGHT_CATCH_ADD_TESTS_SCRIPT}"
    COMMENT "Listing the Catch2 test cases of ${target}"
    VERBATIM)

  # Until the executable is built, ctest sees one failing placeholder instead of nothing.
  file(WRITE "${include_file}"
       "if(EXISTS \"${tests_file}\")\n"
       "  include(\"${tests_file}\")\n"
       "else()\n"
       "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
