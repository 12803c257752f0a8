#!/bin/bash
# experiments/backends.py end to end on CI-sized data (--quick --check), then its --check and
# argument checks on broken input. Usage: test_backends_quick.sh SOURCE_DIR BUILD_DIR OUT_DIR
set -u
SRC="$1" BUILD="$2" OUT="$3"
PY="$SRC/experiments/backends.py"
rm -rf "$OUT"
fail=0

/usr/bin/python3 "$PY" --quick --build "$BUILD" --out "$OUT" --check || { echo "backends.py --quick --check failed"; exit 1; }

# a run without its summary.json: --check names the row and exits 1
rm "$OUT/runs/res_cnn/xnnpack/ptq_w8a8/summary.json"
/usr/bin/python3 "$PY" --quick --build "$BUILD" --out "$OUT" --report-only --check > "$OUT/check.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { echo "--check with a summary.json missing: exit $rc, want 1"; cat "$OUT/check.txt"; fail=1; }
grep -qF "res_cnn xnnpack ptq w8a8: failed" "$OUT/check.txt" || { echo "--check does not name the row:"; cat "$OUT/check.txt"; fail=1; }

# bad arguments: refused before any run, naming what is wrong
expect() {
  local pat="$1"; shift
  /usr/bin/python3 "$PY" --dry-run "$@" > "$OUT/args.txt" 2>&1 && { echo "accepted: $*"; fail=1; return; }
  grep -qF -- "$pat" "$OUT/args.txt" || { echo "$*: message lacks '$pat':"; cat "$OUT/args.txt"; fail=1; }
}
expect "'tpu' is not one of" --backends onednn,tpu
expect "'ptq_msee' is not a method" --rows ptq_msee:w8a8
expect "w9a8" --rows ptq:w9a8
expect "expected MODEL=CHECKPOINT" --fp32 fashion_cnn
expect "no fp32 recipe" --models fashion_rnn

[ $fail -eq 0 ] || exit 1
echo "backends quick: ok"
