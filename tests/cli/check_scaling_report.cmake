# ctest -P script: bench/scaling.sh over 1 and 2 threads (CI-sized runs)
# prints the report with the roofline columns, a row per thread count, and
# passes its own --check (every figure positive, no decode step above
# MAX_FRACTION of its roofline).
#   cmake -DSCRIPT=bench/scaling.sh -DPAGEDATTN=path/to/pagedattn -DPYTHON=python3
#         -DOUT=folder -DMAX_FRACTION=3 -P check_scaling_report.cmake
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env PYTHON=${PYTHON}
          bash ${SCRIPT} --pagedattn ${PAGEDATTN} --quick --model tiny --threads 1,2
          --out ${OUT} --check ${MAX_FRACTION}
  RESULT_VARIABLE rc OUTPUT_VARIABLE report ERROR_VARIABLE log)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench/scaling.sh exited with ${rc}:\n${report}\n${log}")
endif()
foreach(column "read probe GB/s" "memory bound ms" "FMA probe GFLOP/s" "compute bound ms"
               "of roofline" "attention % of read probe")
  string(FIND "${report}" "| ${column} |" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the report has no '${column}' column:\n${report}")
  endif()
endforeach()
# Two CPUs or more run both counts; a one-CPU machine skips 2 (with a note).
cmake_host_system_information(RESULT cpus QUERY NUMBER_OF_LOGICAL_CORES)
set(expected 1)
if(cpus GREATER 1)
  list(APPEND expected 2)
endif()
foreach(threads IN LISTS expected)
  if(NOT report MATCHES "\n\\| ${threads} \\| [0-9.]+ \\|")
    message(FATAL_ERROR "the report has no row for ${threads} threads:\n${report}")
  endif()
endforeach()
message(STATUS "bench/scaling.sh: report with roofline columns for threads ${expected}")
