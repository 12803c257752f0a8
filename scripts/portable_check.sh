#!/bin/bash
# The sources that hold GNU C vectors wider than the baseline x86-64 ISA (64-byte vectors: one
# AVX-512 register) compiled as a QT_NATIVE=OFF build compiles them, with the project's warnings
# as errors: CI builds with -march=native, where these files cannot warn, so this keeps a portable
# -DQT_NATIVE=OFF -DQT_WERROR=ON build from breaking unseen (GCC's -Wpsabi did once). Needs the
# build directory's generated headers (run after scripts/test.sh). About 30 s on one core.
# Usage: scripts/portable_check.sh [BUILD_DIR (default build)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mapfile -t files < <(grep -rlE --include='*.c' --exclude-dir='build*' --exclude-dir=node_modules \
                       --exclude-dir=.git 'vector_size\((32|64)\)' . | sort)
[ ${#files[@]} -gt 0 ] || { echo "portable_check: no files with wide vectors found" >&2; exit 1; }
for f in "${files[@]}"; do
  echo "portable_check: $f"
  gcc -std=c11 -O2 -fopenmp -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-format-truncation \
    -D_POSIX_C_SOURCE=200809L -ffp-contract=off -Werror -I. -I"$build" -c "$f" -o /dev/null
done
