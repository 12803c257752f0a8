#!/bin/bash
# bench/bench_qat.py runs end to end on a few images and prints its three figures: the fp32
# epoch's images/s, and the observer and LSQ QAT epochs' images/s with their ratios to it (all
# positive). It starts its QAT runs from a one-epoch fp32 checkpoint of its own, which qat_train
# refuses unless told to take it as it is (quant.fp32_reuse); a change there fails this test.
# Timing values are not judged.
# Usage: test_bench_qat.sh BUILD_DIR SOURCE_DIR
set -u
BUILD="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
if ! /usr/bin/python3 "$SRC/bench/bench_qat.py" --images 512 --repeat 1 --build "$BUILD" > "$T/out.txt" 2> "$T/err.txt"; then
  echo "bench_qat.py failed:"; cat "$T/out.txt" "$T/err.txt"; exit 1
fi
/usr/bin/python3 - "$T/out.txt" <<'PY' || { cat "$T/out.txt"; exit 1; }
import re, sys
txt = open(sys.argv[1]).read()
m = re.search(r"^fp32\s+(\d+) images/s$", txt, re.M)
assert m and int(m.group(1)) > 0, "no fp32 images/s line"
for name in ("QAT W4A8, per-channel fake quant, observers", "QAT W4A8, LSQ (the example config)"):
    m = re.search(r"^" + re.escape(name) + r"\s+(\d+) images/s\s+([0-9.]+)x the fp32 epoch \(rounds: median ([0-9.]+)x",
                  txt, re.M)
    assert m, "no line for " + name
    assert int(m.group(1)) > 0 and float(m.group(2)) > 0 and float(m.group(3)) > 0, name + ": a figure is not positive"
print("test_bench_qat: ok")
PY
