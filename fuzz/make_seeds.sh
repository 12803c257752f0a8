#!/bin/bash
# Regenerates the fuzz seed corpora into fuzz/corpus/ (committed): the Q/DQ files, checkpoints
# and image-folder inputs with the project's own build (build/fuzz/fuzz_make_seeds, built here
# when missing), the IDX, HDF5 and config seeds with /usr/bin/python3 (h5py, numpy). Files a
# corpus holds that are not generated (minimized inputs from fuzzing runs) are kept. Also
# writes fuzz/dict/config.dict from the schema (qat_train --keys).
# Usage: bash fuzz/make_seeds.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target fuzz_make_seeds qat_train -j2 >/dev/null
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE "$build/fuzz/fuzz_make_seeds" fuzz/corpus
keys=$(mktemp)
trap 'rm -f "$keys"' EXIT
"$build/bin/qat_train" --keys >"$keys"
/usr/bin/python3 fuzz/make_seeds.py fuzz/corpus . "$keys"
du -sh fuzz/corpus/* | sed 's/^/make_seeds: /'
