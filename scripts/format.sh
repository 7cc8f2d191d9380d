#!/usr/bin/env bash
# Formats the tree's C and C++ sources with clang-format (.clang-format), or
# with --check lists the files that differ from it and fails (CI's first
# stage). The version is pinned to Debian 12's clang-format 14: another
# version formats some constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."

format=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$format" ]; then
  echo "format: clang-format not found (Debian package clang-format)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')

if [ "${1:-}" = "--check" ]; then
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
