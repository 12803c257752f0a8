#!/bin/bash
# Data-parallel training across emulated hosts: two network namespaces on this machine joined by a
# link with a one-way delay of 0, 1 and 10 ms per packet (tests/dist/hosts.sh; root), one process
# of one thread per host, against two processes over shared memory on one host, in alternating
# rounds. FashionCNN fp32 (or CONFIG), one epoch of IMAGES training images at batch 128; the figure
# is the epoch's training images/s from metrics.csv. Then the time a job takes to end once a
# host is lost: its processes killed (the connections close), and cut off by a partition (they
# do not: the dist.timeout watchdog ends it).
# Usage: bash bench/bench_hosts.sh [IMAGES (default 5120)] [ROUNDS (default 2)] [CONFIG]
# Both cores are shared by the two "hosts" and the link, so compare the rows with each other,
# not with a network of real machines.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=${1:-5120}
ROUNDS=${2:-2}
CFG=${3:-experiments/fashion_cnn_fp32.ini}
QAT=${QT_BUILD:-build}/bin/qat_train
# shellcheck source=../tests/dist/hosts.sh
source tests/dist/hosts.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RUN=(train.epochs=1 "data.train_limit=$IMAGES" data.test_limit=500 output.progress=none output.dot=false)
ips() { sed -n 2p "$1/metrics.csv" | cut -d, -f7; }

declare -A best
for ((r = 1; r <= ROUNDS; r++)); do
  rm -rf "$T/shm"
  mpirun --allow-run-as-root -np 2 --bind-to core -x OMP_NUM_THREADS=1 "$QAT" "$CFG" "${RUN[@]}" \
    output.dir="$T/shm" >/dev/null 2>&1
  row="round $r: one host, shared memory $(ips "$T/shm")"
  best[shm]=$(printf '%s\n%s\n' "${best[shm]:-0}" "$(ips "$T/shm")" | sort -g | tail -1)
  for delay in 0 1 10; do
    hosts_up 2 "$delay" 0
    rm -rf "$T/h$delay"
    hosts_mpirun "$QAT" "$CFG" "${RUN[@]}" output.dir="$T/h$delay" >/dev/null 2>&1
    hosts_down
    row+=", two hosts +$delay ms $(ips "$T/h$delay")"
    best[$delay]=$(printf '%s\n%s\n' "${best[$delay]:-0}" "$(ips "$T/h$delay")" | sort -g | tail -1)
  done
  echo "$row images/s"
done
echo "best of $ROUNDS rounds, $IMAGES images, batch 128, 2 processes x 1 thread:"
echo "  one host, shared memory:   ${best[shm]} images/s"
for delay in 0 1 10; do echo "  two hosts, +$delay ms one way: ${best[$delay]} images/s"; done

# ---- a lost host: killed, and cut off
lost() { # how: kill | partition
  hosts_up 2 1 0
  rm -rf "$T/lost"
  hosts_mpirun "$QAT" "$CFG" train.epochs=3 "data.train_limit=$IMAGES" data.test_limit=500 output.progress=none \
    output.dot=false output.dir="$T/lost" >"$T/out.txt" 2>&1 &
  local job=$! t0 t1
  hosts_first_epoch "$T/lost/metrics.csv" $job || { echo "  $1: the run ended before its first epoch"; return; }
  t0=$(date +%s.%N)
  hosts_lose_second "$1"
  wait $job || true
  t1=$(date +%s.%N)
  hosts_down
  echo "  $1: the job ended after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s;" \
    "$(grep -E -m1 "lost communication|no progress|exited on signal" "$T/out.txt" | cut -c1-150)"
}
echo "a host lost in the second epoch (dist.timeout 30 s):"
lost kill
lost partition
