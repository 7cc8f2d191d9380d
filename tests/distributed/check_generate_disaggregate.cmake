# ctest -P script: `mpirun -np 2 pagedattn generate --disaggregate` prints the
# same text as `pagedattn generate` alone on the test model, and reports its
# KV transfer. Skipped (SKIPPED on stdout) without PAGEDATTN_TEST_MODEL.
#   cmake -DCLI=pagedattn -DMPIEXEC=mpiexec -P check_generate_disaggregate.cmake
if("$ENV{PAGEDATTN_TEST_MODEL}" STREQUAL "")
  message("SKIPPED: PAGEDATTN_TEST_MODEL is not set (scripts/get_test_model.sh)")
  return()
endif()
set(args generate --model $ENV{PAGEDATTN_TEST_MODEL} --chat --prompt "Name three colours."
    --max-tokens 24)
execute_process(COMMAND ${CLI} ${args} OUTPUT_VARIABLE alone RESULT_VARIABLE rc_alone)
execute_process(COMMAND ${MPIEXEC} -np 2 --oversubscribe ${CLI} ${args} --disaggregate
                OUTPUT_VARIABLE disaggregated ERROR_VARIABLE report RESULT_VARIABLE rc)
if(NOT rc_alone EQUAL 0 OR NOT rc EQUAL 0)
  message(FATAL_ERROR "generate exited ${rc_alone}, generate --disaggregate exited ${rc}:\n${report}")
endif()
if(NOT alone STREQUAL disaggregated)
  message(FATAL_ERROR "generate printed:\n${alone}\ngenerate --disaggregate printed:\n${disaggregated}")
endif()
if(NOT report MATCHES "disaggregated: prompt [0-9]+ tokens prefilled on rank 0.*KV pages [0-9.]+ MiB")
  message(FATAL_ERROR "no KV transfer report on stderr:\n${report}")
endif()
message(STATUS "generate --disaggregate printed the same text:\n${disaggregated}")
