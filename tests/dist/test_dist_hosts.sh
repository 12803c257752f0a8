#!/bin/bash
# Data-parallel training across hosts: two network namespaces on this machine, each its own host
# with its own TCP stack, joined by a link that delays every packet by 1 ms one way and drops 0.5%
# of them (tests/dist/hosts.sh, netns_link.py); mpirun in the first starts the second's daemon
# through an rsh agent, and the processes speak TCP (no shared memory between them).
#
# - Two hosts train FashionCNN (2 epochs of 640 images, batch 64) to the same bits as two
#   processes over shared memory on one host (dist_compare with tolerance 0; test accuracy in
#   metrics.csv equal): the sums add in a fixed order whatever the transport.
# - A lost host: 3 epochs of 1280 images on two hosts; once the first epoch's checkpoint is
#   written, every process of the second host's namespace (its rank and Open MPI's daemon) is
#   killed. The job must end with a non-zero status, Open MPI's message about the lost process or
#   daemon, within 60 s of the kill (printed: the time it took), and keep the first epoch's
#   checkpoint. Resumed on the two hosts, it ends at the same bits as an undisturbed run.
# - A partition: the same run, but the link stops carrying packets once the first epoch is
#   written. No connection closes, so MPI alone would wait for ever; the watchdog
#   (dist.timeout=5) must end the job within 60 s with process 0's message naming the cause.
# Needs root (network namespaces and TUN devices): it fails, not skips, without them.
# Usage: test_dist_hosts.sh QAT_TRAIN DIST_COMPARE "MPIEXEC;ARGS;..." (the one-host runs)
set -u
QAT=$1
CMP=$2
IFS=';' read -r -a MPI <<<"$3"
CFG=${QT_SOURCE_DIR:?}/experiments/fashion_cnn_fp32.ini
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "test_dist_hosts: $*" >&2
  exit 1
}
# shellcheck source=hosts.sh
source "$QT_SOURCE_DIR/tests/dist/hosts.sh"
hosts_up 2 1 0.005 || fail "cannot set up two emulated hosts (see above)"

local_two() { "${MPI[@]}" "$QAT" "$CFG" output.progress=none output.dot=false "$@"; }
hosts_two() { hosts_mpirun "$QAT" "$CFG" output.progress=none output.dot=false "$@"; }
same() { # A B what
  if ! "$CMP" "$1/checkpoint.h5" "$2/checkpoint.h5" 0 0 "$CFG" >"$T/cmp.txt"; then
    cat "$T/cmp.txt" >&2
    fail "$3: the weights or BN statistics differ"
  fi
}
test_acc() { cut -d, -f1,6 "$1/metrics.csv"; }

# ---- two hosts train as two processes on one host do
RUN=(train.epochs=2 data.train_limit=640 data.test_limit=200 train.batch_size=64)
local_two "${RUN[@]}" output.dir="$T/local" || fail "two processes on one host failed"
hosts_two "${RUN[@]}" output.dir="$T/hosts" >"$T/out.txt" 2>&1 || fail "two hosts failed: $(cat "$T/out.txt")"
same "$T/local" "$T/hosts" "two hosts against two processes on one host"
[ "$(test_acc "$T/local")" = "$(test_acc "$T/hosts")" ] ||
  fail "test accuracy differs: $(test_acc "$T/local") against $(test_acc "$T/hosts")"

# A 3-epoch run on two hosts (output DIR, the overrides after HOW) that loses its second host
# (hosts_lose_second HOW) once the first epoch is written; the job must end within 60 s. Sets
# rc to its exit status; prints how long it took.
lose_second_host() { # DIR HOW WHAT overrides...
  local dir=$1 how=$2 what=$3 job t0 t1 i
  shift 3
  hosts_two "${RUN[@]}" "$@" output.dir="$dir" >"$T/out.txt" 2>&1 &
  job=$!
  hosts_first_epoch "$dir/metrics.csv" $job || fail "the run ended before its first epoch: $(cat "$T/out.txt")"
  [ "$(wc -l <"$dir/metrics.csv")" = 2 ] || fail "not in the second epoch at $what: $(cat "$dir/metrics.csv")"
  t0=$(date +%s.%N)
  hosts_lose_second "$how" || fail "no process on the second host"
  for ((i = 0; i < 1200; i++)); do
    kill -0 $job 2>/dev/null || break
    sleep 0.05
  done
  t1=$(date +%s.%N)
  kill -0 $job 2>/dev/null && { kill -9 $job; fail "the job was still running 60 s after $what"; }
  wait $job
  rc=$?
  echo "test_dist_hosts: the job ended $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s after" \
    "$what (exit $rc)"
  [ $rc != 0 ] || fail "$what: exit status 0"
  [ "$(wc -l <"$dir/metrics.csv")" = 2 ] || fail "metrics.csv after $what: $(cat "$dir/metrics.csv")"
}

# ---- a host lost in the second epoch
RUN=(train.epochs=3 data.train_limit=1280 data.test_limit=200 train.batch_size=64)
lose_second_host "$T/lost" kill "the second host's processes were killed"
msg=$(grep -E -m1 "lost communication with a remote daemon|exited on signal 9|unable to reach|has lost" "$T/out.txt") ||
  fail "no message about the lost host: $(cat "$T/out.txt")"
echo "test_dist_hosts: Open MPI: $msg"
[ -f "$T/lost/checkpoint.h5" ] || fail "the first epoch's checkpoint is gone"
hosts_two "${RUN[@]}" output.dir="$T/lost" train.resume=true >"$T/out.txt" 2>&1 ||
  fail "resuming on two hosts failed: $(cat "$T/out.txt")"
grep -q "resuming from .*1 epoch(s) done, step 20" "$T/out.txt" || fail "no resume: $(cat "$T/out.txt")"
local_two "${RUN[@]}" output.dir="$T/undisturbed" || fail "the undisturbed run failed"
same "$T/undisturbed" "$T/lost" "lost a host in epoch 2, resumed"
[ "$(test_acc "$T/undisturbed")" = "$(test_acc "$T/lost")" ] ||
  fail "test accuracy differs: $(test_acc "$T/undisturbed") against $(test_acc "$T/lost")"

# ---- a partition in the second epoch: the link stops carrying packets, no connection closes,
# and the processes would wait in their collectives for ever; the watchdog (dist.timeout, 5 s
# here) ends them, and mpirun follows once TCP gives up on the cut-off daemon (hosts.sh)
lose_second_host "$T/cut" partition "the partition" dist.timeout=5
grep -q "process 0 of 2: no progress in data-parallel training for [0-9]* s" "$T/out.txt" ||
  fail "no watchdog message: $(cat "$T/out.txt")"
exit 0
