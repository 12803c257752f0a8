#!/bin/bash
# Gradients summed in buckets during the backward (dist.bucket_mb) train, under mpirun with two
# processes, exactly what one sum after the backward trains (dist.bucket_mb = 0): the parameters,
# BN statistics and, for QAT, qparams and LSQ scales after 10 steps are equal (dist_compare with
# tolerance 0), for buckets of the default size, of 50 KB (many segmented sums), of 4 KB (the small
# path) and larger than the slab; fp32 FashionCNN and W4A8 QAT with learned scales from the
# initialization. Usage: test_dist_buckets_train.sh QAT_TRAIN DIST_COMPARE "MPIEXEC;ARGS;..."
set -u
QAT=$1
CMP=$2
IFS=';' read -r -a MPI <<<"$3"
CFG=${QT_SOURCE_DIR:?}/experiments/fashion_cnn_fp32.ini
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "test_dist_buckets_train: $*" >&2
  exit 1
}
RUN=(train.epochs=1 data.train_limit=640 data.test_limit=100 train.batch_size=64 output.progress=none output.dot=false)
QATRUN=(quant.mode=qat quant.weight_bits=4 quant.activation_bits=8 quant.learnable_scale=true output.timing=false)
two() { "${MPI[@]}" "$QAT" "$CFG" "${RUN[@]}" "$@"; }
same() { # A B what [overrides of the run]
  if ! "$CMP" "$1/checkpoint.h5" "$2/checkpoint.h5" 0 0 "$CFG" "${@:4}" >"$T/cmp.txt"; then
    cat "$T/cmp.txt" >&2
    fail "$3: the weights, qparams or BN statistics differ from one sum after the backward"
  fi
}

two output.dir="$T/fp32_off" dist.bucket_mb=0 || fail "fp32, dist.bucket_mb = 0, failed"
for mb in default 0.05 0.004 64; do
  set -- output.dir="$T/fp32_$mb"
  [ "$mb" = default ] || set -- "$@" dist.bucket_mb=$mb
  two "$@" || fail "fp32, dist.bucket_mb = $mb, failed"
  same "$T/fp32_off" "$T/fp32_$mb" "fp32, dist.bucket_mb = $mb"
done

two "${QATRUN[@]}" output.dir="$T/qat_off" dist.bucket_mb=0 2>"$T/err.txt" || { cat "$T/err.txt" >&2; fail "QAT, dist.bucket_mb = 0, failed"; }
for mb in default 0.05; do
  set -- output.dir="$T/qat_$mb"
  [ "$mb" = default ] || set -- "$@" dist.bucket_mb=$mb
  two "${QATRUN[@]}" "$@" 2>"$T/err.txt" || { cat "$T/err.txt" >&2; fail "QAT, dist.bucket_mb = $mb, failed"; }
  same "$T/qat_off" "$T/qat_$mb" "QAT, dist.bucket_mb = $mb" "${QATRUN[@]}"
done
exit 0
