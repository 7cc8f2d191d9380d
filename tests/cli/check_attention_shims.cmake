# ctest -P script: `pagedattn bench-attention --shims` loads two copies of
# this build's kernel shim side by side, checks each against the reference
# and times them in turn; it refuses a library that is not a shim.
#   cmake -DPAGEDATTN=path/to/pagedattn -DSHIM=path/to/libpagedattn_kernel_shim.so
#         -DWORK=scratch/dir -P check_attention_shims.cmake
file(MAKE_DIRECTORY ${WORK}/a ${WORK}/b)
# Two files: dlopen would hand back the first copy for a second path to the same file.
file(COPY ${SHIM} DESTINATION ${WORK}/a)
file(COPY ${SHIM} DESTINATION ${WORK}/b)
get_filename_component(name ${SHIM} NAME)
set(a ${WORK}/a/${name})
set(b ${WORK}/b/${name})

execute_process(COMMAND ${PAGEDATTN} bench-attention --batch 2 --kv-len 90 --heads 8x2 --seconds 0.05
                        --no-probe --shims ${a},${b}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--shims exited with ${rc}:\n${out}\n${err}")
endif()
foreach(pattern "shim 0: max [^\n]*\\(ok\\)" "shim 1: max [^\n]*\\(ok\\)"
                "alternating 2 builds call by call, [0-9]+ rounds"
                "shim 1 \\([^\n]*\\): median [0-9.]+ ms; speed-up over shim 0: median [0-9.]+")
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "--shims: no line matching '${pattern}' in:\n${out}")
  endif()
endforeach()

# Not a shim: this program itself has none of the shim's symbols.
execute_process(COMMAND ${PAGEDATTN} bench-attention --kv-len 40 --no-probe --shims ${a},${PAGEDATTN}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "cannot load|has no symbol pagedattn_shim_layout")
  message(FATAL_ERROR "--shims accepted a program that is not a shim (exit ${rc}):\n${out}\n${err}")
endif()
