#!/bin/bash
# Sets up (scripts/setup.sh) and runs the test suite, excluding tests labelled "slow".
# Slow tests: ctest --test-dir build -L slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -LE slow -j2
