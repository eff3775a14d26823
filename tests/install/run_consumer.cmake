# The install_consumer test (cmake -P): installs the current build tree into a
# fresh prefix, then configures, builds and runs the project in consumer/
# against that install (find_package(kiln), kiln::kiln), the way a user would.
#
# Inputs (-D): KILN_SOURCE, KILN_BUILD (the kiln build tree), WORK (scratch
# directory, wiped), GENERATOR (CMake generator for the consumer).

foreach(var KILN_SOURCE KILN_BUILD WORK GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK}/prefix")
set(consumer_build "${WORK}/build")
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# Build the consumer with the compiler, build type and make program of the kiln
# build, so both sides agree (ABI, -fsanitize).
set(cache_args)
file(STRINGS "${KILN_BUILD}/CMakeCache.txt" cache_lines
     REGEX "^(CMAKE_CXX_COMPILER|CMAKE_BUILD_TYPE|CMAKE_MAKE_PROGRAM):[A-Z]+=")
foreach(line IN LISTS cache_lines)
  string(REGEX MATCH "^([A-Z_]+):[A-Z]+=(.*)$" _ "${line}")
  if(NOT "${CMAKE_MATCH_2}" STREQUAL "")
    list(APPEND cache_args "-D${CMAKE_MATCH_1}=${CMAKE_MATCH_2}")
  endif()
endforeach()

# Runs one step; on failure stops the test with the step's output.
function(step what)
  message(STATUS "install_consumer: ${what}")
  execute_process(COMMAND ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc STREQUAL "0")
    string(REPLACE ";" " " cmd "${ARGN}")
    # Plain message(): printed verbatim, unlike FATAL_ERROR's reflowed text.
    message("---- command: ${cmd}\n${out}----")
    message(FATAL_ERROR "install_consumer: ${what} FAILED (${rc}), output above")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("install ${KILN_BUILD} into ${prefix}"
     "${CMAKE_COMMAND}" --install "${KILN_BUILD}" --prefix "${prefix}")
file(GLOB_RECURSE config "${prefix}/*/kilnConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "install_consumer: no kilnConfig.cmake under ${prefix}")
endif()

step("configure consumer"
     "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${consumer_build}"
     -G "${GENERATOR}" ${cache_args}
     "-DCMAKE_PREFIX_PATH=${prefix}"
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
# The consumer must have found the fresh install, not some other kiln.
file(STRINGS "${consumer_build}/CMakeCache.txt" kiln_dir REGEX "^kiln_DIR:")
string(REGEX REPLACE "^kiln_DIR:[A-Z]+=" "" kiln_dir "${kiln_dir}")
cmake_path(IS_PREFIX prefix "${kiln_dir}" NORMALIZE found_ours)
if(NOT found_ours)
  message(FATAL_ERROR "install_consumer: consumer found kiln in '${kiln_dir}', "
                      "not in the install prefix ${prefix}")
endif()

step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}")
step("run consumer" "${consumer_build}/app")
message(STATUS "${step_output}")
message(STATUS "install_consumer: OK (kiln installed to ${prefix})")
