#!/bin/bash
# Installs the Debian packages the project needs (when missing), the test environment (.venv:
# ONNX Runtime, onnx, numpy and h5py from PyPI, as tests/requirements.txt pins them), and builds
# the project into build/.
# Usage (as root on Debian 12): bash scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

# libdnnl-dev only recommends the OpenCL dev files, but its CMake config needs them.
PACKAGES=(build-essential cmake pkg-config libdnnl-dev ocl-icd-opencl-dev libhdf5-dev libstb-dev libinih-dev zlib1g-dev
          dataset-fashion-mnist gnuplot-nox python3 python3-h5py python3-numpy
          libonnx-dev protobuf-c-compiler libprotobuf-c-dev python3-onnx libxnnpack-dev libpthreadpool-dev
          libopenmpi-dev openmpi-bin clang-format)
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

# The test environment: a virtual environment (.venv, or $QT_VENV) with ONNX Runtime, the
# current onnx, numpy and h5py from PyPI, as tests/requirements.txt pins them (wheels only),
# remade only when that file changed since the last install. Its interpreter is the python3
# first on PATH (or $QT_VENV_PYTHON); Debian's python3 needs python3-venv for it.
venv=${QT_VENV:-.venv}
venv_python=${QT_VENV_PYTHON:-python3}
req_sum=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
stamp=$venv/.qt-requirements-sha256
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req_sum" ]; then
  :
else
  echo "setup: test environment $venv (pip install -r tests/requirements.txt)"
  rm -rf "$venv"
  if ! "$venv_python" -m venv "$venv" >/dev/null 2>&1; then
    echo "setup: installing python3-venv ($venv_python -m venv failed)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    rm -rf "$venv"
    "$venv_python" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --only-binary=:all: \
    -r tests/requirements.txt
  echo "$req_sum" > "$stamp"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQT_TEST_PYTHON="$(cd "$venv" && pwd)/bin/python" "$@" >/dev/null
cmake --build build -j"$(nproc)"
