#!/bin/bash
# The sources that hold GNU C vectors wider than the baseline x86-64 ISA (32- and 64-byte vectors:
# AVX and AVX-512 registers) compiled by a -DQT_NATIVE=OFF -DQT_WERROR=ON build (the project's own
# flags, from CMake; build-portable/, only those objects): CI's build is -march=native, where these
# files cannot warn, so this keeps a portable build from breaking unseen (GCC's -Wpsabi did once).
# Run after scripts/test.sh (the packages the configure step needs). About 30 s on one core.
# Usage: scripts/portable_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bdir=build-portable
mapfile -t files < <(grep -rlE --include='*.c' --exclude-dir='build*' --exclude-dir=.venv \
                       --exclude-dir=.git 'vector_size\((32|64)\)' . | sed 's|^\./||' | sort)
[ ${#files[@]} -gt 0 ] || { echo "portable_check: no files with wide vectors found" >&2; exit 1; }
cmake -S . -B "$bdir" -DQT_NATIVE=OFF -DQT_WERROR=ON > /dev/null
for f in "${files[@]}"; do
  echo "portable_check: $f"
  # the Makefile generator's per-source object target in the source's directory
  make -s -C "$bdir/$(dirname "$f")" "$(basename "${f%.c}").o"
done
