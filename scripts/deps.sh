#!/usr/bin/env bash
# Installs the Debian packages pagedattn builds with, when missing. As root it
# runs apt-get; otherwise it prints the apt-get line and fails.
set -euo pipefail

# python3-venv: scripts/test_python.sh makes a virtual environment.
# libcpp-httplib-dev (+ pkg-config, which finds it): `pagedattn serve`.
# libopenmpi-dev + openmpi-bin: the MPI distributed modes (mpirun in the tests).
# libxxhash-dev: XXH3-128 page keys of the prefix cache (used header-only).
# libcli11-dev: CLI11, the flag parser of the pagedattn subcommands (header-only).
# clang (Debian's default, 14) with libomp-dev (its OpenMP), libclang-rt-14-dev
# (libFuzzer and the sanitizer runtimes) and llvm (llvm-symbolizer for
# readable sanitizer stacks): the `sanitize` preset.
# clang-format (14): scripts/format.sh, checked first by the test command.
# libdnnl-dev (oneDNN): prefill's and large batches' f32 products
# (src/engine/onednn_sgemm.h; -DPAGEDATTN_WITH_ONEDNN=OFF builds without it).
packages=(g++ cmake ninja-build libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev python3-venv
          libopenblas-dev python3-pip libicu-dev nlohmann-json3-dev clang libomp-dev
          libclang-rt-14-dev llvm libcpp-httplib-dev pkg-config
          libopenmpi-dev openmpi-bin libxxhash-dev libcli11-dev clang-format libdnnl-dev)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "deps: not a Debian system; make sure these are installed: ${packages[*]}" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "deps: missing Debian packages; as root run:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi
