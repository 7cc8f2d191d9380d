#!/usr/bin/env bash
# Builds and tests the Python package in a virtual environment, build/pyenv:
#   scripts/test_python.sh              everything below; `pip install .` runs
#                                       its own Release build in build/python/
#   scripts/test_python.sh BUILD_DIR    `pip install .` reusing a configured
#                                       tree, then pytest, in the venv the two
#                                       calls below made (scripts/test.sh runs
#                                       them, then passes build/release)
#   scripts/test_python.sh env-build    only the venv and the build tools
#   scripts/test_python.sh env-test     only the test packages
# pytest runs from outside the source tree, so the installed package is what
# is imported.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
mode=${1:-all}

python=${PYTHON:-python3}
# No wheel cache: a fresh CI machine would keep a second copy of torch and its
# CUDA packages (several GB) in pip's wheel cache, and its disk can be small.
pip=(build/pyenv/bin/python -m pip --disable-pip-version-check --no-cache-dir -q)

env_build() {
  [ -x build/pyenv/bin/python ] || "$python" -m venv build/pyenv
  # pybind11-stubgen (with numpy and typing_extensions, whose names the stubs
  # use) generates the type stubs when the module is built (python/CMakeLists.txt).
  "${pip[@]}" install scikit-build-core 'pybind11>=3.0' 'pybind11-stubgen>=2.5' numpy typing_extensions
}

# install_without DIST EXCLUDED...: installs DIST and its requirements for
# this interpreter, leaving out EXCLUDED (a requirement met by an installed
# package still brings that package's own requirements: name it too).
install_without() {
  local dist=$1
  shift
  "${pip[@]}" install --no-deps "$dist"
  local requirements
  mapfile -t requirements < <(build/pyenv/bin/python scripts/requirements_of.py "$dist" --except "$@")
  "${pip[@]}" install "${requirements[@]}"
}

env_test() {
  # gguf: the reference GGUF reader for test_gguf.py; openai: the official
  # client, for test_serve_openai.py.
  "${pip[@]}" install pytest ml_dtypes gguf tokenizers openai
  # test_model_families.py and test_tokenizer_families.py check each GGUF
  # model family's logits, tokenizer and chat template against Hugging Face
  # transformers on the same file (torch's PyPI wheel, ~3 GB with its CUDA
  # packages; accelerate: transformers' GGUF loading needs it; jinja2: its
  # chat templates). Nothing is downloaded from a model hub at test time.
  # Neither torch nor accelerate brings triton (~1 GB, needed only by
  # torch.compile, which no test uses).
  install_without torch triton
  install_without accelerate torch
  "${pip[@]}" install transformers jinja2
  # test_ort_parity.py compares with ONNX Runtime's own GroupQueryAttention; it
  # skips (saying why) where no onnxruntime wheel exists for this Python.
  "${pip[@]}" install onnx onnxruntime ||
    echo "test_python.sh: onnx/onnxruntime not installable here; test_ort_parity.py will skip" >&2
}

case "$mode" in
  env-build) env_build; exit 0 ;;
  env-test) env_test; exit 0 ;;
  all) env_build; env_test
       CMAKE_BUILD_PARALLEL_LEVEL=$jobs "${pip[@]}" install --no-build-isolation . ;;
  *) [ -x build/pyenv/bin/python ] || { echo "test_python.sh: no build/pyenv; run env-build and env-test first" >&2; exit 1; }
     # The tree's own options, so that scikit-build-core's configure changes
     # nothing and its build finds every target up to date.
     [ -f "$mode/CMakeCache.txt" ] || { echo "test_python.sh: $mode is not a configured build tree" >&2; exit 1; }
     "${pip[@]}" install --no-build-isolation . -Cbuild-dir="$mode" \
       -Ccmake.define.PAGEDATTN_BUILD_TESTS=ON -Ccmake.define.PAGEDATTN_BUILD_TOOLS=ON \
       -Ccmake.define.PAGEDATTN_BUILD_BENCHMARKS=ON ;;
esac

# test_serve_openai.py runs the CLI of the Release build (scripts/test.sh builds it first).
export PAGEDATTN_CLI=${PAGEDATTN_CLI:-$PWD/build/release/tools/pagedattn}
# Tests share the cores with the servers and engines they start: threads that
# spin while they wait would take the cores those need (docs/engine.md#threads).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
(cd python/tests && ../../build/pyenv/bin/python -m pytest -q -p no:cacheprovider .)
