#!/bin/bash
# experiments/grid.py refuses a broken grid description with a message naming the file, the
# section and the problem (exit != 0, nothing run: --dry-run), and --models/--seeds slices
# plan the expected runs. Usage: test_grid_config.sh SOURCE_DIR
set -u
SRC="$1"
GRID="$SRC/experiments/grid.py"
INI="$SRC/experiments/grid/grid.ini"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0

# expect NAME PATTERN SED-EXPRESSION: the grid.ini edited by SED-EXPRESSION must be refused
expect() {
  local name="$1" pat="$2" expr="$3"
  sed -e "$expr" "$INI" > "$T/$name.ini"
  if cmp -s "$INI" "$T/$name.ini"; then echo "$name: the edit changed nothing"; fail=1; return; fi
  /usr/bin/python3 "$GRID" --config "$T/$name.ini" --dry-run > "$T/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then echo "$name: accepted"; fail=1; return; fi
  grep -qF -- "$pat" "$T/out" || { echo "$name: message lacks '$pat':"; cat "$T/out"; fail=1; }
  grep -qF -- "$name.ini" "$T/out" || { echo "$name: message does not name the file:"; cat "$T/out"; fail=1; }
}

expect unknown_method "method 'ptq_msee'" 's/^methods = ptq, ptq_mse, qat_ste,/methods = ptq, ptq_msee, qat_ste,/'
expect bad_mode "[ptq_mse]: mode must be ptq or qat" 's/^mode = ptq$/mode = pqt/'
expect shared_label "share the label 'QAT'" 's/^label = STE$/label = QAT/'
expect unknown_key "unknown key 'labl' in [ptq]" 's/^label = PTQ$/labl = PTQ/'
expect bad_bits "w9a8" 's/^bits = w8a8, w4a8/bits = w9a8, w4a8/'
expect debug_seed "[ptq_debug] seed 7" 's/^seed = 0$/seed = 7/'

# slices: every planned run is of the chosen model and seed, and there are some
/usr/bin/python3 "$GRID" --dry-run --models fashion_mlp --seeds 1 | grep qat_train > "$T/slice"
n=$(wc -l < "$T/slice")
[ "$n" -gt 1 ] || { echo "slice fashion_mlp seed 1: $n runs planned"; fail=1; }
[ "$(grep -c 'fashion_mlp_fp32.ini' "$T/slice")" -eq "$n" ] || { echo "slice: runs of other models planned"; fail=1; }
[ "$(grep -c 'train.seed=1 ' "$T/slice")" -eq "$n" ] || { echo "slice: runs of other seeds planned"; fail=1; }
/usr/bin/python3 "$GRID" --dry-run --models fashion_rnn > "$T/out" 2>&1 && { echo "unknown --models accepted"; fail=1; }
grep -qF "fashion_rnn" "$T/out" || { echo "unknown --models: message lacks the name"; cat "$T/out"; fail=1; }

# base = grid.ini (experiments/grid/onnx*.ini): the base's recipes and [grid] keys apply where the
# file sets none, its studies and PTQ debugging do not; a missing base or a base with a base of
# its own is refused
/usr/bin/python3 "$GRID" --config "$SRC/experiments/grid/onnx_twins.ini" --dry-run > "$T/twins" 2>&1 ||
  { echo "onnx_twins.ini refused:"; cat "$T/twins"; fail=1; }
grep -q "^# 30 runs, 30 table rows" "$T/twins" || { echo "onnx_twins.ini: not 30 runs (3 models x 10, one seed)"; tail -1 "$T/twins"; fail=1; }
grep -q "quant.learnable_scale=true" "$T/twins" || { echo "onnx_twins.ini: the base's [qat] recipe not taken"; fail=1; }
grep -q "threads=2 " "$T/twins" || { echo "onnx_twins.ini: the base's threads not taken"; fail=1; }
grep -q "qat_ste\|ptq_debug" "$T/twins" && { echo "onnx_twins.ini: the base's study or PTQ debugging planned"; fail=1; }
sed -e 's/^base = grid.ini/base = no_such.ini/' "$SRC/experiments/grid/onnx.ini" > "$T/nobase.ini"
/usr/bin/python3 "$GRID" --config "$T/nobase.ini" --dry-run > "$T/out" 2>&1 && { echo "missing base accepted"; fail=1; }
grep -qF "no_such.ini" "$T/out" || { echo "missing base: message lacks the file"; cat "$T/out"; fail=1; }
cp "$SRC/experiments/grid/onnx.ini" "$T/onnx.ini"
sed -e 's/^base = grid.ini/base = onnx.ini/' "$SRC/experiments/grid/onnx_twins.ini" > "$T/chain.ini"
/usr/bin/python3 "$GRID" --config "$T/chain.ini" --dry-run > "$T/out" 2>&1 && { echo "base of a base accepted"; fail=1; }
grep -qF "one level only" "$T/out" || { echo "base of a base: message:"; cat "$T/out"; fail=1; }

[ $fail -eq 0 ] || exit 1
echo "grid config checks: ok"
