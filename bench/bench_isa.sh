#!/bin/bash
# The speed figures of docs/performance.md on both oneDNN ISAs of this machine, one after the other: the
# native one (AVX-512 with VNNI here) and AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, which the oneDNN inside
# PyTorch honours too; ATEN_CPU_CAPABILITY=avx2 puts PyTorch's own kernels on AVX2 as well).
# Each benchmark compares with PyTorch side by side in its own run, as it does alone:
#   bench_profile (per-op step time and the oneDNN implementations that ran), bench_train.py
#   (fp32 training vs PyTorch), bench_qat.py (QAT epoch / fp32 epoch), bench_infer.py (fp32 and
#   int8 inference vs PyTorch; under AVX2 on a model quantized for a CPU without VNNI,
#   quant.isa=no_vnni: 7-bit weights, docs/design.md: no VNNI).
# Usage: bench/bench_isa.sh [OUT_DIR (default experiments/results/isa)] [--quick]; about 10 minutes on two
# idle cores (--quick: fewer images and rounds). Run with both cores idle.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-experiments/results/isa}
quick=${2:-}
mkdir -p "$out"
# OMP_WAIT_POLICY is left alone: PASSIVE (which the test scripts set for shared cores) slows
# PyTorch several times over (measured: fp32 inference 10x), so run this on idle cores.
unset OMP_WAIT_POLICY
build=build
images=20000 rounds=5 repeat=2 qat_repeat=7
[ "$quick" = "--quick" ] && images=4000 rounds=2 repeat=1 qat_repeat=1
# the models bench_infer.py needs: the fp32 example and a W8A8 PTQ model per ISA
[ -f runs/fashion_cnn_fp32/checkpoint.h5 ] || $build/bin/qat_train experiments/fashion_cnn_fp32.ini output.progress=none
[ -f runs/fashion_cnn_ptq_w8a8/model_qdq.h5 ] || $build/bin/qat_train experiments/fashion_cnn_ptq_w8a8.ini output.progress=none
[ -f runs/fashion_cnn_ptq_w8a8_no_vnni/model_qdq.h5 ] ||
  $build/bin/qat_train experiments/fashion_cnn_ptq_w8a8.ini quant.isa=no_vnni \
    output.dir=runs/fashion_cnn_ptq_w8a8_no_vnni output.progress=none > "$out/ptq_no_vnni.log"
grep -m1 "model name" /proc/cpuinfo > "$out/cpu.txt"
for isa in native avx2; do
  if [ $isa = avx2 ]; then
    export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
    qdq=runs/fashion_cnn_ptq_w8a8_no_vnni/model_qdq.h5
  else
    unset ONEDNN_MAX_CPU_ISA ATEN_CPU_CAPABILITY
    qdq=runs/fashion_cnn_ptq_w8a8/model_qdq.h5
  fi
  echo "bench_isa: $isa"
  $build/bin/bench_profile experiments/fashion_cnn_fp32.ini --steps 50 > "$out/profile_fp32_$isa.txt"
  $build/bin/bench_profile experiments/fashion_cnn_qat_w4a4.ini --steps 50 > "$out/profile_qat_w4a4_$isa.txt"
  /usr/bin/python3 bench/bench_train.py --images $images --rounds $rounds --build $build > "$out/train_$isa.txt"
  # 7 rounds: with 2, the ratio moved by 0.05-0.15 between runs on this shared machine
  /usr/bin/python3 bench/bench_qat.py --images $images --repeat $qat_repeat --build $build > "$out/qat_$isa.txt"
  /usr/bin/python3 bench/bench_infer.py --rounds $rounds --repeat $repeat --build $build --qdq $qdq \
    > "$out/infer_$isa.txt"
  # the int8 device's partitions and the kernels they run on
  $build/bin/qat_run $qdq --images 512 > "$out/int8_partitions_$isa.txt"
done
tail -n +1 "$out"/cpu.txt "$out"/*_native.txt "$out"/*_avx2.txt
