#!/bin/bash
# A run killed (SIGKILL) at the worst moment of an epoch's end, between the metrics.csv row and
# the checkpoint (QT_FAULT, base/base.h), then resumed with train.resume=true, ends with the
# metrics.csv of an uninterrupted run: every row, values equal but for the timing columns
# (images_per_s, epoch_seconds). Once, the checkpoint came first and such a kill lost the
# epoch's row for good. Usage: test_kill_resume.sh path/to/qat_train
set -u
BIN="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
printf '[train]\nepochs = 3\n' > "$T/run.ini"
args=(data.train_limit=512 data.test_limit=256 train.batch_size=64 train.threads=2 output.progress=none output.dot=false)

"$BIN" "$T/run.ini" "${args[@]}" "output.dir=$T/full" > "$T/out" 2>&1 || { echo "uninterrupted run failed:"; cat "$T/out"; exit 1; }
QT_FAULT=between_metrics_and_checkpoint:2 "$BIN" "$T/run.ini" "${args[@]}" "output.dir=$T/killed" > "$T/out" 2>&1
rc=$?
if [ $rc -ne 137 ]; then echo "the fault point did not kill the run (exit $rc):"; cat "$T/out"; exit 1; fi
# (the .lock the killed run left holds no one: its fcntl lock died with it)
"$BIN" "$T/run.ini" "${args[@]}" train.resume=true "output.dir=$T/killed" > "$T/out" 2>&1 ||
  { echo "resume failed:"; cat "$T/out"; exit 1; }
grep -q "resuming from .*: 1 epoch(s) done" "$T/out" || { echo "the resume did not start after epoch 1:"; cat "$T/out"; fail=1; }
cut -d, -f1-6,9 "$T/full/metrics.csv" > "$T/full.csv"
cut -d, -f1-6,9 "$T/killed/metrics.csv" > "$T/killed.csv"
if [ "$(wc -l < "$T/full.csv")" -ne 4 ] || ! cmp -s "$T/full.csv" "$T/killed.csv"; then
  echo "metrics.csv after kill + resume differs from the uninterrupted run's:"
  diff "$T/full.csv" "$T/killed.csv"
  fail=1
fi
exit $fail
