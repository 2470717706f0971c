# Warnings and sanitizers for singleflight's own targets (tests, examples, benchmarks).
#
# Nothing here touches global flags: singleflight_strict() sets options on the one target it
# is given, so a project that consumes singleflight never inherits them.
#
#   SINGLEFLIGHT_SANITIZE  ""                   no sanitizer (default)
#                          "thread"             ThreadSanitizer
#                          "address,undefined"  AddressSanitizer (+LeakSanitizer) and UBSan
#                          (any -fsanitize= list the compiler accepts; thread excludes address)
#   SINGLEFLIGHT_WERROR    ON (default): warnings are errors.
include_guard(GLOBAL)

set(SINGLEFLIGHT_SANITIZE "" CACHE STRING
    "Sanitizers for singleflight's tests and examples: \"\", \"thread\" or \"address,undefined\"")
set_property(CACHE SINGLEFLIGHT_SANITIZE PROPERTY STRINGS "" "thread" "address,undefined")
option(SINGLEFLIGHT_WERROR "Treat warnings as errors in singleflight's tests and examples" ON)

if(SINGLEFLIGHT_SANITIZE)
  if(MSVC)
    message(FATAL_ERROR "SINGLEFLIGHT_SANITIZE is only supported with GCC and Clang")
  endif()
  if(NOT SINGLEFLIGHT_SANITIZE MATCHES "^[a-z-]+(,[a-z-]+)*$")
    message(FATAL_ERROR "SINGLEFLIGHT_SANITIZE='${SINGLEFLIGHT_SANITIZE}': expected a comma "
                        "separated list such as \"thread\" or \"address,undefined\"")
  endif()
  if(SINGLEFLIGHT_SANITIZE MATCHES "thread" AND SINGLEFLIGHT_SANITIZE MATCHES "address")
    message(FATAL_ERROR "SINGLEFLIGHT_SANITIZE: thread and address cannot be combined")
  endif()
endif()

# singleflight_strict(<target> [NO_SANITIZE])
#
# Strict warnings and standard C++ (no GNU extensions) on a project-owned target; unless NO_SANITIZE, also the sanitizers chosen by
# SINGLEFLIGHT_SANITIZE (compile and link options).
function(singleflight_strict target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_SANITIZE" "" "")

  # -std=c++20, not gnu++20: the library must not lean on compiler extensions.
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)

  if(MSVC)
    target_compile_options(${target} PRIVATE /W4 /permissive- $<$<BOOL:${SINGLEFLIGHT_WERROR}>:/WX>)
  else()
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow
                                             $<$<BOOL:${SINGLEFLIGHT_WERROR}>:-Werror>)
  endif()

  if(SINGLEFLIGHT_SANITIZE AND NOT arg_NO_SANITIZE)
    set(flags "-fsanitize=${SINGLEFLIGHT_SANITIZE}" -fno-omit-frame-pointer)
    if(SINGLEFLIGHT_SANITIZE MATCHES "undefined")
      # Make every UBSan finding fatal, whatever UBSAN_OPTIONS says.
      list(APPEND flags -fno-sanitize-recover=undefined)
    endif()
    target_compile_options(${target} PRIVATE ${flags})
    target_link_options(${target} PRIVATE "-fsanitize=${SINGLEFLIGHT_SANITIZE}")
  endif()
endfunction()
