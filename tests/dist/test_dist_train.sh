#!/bin/bash
# Two processes under mpirun train as one process does with the same global batch (FashionCNN,
# 1280 training images, batch 64: 20 SGD steps at the reference recipe's lr 0.05, 500 test images).
#
# - Weights and BN running statistics after the 20 steps: every tensor within 2e-2 of its largest
#   value. That is float reordering amplified by training, not an error: one process alone differs
#   from itself by up to 3.9e-3 between 1 and 2 threads (measured; 2 processes x 1 thread against
#   1 process x 2 threads: 4.2e-4 on parameters, 1.4e-4 on statistics), while two processes whose BN
#   is not synchronized differ by 0.3 to 0.8 (measured).
# - Final test accuracy (metrics.csv and summary.json) equal; the same files written; only process
#   0 writes (a second writer would be refused by the output folder's lock).
# - A checkpoint of two processes resumed by one, and one of one process resumed by two (process 0
#   sends the state it read), end where one process does (same tolerance).
# - A NaN loss stops both processes with exit status 1 naming the process; a quantized mode is
#   refused (exit 2) until observers are synchronized.
# Usage: test_dist_train.sh QAT_TRAIN DIST_COMPARE "MPIEXEC;ARGS;..." (CMake list: tests/dist).
set -u
QAT=$1
CMP=$2
IFS=';' read -r -a MPI <<<"$3"
CFG=${QT_SOURCE_DIR:?}/experiments/fashion_cnn_fp32.ini
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "test_dist_train: $*" >&2
  exit 1
}
one() { OMP_NUM_THREADS=2 "$QAT" "$CFG" output.progress=none "$@"; }
two() { "${MPI[@]}" "$QAT" "$CFG" output.progress=none "$@"; }
compare() { # A B what
  if ! "$CMP" fashion_cnn "$1/checkpoint.h5" "$2/checkpoint.h5" 2e-2 2e-2 >"$T/cmp.txt"; then
    cat "$T/cmp.txt" >&2
    fail "$3: the weights or BN statistics differ beyond the tolerance"
  fi
}

# ---- 20 steps
RUN=(train.epochs=1 data.train_limit=1280 data.test_limit=500 train.batch_size=64)
one "${RUN[@]}" output.dir="$T/one" || fail "one process failed"
two "${RUN[@]}" output.dir="$T/two" || fail "two processes failed"
compare "$T/one" "$T/two" "two processes after 20 steps"
[ "$(tail -1 "$T/one/metrics.csv" | cut -d, -f1-2,6,9)" = "$(tail -1 "$T/two/metrics.csv" | cut -d, -f1-2,6,9)" ] ||
  fail "metrics.csv (epoch, lr, test accuracy, images) differ: $(tail -1 "$T/one/metrics.csv") vs $(tail -1 "$T/two/metrics.csv")"
acc() { grep -o '"fp32": {"test_accuracy": [0-9.]*' "$1/summary.json"; }
[ -n "$(acc "$T/one")" ] && [ "$(acc "$T/one")" = "$(acc "$T/two")" ] ||
  fail "summary.json test accuracy differs: $(acc "$T/one") vs $(acc "$T/two")"
grep -q '"processes": 2' "$T/two/summary.json" || fail "summary.json of two processes does not say so"
grep -q '"processes"' "$T/one/summary.json" && fail "summary.json of one process names processes"
[ "$(ls -A "$T/one")" = "$(ls -A "$T/two")" ] || fail "files differ: $(ls -A "$T/one") vs $(ls -A "$T/two")"

# ---- resume with another number of processes
RUN=(train.epochs=2 data.train_limit=640 data.test_limit=200 train.batch_size=64)
one "${RUN[@]}" output.dir="$T/full" || fail "one process, 2 epochs, failed"
two "${RUN[@]}" output.dir="$T/two_one" train.stop_after_epochs=1 || fail "two processes, first epoch, failed"
one "${RUN[@]}" output.dir="$T/two_one" train.resume=true 2>"$T/err.txt" || fail "one process resuming failed"
grep -q "resuming from .*1 epoch(s) done, step 10" "$T/err.txt" || fail "no resume message: $(cat "$T/err.txt")"
compare "$T/full" "$T/two_one" "two processes, then one"
one "${RUN[@]}" output.dir="$T/one_two" train.stop_after_epochs=1 || fail "one process, first epoch, failed"
two "${RUN[@]}" output.dir="$T/one_two" train.resume=true 2>/dev/null || fail "two processes resuming failed"
compare "$T/full" "$T/one_two" "one process, then two"
for d in two_one one_two; do
  [ "$(wc -l <"$T/$d/metrics.csv")" = 3 ] || fail "$d/metrics.csv: $(cat "$T/$d/metrics.csv")"
done

# ---- failures end every process
two "${RUN[@]}" output.dir="$T/nan" train.lr=1e12 2>"$T/err.txt"
rc=$?
[ $rc = 1 ] || fail "a NaN loss under two processes: exit status $rc, want 1"
grep -q "loss is NaN on process [01] of 2" "$T/err.txt" || fail "NaN message: $(cat "$T/err.txt")"
[ -e "$T/nan/checkpoint.h5" ] && fail "a checkpoint was written by the diverged run"
two "${RUN[@]}" output.dir="$T/qat" quant.mode=qat 2>"$T/err.txt"
rc=$?
[ $rc = 2 ] || fail "quant.mode = qat under two processes: exit status $rc, want 2"
grep -q "observers synchronized" "$T/err.txt" || fail "QAT refusal message: $(cat "$T/err.txt")"
exit 0
