#!/bin/bash
# summary.json and analysis.json stay valid JSON whatever output.dir is called: a folder name
# with a double quote and a backslash goes through the JSON escaper everywhere (a tiny fp32 run
# and a tiny PTQ run with its analysis). Usage: test_summary_json.sh path/to/qat_train
set -u
BIN="$1"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
DIR="$T/odd \"name\" \\ dir"
common=(data.train_limit=256 data.test_limit=128 train.epochs=1 train.batch_size=64 output.progress=none
        train.threads=2)
printf '[train]\nepochs = 1\n' > "$T/ok.ini"
"$BIN" "$T/ok.ini" "${common[@]}" "output.dir=$DIR/fp32" > "$T/out" 2>&1 || { echo "fp32 run failed:"; cat "$T/out"; exit 1; }
"$BIN" "$T/ok.ini" "${common[@]}" "output.dir=$DIR/ptq" quant.mode=ptq quant.calibration_batches=2 \
  analysis.layer_sqnr=true analysis.images=64 > "$T/out" 2>&1 || { echo "PTQ run failed:"; cat "$T/out"; exit 1; }
for f in "$DIR/fp32/summary.json" "$DIR/ptq/summary.json" "$DIR/ptq/analysis.json"; do
  /usr/bin/python3 - "$f" "$DIR" <<'PY' || fail=1
import json, sys
path, d = sys.argv[1], sys.argv[2]
try:
    s = json.load(open(path))
except Exception as e:
    print("%s is not valid JSON: %s" % (path, e)); sys.exit(1)
if path.endswith("summary.json") and not s["checkpoint"].startswith(d):
    print("%s: checkpoint %r does not start with %r" % (path, s["checkpoint"], d)); sys.exit(1)
PY
done
[ $fail -eq 0 ] || exit 1
