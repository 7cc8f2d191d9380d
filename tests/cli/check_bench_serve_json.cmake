# ctest -P script: `pagedattn bench-serve --quick --json OUT` writes every
# figure as a JSON number (not a string), flags as booleans, and an
# unlimited request rate as null; the roofline's probe figures are null
# without --probes.
#   cmake -DPAGEDATTN=path/to/pagedattn -DOUT=file.json -P check_bench_serve_json.cmake
execute_process(COMMAND ${PAGEDATTN} bench-serve --quick --json ${OUT}
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench-serve --quick --json ${OUT} exited with ${rc}")
endif()
file(READ ${OUT} doc)

function(expect_type type)
  string(JSON actual ERROR_VARIABLE error TYPE "${doc}" ${ARGN})
  string(JOIN "." where ${ARGN})
  if(error)
    message(FATAL_ERROR "${where}: ${error}")
  elseif(NOT actual STREQUAL type)
    message(FATAL_ERROR "${where}: expected a JSON ${type}, found ${actual}")
  endif()
endfunction()

foreach(key requests kv_memory_mib page_size max_num_seqs max_num_batched_tokens seed)
  expect_type(NUMBER run ${key})
endforeach()
expect_type(STRING run model)
expect_type(NULL run request_rate)
expect_type(BOOLEAN run deterministic)
expect_type(BOOLEAN run chunked_prefill)
expect_type(BOOLEAN run int8_activations)
expect_type(NUMBER run int8_decode_rows)
expect_type(STRING run int8_tiles)
expect_type(STRING run attention_prefill_products)
expect_type(STRING run attention_decode_products)

# Every summary figure, every contiguous-replay figure, the first sample of
# every timeline and request column.
string(JSON count LENGTH "${doc}" summary)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON key MEMBER "${doc}" summary ${i})
  expect_type(NUMBER summary ${key})
endforeach()
foreach(key kv_efficiency peak_batch steps)
  expect_type(NUMBER contiguous 0 ${key})
endforeach()
foreach(section timeline requests)
  string(JSON count LENGTH "${doc}" ${section})
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON key MEMBER "${doc}" ${section} ${i})
    expect_type(NUMBER ${section} ${key} 0)
  endforeach()
endforeach()
# The roofline's model and decode-step figures; without --probes its bounds
# are null (the probes run only when asked: they take seconds).
foreach(key threads parameters weight_bytes expert_weight_bytes matmul_flops_per_token
            kv_bytes_per_token attention_flops_per_context_token decode_steps decode_step_s
            decode_tokens_per_step decode_context_tokens_per_step decode_step_bytes
            decode_step_flops)
  expect_type(NUMBER roofline ${key})
endforeach()
foreach(key read_gbps fma_gflops fma_isa probe_other_cores memory_bound_s compute_bound_s
            roofline_fraction)
  expect_type(NULL roofline ${key})
endforeach()
string(JSON steps GET "${doc}" roofline decode_steps)
string(JSON weight_bytes GET "${doc}" roofline weight_bytes)
if(steps LESS_EQUAL 0 OR weight_bytes LESS_EQUAL 0)
  message(FATAL_ERROR "roofline: decode_steps = ${steps}, weight_bytes = ${weight_bytes}: "
                      "expected both positive")
endif()
message(STATUS "bench-serve JSON: all figures are numbers")
