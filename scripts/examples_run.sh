#!/bin/bash
# Runs every example config of experiments/ into runs/ (from the current checkout, built into
# build/), so that a refactor can be checked for unchanged results with
# scripts/examples_compare.py OLD_RUNS NEW_RUNS. About 8 minutes on two idle cores.
# Usage: scripts/examples_run.sh [CONFIG_NAME ...]   (default: all of them, in order)
# QT_BUILD=DIR runs the binaries of another build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
# Results do not depend on it; it keeps OpenMP from spinning when other work shares the cores.
export OMP_WAIT_POLICY=PASSIVE
configs=(fashion_cnn_fp32 fashion_mlp_fp32 res_cnn_fp32
         fashion_cnn_ptq_w8a8 fashion_cnn_ptq_w4a8 fashion_cnn_ptq_w4a4 fashion_cnn_ptq_accel
         fashion_cnn_ptq_debug fashion_cnn_qat_w8a8 fashion_cnn_qat_w4a8 fashion_cnn_qat_w4a4)
[ $# -gt 0 ] && configs=("$@")
for c in "${configs[@]}"; do
  echo "examples_run: $c"
  "${QT_BUILD:-build}/bin/qat_train" "experiments/$c.ini" > "/tmp/examples_run_$c.log" 2>&1 || {
    echo "examples_run: $c failed (log /tmp/examples_run_$c.log)"; exit 1; }
done
