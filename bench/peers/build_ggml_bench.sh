#!/usr/bin/env bash
# Builds ggml_attention_bench.cc against a llama.cpp source tree's ggml
# headers and a CMake build of its ggml libraries (see README.md here for
# getting and building them; this script downloads nothing).
#
#   bench/peers/build_ggml_bench.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD [OUT]
#
# LLAMA_CPP_SRC: the llama.cpp tree (e.g. the sdist's vendor/llama.cpp);
# LLAMA_CPP_BUILD: its CMake build directory holding libggml*.so;
# OUT: the program to write (default build/peers/ggml_attention_bench).
# The program finds the libraries through an rpath: no LD_LIBRARY_PATH.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 LLAMA_CPP_SRC LLAMA_CPP_BUILD [OUT]" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${3:-$(cd "$here/../.." && pwd)/build/peers/ggml_attention_bench}
include_dir=$src/ggml/include
[[ -f $include_dir/ggml.h ]] || { echo "no $include_dir/ggml.h: LLAMA_CPP_SRC is not a llama.cpp tree" >&2; exit 2; }

# The directories holding libggml.so, libggml-base.so and libggml-cpu.so
# (bin/ with llama.cpp's default output layout, ggml/src/ otherwise).
lib_dirs=()
for lib in libggml.so libggml-base.so libggml-cpu.so; do
  found=$(find "$build" -name "$lib" -print -quit)
  [[ -n $found ]] || { echo "no $lib under $build: build the ggml, ggml-base and ggml-cpu targets" >&2; exit 2; }
  dir=$(dirname "$found")
  [[ " ${lib_dirs[*]-} " == *" $dir "* ]] || lib_dirs+=("$dir")
done
link_flags=()
for dir in "${lib_dirs[@]}"; do link_flags+=("-L$dir" "-Wl,-rpath,$dir"); done

mkdir -p "$(dirname "$out")"
g++ -std=c++20 -O2 -march=native -Wall -Wextra -I"$include_dir" -I"$here/../../perf" "$here/ggml_attention_bench.cc" \
  "${link_flags[@]}" -lggml -lggml-cpu -lggml-base -o "$out"
echo "built $out"
