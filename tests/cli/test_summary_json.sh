#!/bin/bash
# summary.json and analysis.json stay valid JSON whatever output.dir is called: a folder name
# with a double quote and a backslash goes through the JSON escaper everywhere (a tiny fp32 run,
# a tiny PTQ run with its analysis, and one with CLE, block reconstruction and bias correction,
# whose outcomes summary.json's "quant" must hold: FashionCNN's 3 equalized pairs, its 4 layers
# rounded in its 4 blocks, and corrected, and its analysis the nodes' SQNR without and with them). Usage: test_summary_json.sh path/to/qat_train
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
ptq=(quant.mode=ptq quant.calibration_batches=2)
"$BIN" "$T/ok.ini" "${common[@]}" "output.dir=$DIR/methods" "${ptq[@]}" quant.weight_bits=4 quant.cle=true \
  quant.adaround=true quant.adaround_unit=block quant.adaround_images=64 quant.adaround_iterations=20 \
  quant.bias_correction=empirical \
  quant.bias_correction_images=64 analysis.layer_sqnr=true analysis.images=64 > "$T/out" 2>&1 ||
  { echo "PTQ methods run failed:"; cat "$T/out"; exit 1; }
/usr/bin/python3 - "$DIR/methods/summary.json" <<'PY' || fail=1
import json, sys
q = json.load(open(sys.argv[1]))["quant"]
layers = [l["name"] for l in q["adaround"]["per_unit"]]
ok = (q["cle"]["pairs"] == 3 and q["bias_correction"]["layers"] == 4 and q["adaround"]["layers"] == 4
      and q["adaround"]["unit"] == "block"
      and layers == ["conv1..relu1.fq", "pool1..relu2.fq", "pool2..relu3.fq", "fc2..fc2.fq"]
      and q["adaround"]["iterations"] == 20
      and all(0 <= l["flipped"] <= 1 and l["weights"] > 0 for l in q["adaround"]["per_unit"]))
if not ok:
    print("summary.json's quant lacks the PTQ methods' outcomes: %s" % json.dumps(q)); sys.exit(1)
PY
# the analysis compares the nodes' SQNR without and with the methods
/usr/bin/python3 - "$DIR/methods/analysis.json" "$DIR/methods/analysis.md" <<'PY' || fail=1
import json, sys
a = json.load(open(sys.argv[1]))
md = open(sys.argv[2]).read()
nodes = lambda k: [n["node"] for n in a[k]["nodes"]]
if not (nodes("sqnr") and nodes("sqnr") == nodes("sqnr_without_methods")
        and "before and after the PTQ methods (CLE, block reconstruction, empirical bias correction)" in md):
    print("analysis lacks the PTQ methods' comparison: %s" % sorted(a)); sys.exit(1)
PY
for f in "$DIR/fp32/summary.json" "$DIR/ptq/summary.json" "$DIR/ptq/analysis.json" "$DIR/methods/summary.json"; do
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
