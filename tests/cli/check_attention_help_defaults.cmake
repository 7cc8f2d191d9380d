# ctest -P script: the defaults `pagedattn bench-attention --help` prints are
# the shape a run without options uses.
#   cmake -DPAGEDATTN=path/to/pagedattn -P check_attention_help_defaults.cmake
execute_process(COMMAND ${PAGEDATTN} bench-attention --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench-attention --help exited with ${rc}")
endif()

function(help_default var pattern)
  if(NOT help MATCHES "${pattern}")
    message(FATAL_ERROR "bench-attention --help: no default matching '${pattern}' in:\n${help}")
  endif()
  set(${var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
help_default(dtype "--kv-dtype T [^\n]*\\(default ([a-z0-9_]+)\\)")
help_default(batch "--batch N [^\n]*\\(default ([0-9]+)\\)")
help_default(kv_len "--kv-len N [^\n]*\\(default ([0-9]+)\\)")
help_default(heads "--heads QxK [^\n]*\\(default ([0-9]+x[0-9]+)\\)")
help_default(head_dim "--head-dim D [^\n]*\\(default ([0-9]+)\\)")
help_default(page "--page-size P [^\n]*\\(default ([0-9]+)\\)")

execute_process(COMMAND ${PAGEDATTN} bench-attention --no-probe --no-check --seconds 0.001
                OUTPUT_VARIABLE run RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench-attention without options exited with ${rc}")
endif()
set(expected "shape: ${dtype} KV, heads ${heads}, head_dim ${head_dim}, batch ${batch}, q_len 1, kv_len ${kv_len}, page ${page},")
string(FIND "${run}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "--help promises '${expected}' but a run without options printed:\n${run}")
endif()
message(STATUS "bench-attention --help defaults match the run: ${expected}")
