# Script (cmake -P) run after a Catch2 test executable is built; see singleflight-catch.cmake.
# Inputs: TEST_EXECUTABLE TEST_WORKING_DIR TEST_PREFIX TEST_TIMEOUT TEST_SLOW_TIMEOUT
#         TEST_LABELS (","-separated) TEST_SKIP_RETURN_CODE (may be empty) CATCH_VERSION_MAJOR
#         CTEST_FILE TEST_FIXTURES (","-separated FIXTURES_REQUIRED, may be empty)
# Output: CTEST_FILE, a ctest script with one add_test per visible test case.
cmake_minimum_required(VERSION 3.24)

if(NOT EXISTS "${TEST_EXECUTABLE}")
  message(FATAL_ERROR "Test executable '${TEST_EXECUTABLE}' does not exist")
endif()

# _sf_list_tests(<out-var> <check> [<test spec>]): the names of the (visible) test cases
# matching the spec, one list element per name. Splits on newlines by hand so that a ";" in a
# name survives. With <check> TRUE, a failing listing stops the build.
function(_sf_list_tests out_var check)
  if(CATCH_VERSION_MAJOR GREATER_EQUAL 3)
    set(list_args --list-tests --verbosity quiet)
  else()
    set(list_args --list-test-names-only)
  endif()
  execute_process(
    COMMAND "${TEST_EXECUTABLE}" ${ARGN} ${list_args}
    WORKING_DIRECTORY "${TEST_WORKING_DIR}"
    OUTPUT_VARIABLE output
    ERROR_VARIABLE error
    RESULT_VARIABLE result)
  # Catch2 v2 exits with the number of listed tests, v3 with 0; anything else (a signal name,
  # a failure to start) means the executable is broken.
  if(check AND (NOT result MATCHES "^[0-9]+$"
                OR (CATCH_VERSION_MAJOR GREATER_EQUAL 3 AND NOT result EQUAL 0)))
    message(FATAL_ERROR "Listing the tests of '${TEST_EXECUTABLE}' failed (${result}):\n"
                        "${output}\n${error}")
  endif()
  set(names "")
  string(REPLACE "\r" "" output "${output}")
  while(NOT output STREQUAL "")
    string(FIND "${output}" "\n" eol)
    if(eol EQUAL -1)
      set(line "${output}")
      set(output "")
    else()
      string(SUBSTRING "${output}" 0 ${eol} line)
      math(EXPR next "${eol} + 1")
      string(SUBSTRING "${output}" ${next} -1 output)
    endif()
    if(NOT line STREQUAL "")
      string(REPLACE ";" "\\;" line "${line}")
      list(APPEND names "${line}")
    endif()
  endwhile()
  set(${out_var} "${names}" PARENT_SCOPE)
endfunction()

_sf_list_tests(all_tests TRUE)
# Not checked: the full listing above already proved the executable works, and a spec that
# matches nothing must not fail the build whatever exit status a Catch2 version gives it.
_sf_list_tests(slow_tests FALSE "[slow]")

string(REPLACE "," ";" labels "${TEST_LABELS}")
set(script "")
foreach(name IN LISTS all_tests)
  # A Catch2 test spec treats \ , [ ] specially: escape them to select exactly this test.
  set(spec "${name}")
  foreach(char IN ITEMS "\\" "," "[" "]")
    string(REPLACE "${char}" "\\${char}" spec "${spec}")
  endforeach()
  # Catch2 v2 lists a name that starts with "#" in quotes; the quoted form is a valid spec.
  set(test_name "${name}")
  if(name MATCHES "^\"(#.*)\"$")
    set(test_name "${CMAKE_MATCH_1}")
  endif()
  set(test_labels "${labels}")
  set(extra "")
  if(NOT TEST_SKIP_RETURN_CODE STREQUAL "")
    string(APPEND extra " SKIP_RETURN_CODE ${TEST_SKIP_RETURN_CODE}")
  endif()
  if(NOT "${TEST_FIXTURES}" STREQUAL "")
    string(REPLACE "," ";" fixtures "${TEST_FIXTURES}")
    string(APPEND extra " FIXTURES_REQUIRED [==[${fixtures}]==]")
  endif()
  # Only names that also appear in the full list count: junk lines in the [slow] listing
  # (e.g. a "no test cases matched" message) can never match one.
  if(name IN_LIST slow_tests)
    list(APPEND test_labels slow)
    set(timeout "${TEST_SLOW_TIMEOUT}")
    string(APPEND extra " RUN_SERIAL TRUE")
  else()
    set(timeout "${TEST_TIMEOUT}")
  endif()
  string(APPEND script
         "add_test([==[${TEST_PREFIX}${test_name}]==] [==[${TEST_EXECUTABLE}]==] [==[${spec}]==]"
         " --warn NoTests)\n"
         "set_tests_properties([==[${TEST_PREFIX}${test_name}]==] PROPERTIES"
         " WORKING_DIRECTORY [==[${TEST_WORKING_DIR}]==] TIMEOUT ${timeout}"
         " LABELS [==[${test_labels}]==]${extra})\n")
endforeach()

if(all_tests STREQUAL "")
  # ctest's noTestsAction catches an empty project; an empty executable is worth a line too.
  message(WARNING "Test executable '${TEST_EXECUTABLE}' has no visible test cases")
endif()

file(WRITE "${CTEST_FILE}" "${script}")
