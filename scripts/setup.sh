#!/bin/bash
# Installs the Debian packages the project needs (when missing), Node.js and ONNX Runtime for the
# tests (tests/ort: onnxruntime-node from npm, as package-lock.json pins it), and builds the
# project into build/.
# Usage (as root on Debian 12): bash scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev only recommends the OpenCL dev files, but its CMake config needs them.
PACKAGES=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libhdf5-dev libstb-dev libinih-dev zlib1g-dev
          dataset-fashion-mnist gnuplot-nox python3 python3-h5py python3-numpy
          libonnx-dev protobuf-c-compiler libprotobuf-c-dev python3-onnx libxnnpack-dev libpthreadpool-dev
          libopenmpi-dev openmpi-bin)
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

# Node.js for the ONNX Runtime tests: Debian's nodejs + npm when there is no node (a machine
# with NodeSource's nodejs has node and its bundled npm already, and Debian's npm conflicts
# with it: left alone).
if ! command -v node >/dev/null; then
  echo "setup: installing nodejs npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
elif ! command -v npm >/dev/null; then
  echo "setup: installing npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
# onnxruntime-node into tests/ort/node_modules, skipped when the last install came from this
# package-lock.json. ONNXRUNTIME_NODE_INSTALL=skip: its postinstall would download GPU files
# (the CPU binaries are in the npm tarball).
lock_sum=$(sha256sum tests/ort/package-lock.json | cut -d' ' -f1)
stamp=tests/ort/node_modules/.qt-installed-lock-sha256
if [ -f tests/ort/node_modules/onnxruntime-node/package.json ] && [ -f "$stamp" ] \
   && [ "$(cat "$stamp")" = "$lock_sum" ]; then
  :
else
  echo "setup: npm ci in tests/ort (onnxruntime-node)"
  (cd tests/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" > "$stamp"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
