#!/bin/bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer: builds build-asan/ (Debug
# at -O1, -DQT_SANITIZE=ON, warnings as errors) and runs every test but those labelled e2e, grid
# and slow (whole training runs, which scripts/test.sh runs in the release build) and ort (ONNX
# Runtime on committed or exported models: none of this project's compiled code runs in them). Any sanitizer report fails the test that made it: ASan stops at the first error, UBSan
# is built with -fno-sanitize-recover, LeakSanitizer reports at exit. Run scripts/setup.sh first
# (the packages); extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-O1 -g" -DQT_SANITIZE=ON -DQT_WERROR=ON "$@" \
  >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export OMP_WAIT_POLICY=PASSIVE
ctest --test-dir build-asan --output-on-failure -j2 -LE "grid|e2e|slow|ort"
