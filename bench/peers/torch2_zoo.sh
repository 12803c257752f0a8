#!/bin/bash
# torch 2.x's exports of FashionCNN, torchvision's ResNet-18 and MobileNetV2 (bench/peers/torch2_zoo.py:
# as the README shows the call, and with the exporter's defaults) through the whole pipeline:
# fp32 import checked against ONNX Runtime, fp32 training, QAT W4A4, check, int8 device, QDQ
# export in ONNX Runtime (tests/ort/test_ort_torch2.py on 2000 training / 1000 test images).
# Needs the peers' environment (bash bench/peers/setup_peers.sh) and a built tree.
# Usage: bash bench/peers/torch2_zoo.sh [WORK_DIR]   (about 4 minutes on two idle cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/tmp/torch2_zoo}
mkdir -p "$work/models"
bench/peers/.venv/bin/python bench/peers/torch2_zoo.py "$work/models" 2>&1 | grep -v '^\[torch.onnx\]'
cmake --build build --target onnx_forward qat_train > /dev/null
OMP_WAIT_POLICY=PASSIVE .venv/bin/python tests/ort/test_ort_torch2.py build "$work/runs" --train 2000 --test 1000 \
  --ort-slack 5 "$work"/models/*.onnx
