#!/bin/bash
# End to end on a slice of Fashion-MNIST: qat_train trains a tiny fp32 model (through
# quant.fp32_config, as the example configs do), fine-tunes it with W4A4 QAT, converts it,
# saves both graphs and checks them; qat_check then re-checks the two files. A PTQ W8A8 run
# does the same. Then the check must catch a tampered Q/DQ file (a changed scale).
# Usage: test_qat_e2e.sh BIN_DIR SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$SRC" || exit 1
fail=0
common=(data.train_limit=1024 data.test_limit=512 output.progress=none "quant.fp32_checkpoint=$T/fp32/checkpoint.h5")

if ! "$BIN/qat_train" experiments/fashion_cnn_qat_w4a4.ini "${common[@]}" train.epochs=1 "output.dir=$T/qat" \
    >"$T/qat.log" 2>&1; then
  echo "qat_train (QAT W4A4) failed:"; cat "$T/qat.log"; exit 1
fi
for f in fp32/checkpoint.h5 qat/summary.json qat/model_qdq.h5 qat/model_trained.h5 qat/quantizer.txt; do
  [ -s "$T/$f" ] || { echo "missing $f"; fail=1; }
done
for key in '"fake_quant"' '"qdq"' '"check"' '"ok": true' '"qdq_model"'; do
  grep -qF "$key" "$T/qat/summary.json" || { echo "summary.json lacks $key"; cat "$T/qat/summary.json"; fail=1; }
done
if ! "$BIN/qat_check" "$T/qat/model_trained.h5" "$T/qat/model_qdq.h5" --images 256 >"$T/check.log" 2>&1; then
  echo "qat_check failed:"; cat "$T/check.log"; fail=1
fi
grep -q "PASS" "$T/check.log" || { echo "qat_check printed no PASS"; cat "$T/check.log"; fail=1; }

if ! "$BIN/qat_train" experiments/fashion_cnn_ptq_w8a8.ini "${common[@]}" quant.calibration_batches=4 \
    "output.dir=$T/ptq" >"$T/ptq.log" 2>&1; then
  echo "qat_train (PTQ W8A8) failed:"; cat "$T/ptq.log"; exit 1
fi
"$BIN/qat_check" "$T/ptq/model_trained.h5" "$T/ptq/model_qdq.h5" --images 128 >"$T/check2.log" 2>&1 ||
  { echo "qat_check (PTQ) failed:"; cat "$T/check2.log"; fail=1; }

# Tamper: checking the PTQ training graph against the QAT convert graph must fail (different
# qparams everywhere) and name a node.
"$BIN/qat_check" "$T/ptq/model_trained.h5" "$T/qat/model_qdq.h5" --images 64 >"$T/check3.log" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "input.fq" "$T/check3.log"; then
  echo "qat_check did not catch mismatched graphs (exit $rc):"; cat "$T/check3.log"; fail=1
fi
"$BIN/qat_check" "$T/nope.h5" "$T/qat/model_qdq.h5" >"$T/check4.log" 2>&1
[ $? -eq 2 ] || { echo "qat_check on a missing file did not exit 2"; fail=1; }
exit $fail
