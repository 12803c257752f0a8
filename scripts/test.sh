#!/bin/bash
# Sets up (scripts/setup.sh) and runs the whole test suite (about 6 minutes on two idle cores,
# 1.5 of them the quick experiment grid, half a minute the quick backends table; the whole of
# .ci/run, with its three builds, the sanitizer pass and the fuzz smoke run: 14 minutes once the
# packages are installed).
# Extra arguments go to scripts/setup.sh's cmake (CI passes -DQT_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "$@"
ctest --test-dir build --output-on-failure -j2
