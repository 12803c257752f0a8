#!/bin/sh
# test_ort_run: tests/ort/ort_run.py's error messages and exit status (1, a message naming the
# problem, no output file left behind) and that its options reach ONNX Runtime: the session
# config entries of --x64quantprecision and --no-spinning appear in ORT's verbose log of the
# session options, and --optimized-model writes the graph ORT runs. Run through
# tests/ort/ort_test.sh (QT_PYTHON set); by hand:
#   QT_PYTHON=.venv/bin/python sh tests/ort/test_ort_run.sh
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
py=${QT_PYTHON:-$src/.venv/bin/python}
run="$src/tests/ort/ort_run.py"
models="$src/tests/onnx/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# 2 images of 1x28x28 float32 (zeros are enough for the error paths), 3 images for the fixed batch
head -c $((2 * 784 * 4)) /dev/zero > "$tmp/x2.bin"
head -c $((3 * 784 * 4)) /dev/zero > "$tmp/x3.bin"
echo "not an onnx model" > "$tmp/bad.onnx"

# expect_error NAME PATTERN ARGS...: exit status 1, stderr matches PATTERN, no output file
expect_error() {
  name=$1 pattern=$2
  shift 2
  rm -f "$tmp/out.bin" "$tmp/out.bin.tmp"
  "$py" "$run" "$@" > "$tmp/stdout" 2> "$tmp/stderr"
  rc=$?
  msg=$(head -n 1 "$tmp/stderr")
  if [ $rc -ne 1 ]; then
    echo "FAIL $name: exit status $rc, expected 1 ($msg)"; fails=$((fails + 1))
  elif ! grep -q -- "$pattern" "$tmp/stderr"; then
    echo "FAIL $name: message '$msg' does not match '$pattern'"; fails=$((fails + 1))
  elif [ -e "$tmp/out.bin" ] || [ -e "$tmp/out.bin.tmp" ]; then
    echo "FAIL $name: an output file was left behind"; fails=$((fails + 1))
  elif [ -s "$tmp/stdout" ]; then
    echo "FAIL $name: printed on stdout: $(cat "$tmp/stdout")"; fails=$((fails + 1))
  else
    echo "ok   $name: $msg"
  fi
}

m="$models/fashion_mlp.onnx"
o="$tmp/out.bin"
expect_error "no arguments" "--model is required"
expect_error "unknown option" "unknown argument '--bogus'" --bogus
expect_error "option without value" "--output needs a value" --model "$m" --input "$tmp/x2.bin" --shape 2,1,28,28 --output
expect_error "missing model" "cannot open model $tmp/none.onnx: no such file" \
  --model "$tmp/none.onnx" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o"
expect_error "model is a folder" "is not a regular file" --model "$tmp" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o"
expect_error "missing input" "cannot open input $tmp/none.bin: no such file" \
  --model "$m" --input "$tmp/none.bin" --shape 2,1,28,28 --output "$o"
expect_error "input size" "has 6272 bytes; --shape 3,1,28,28 needs 3\*1\*28\*28\*4 = 9408" \
  --model "$m" --input "$tmp/x2.bin" --shape 3,1,28,28 --output "$o"
expect_error "shape of 3 dims" "--shape must be N,C,H,W" --model "$m" --input "$tmp/x2.bin" --shape 2,784 --output "$o"
expect_error "shape zero" "--shape expects positive integers, not '0'" \
  --model "$m" --input "$tmp/x2.bin" --shape 0,1,28,28 --output "$o"
expect_error "bad --opt" "--opt must be one of disabled, basic, extended, all, not 'fast'" \
  --model "$m" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o" --opt fast
expect_error "bad --threads" "--threads expects positive integers, not 'two'" \
  --model "$m" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o" --threads two
expect_error "not an ONNX file" "ONNX Runtime cannot load $tmp/bad.onnx" \
  --model "$tmp/bad.onnx" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o"
expect_error "shape against the model" "model input 'input' is \[batch, 1, 28, 28\]; --shape 1,2,28,28 does not fit it" \
  --model "$m" --input "$tmp/x2.bin" --shape 1,2,28,28 --output "$o"
expect_error "fixed batch" "has a fixed batch of 2; N = 3 is not a multiple of it" \
  --model "$models/tiny_features.onnx" --input "$tmp/x3.bin" --shape 3,1,28,28 --output "$o"
expect_error "output folder missing" "cannot write $tmp/none/out.bin.tmp" \
  --model "$m" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$tmp/none/out.bin"

# A good run with the session options: the JSON line, the output's size, the config entries.
rm -f "$o"
if ! "$py" "$run" --model "$m" --input "$tmp/x2.bin" --shape 2,1,28,28 --output "$o" --opt basic \
     --threads 1 --x64quantprecision --no-spinning --verbose --optimized-model "$tmp/opt.onnx" \
     > "$tmp/stdout" 2> "$tmp/stderr"; then
  echo "FAIL good run: $(grep -v '^[0-9-]* [0-9:.]* \[' "$tmp/stderr" | head -n 3)"; fails=$((fails + 1))
else
  json=$(cat "$tmp/stdout")
  for want in '"dims":\[2,10\]' '"ort_version":"1\.' '"opt":"basic"' '"x64quantprecision":true' \
              '"threads":1' '"spinning":false' '"output":"logits"'; do
    echo "$json" | grep -q "$want" || { echo "FAIL good run: JSON line lacks $want: $json"; fails=$((fails + 1)); }
  done
  size=$(wc -c < "$o")
  [ "$size" -eq 80 ] || { echo "FAIL good run: output has $size bytes, expected 2*10*4 = 80"; fails=$((fails + 1)); }
  for want in 'session.x64quantprecision: 1' 'session.intra_op.allow_spinning: 0' 'graph_optimization_level:1 '; do
    grep -q "$want" "$tmp/stderr" || { echo "FAIL good run: ORT's verbose log lacks '$want'"; fails=$((fails + 1)); }
  done
  [ -s "$tmp/opt.onnx" ] || { echo "FAIL good run: --optimized-model wrote no $tmp/opt.onnx"; fails=$((fails + 1)); }
  echo "ok   good run: $json"
fi

if [ $fails -ne 0 ]; then
  echo "$fails failures"
  exit 1
fi
echo "all ok"
