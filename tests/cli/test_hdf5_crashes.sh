#!/bin/bash
# Files on which HDF5 1.10.8 crashes inside itself (fuzz/hdf5-crashes/: a Q/DQ file, a checkpoint,
# an HDF5 data set) given to the programs that read such files from anywhere: qat_export (Q/DQ),
# qat_report --fp32 (checkpoint) and qat_train (data.format = hdf5). Each must end with exit 2
# and a message naming the file, never with a signal: the readers parse such a file first in a
# child process (base/h5.h qt_h5_contained), where a crash costs nothing. Inputs that crash only
# under a sanitizer (an over-read the release library survives) are refused or read as usual;
# the test prints how many of the inputs the child process caught.
# Usage: test_hdf5_crashes.sh BIN_DIR SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
caught=0
n=0
MODEL="$SRC/fuzz/corpus/qdq/all_ops_ptq_w4a8.h5"
[ -s "$MODEL" ] || { echo "FAIL: $MODEL missing"; exit 1; }
printf '[train]\nepochs = 1\n' > "$T/ok.ini"

# check KIND FILE -- COMMAND...: exit 2, the file named, no signal
check() {
  local kind=$1 f=$2
  shift 3
  n=$((n + 1))
  "$@" > "$T/out" 2> "$T/err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF "$f" "$T/err"; then
    echo "FAIL $kind $(basename "$f"): exit $rc, want 2 naming the file; stderr:"; head -5 "$T/err"; fail=1
  fi
  grep -q "the HDF5 library failed reading it" "$T/err" && caught=$((caught + 1))
}

shopt -s nullglob
for f in "$SRC"/fuzz/hdf5-crashes/qdq/crash-*; do
  check qdq "$f" -- "$BIN/qat_export" "$f" "$T/out.onnx"
  [ -e "$T/out.onnx" ] && { echo "FAIL qdq $(basename "$f"): an ONNX file was written"; fail=1; }
done
for f in "$SRC"/fuzz/hdf5-crashes/checkpoint/crash-*; do
  check checkpoint "$f" -- "$BIN/qat_report" "$MODEL" --fp32 "$f" --model fashion_cnn --images 16
done
for f in "$SRC"/fuzz/hdf5-crashes/hdf5/crash-*; do
  check hdf5 "$f" -- "$BIN/qat_train" "$T/ok.ini" data.format=hdf5 "data.train_path=$f" "data.test_path=$f" \
    output.progress=none "output.dir=$T/run"
done
[ $n -ge 12 ] || { echo "FAIL: only $n crash inputs found under fuzz/hdf5-crashes"; fail=1; }
[ $caught -ge 1 ] || { echo "FAIL: no input was caught in the child process"; fail=1; }
[ $fail -eq 0 ] && echo "hdf5 crash inputs: $n refused with exit 2, $caught of them caught in the child process"
exit $fail
