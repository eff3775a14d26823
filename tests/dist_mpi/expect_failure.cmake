# Runs CMD (its arguments separated by '|') and passes when it exits non-zero
# within MAX_SECONDS with output matching REGEX: a fault must end the job with a
# message, never hang it.
#   cmake -DCMD="mpirun|-np|2|prog|hang" -DREGEX="..." -DMAX_SECONDS=40 -P expect_failure.cmake
string(REPLACE "|" ";" cmd "${CMD}")
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${MAX_SECONDS})
string(TIMESTAMP t1 "%s")
math(EXPR dt "${t1} - ${t0}")
message("${out}${err}")
if(rc MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "still running after ${MAX_SECONDS} s (${rc}): the job hangs")
endif()
if(rc STREQUAL "0")
  message(FATAL_ERROR "exited with 0 although a rank stopped")
endif()
if(NOT "${out}${err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "exit status ${rc}, but the output does not match '${REGEX}'")
endif()
message(STATUS "ended with status ${rc} after ${dt} s, as expected")
