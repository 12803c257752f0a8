#!/bin/sh
# Runs a test that needs ONNX Runtime (tests registered with qt_add_ort_test, tests/ort/OrtTest.cmake):
#   sh tests/ort/ort_test.sh NODE -- COMMAND [ARGS...]
# NODE is the node binary CMake found (find_program(QT_NODE node)), or empty / *-NOTFOUND.
#  - node absent: prints SKIP and why, exits 77 (the test's SKIP_RETURN_CODE): the one case
#    where an ONNX Runtime test may skip;
#  - node present but tests/ort/node_modules not installed from package-lock.json (missing, or
#    another onnxruntime-node version than the lock pins): prints FAIL and what to run, exits 1;
#  - else runs COMMAND with QT_NODE=NODE in its environment; its status is the test's, except
#    that 77 from COMMAND becomes 1 (only this wrapper may skip).
ort_dir=$(cd "$(dirname "$0")" && pwd)
node=$1
shift
[ "$1" = "--" ] && shift
if [ $# -eq 0 ]; then
  echo "usage: sh ort_test.sh NODE -- COMMAND [ARGS...]" >&2
  exit 1
fi
case "$node" in
  "" | *-NOTFOUND)
    echo "SKIP: node (Node.js) is absent: CMake's find_program(QT_NODE node) found none, so the" \
         "ONNX Runtime tests cannot run. Install it (scripts/setup.sh does: Debian packages nodejs npm)" \
         "and configure again."
    exit 77 ;;
esac
if [ ! -x "$node" ]; then
  echo "SKIP: node (Node.js) is absent: $node (found by CMake) is no longer there. Install it" \
       "(scripts/setup.sh) and configure again."
  exit 77
fi
# node is present from here on: anything missing is a failure.
if [ ! -f "$ort_dir/node_modules/onnxruntime-node/package.json" ]; then
  echo "FAIL: node is present ($node) but onnxruntime-node is not installed in $ort_dir/node_modules:" \
       "run scripts/setup.sh (or: cd tests/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)"
  exit 1
fi
if ! "$node" -e '
  const fs = require("fs"), path = require("path");
  const dir = process.argv[1];
  const lock = JSON.parse(fs.readFileSync(path.join(dir, "package-lock.json"), "utf8"));
  const want = lock.packages["node_modules/onnxruntime-node"].version;
  const have = JSON.parse(fs.readFileSync(path.join(dir, "node_modules/onnxruntime-node/package.json"), "utf8")).version;
  if (want !== have) {
    console.log(`FAIL: tests/ort/node_modules holds onnxruntime-node ${have}, package-lock.json pins ${want}: ` +
                "run scripts/setup.sh (or: cd tests/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)");
    process.exit(1);
  }' "$ort_dir"; then
  exit 1
fi
QT_NODE=$node
export QT_NODE
"$@"
rc=$?
if [ $rc -eq 77 ]; then
  echo "FAIL: the test exited with 77, the skip status, which only ort_test.sh gives (node absent)"
  exit 1
fi
exit $rc
