#!/bin/bash
# Installs the Debian packages the project needs (when missing) and builds it into build/.
# Usage (as root on Debian 12): bash scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev only recommends the OpenCL dev files, but its CMake config needs them.
PACKAGES=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libhdf5-dev libstb-dev libinih-dev zlib1g-dev
          dataset-fashion-mnist gnuplot-nox python3 python3-h5py python3-numpy python3-onnx
          libonnx-dev protobuf-c-compiler libprotobuf-c-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
