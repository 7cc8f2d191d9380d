# pagedattn_highway_unrunnable_targets(<out_var>): the Highway targets compiled
# by default that the build machine cannot run, as an HWY_DISABLED_TARGETS mask
# (0 when it runs them all). The static target is never in it.
function(pagedattn_highway_unrunnable_targets out_var)
  try_run(run_result compile_result
          SOURCES ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/highway_unrunnable_targets.cc
          NO_CACHE
          CXX_STANDARD 20
          LINK_LIBRARIES hwy::hwy
          COMPILE_OUTPUT_VARIABLE compile_output
          RUN_OUTPUT_VARIABLE run_output)
  if(NOT compile_result OR NOT run_result EQUAL 0)
    message(FATAL_ERROR "could not find this machine's Highway targets:\n${compile_output}")
  endif()
  string(STRIP "${run_output}" run_output)
  message(STATUS "Highway targets this machine cannot run (not compiled): mask ${run_output}")
  set(${out_var} ${run_output} PARENT_SCOPE)
endfunction()
