# ctest -P script: bench-serve's prefix-caching workloads. `--workload W
# --prefix-caching on|off --quick --json OUT` completes; with caching off no
# prompt token hits, with it on the shared system prompts (shared-prefix) or
# the resent history (multi-turn) mostly do.
#   cmake -DPAGEDATTN=path/to/pagedattn -DWORKLOAD=shared-prefix|multi-turn
#         -DOUT=file.json -P check_bench_serve_prefix.cmake
function(run_json caching)
  execute_process(COMMAND ${PAGEDATTN} bench-serve --quick --workload ${WORKLOAD}
                          --prefix-caching ${caching} --json ${OUT}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "bench-serve --workload ${WORKLOAD} --prefix-caching ${caching} exited with ${rc}:\n${out}")
  endif()
  file(READ ${OUT} doc)
  set(doc "${doc}" PARENT_SCOPE)
endfunction()

function(summary_value key var)
  string(JSON value ERROR_VARIABLE error GET "${doc}" summary ${key})
  if(error)
    message(FATAL_ERROR "summary.${key}: ${error}")
  endif()
  set(${var} ${value} PARENT_SCOPE)
endfunction()

if(WORKLOAD STREQUAL "multi-turn")
  set(base history_tokens)
else()
  set(base shared_prefix_tokens)
endif()

run_json(off)
summary_value(prefix_hit_tokens hits)
summary_value(completed_requests done)
if(NOT hits EQUAL 0 OR done LESS 40)
  message(FATAL_ERROR "caching off: ${hits} hit tokens (expected 0), ${done} of 40 requests completed")
endif()

run_json(on)
summary_value(prefix_hit_tokens hits)
summary_value(${base} total)
summary_value(completed_requests done)
math(EXPR percent "100 * ${hits} / ${total}")
if(percent LESS 50 OR done LESS 40)
  message(FATAL_ERROR "caching on: ${hits} hit tokens of ${total} ${base} (${percent}%, expected >= 50%), "
                      "${done} of 40 requests completed")
endif()
message(STATUS "bench-serve ${WORKLOAD}: ${percent}% of the ${base} hit with caching on")
