#!/bin/bash
# Sets up (scripts/setup.sh) and runs the whole test suite (about 12 minutes on two idle cores,
# 4 of them the zoo's pipeline test; the whole of .ci/run, with its three builds, the sanitizer
# pass and the fuzz smoke run: 22 minutes once the packages are installed).
#   bash scripts/test.sh [CMAKE_ARGS...]   # set up, build, the whole suite
#   bash scripts/test.sh --quick           # build (build/ must exist) and the unit tests only:
#                                          # no training runs, grids, ONNX Runtime, MPI or tests
#                                          # labelled long (over about 5 s)
# Extra arguments go to scripts/setup.sh's cmake (CI passes -DQT_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  [ -d build ] || { echo "test.sh --quick: no build/ yet: run bash scripts/test.sh (or scripts/setup.sh) once" >&2; exit 1; }
  cmake --build build -j"$(nproc)"
  exec ctest --test-dir build --output-on-failure -j2 -LE "e2e|grid|slow|ort|mpi|bench|onnx|long"
fi
bash scripts/setup.sh "$@"
ctest --test-dir build --output-on-failure -j2
