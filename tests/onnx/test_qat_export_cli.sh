#!/bin/bash
# qat_export as a command: --help (exit 0), a Q/DQ graph exported (exit 0, the file written and
# accepted by onnx.checker), and bad input with exit 2 and a clear message: no arguments, an
# unknown option, a missing or non-HDF5 model file, a prepared graph (model_trained.h5), an output
# path that is a symlink or device (the atomic write would replace it with a regular file); an
# output that cannot be written is exit 1. Uses the files test_onnx_export_checker keeps.
# Usage: test_qat_export_cli.sh QAT_EXPORT
set -u
BIN="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0

# expect NAME STATUS NEEDLE -- ARGS...: exit status STATUS and NEEDLE in stderr (or stdout for 0)
expect() {
  local name=$1 want=$2 needle=$3
  shift 4
  "$BIN" "$@" > "$T/out" 2> "$T/err"
  local rc=$?
  if [ $rc -ne "$want" ] || ! grep -qF -- "$needle" "$T/out" "$T/err"; then
    echo "$name: exit $rc (want $want), want '$needle' in the output:"; cat "$T/out" "$T/err"; fail=1
  fi
}

expect help 0 "usage: qat_export MODEL_QDQ.h5 OUT.onnx" -- --help
expect no_args 2 "usage: qat_export" --
expect one_arg 2 "usage: qat_export" -- export_fashion_cnn_w8a8_qdq.h5
expect bad_option 2 "unknown option '--bogus'" -- export_fashion_cnn_w8a8_qdq.h5 "$T/a.onnx" --bogus
expect three_paths 2 "unexpected argument" -- export_fashion_cnn_w8a8_qdq.h5 "$T/a.onnx" "$T/b.onnx"
expect missing_model 2 "$T/none.h5" -- "$T/none.h5" "$T/a.onnx"
echo "not hdf5" > "$T/text.h5"
expect not_hdf5 2 "$T/text.h5" -- "$T/text.h5" "$T/a.onnx"
expect prepared 2 "prepared (training) graph" -- export_prepared.h5 "$T/a.onnx"
[ -e "$T/a.onnx" ] && { echo "a refused export left $T/a.onnx"; fail=1; }
expect unwritable 1 "$T/no_dir/a.onnx" -- export_fashion_cnn_w8a8_qdq.h5 "$T/no_dir/a.onnx"
ln -s "$T/ok.onnx" "$T/link.onnx"
expect symlink 2 "exists and is not a regular file" -- export_fashion_cnn_w8a8_qdq.h5 "$T/link.onnx"
expect ok 0 "1 permuted linear weights" -- export_fashion_cnn_w8a8_qdq.h5 "$T/ok.onnx"
# (on the loaded model: given a path, onnx's full check may rewrite the file with inferred shapes)
"${QT_PYTHON:?QT_PYTHON, the test environment python, is unset (CTest sets it)}" -c 'import sys, onnx; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)' "$T/ok.onnx" ||
  { echo "onnx.checker rejects the exported $T/ok.onnx"; fail=1; }
# Deterministic: the same file twice gives the same bytes.
"$BIN" export_fashion_cnn_w8a8_qdq.h5 "$T/again.onnx" --quiet > "$T/out" 2>&1 && [ ! -s "$T/out" ] ||
  { echo "--quiet printed or failed:"; cat "$T/out"; fail=1; }
cmp -s "$T/ok.onnx" "$T/again.onnx" || { echo "two exports of one file differ"; fail=1; }
exit $fail
