#!/bin/bash
# A quantized run that starts from an existing fp32 checkpoint checks that the checkpoint is what
# its quant.fp32_config trains with this run's [data] (the stored config against the recipe):
# a quick trial (data.train_limit=512) trains the fp32 model on the way; a second run with other
# data limits is refused (exit 2) naming the differing key and both values, before anything is
# written; quant.fp32_reuse = any uses it with a warning, = retrain trains it again (after which
# the second run's recipe matches), and a matching checkpoint is reused silently. When the
# checkpoint is the fp32 config's own (its output.dir, which every run of it shares), a trial
# with other [data] writes its fp32 model under its own output.dir instead, never there.
# Usage: test_fp32_reuse.sh BIN_DIR SOURCE_DIR
set -u
BIN="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$SRC" || exit 1
fail=0
c=(experiments/fashion_cnn_ptq_w8a8.ini "quant.fp32_checkpoint=$T/fp32/checkpoint.h5" quant.calibration_batches=2
   output.progress=none data.test_limit=256)
run() { "$BIN/qat_train" "${c[@]}" "$@" > "$T/log" 2>&1; }

run data.train_limit=512 "output.dir=$T/trial" || { echo "FAIL trial: $(tail -3 "$T/log")"; fail=1; }
[ -f "$T/fp32/checkpoint.h5" ] || { echo "FAIL trial: no fp32 checkpoint trained"; fail=1; }
cp "$T/fp32/checkpoint.h5" "$T/fp32.orig"
# how SUMMARY WORDS: summary.json's fp32_model.how
how() { grep -qF "\"fp32_model\": {\"how\": \"$2\"" "$1" || { echo "FAIL $1: fp32_model.how is not '$2'"; fail=1; }; }
how "$T/trial/summary.json" trained
grep -qF '"train_limit": 512' "$T/trial/summary.json" || { echo "FAIL trial: summary lacks train_limit 512"; fail=1; }

run data.train_limit=768 "output.dir=$T/real"
rc=$?
[ $rc -eq 2 ] && grep -q "data.train_limit: '512' in the checkpoint, '768' in the recipe" "$T/log" &&
  grep -q "quant.fp32_reuse = retrain" "$T/log" || { echo "FAIL other limits: exit $rc: $(cat "$T/log")"; fail=1; }
[ -e "$T/real/summary.json" ] && { echo "FAIL other limits: the refused run wrote a summary"; fail=1; }
cmp -s "$T/fp32/checkpoint.h5" "$T/fp32.orig" || { echo "FAIL other limits: the fp32 checkpoint changed"; fail=1; }

run data.train_limit=512 "output.dir=$T/again"
rc=$?
[ $rc -eq 0 ] && ! grep -q "warning" "$T/log" || { echo "FAIL matching checkpoint: exit $rc: $(cat "$T/log")"; fail=1; }
how "$T/again/summary.json" reused

run data.train_limit=768 quant.fp32_reuse=any "output.dir=$T/any"
rc=$?
[ $rc -eq 0 ] && grep -q "using it anyway (quant.fp32_reuse = any)" "$T/log" ||
  { echo "FAIL fp32_reuse=any: exit $rc: $(cat "$T/log")"; fail=1; }
cmp -s "$T/fp32/checkpoint.h5" "$T/fp32.orig" || { echo "FAIL fp32_reuse=any: the fp32 checkpoint changed"; fail=1; }
how "$T/any/summary.json" "reused with quant.fp32_reuse = any"

run data.train_limit=768 quant.fp32_reuse=retrain "output.dir=$T/retrain"
rc=$?
[ $rc -eq 0 ] || { echo "FAIL fp32_reuse=retrain: exit $rc: $(tail -3 "$T/log")"; fail=1; }
cmp -s "$T/fp32/checkpoint.h5" "$T/fp32.orig" && { echo "FAIL fp32_reuse=retrain: the checkpoint was not retrained"; fail=1; }
how "$T/retrain/summary.json" trained
run data.train_limit=768 "output.dir=$T/after" || { echo "FAIL after retrain: $(tail -3 "$T/log")"; fail=1; }
how "$T/after/summary.json" reused

# quant.fp32_checkpoint in the fp32 config's own output.dir: a trial with other data limits trains
# into <its output.dir>/fp32/, the shared folder stays empty; a run with the config's own [data]
# trains into the shared folder, and the next one reuses it from there.
sed -e "s|^dir = .*|dir = $T/shared|" -e "s|^std = .*|&\ntrain_limit = 768\ntest_limit = 256|" \
  experiments/fashion_cnn_fp32.ini > "$T/fp32.ini"
own=("quant.fp32_config=$T/fp32.ini" "quant.fp32_checkpoint=$T/shared/checkpoint.h5")
run "${own[@]}" data.train_limit=512 "output.dir=$T/trial2" || { echo "FAIL own trial: $(tail -3 "$T/log")"; fail=1; }
grep -q "data.train_limit is '512' here, '768' in $T/fp32.ini" "$T/log" ||
  { echo "FAIL own trial: the log does not say why the fp32 model moved: $(cat "$T/log")"; fail=1; }
[ -f "$T/trial2/fp32/checkpoint.h5" ] && [ ! -e "$T/shared/checkpoint.h5" ] ||
  { echo "FAIL own trial: fp32 model not under the trial's output.dir, or written to the shared folder"; fail=1; }
grep -qF "\"checkpoint\": \"$T/trial2/fp32/checkpoint.h5\"" "$T/trial2/summary.json" ||
  { echo "FAIL own trial: summary does not name the trial's fp32 checkpoint"; fail=1; }
run "${own[@]}" data.train_limit=768 "output.dir=$T/own" || { echo "FAIL own data: $(tail -3 "$T/log")"; fail=1; }
[ -f "$T/shared/checkpoint.h5" ] || { echo "FAIL own data: the fp32 model is not in the shared folder"; fail=1; }
how "$T/own/summary.json" trained
run "${own[@]}" data.train_limit=768 "output.dir=$T/own2" || { echo "FAIL own data again: $(tail -3 "$T/log")"; fail=1; }
how "$T/own2/summary.json" reused

[ $fail -eq 0 ] && echo "fp32 reuse: refused, reused, accepted and retrained as configured"
exit $fail
