# pagedattn_highway_sanitizer_disabled_targets(<out_var> [flags...]): the
# HWY_DISABLED_TARGETS mask of a sanitizer build compiled with `flags` (0 when
# it compiles every default target): the Highway targets this machine cannot
# run, and those whose vector width another compiled target already covers
# (cmake/highway_sanitizer_targets.cc says which).
function(pagedattn_highway_sanitizer_disabled_targets out_var)
  try_run(run_result compile_result
          SOURCES ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/highway_sanitizer_targets.cc
          NO_CACHE
          COMPILE_DEFINITIONS ${ARGN}
          CXX_STANDARD 20
          LINK_LIBRARIES hwy::hwy
          COMPILE_OUTPUT_VARIABLE compile_output
          RUN_OUTPUT_VARIABLE run_output)
  if(NOT compile_result OR NOT run_result EQUAL 0)
    message(FATAL_ERROR "could not find this machine's Highway targets:\n${compile_output}")
  endif()
  string(STRIP "${run_output}" run_output)
  message(STATUS "Highway targets left out of the sanitizer build: mask ${run_output}")
  set(${out_var} ${run_output} PARENT_SCOPE)
endfunction()
