#!/usr/bin/env bash
# Builds and tests the Python package: a venv in build/pyenv with the build
# tools and test packages from PyPI (gguf: the reference GGUF reader for
# test_gguf.py), `pip install .` (scikit-build-core runs the project's CMake:
# one Release build of the library and the extension, kept in build/python/
# so a rerun only rebuilds what changed), then pytest
# from outside the source tree so the installed package is what is imported
# (openai: the official client, for test_serve_openai.py).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

python=${PYTHON:-python3}
if [ ! -x build/pyenv/bin/python ]; then
  "$python" -m venv build/pyenv
fi
pip=(build/pyenv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install scikit-build-core pybind11 numpy pytest ml_dtypes gguf tokenizers openai
# test_model_families.py and test_tokenizer_families.py check each GGUF model
# family's logits, tokenizer and chat template against Hugging Face
# transformers on the same file (torch's PyPI wheel, ~3 GB with its CUDA
# packages; accelerate: transformers' GGUF loading needs it; jinja2: its chat
# templates). Nothing is downloaded from a model hub at test time.
"${pip[@]}" install torch transformers accelerate jinja2
# test_ort_parity.py compares with ONNX Runtime's own GroupQueryAttention; it
# skips (saying why) where no onnxruntime wheel exists for this Python.
"${pip[@]}" install onnx onnxruntime ||
  echo "test_python.sh: onnx/onnxruntime not installable here; test_ort_parity.py will skip" >&2
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "${pip[@]}" install --no-build-isolation .
# test_serve_openai.py runs the CLI of the Release build (scripts/test.sh builds it first).
export PAGEDATTN_CLI=${PAGEDATTN_CLI:-$PWD/build/release/tools/pagedattn}
(cd python/tests && ../../build/pyenv/bin/python -m pytest -q -p no:cacheprovider .)
