#!/bin/bash
# The processes of a job compare their options and their data before any work. Each case starts
# two processes with mpiexec's MPMD syntax, the second with one thing of its own; every case must
# end with exit 2 and one message naming the key (or the data) and both values, never a crash
# inside a collective (exit 139), Open MPI's MPI_ERR_TRUNCATE (exit 15), or a run that ends 0:
# - model.name, train.batch_size, data.train_limit, quant.mode and train.seed differ;
# - the same config, but process 1 sees other files at the [data] paths (a mount namespace of its
#   own, where Fashion-MNIST's test files are bound over copies of its training files);
# - what a process may set for itself (train.threads, output.progress) does not stop the job.
# Usage: test_dist_agree.sh QAT_TRAIN "MPIEXEC;ARGS;..." (CMake list: tests/dist).
set -u
QAT=$1
IFS=';' read -r -a MPI <<<"$2"
CFG=${QT_SOURCE_DIR:?}/experiments/fashion_cnn_fp32.ini
FM=/usr/share/datasets/fashion-mnist
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
NP=$((${#MPI[@]} - 2)) # MPI without its trailing "-np 2": one process of each kind (MPMD)
RUN=(output.progress=none data.train_limit=512 data.test_limit=256 train.epochs=1 train.batch_size=64)

# case NAME PATTERN -- ARGS OF PROCESS 1: process 0 runs RUN, process 1 RUN and its own ARGS
case_differs() {
  local name=$1 pattern=$2
  shift 3
  "${MPI[@]:0:NP}" -np 1 "$QAT" "$CFG" "${RUN[@]}" "output.dir=$T/$name" : \
    -np 1 "$QAT" "$CFG" "${RUN[@]}" "$@" "output.dir=$T/$name" >"$T/out" 2>&1
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF "$pattern" "$T/out"; then
    echo "FAIL $name: exit $rc, want 2 with \"$pattern\":"; cat "$T/out"; fail=1
  fi
}
case_differs model "model.name is 'fashion_cnn' on process 0 but 'res_cnn' on process 1" -- model.name=res_cnn
case_differs batch "train.batch_size is '64' on process 0 but '32' on process 1" -- train.batch_size=32
case_differs limit "data.train_limit is '512' on process 0 but '256' on process 1" -- data.train_limit=256
case_differs mode "quant.mode is 'none' on process 0 but 'ptq' on process 1" -- quant.mode=ptq
case_differs seed "train.seed is '0' on process 0 but '1' on process 1" -- train.seed=1

# The same config naming copies of the training files; process 1's own mount namespace binds the
# test files over them (as another host holding other files at the same paths).
cp "$FM/train-images-idx3-ubyte.gz" "$T/images.gz" && cp "$FM/train-labels-idx1-ubyte.gz" "$T/labels.gz" || exit 1
DATA=("data.train_images=$T/images.gz" "data.train_labels=$T/labels.gz")
"${MPI[@]:0:NP}" -np 1 "$QAT" "$CFG" "${RUN[@]}" "${DATA[@]}" "output.dir=$T/data" : \
  -np 1 unshare -m bash -c 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && shift 4 && exec "$@"' _ \
  "$FM/t10k-images-idx3-ubyte.gz" "$T/images.gz" "$FM/t10k-labels-idx1-ubyte.gz" "$T/labels.gz" \
  "$QAT" "$CFG" "${RUN[@]}" "${DATA[@]}" "output.dir=$T/data" >"$T/out" 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -qF "the images or labels process 1 loaded differ from process 0's" "$T/out"; then
  echo "FAIL other data files: exit $rc, want 2 naming the data:"; cat "$T/out"; fail=1
fi
[ -e "$T/data/checkpoint.h5" ] && { echo "FAIL other data files: a checkpoint was written"; fail=1; }

# What each process may choose: the job runs.
"${MPI[@]:0:NP}" -np 1 "$QAT" "$CFG" "${RUN[@]}" train.threads=1 "output.dir=$T/own" : \
  -np 1 "$QAT" "$CFG" "${RUN[@]}" train.threads=2 output.progress=lines "output.dir=$T/own_elsewhere" >"$T/out" 2>&1 ||
  { echo "FAIL per-process keys: the job did not run:"; cat "$T/out"; fail=1; }

[ $fail -eq 0 ] && echo "ranks agree or stop: 6 differences refused, per-process keys accepted"
exit $fail
