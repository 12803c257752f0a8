#!/bin/sh
# Runs a test that needs ONNX Runtime or the current onnx (tests registered with qt_add_ort_test,
# tests/ort/OrtTest.cmake):
#   sh tests/ort/ort_test.sh PYTHON -- COMMAND [ARGS...]
# PYTHON is the test environment's interpreter (CMake's QT_TEST_PYTHON, .venv/bin/python).
#  - PYTHON missing, or its onnxruntime / onnx / numpy / h5py not the versions that
#    tests/requirements.txt pins: prints FAIL and what to run, exits 1 (these tests never skip);
#  - else runs COMMAND with QT_PYTHON=PYTHON in its environment; its status is the test's.
ort_dir=$(cd "$(dirname "$0")" && pwd)
python=$1
shift
[ "$1" = "--" ] && shift
if [ $# -eq 0 ]; then
  echo "usage: sh ort_test.sh PYTHON -- COMMAND [ARGS...]" >&2
  exit 1
fi
if [ ! -x "$python" ]; then
  echo "FAIL: the test environment's python ($python) does not exist: run scripts/setup.sh" \
       "(it makes .venv from tests/requirements.txt) and configure again"
  exit 1
fi
if ! "$python" - "$ort_dir/../requirements.txt" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        bad.append("%s %s (tests/requirements.txt pins %s)" % (name, have or "not installed", want))
if bad:
    print("FAIL: the test environment %s holds %s: run scripts/setup.sh" % (sys.executable, "; ".join(bad)))
    sys.exit(1)
PY
then
  exit 1
fi
QT_PYTHON=$python
export QT_PYTHON
exec "$@"
