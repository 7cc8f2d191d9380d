#!/usr/bin/env bash
# Formats C and C++ sources with clang-format (.clang-format): the files named,
# or with none named every tracked source. With --check it lists the files
# that differ and fails instead (CI's first stage, over the whole tree). The
# version is pinned to Debian 12's clang-format 14: another version formats
# some constructs differently.
#   scripts/format.sh [--check] [FILE...]
set -euo pipefail
check=false
if [ "${1:-}" = "--check" ]; then
  check=true
  shift
fi
files=()
for f in "$@"; do files+=("$(realpath "$f")"); done  # named from the caller's directory
cd "$(dirname "$0")/.."

format=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$format" ]; then
  echo "format: clang-format not found (Debian package clang-format)" >&2
  exit 1
fi
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
fi

if $check; then
  if ! "$format" --dry-run --Werror "${files[@]}" 2>/dev/null; then
    echo "format: these files differ from .clang-format; run scripts/format.sh:" >&2
    for f in "${files[@]}"; do
      "$format" --dry-run --Werror "$f" >/dev/null 2>&1 || echo "  $f" >&2
    done
    exit 1
  fi
  echo "format: ${#files[@]} files match .clang-format ($("$format" --version))"
else
  "$format" -i "${files[@]}"
fi
